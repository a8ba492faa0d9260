"""`opsynth catalog check`: build and run every entry on the meta device, in every workload; with `--execute`,
also run each entry's one-operator task through the execution filters on the CPU.

An entry passes when, among a few seeded tries, its sampled call composes and the rendered one-op task
loads and runs forward on meta (and, executed, passes every check); the failure of an entry says why.
"""

from __future__ import annotations

import random
import zlib

from opsynth.filters.calibration import rescale_factor
from opsynth.filters.execution import ExecutionConfig, run_checks
from opsynth.filters.shape_check import check_shapes
from opsynth.operator_catalog.codegen import render
from opsynth.operator_catalog.compose import CHAIN_ERRORS, chain
from opsynth.operator_catalog.entry import OpEntry
from opsynth.operator_catalog.faithfulness import ops_faithful
from opsynth.operator_catalog.registry import get
from opsynth.operator_catalog.transformers_modules import TransformersEntry, transformers_task
from opsynth.operator_catalog.transformers_render import render_transformers
from opsynth.reasons import RUNTIME_ABOVE_WINDOW, RUNTIME_BELOW_WINDOW
from opsynth.workload import Workload

TRIES = 12


def check_entry(entry: OpEntry | TransformersEntry, workload: Workload, tries: int = TRIES) -> str | None:
    """None when the entry builds and runs on meta; else the last error."""
    rng = random.Random(zlib.crc32(f"{entry.name}/{workload.name}".encode()))
    if isinstance(entry, TransformersEntry):
        task = render_transformers(entry, entry.sampler(rng, workload))
        verdict = check_shapes(task.source)
        return None if verdict.kept else f"rendered task fails the shape check: {verdict.reason} {verdict.detail}"
    error = "no try succeeded"
    for _ in range(tries):
        try:
            task = render(chain([entry], rng, workload))
        except CHAIN_ERRORS as e:
            error = f"{type(e).__name__}: {e}"
            continue
        verdict = check_shapes(task.source)
        if not ops_faithful(task.source, task.ops) or task.ops != (entry.name,):
            return f"rendered ops {task.ops} differ from the operators in forward"
        if verdict.kept:
            return None
        error = f"rendered task fails the shape check: {verdict.reason} {verdict.detail}"
    return error


# Layers that give a task measurable work when an operator alone is too cheap to time (views, identities).
PARTNER = "nn.Linear"


def _task(entry: OpEntry | TransformersEntry, seed: int, workload: Workload, batch_scale: float, partner: bool):
    """The entry's task of a seed (alone, or after `PARTNER`), its batch scaled; or why it cannot be composed."""
    rng = random.Random(seed)
    if isinstance(entry, TransformersEntry):
        return transformers_task(entry, rng, workload, batch_scale)
    entries = [get(PARTNER), entry] if partner else [entry]
    try:
        return render(chain(entries, rng, workload, batch_scale))
    except CHAIN_ERRORS as e:
        return f"{type(e).__name__}: {e}"


def execute_entry(
    entry: OpEntry | TransformersEntry,
    workload: Workload,
    config: ExecutionConfig,
    calibration_steps: int,
    max_factor: float,
    tries: int = 8,
    target: float = 0.5,
) -> str | None:
    """None when a task with the entry passes the shape check and every execution check of `config` (in this
    process), its batch calibrated into the runtime window as `generate` does; else why the tries failed.

    The entry is tried alone first; an operator too cheap to reach the window at any batch the workload allows
    (a view, an identity) is then tried after a linear layer, as it would occur in a generated chain."""
    reasons: list[str] = []
    base = zlib.crc32(f"{entry.name}/{workload.name}/execute".encode())
    for attempt in range(2 * tries):
        partner = attempt >= tries
        if partner and (isinstance(entry, TransformersEntry) or entry.name == PARTNER):
            break
        scale = 1.0
        for step in range(calibration_steps + 1):
            task = _task(entry, base + attempt, workload, scale, partner)
            if isinstance(task, str):
                reasons.append(task)
                break
            verdict = check_shapes(task.source)
            if verdict.kept:
                verdict = run_checks(task.source, attempt, config)
            if verdict.kept:
                return None
            if verdict.reason not in (RUNTIME_BELOW_WINDOW, RUNTIME_ABOVE_WINDOW) or step == calibration_steps:
                reasons.append(f"{verdict.reason}: {verdict.detail}")
                break
            scale *= rescale_factor(verdict.measurements["eager_ms"], config.runtime_window_ms, max_factor, target)
    return "; ".join(sorted(set(reasons)))[:500]
