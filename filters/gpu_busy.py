"""How busy the GPUs are: NVML's utilization of each visible GPU (the share of its last sample period in which
a kernel ran), sampled in a background thread, so a run can say what share of its execution kept them busy.
"""

from __future__ import annotations

import contextlib
import threading
import time

SAMPLE_PERIOD_S = 0.5  # NVML's own sample period is 1/6 s to 1 s


class GpuBusyMonitor:
    """Samples every visible GPU's utilization every `period_s` until stopped; a context manager. Where NVML
    cannot be read (no GPU, no NVML library), it records nothing and `unavailable` says why."""

    def __init__(self, period_s: float = SAMPLE_PERIOD_S):
        self.period_s = period_s
        self.samples: list[tuple[float, tuple[float, ...]]] = []  # (monotonic time, busy fraction per GPU)
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
                self.samples.append((time.monotonic(), self._sample()))

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
