"""How the execution checks' outcomes become verdicts: a check that decides (CheckFailed), an exception a task
raised (classify_error), a CUDA error that poisons its worker, and a verdict's form on the worker's socket (plain
JSON-able data: the worker runs task code, so nothing it sends is unpickled).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch

from opsynth.reasons import COMPILE_ERROR, OUT_OF_MEMORY, RUNTIME_ERROR, Verdict, one_line

CUDA_FATAL_MARKERS = (
    "CUDA error",
    "device-side assert",
    "illegal memory access",
    "CUBLAS_STATUS",
    "cuDNN error",
    # An earlier task's CUDA graph capture that failed leaves the default generator refusing every draw: the
    # worker is replaced after the first task it fails, not kept to fail all the rest.
    "Offset increment outside graph capture",
)


class CheckFailed(Exception):
    """A check decided: carries the verdict, with what was measured before it."""

    def __init__(self, reason: str, detail: str, measurements: dict[str, Any] | None = None):
        super().__init__(detail)
        self.verdict = Verdict(reason, detail, measurements or {})


def classify_error(error: BaseException) -> Verdict:
    """An exception raised while running a task: out_of_memory when it is one, else runtime_error."""
    text = str(error)
    if isinstance(error, torch.OutOfMemoryError | MemoryError) or "out of memory" in text or "can't allocate" in text:
        return Verdict(OUT_OF_MEMORY, one_line(error))
    return Verdict(RUNTIME_ERROR, one_line(error))


def verdict_to_wire(v: Verdict) -> dict:
    return asdict(v)


def verdict_from_wire(d: dict) -> Verdict:
    return Verdict(**d)


def is_fatal_cuda_error(v: Verdict) -> bool:
    """A CUDA error poisons the worker's context: the pool replaces the worker after such a verdict, whether the
    eager model or the compiled one (an inductor kernel's device-side assert) raised it."""
    return v.reason in (RUNTIME_ERROR, COMPILE_ERROR) and any(m in v.detail for m in CUDA_FATAL_MARKERS)
