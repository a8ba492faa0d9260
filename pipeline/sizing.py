"""How a run sizes its candidates for its GPUs: the gpu workload's element budget from their memory, and the
speed at which a round's candidates are sized before they run (filters.cost), corrected by what earlier rounds
measured."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Collection

from opsynth.config import GPU_SPEED, SPEED_SAMPLES
from opsynth.filters.execution import ExecutionConfig
from opsynth.filters.worker_budgets import element_budget
from opsynth.options import GenerateOptions
from opsynth.pipeline.stages import Sizing
from opsynth.records import Candidate, Rejection, executed_candidates


def with_gpu_budget(options: GenerateOptions) -> GenerateOptions:
    """The gpu workload on CUDA: its element budget set by the smallest GPU's memory (see element_budget), so
    that a cheap chain can grow into the window; a run keeps the budget it started with (it is in its config)."""
    if options.device != "cuda" or options.workload != "gpu" or options.max_elements is not None:
        return options
    import torch

    smallest = min(torch.cuda.get_device_properties(d).total_memory for d in range(torch.cuda.device_count()))
    execution = ExecutionConfig(options.device, options.runtime_window_ms, options.timeout_s, workers=options.workers)
    return dataclasses.replace(options, max_elements=element_budget(smallest, execution))


def round_sizing(options: GenerateOptions, timed: Collection[float], log=print) -> Sizing | None:
    """How a round's candidates are sized before they run (CUDA only): at GPU_SPEED, corrected by the median of
    `timed` (the latest SPEED_WINDOW executions' measured over predicted time) once there are SPEED_SAMPLES."""
    if options.device != "cuda":
        return None
    correction = statistics.median(timed) if len(timed) >= SPEED_SAMPLES else 1.0
    if len(timed) >= SPEED_SAMPLES:
        log(f"sizing: measured / predicted time {correction:.2f} (median of {len(timed)} executions)")
    return Sizing(GPU_SPEED.scaled(correction), options.runtime_window_ms, options.sizes, options.op_weights)


def timed_predictions(accepted: list[Candidate], rejected: list[Rejection]) -> list[float]:
    """Measured over predicted eager time of a round's executed candidates that ran at the sizes predicted for."""
    executed = executed_candidates(accepted, rejected)
    return [
        c.measurements["eager_ms"] / c.measurements["predicted_ms"]
        for c in executed
        if c.measurements.get("predicted_ms")
        and "eager_ms" in c.measurements
        and not c.measurements.get("calibration_steps")
    ]
