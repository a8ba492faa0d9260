"""Where a timed task stands against the runtime window: outside it (kept with a margin, or not), near enough that
only a finer measure can tell, or over a first try's ceiling."""

from __future__ import annotations

from typing import Any

from opsynth.filters.device_holds import sharers
from opsynth.filters.verdicts import CheckFailed
from opsynth.reasons import RUNTIME_ABOVE_WINDOW, RUNTIME_BELOW_WINDOW
from opsynth.workload import kept_window

PRESCREEN_MARGIN = 3.0  # a forward timed this far above the window decides it without the profiler


def near_window(ms: float, window: tuple[float, float]) -> bool:
    """Within PRESCREEN_MARGIN of the window: only a finer measure can say whether it is in."""
    low, high = window
    return low / PRESCREEN_MARGIN <= ms <= high * PRESCREEN_MARGIN


def check_events(measurements: dict[str, Any], window: tuple[float, float]) -> None:
    """CUDA: the checks' forwards timed by events decide a task below the window, or far above it, before the
    profiler. Events bound a forward's device time from above (they include the gaps between kernels, and the
    checks may share the GPU), so a task under the window by them is under it by the profiler too; above it,
    the gaps may be what puts it there, so only a task PRESCREEN_MARGIN above is decided."""
    low, high = window
    if measurements["eager_event_ms"] < low or measurements["eager_event_ms"] > high * PRESCREEN_MARGIN:
        check_window({**measurements, "eager_ms": measurements["eager_event_ms"]}, window)


def over_ceiling(ms: float, ceiling_ms: float | None, device_lock) -> dict[str, Any] | None:
    """The measurements of a first try stopped at its ceiling (filters.calibration), where its first timed forward,
    `ms`, is over `ceiling_ms` times one more than the tasks that share the GPU with it now (`sharers`): beside n
    others' work a forward reads up to about n + 1 times its own time, so such a stop needs that much more; else
    None. With the ceiling alone (no sharers counted), 600-row runs on one H200 made 1.52-1.55 executions a row
    against 1.29 before it, where the rows over 8 ms had been 9 % of a run's."""
    if ceiling_ms is None or ms <= ceiling_ms:
        return None
    n = sharers(device_lock)
    return {"eager_ms": ms, "ceiling_ms": ceiling_ms, "sharers": n} if ms > ceiling_ms * (1 + n) else None


def check_window(measurements: dict[str, Any], window: tuple[float, float], margin: float = 0.0) -> None:
    """A task timed outside the window fails; with `margin` (the final measure's), one within that fraction of an
    end too, a timing that close to an end being as likely to fall out of the window when measured again."""
    low, high = kept_window(window, margin)
    inside = f" (the window {list(window)} ms with a {margin:.0%} margin)" if margin else ""
    eager_ms = measurements["eager_ms"]
    if eager_ms < low:
        raise CheckFailed(RUNTIME_BELOW_WINDOW, f"eager {eager_ms:.4f} ms < {low} ms{inside}", measurements)
    if eager_ms > high:
        raise CheckFailed(RUNTIME_ABOVE_WINDOW, f"eager {eager_ms:.4f} ms > {high} ms{inside}", measurements)
