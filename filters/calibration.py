"""Shape calibration: a candidate whose eager time misses the runtime window is rescaled from its seed and measured
again, each step aimed inside the window; a first try may stop at a ceiling (docs/execution.md, "The checks and
the timing")."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

from opsynth.filters.workers import Job, WorkerPool
from opsynth.reasons import RUNTIME_ABOVE_WINDOW, RUNTIME_BELOW_WINDOW, Verdict
from opsynth.workload import kept_window

T = TypeVar("T")
REACH_MARGIN = 0.5  # a rescaled task predicted below half the window's low end (or above twice its high) is decided
# A step that moves a task's sizes by at most SMALL_STEP either way changes its forward's time in proportion (no
# cache or launch regime changes within it), so its prediction decides the task within timing noise, STEP_NOISE.
# On one H200, 19 of 600 rows' candidates (single memory-bound operators at the element budget, about 1.0 ms) were
# re-run three times each, the budget letting each step grow them by a few percent, and ended below the window.
SMALL_STEP = 1.5
STEP_NOISE = 0.95
# In the final verdict of an item whose first try stopped at its ceiling: the time of the forward that stopped it.
CEILING_STOP = "ceiling_stop_ms"


def aim_ms(window: tuple[float, float], target: float = 0.5) -> float:
    """The time `target` of the way into the window in log terms (0.5: the geometric middle)."""
    low, high = window
    return low ** (1 - target) * high**target if low > 0 else high / 10


def rescale_factor(
    eager_ms: float, window: tuple[float, float], max_factor: float, target: float = 0.5, fixed_ms: float = 0.0
) -> float:
    """How much to grow (> 1) or shrink (< 1) a task so that its time lands `target` of the way into the
    window in log terms (0.5: the geometric middle). `fixed_ms`, where known, is the part of its time that its
    sizes do not scale (its kernels' launches): only the rest grows with them. Where the fixed part alone is
    past the aim, the whole time is scaled, as if none of it were fixed."""
    aim = aim_ms(window, target)
    if 0 < fixed_ms < min(aim, eager_ms):
        factor = (aim - fixed_ms) / (eager_ms - fixed_ms)
    else:
        factor = aim / max(eager_ms, 1e-6)
    return min(max(factor, 1 / max_factor), max_factor)


def may_reach(eager_ms: float, growth: float, window: tuple[float, float], margin: float = 0.0) -> bool:
    """Whether a task timed at `eager_ms`, its sizes grown by `growth` (< 1: shrunk), may land in the window, kept
    `margin` inside its ends as the verdicts are. A forward's time grows about in proportion to its sizes, and
    less where launches dominate it, so a prediction short of the window by REACH_MARGIN decides the task without
    another execution (as when the element budget holds its sizes where they are); after a small step (see
    SMALL_STEP), one short by more than timing noise does."""
    low, high = kept_window(window, margin)
    slack = STEP_NOISE if 1 / SMALL_STEP <= growth <= SMALL_STEP else REACH_MARGIN
    predicted = eager_ms * growth
    return low * slack <= predicted <= high / slack


def first_try(job: Job, ceiling_ms: float | None) -> Job:
    """`job` as a first try: with `ceiling_ms` (None: none)."""
    return job if ceiling_ms is None else dataclasses.replace(job, ceiling_ms=ceiling_ms)


def ceiling_shrink(eager_ms: float, ceiling_ms: float, max_factor: float) -> float:
    """The scale of a task stopped at a first try's ceiling, `eager_ms` its stopped forward's time over one more
    than the tasks that shared the GPU with it (the least it may take alone): toward half the ceiling, at most
    `max_factor` less. Alone it may take up to that many times more, so it is aimed between the calibration's aim
    and the ceiling rather than at the aim."""
    return min(1.0, max(ceiling_ms / 2 / max(eager_ms, 1e-6), 1 / max_factor))


def _summed_phases(verdicts: list[Verdict]) -> dict[str, float]:
    total: dict[str, float] = {}
    for v in verdicts:
        for phase, s in v.measurements.get("phase_s", {}).items():
            total[phase] = round(total.get(phase, 0.0) + s, 4)
    return total


def run_calibrated(
    pool: WorkerPool,
    items: list[T],
    job_of: Callable[[T], Job],
    rescale: Callable[[T, float], T | None],
    window: tuple[float, float],
    tries: int,
    max_factor: float,
    target: float = 0.5,
    on_result: Callable[[int, tuple[T, Verdict, int]], None] | None = None,
    size: Callable[[T], float] | None = None,
    skip: Callable[[int], Verdict | None] | None = None,
    ahead: Callable[[], Job | None] | None = None,
    margin: float = 0.0,
    first_job_of: Callable[[T], Job] | None = None,
) -> list[tuple[T, Verdict, int]]:
    """(final item, its verdict, calibration steps taken) per input item, in order. `rescale` returns None
    where an item cannot be rescaled further (a size limit); `size(item)` (its elements), where given, lets a
    rescaled item that cannot reach the window (see `may_reach`; `margin`: the verdicts' keep margin) keep its
    verdict unexecuted. The final verdict's `phase_s` sums every step's. `on_result(i, result)` is called as item
    i's result is final, in the order they finish. `skip(i)` may decide item i, first measure or re-measure,
    without running it (see `WorkerPool.run`), as `ahead()` may start a job of a later run (made as
    `first_job_of` makes an item's first job: `job_of` unless given, or a first try with a ceiling, `first_try`).
    An item stopped at its first try's ceiling runs again (`job_of`), shrunk (`ceiling_shrink`) where `rescale`
    can, else as it is: that verdict is never final; the final one records the stopped forward's time
    (CEILING_STOP)."""
    current = list(items)
    earlier: list[list[Verdict]] = [[] for _ in items]
    final: list[tuple[T, Verdict, int] | None] = [None] * len(items)

    def follow_up(i: int, verdict: Verdict) -> Job | None:
        ceiling = verdict.measurements.get("ceiling_ms")
        if ceiling is not None:
            earlier[i].append(verdict)
            alone_ms = verdict.measurements["eager_ms"] / (1 + verdict.measurements.get("sharers", 0))
            rescaled = rescale(current[i], ceiling_shrink(alone_ms, ceiling, max_factor))
            if rescaled is not None:
                current[i] = rescaled
            return job_of(current[i])
        if verdict.reason not in (RUNTIME_BELOW_WINDOW, RUNTIME_ABOVE_WINDOW) or len(earlier[i]) >= tries:
            return None
        eager_ms = verdict.measurements["eager_ms"]
        rescaled = rescale(current[i], rescale_factor(eager_ms, window, max_factor, target))
        if rescaled is None:
            return None
        if size is not None and not may_reach(eager_ms, size(rescaled) / max(size(current[i]), 1), window, margin):
            return None
        current[i] = rescaled
        earlier[i].append(verdict)
        return job_of(rescaled)

    def on_final(i: int, verdict: Verdict) -> None:
        if earlier[i]:
            added = {"phase_s": _summed_phases([*earlier[i], verdict])}
            stopped = [v for v in earlier[i] if "ceiling_ms" in v.measurements]
            if stopped:
                added[CEILING_STOP] = round(stopped[0].measurements["eager_ms"], 4)
            verdict = Verdict(verdict.reason, verdict.detail, {**verdict.measurements, **added})
        final[i] = (current[i], verdict, len(earlier[i]))
        if on_result is not None:
            on_result(i, final[i])

    first_job_of = first_job_of or job_of
    verdicts = pool.run([first_job_of(item) for item in items], follow_up, on_final, skip, ahead)
    # A place that never got a final verdict (the pool gave up on it) keeps the pool's verdict for it.
    return [f if f is not None else (current[i], verdicts[i], len(earlier[i])) for i, f in enumerate(final)]
