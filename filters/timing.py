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


def profile_forwards(runs: list[tuple], inputs: list, iters: int, hold, clock: PhaseClock, activities=None,
                     warm_hold=contextlib.nullcontext):  # fmt: skip
    """The profile of `runs`, each (fn, phase) of them `iters` forwards of `fn` under torch.profiler (CUDA
    activity by default), the device work of the paper's measure, timed as `phase`. All of them run inside one
    `hold` (the GPU's lock, exclusive: another process's kernels would slow these), so the hold covers the
    forwards alone: the profiler starts before the lock is taken and collects its trace after it is let go. A
    profiler records this process's work only. The profile's first step, which its schedule drops, launches one
    kernel (`separate`) within `warm_hold()`, so that the profiler's set-up is not inside the hold; the runs share
    the one recorded step, `separate` between them splitting their events (why: docs/execution.md)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = activities or [ProfilerActivity.CUDA]
    prof = profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=1, repeat=1))
    with torch.no_grad(), clock("profiler"):
        prof.__enter__()
        try:
            with warm_hold():
                separate()
            prof.step()
            with hold:
                for k, (fn, phase) in enumerate(runs):
                    with clock(phase):
                        if k:
                            separate()
                        for _ in range(iters):
                            fn(*inputs)
                        if torch.cuda.is_available():
                            torch.cuda.synchronize()
        finally:
            prof.__exit__(None, None, None)
    return prof


SEPARATOR = "opsynth::separator"  # the host-side range `separate` opens (recorded where the CPU activity is)
SEPARATOR_KERNEL = "spin_kernel"  # in the name of the kernel `torch.cuda._sleep` launches


def separate() -> None:
    """The mark between two runs of a profile, finished before it returns: a one-cycle kernel (`torch.cuda._sleep`)
    where CUDA is, within a host-side range named SEPARATOR."""
    with torch.profiler.record_function(SEPARATOR):
        if torch.cuda.is_available():
            torch.cuda._sleep(1)
            torch.cuda.synchronize()


def split_runs(events: list, runs: int) -> list[list] | None:
    """`events` (a profile's) split into `runs` runs at the marks `separate` left: its kernels where there are
    device events, else its host-side ranges; each mark must lie between two runs, every event wholly before or
    after it. None where the marks are not `runs` - 1 such (task code launched the kernel too)."""
    from torch.autograd import DeviceType

    device = [e for e in events if e.device_type == DeviceType.CUDA]
    if runs == 1:
        return [device or events]  # no mark: a kernel of that name is the task's own
    if device:
        marks = [e for e in device if SEPARATOR_KERNEL in e.name]
        rest = [e for e in device if SEPARATOR_KERNEL not in e.name]
    else:
        marks = [e for e in events if e.name == SEPARATOR]
        # neither a mark, nor inside one, nor the schedule's step range (around every run)
        rest = [e for e in events
                if e.name != SEPARATOR and not e.name.startswith("ProfilerStep") and not _within(e, marks)]  # fmt: skip
    if len(marks) != runs - 1:
        return None
    bounds = [(m.time_range.start, m.time_range.end) for m in sorted(marks, key=lambda m: m.time_range.start)]
    split: list[list] = [[] for _ in range(runs)]
    for e in rest:
        k = sum(e.time_range.start >= end for _, end in bounds)
        if k < len(bounds) and e.time_range.end > bounds[k][0]:
            return None  # across a mark
        split[k].append(e)
    return split


def _within(event, marks: list) -> bool:
    return any(m.time_range.start <= event.time_range.start and event.time_range.end <= m.time_range.end for m in marks)


def device_ms(events: list, iters: int) -> float:
    """The paper's measure: summed device time of the CUDA work of one forward (CPU launch overhead excluded),
    averaged over the profiled forwards whose `events` these are."""
    from torch.autograd import DeviceType

    device_us = sum(e.time_range.elapsed_us() for e in events if e.device_type == DeviceType.CUDA)
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
    alone; where their profile cannot be split (see `profile_forwards`), each run in a hold of its own."""
    from opsynth.filters.device_holds import briefly

    def profiled(some: list[tuple]) -> list[list] | None:
        prof = profile_forwards(some, inputs, iters, clock.holding(device_lock), clock,
                                warm_hold=lambda: briefly(device_lock))  # fmt: skip
        with clock("profile_parse"):
            return split_runs(list(prof.events()), len(some))

    split = profiled(runs)
    if split is None:
        split = [profiled([run])[0] for run in runs]
    return [device_ms(events, iters) for events in split]


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
