"""How busy the GPUs are: NVML's utilization of each visible GPU (the share of its last sample period in which
a kernel ran), sampled in a background thread, so a run can say what share of its execution kept them busy, and
where its workers were while a GPU idled.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable

SAMPLE_PERIOD_S = 0.5  # NVML's own sample period is 1/6 s to 1 s


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
        while not self._stop.wait(self.period_s):
            with contextlib.suppress(Exception):  # one unreadable sample is a gap, not a failed run
                now = time.monotonic()
                self.samples.append((now, self._sample()))
                if self.states is not None:
                    self.state_samples.append((now, Counter(self.states())))

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

    def series(self, t0: float) -> list[dict]:
        """Every sample as a record: `t`, its seconds after `t0` (monotonic); `busy`, each GPU's busy fraction;
        and where the workers' states were sampled, `workers`, per GPU the number of its workers in each state:
        when the GPU idled, not only how much."""
        states = dict(self.state_samples)
        records = []
        for t, used in list(self.samples):
            record = {"t": round(t - t0, 2), "busy": list(used)}
            if t in states:
                record["workers"] = [
                    {state: n for (gpu, state), n in sorted(states[t].items()) if gpu == d} for d in self.devices
                ]
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
