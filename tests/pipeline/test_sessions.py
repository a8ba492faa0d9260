"""Each process's wall time on a run, recorded as it goes, so a process killed outright still counts; a session of
the command line counts from its process's start."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from opsynth.pipeline.sessions import SessionClock, process_started, read_sessions


def _recorded_wall(path: str) -> float:
    return json.loads(Path(path).read_text())["wall_s"]


def test_a_process_records_its_time_as_it_goes_and_when_it_ends(tmp_path):
    with SessionClock(str(tmp_path), tick_s=0.05) as clock:
        (record,) = read_sessions(str(tmp_path))
        assert record["finished"] is False  # written at the start
        deadline = time.monotonic() + 60
        while _recorded_wall(clock.path) < 0.1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _recorded_wall(clock.path) >= 0.1  # the background tick keeps it current
        time.sleep(0.2)
    (record,) = read_sessions(str(tmp_path))
    assert record["finished"] is True and record["wall_s"] >= 0.3
    assert record["peak_rss_mib"] >= 10  # this Python process, with pytest and torch loaded
    assert record["host"]["cores"] == os.cpu_count()  # as the workers are sized
    cpuinfo = Path("/proc/cpuinfo")
    named = cpuinfo.exists() and any(line.startswith("model name") for line in cpuinfo.read_text().splitlines())
    cpu = record["host"]["cpu"]
    assert (isinstance(cpu, str) and cpu) if named else cpu is None


def test_a_session_counts_from_the_start_it_is_given(tmp_path):
    with SessionClock(str(tmp_path), t0=time.monotonic() - 5.0):
        pass
    (record,) = read_sessions(str(tmp_path))
    assert record["wall_s"] >= 5.0
    with SessionClock(str(tmp_path / "later"), t0=time.monotonic() + 100.0) as clock:
        assert clock.elapsed() >= 0  # a start in the future is now


def test_the_process_start_is_before_its_first_line_runs():
    code = (
        "import time; t = time.monotonic(); time.sleep(0.5)\n"
        "from opsynth.pipeline.sessions import process_started\n"
        "print(t - process_started(), time.monotonic() - process_started())"
    )
    before, age = map(float, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                            check=True).stdout.split())  # fmt: skip
    assert before >= -0.02 and age >= 0.5  # /proc counts in hundredths of a second
    assert process_started() <= time.monotonic()


def test_a_process_that_fails_is_recorded_as_unfinished(tmp_path):
    try:
        with SessionClock(str(tmp_path)):
            raise RuntimeError("a stage failed")
    except RuntimeError:
        pass
    assert [r["finished"] for r in read_sessions(str(tmp_path))] == [False]
    assert read_sessions(str(tmp_path / "elsewhere")) == []


def test_a_sessions_gpu_record_says_when_its_workers_started_and_how_long_they_waited_for_bytecode():
    """Seconds after the session's start; the pool's wait for the libraries' bytecode comes before its start."""
    from types import SimpleNamespace

    from opsynth.pipeline.run import gpu_record

    idle = {"seconds": 12.0, "workers": {"compile": 7.0}}
    monitor = SimpleNamespace(unavailable=None, busy=lambda start, end: [0.9], host_busy=lambda start, end: 0.75,
                              workers_while=lambda start, end, busy: None if busy else idle)  # fmt: skip
    pool = SimpleNamespace(first_handed=130.0, last_done=250.0, started_at=107.5, bytecode_wait_s=4.04, replaced=0,
                           ready_at=118.0, compiling_in_process=0)  # fmt: skip
    shapes = SimpleNamespace(ready_at=112.0)
    assert gpu_record(monitor, pool, 100.0, shapes) == {
        "gpu": {
            "executing_s": 120.0, "busy_fraction": [0.9], "host_busy_fraction": 0.75, "first_execution_s": 30.0,
            "workers_started_s": 7.5,
            "bytecode_wait_s": 4.0, "workers_replaced": 0, "workers_ready_s": 18.0, "shape_workers_ready_s": 12.0,
            "while_idle": idle,
        }
    }  # fmt: skip
    assert gpu_record(None, pool, 100.0) == {}  # a CPU run's
    pool.compiling_in_process = 2  # workers whose compile processes did not start: named, where there are any
    assert gpu_record(monitor, pool, 100.0, shapes)["gpu"]["workers_compiling_in_process"] == 2
