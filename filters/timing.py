"""How a task's forwards are timed: the phase clock that says where a task's time goes, the profiler's summed
device time of a forward (the paper's measure) taken in one exclusive hold of the GPU, the allocations that failed
while a timing ran, the host clock on the CPU, CUDA events for a single forward, and how many forwards a timing
takes."""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

# CUDA: timed forwards stop near this much device time, but never fewer than MIN_TIMED_ITERS (a task of over 5 ms
# is timed over two). The profiler sums each forward's kernel times, which vary little from one forward to the next
# of the same inputs. The timed forwards are a kept task's only exclusive hold of the GPU; over 20 ms (at least 3)
# they were a third of its forwards. On one H200 the same tasks timed in three runs so repeated as well as over
# 20 ms: one run's times over another's, median 1.000, 5th-95th percentile 0.905-1.108 (20 ms: 0.873-1.133).
TIMING_SPAN_MS = 10.0
MIN_TIMED_ITERS = 2


class PhaseClock:
    """Seconds a task spends in each of `PHASES`, into a dict the task's measurements carry. Phases nest: time
    in an inner phase (the wait for the lock inside a profiling, say) counts there and not in the outer one.
    `report(phase)`, where given, is told the phase the task is in each time that changes (None: out of all)."""

    def __init__(self, report: Callable[[str | None], None] | None = None):
        self.seconds: dict[str, float] = {}
        self._inner: list[float] = []  # per open phase, the seconds of the phases opened inside it
        self._open: list[str] = []  # the open phases, innermost last
        self._report = report

    @contextlib.contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        self._inner.append(0.0)
        self._enter(phase)
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self.seconds[phase] = self.seconds.get(phase, 0.0) + elapsed - self._inner.pop()
            if self._inner:
                self._inner[-1] += elapsed
            self._leave()

    def _enter(self, phase: str) -> None:
        self._open.append(phase)
        if self._report is not None:
            self._report(phase)

    def _leave(self) -> None:
        self._open.pop()
        if self._report is not None:
            self._report(self._open[-1] if self._open else None)

    @contextlib.contextmanager
    def holding(self, lock):
        """Hold `lock` for the enclosed device work; the wait for it counts as `lock_wait`."""
        with self("lock_wait"):
            lock.__enter__()
        try:
            yield
        finally:
            lock.__exit__(None, None, None)


def profile_forwards(runs: list[tuple], inputs: list, iters: int, hold, clock: PhaseClock, activities=None) -> list:
    """One profile per (fn, phase) of `runs`: `iters` forwards of `fn` under torch.profiler (CUDA activity by
    default), the device work of the paper's measure, timed as `phase`. All of them run inside one `hold` (the
    GPU's lock, exclusive: another process's kernels would slow these), so the hold covers the forwards alone:
    the first profiler starts before the lock is taken and the last collects its trace after it is let go;
    between runs one stops and the next starts inside the hold. A profiler records this process's work only."""
    from torch.profiler import ProfilerActivity, profile

    activities = activities or [ProfilerActivity.CUDA]
    profiles = []
    with torch.no_grad(), clock("profiler"):
        current = profile(activities=activities)
        current.__enter__()
        try:
            with hold:
                for k, (fn, phase) in enumerate(runs):
                    if k:
                        current.__exit__(None, None, None)
                        profiles.append(current)
                        current = profile(activities=activities)
                        current.__enter__()
                    with clock(phase):
                        for _ in range(iters):
                            fn(*inputs)
                        if torch.cuda.is_available():
                            torch.cuda.synchronize()
        finally:
            current.__exit__(None, None, None)
    return [*profiles, current]


def device_ms(prof, iters: int) -> float:
    """The paper's measure: summed device time of the CUDA work of one forward (CPU launch overhead excluded),
    averaged over the profiled forwards."""
    from torch.autograd import DeviceType

    device_us = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == DeviceType.CUDA)
    return device_us / 1e3 / iters


def host_time_ms(fn, inputs: list, warmup: int, iters: int) -> float:
    """Median wall time of one forward by the host clock (the CPU's measure)."""
    with torch.no_grad():
        for _ in range(warmup):
            fn(*inputs)
        samples = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn(*inputs)
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def allocation_failures() -> int:
    """Allocations this process's CUDA caching allocator has failed so far (`num_ooms`; 0 without CUDA). Those
    cuDNN catches count too: short of memory for a faster algorithm's workspace, a convolution falls back to one
    with less, maybe slower, and its timing with it."""
    return int(torch.cuda.memory_stats().get("num_ooms", 0)) if torch.cuda.is_available() else 0


def timed_iters(iters: int, estimate_ms: float) -> int:
    """Timed forwards on CUDA: `iters` (the paper's 10) for a task of up to 1 ms, fewer for a heavier one, whose
    mean over forwards of TIMING_SPAN_MS in all (at least MIN_TIMED_ITERS) is as steady; the device time is what
    bounds a run."""
    return max(min(iters, MIN_TIMED_ITERS), min(iters, math.ceil(TIMING_SPAN_MS / max(estimate_ms, 1e-6))))


def timed_forward(model, inputs: list, cuda: bool) -> tuple[Any, float]:
    """One forward and its time in ms: CUDA events on the GPU, the host clock on the CPU."""
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = model(*inputs)
        end.record()
        end.synchronize()
        return out, start.elapsed_time(end)
    t0 = time.perf_counter()
    out = model(*inputs)
    return out, (time.perf_counter() - t0) * 1e3


def profiled_ms(runs: list[tuple], inputs: list, iters: int, device_lock, clock: PhaseClock) -> list[float]:
    """The paper's measure of each (fn, phase) of `runs`: `iters` profiled forwards, all in one hold of the GPU
    alone."""
    profiles = profile_forwards(runs, inputs, iters, clock.holding(device_lock), clock)
    with clock("profile_parse"):
        return [device_ms(prof, iters) for prof in profiles]


def counting_failures(timer, failures, measurements: dict[str, Any]):
    """`timer`, the allocations that failed while it ran added to `measurements`' timing_allocation_failures."""

    def counted(*args) -> list[float]:
        before = failures()
        try:
            return timer(*args)
        finally:
            if failed := failures() - before:
                measurements["timing_allocation_failures"] = measurements.get("timing_allocation_failures", 0) + failed

    return counted
