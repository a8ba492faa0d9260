"""The wall time of every process that worked on a run (a run stopped and resumed spends their sum): each `generate`
process writes `sessions/<start>-<pid>.json` as it starts and every `SESSION_TICK_S`, with its peak resident memory
and host (docs/output.md)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from opsynth.pipeline import workfiles

SESSIONS_DIR = "sessions"
SESSION_TICK_S = 10.0
GPU_SERIES_SUFFIX = ".gpu.jsonl"  # beside a CUDA session's record: its GPUs' busy share and workers, sampled


def process_started() -> float:
    """When this process started, on the monotonic clock: its age from /proc (Linux), else now. A session counts
    from it: its imports are time its user waits too."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: start, in clock ticks after boot
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.monotonic()
    return time.monotonic() - max(0.0, age)


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (its children not counted), in MiB."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return round(peak / (1 << 20 if sys.platform == "darwin" else 1 << 10), 1)


def host() -> dict:
    """The CPU this process runs on and its cores, as the run counts them to size its workers: hosts of one GPU
    kind compile a run's tasks at different speeds, and the run's time and GPU busy share follow them
    (docs/execution.md)."""
    cpu = None
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    return {"cpu": cpu, "cores": os.cpu_count()}


class SessionClock:
    """Records this process's wall time on the run in `work_root`, from `t0` (monotonic; default now); a
    context manager."""

    def __init__(self, work_root: str, tick_s: float = SESSION_TICK_S, t0: float | None = None):
        self.extra: Callable[[], dict] | None = None  # more of this process's record, written with its time
        self.folder = workfiles.join(work_root, SESSIONS_DIR)
        self.t0 = time.monotonic() if t0 is None else min(t0, time.monotonic())  # the session's start
        self.started = datetime.fromtimestamp(time.time() - self.elapsed(), UTC)
        self.path = workfiles.join(self.folder, f"{self.started.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.json")
        self._host = host()
        self._tick_s = tick_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, name="opsynth-session-clock", daemon=True)

    def companion(self, suffix: str) -> str:
        """The path of another file of this session's, beside its record: its name with `suffix` for `.json`."""
        return self.path.removesuffix(".json") + suffix

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def write(self, finished: bool = False) -> None:
        record = {
            "started": self.started.isoformat(timespec="seconds"),
            "wall_s": round(self.elapsed(), 1),
            "peak_rss_mib": peak_rss_mib(),
            "host": self._host,
        }
        if self.extra is not None:
            record.update(self.extra())
        workfiles.write_text(self.path, json.dumps({**record, "finished": finished}, sort_keys=True))

    def _tick(self) -> None:
        while not self._stop.wait(self._tick_s):
            with contextlib.suppress(OSError):  # a work folder gone for a moment (a network mount) costs a tick
                self.write()

    def __enter__(self) -> SessionClock:
        workfiles.mkdirs(self.folder)
        self.write()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.write(finished=exc[0] is None)


def read_sessions(work_root: str) -> list[dict]:
    """Every process's readable record, oldest first."""
    folder = workfiles.join(work_root, SESSIONS_DIR)
    if not workfiles.exists(folder):
        return []
    records = []
    for path in workfiles.match(workfiles.join(folder, "*.json")):
        record = workfiles.read_json(path)  # a damaged record costs that process's time in the sum, nothing else
        if isinstance(record, dict) and isinstance(record.get("wall_s"), int | float):
            records.append(record)
    return records
