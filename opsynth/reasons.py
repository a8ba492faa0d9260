"""The fixed vocabulary of reasons a candidate is dropped, and the verdict every filter returns.

Stats, rejected shards and `validate` reports use these names verbatim; nothing else may be a reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KEEP = "keep"

LOAD_ERROR = "load_error"
SHAPE_ERROR = "shape_error"
RUNTIME_ERROR = "runtime_error"
CRASH = "crash"
TIMEOUT = "timeout"
OUT_OF_MEMORY = "out_of_memory"
TAMPERING = "tampering"  # the task changed the process that judged it (see filters.integrity)
NOT_FINITE = "not_finite"
NOT_DETERMINISTIC = "not_deterministic"
INDISTINGUISHABLE_OUTPUTS = "indistinguishable_outputs"
RUNTIME_BELOW_WINDOW = "runtime_below_window"
RUNTIME_ABOVE_WINDOW = "runtime_above_window"
COMPILE_ERROR = "compile_error"
COMPILE_MISMATCH = "compile_mismatch"
KERNELBENCH_NEAR_DUPLICATE = "kernelbench_near_duplicate"
DUPLICATE = "duplicate"
# Not run, or its verdict set aside: earlier candidates of its data source had already been accepted in the
# numbers the selection asked of the round.
NOT_NEEDED = "not_needed"

REASONS = (
    LOAD_ERROR,
    SHAPE_ERROR,
    RUNTIME_ERROR,
    CRASH,
    TIMEOUT,
    OUT_OF_MEMORY,
    TAMPERING,
    NOT_FINITE,
    NOT_DETERMINISTIC,
    INDISTINGUISHABLE_OUTPUTS,
    RUNTIME_BELOW_WINDOW,
    RUNTIME_ABOVE_WINDOW,
    COMPILE_ERROR,
    COMPILE_MISMATCH,
    KERNELBENCH_NEAR_DUPLICATE,
    DUPLICATE,
    NOT_NEEDED,
)


@dataclass(frozen=True)
class Verdict:
    """Keep, or the first reason a task failed, with what was measured on the way."""

    reason: str = KEEP
    detail: str = ""  # one line: the exception or the measurement that decided
    measurements: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.reason != KEEP and self.reason not in REASONS:
            raise ValueError(f"unknown reason {self.reason!r}")

    @property
    def kept(self) -> bool:
        return self.reason == KEEP


def one_line(error: BaseException, limit: int = 300) -> str:
    """An exception as one short line: its type and the first line of its message."""
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    return text[:limit]
