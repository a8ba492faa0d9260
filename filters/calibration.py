"""Shape calibration: a candidate whose eager time misses the runtime window is rescaled and measured again.

The caller says how to rescale (for generated tasks: the same seed, the batch multiplied), so operators and
structure never change; each step aims at the window's geometric middle, and a bounded number of steps is
tried before the last verdict stands.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

from filters.reasons import RUNTIME_ABOVE_WINDOW, RUNTIME_BELOW_WINDOW, Verdict
from filters.workers import Job, WorkerPool

T = TypeVar("T")


def rescale_factor(eager_ms: float, window: tuple[float, float], max_factor: float) -> float:
    """How much to grow (> 1) or shrink (< 1) a task so that its time lands mid-window, in log terms."""
    low, high = window
    target = math.sqrt(low * high) if low > 0 else high / 10
    factor = target / max(eager_ms, 1e-6)
    return min(max(factor, 1 / max_factor), max_factor)


def run_calibrated(
    pool: WorkerPool,
    items: list[T],
    job_of: Callable[[T], Job],
    rescale: Callable[[T, float], T | None],
    window: tuple[float, float],
    tries: int,
    max_factor: float,
) -> list[tuple[T, Verdict, int]]:
    """(final item, its verdict, calibration steps taken) per input item, in order. `rescale` returns None
    where an item cannot be rescaled further (a size limit)."""
    final: list[tuple[T, Verdict, int] | None] = [None] * len(items)
    pending = list(enumerate(items))
    for step in range(tries + 1):
        verdicts = pool.run([job_of(item) for _, item in pending])
        again = []
        for (slot, item), verdict in zip(pending, verdicts, strict=True):
            off_window = verdict.reason in (RUNTIME_BELOW_WINDOW, RUNTIME_ABOVE_WINDOW)
            rescaled = None
            if off_window and step < tries:
                rescaled = rescale(item, rescale_factor(verdict.measurements["eager_ms"], window, max_factor))
            if rescaled is None:
                final[slot] = (item, verdict, step)
            else:
                again.append((slot, rescaled))
        pending = again
        if not pending:
            break
    return final
