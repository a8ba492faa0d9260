"""How busy the GPUs are: NVML's utilization of each visible GPU sampled on a background thread, with where the
workers were, what each GPU's lock was doing between samples and the host's cores' busy share, so a run can say
what share of its execution kept them busy and why they idled (docs/execution.md; docs/output.md, `stats.json`)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from itertools import pairwise

SAMPLE_PERIOD_S = 0.5  # NVML's own sample period is 1/6 s to 1 s
LOCK_PERIOD_S = 0.02  # how often the lock's state is read between samples: NVML's cannot tell a hold from a drain
RECENT_S = 1 / 6  # NVML's shortest sample period: each sample also carries the lock's shares of this last span
LOCK_STATES = (
    "timing",
    "clearing",
    "draining",
    "timing_waits",
    "shared_1",
    "shared_2",
    "shared_3+",
    "waiting_to_share",
    "free",
)


PROC_STAT = "/proc/stat"


def host_ticks(path: str = PROC_STAT) -> tuple[int, int] | None:
    """The host's cores' busy and total clock ticks since boot, from the first line of Linux's `/proc/stat` (user,
    nice, system, idle, iowait, irq, softirq, steal: all but idle and iowait are busy; its guest fields are
    counted within user already); None where it cannot be read (another system)."""
    try:
        with open(path) as f:
            fields = f.readline().split()
        if fields[0] != "cpu":
            return None
        ticks = [int(field) for field in fields[1:9]]
    except (OSError, ValueError, IndexError):
        return None
    if len(ticks) < 5:
        return None
    total = sum(ticks)
    return total - ticks[3] - ticks[4], total


def tick_share(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    """The share of the host's cores' time busy between two `host_ticks` readings; None where no tick passed."""
    if after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def lock_state(states: Mapping[str, int]) -> str:
    """What a GPU's lock was doing, from the number of its workers in each state (filters.worker_handle's
    `worker_state`): `timing` (a task holds it alone); `clearing` (a timing waits for memory freed before it to
    be cleared, see DeviceLock.clearing: holding the GPU, or before it drains the tasks sharing it); `draining`
    (a timing waits for the tasks that share it to reach a pause); `timing_waits` (a timing waits with none
    sharing: gathering others, its turn after another timing); `shared_K` (K tasks share it, no timing
    waiting); `waiting_to_share` (none holds it, a task waits to); `free`."""
    held = {state.partition(":")[0] for state, n in states.items() if n and ":" in state}
    sharing = sum(n for state, n in states.items() if state.startswith("sharing:"))
    if "alone" in held:
        return "timing"
    if states.get("waiting_for_clearing", 0):
        return "clearing"
    if states.get("waiting_to_time", 0):
        return "draining" if sharing else "timing_waits"
    if sharing:
        return f"shared_{sharing}" if sharing < 3 else "shared_3+"
    return "waiting_to_share" if states.get("waiting_to_share", 0) else "free"


class GpuBusyMonitor:
    """Samples every visible GPU's utilization every `period_s` until stopped; a context manager. Where NVML
    cannot be read (no GPU, no NVML library), it records nothing and `unavailable` says why."""

    def __init__(self, period_s: float = SAMPLE_PERIOD_S, states: Callable[[], list[tuple]] | None = None):
        self.period_s = period_s
        self.samples: list[tuple[float, tuple[float, ...]]] = []  # (monotonic time, busy fraction per GPU)
        # `states()`: (GPU index, state) of each worker (filters.workers.WorkerPool.worker_states), sampled with
        # the GPUs: per sample, a count of the workers of each GPU in each state
        self.states = states
        self.state_samples: list[tuple[float, Counter]] = []
        # per sample where states are given: (time, per GPU the share of the sample's period its lock spent in each
        # of LOCK_STATES, and the same over its last RECENT_S)
        self.lock_samples: list[tuple[float, list[dict], list[dict]]] = []
        self.host_samples: list[tuple[float, tuple[int, int]]] = []  # (time, the host's busy and total ticks)
        # per sample where states are given: (time, per (GPU, state before) the workers that began to compile since
        # the sample before, as read every LOCK_PERIOD_S): whether compiles start together, and after what
        self.compile_entries: list[tuple[float, Counter]] = []
        self._entries: Counter = Counter()
        self._listed: list[tuple] = []  # the workers' states at the last read, in the pool's order
        # (time, per GPU its lock's state) read since the last sample; bounded where samples fail to be taken
        self._ticks: deque = deque(maxlen=max(16, int(4 * period_s / LOCK_PERIOD_S)))
        self.unavailable: str | None = None
        self.devices = self._devices()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="opsynth-gpu-busy", daemon=True)

    def _devices(self) -> list[int]:
        try:
            import torch

            count = torch.cuda.device_count()
            if not count:
                self.unavailable = "no GPU"
            for d in range(count):
                torch.cuda.utilization(d)
            return list(range(count))
        except Exception as e:  # NVML missing or failing: the run goes on without the measure
            self.unavailable = f"NVML unreadable ({type(e).__name__}: {e})"[:200]
            return []

    def _sample(self) -> tuple[float, ...]:
        import torch

        return tuple(torch.cuda.utilization(d) / 100.0 for d in self.devices)

    def _run(self) -> None:
        tick = self.period_s if self.states is None else min(LOCK_PERIOD_S, self.period_s)
        last = time.monotonic()
        while not self._stop.wait(tick):
            with contextlib.suppress(Exception):  # one unreadable sample is a gap, not a failed run
                now = time.monotonic()
                listed = self.states() if self.states is not None else None
                states = Counter(listed) if listed is not None else None
                if states is not None:
                    self._ticks.append((now, [lock_state(per_gpu(states, d)) for d in self.devices]))
                    self._note_entries(listed)
                if now < last + self.period_s - tick / 2:
                    continue
                last = now
                self.samples.append((now, self._sample()))
                if (ticks := host_ticks()) is not None:
                    self.host_samples.append((now, ticks))
                if states is not None:
                    self.state_samples.append((now, states))
                    self.lock_samples.append((now, self._shares(now - self.period_s), self._shares(now - RECENT_S)))
                    self.compile_entries.append((now, self._entries))
                    self._entries = Counter()
                    self._ticks.clear()

    def _note_entries(self, listed: list[tuple]) -> None:
        """Count the workers found compiling that were not at the read before, by (GPU, the state they left);
        none where the pool's size changed between the two reads."""
        if len(listed) == len(self._listed):
            for (_, before), (gpu, state) in zip(self._listed, listed, strict=True):
                if state == "compile" and before != "compile":
                    self._entries[(gpu, before)] += 1
        self._listed = list(listed)

    def _shares(self, since: float) -> list[dict]:
        """Per GPU, the share of the lock states read after `since` (since the last sample) in each state."""
        ticks = [lock for t, lock in self._ticks if t > since]
        shares = []
        for d in range(len(self.devices)):
            counts = Counter(lock[d] for lock in ticks)
            shares.append({state: round(n / len(ticks), 3) for state, n in sorted(counts.items(), key=_in_order)})
        return shares

    def __enter__(self) -> GpuBusyMonitor:
        if self.devices:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def busy(self, start: float, end: float) -> list[float] | None:
        """The mean busy fraction of each GPU over the samples taken between `start` and `end` (monotonic
        times); None where none were."""
        taken = [s for t, s in list(self.samples) if start <= t <= end]
        if not taken:
            return None
        return [round(sum(s[d] for s in taken) / len(taken), 3) for d in range(len(self.devices))]

    def host_busy(self, start: float, end: float) -> float | None:
        """The share of the host's cores' time busy between the first and the last host sample taken between
        `start` and `end` (monotonic times); None where fewer than two were."""
        taken = [ticks for t, ticks in list(self.host_samples) if start <= t <= end]
        share = tick_share(taken[0], taken[-1]) if len(taken) >= 2 else None
        return None if share is None else round(share, 3)

    def series(self, t0: float) -> list[dict]:
        """Every sample as a record: `t`, its seconds after `t0` (monotonic); `busy`, each GPU's busy fraction;
        and where the workers' states were sampled, `workers`, per GPU the number of its workers in each state:
        when the GPU idled, not only how much; `lock` and `lock_recent`, per GPU the share of the sample's period
        (of its last RECENT_S) its lock spent in each of LOCK_STATES; `into_compile`, per GPU the workers that began
        to compile since the sample before, by the state they left (where any did); `host`, the share of the host's
        cores' time busy since the sample before."""
        states = dict(self.state_samples)
        entries = {t: counts for t, counts in list(self.compile_entries) if counts}
        locks = {t: (whole, recent) for t, whole, recent in list(self.lock_samples)}
        host = {}
        for (_, before), (t, after) in pairwise(list(self.host_samples)):
            if (share := tick_share(before, after)) is not None:
                host[t] = round(share, 2)
        records = []
        for t, used in list(self.samples):
            record = {"t": round(t - t0, 2), "busy": list(used)}
            if t in host:
                record["host"] = host[t]
            if t in states:
                record["workers"] = [per_gpu(states[t], d) for d in self.devices]
            if t in locks:
                record["lock"], record["lock_recent"] = locks[t]
            if t in entries:
                record["into_compile"] = [per_gpu(entries[t], d) for d in self.devices]
            records.append(record)
        return records

    def workers_while(self, start: float, end: float, busy: bool = False) -> dict | None:
        """Where the workers of a GPU were while it idled (`busy`: while it was busy), between `start` and `end`:
        the mean number of them in each state (filters.worker_handle.worker_state), each sample weighted by its GPU's
        idle (busy) share, and the seconds that weighs; None where no state was sampled then."""
        at = dict(self.samples)
        seconds, weighted = 0.0, Counter()
        for t, states in list(self.state_samples):
            if not start <= t <= end or t not in at:
                continue
            for d, used in zip(self.devices, at[t], strict=True):
                share = (used if busy else 1.0 - used) * self.period_s
                if not share:
                    continue
                seconds += share
                for (gpu, state), n in states.items():
                    if gpu == d:
                        weighted[state] += share * n
        if not seconds:
            return None
        return {
            "seconds": round(seconds, 1),
            "workers": {state: round(w / seconds, 2) for state, w in sorted(weighted.items(), key=lambda x: -x[1])},
        }


def _in_order(item: tuple[str, int]) -> int:
    return LOCK_STATES.index(item[0])


def per_gpu(states: Counter, gpu: int) -> dict[str, int]:
    """The number of `gpu`'s workers in each state, of a sample's (GPU, state) counts."""
    return {state: n for (d, state), n in sorted(states.items()) if d == gpu}
