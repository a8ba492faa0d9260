"""`opsynth catalog check`: build and run every entry on the meta device, in every workload; with `--execute`,
also run each entry's one-operator task through the execution filters, in contained workers.

An entry passes when, among a few seeded tries, its sampled call composes and the rendered one-op task
loads and runs forward on meta (and, executed, passes every check); the failure of an entry says why.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from functools import partial

from opsynth.config import CALIBRATION_MAX_FACTOR, CALIBRATION_TARGET, CALIBRATION_TRIES
from opsynth.filters.calibration import run_calibrated
from opsynth.filters.shape_check import check_shapes
from opsynth.filters.workers import Job, WorkerPool
from opsynth.operator_catalog.codegen import render
from opsynth.operator_catalog.compose import CHAIN_ERRORS, chain
from opsynth.operator_catalog.entry import OpEntry, RenderedTask
from opsynth.operator_catalog.faithfulness import ops_faithful
from opsynth.operator_catalog.registry import get
from opsynth.operator_catalog.transformers_modules import transformers_task
from opsynth.workload import Workload

TRIES = 12


def check_entry(entry: OpEntry, workload: Workload, tries: int = TRIES) -> str | None:
    """None when the entry builds and runs on meta; else the last error."""
    rng = random.Random(zlib.crc32(f"{entry.name}/{workload.name}".encode()))
    if entry.kind == "transformers":
        task = transformers_task(entry, rng, workload)
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


def _task(entry: OpEntry, seed: int, workload: Workload, batch_scale: float, partner: bool):
    """The entry's task of a seed (alone, or after `PARTNER`), its batch scaled; or why it cannot be composed."""
    rng = random.Random(seed)
    if entry.kind == "transformers":
        return transformers_task(entry, rng, workload, batch_scale)
    entries = [get(PARTNER), entry] if partner else [entry]
    try:
        return render(chain(entries, rng, workload, batch_scale))
    except CHAIN_ERRORS as e:
        return f"{type(e).__name__}: {e}"


@dataclass(frozen=True)
class _EntryTask:
    """One try at an entry's task: the entry, its seed, whether after PARTNER, its batch scale and the task."""

    entry: OpEntry
    seed: int
    attempt: int
    partner: bool
    scale: float
    task: RenderedTask


def _rescaled(item: _EntryTask, factor: float, workload: Workload) -> _EntryTask | None:
    scale = item.scale * factor
    task = _task(item.entry, item.seed, workload, scale, item.partner)
    return None if isinstance(task, str) else _EntryTask(item.entry, item.seed, item.attempt, item.partner, scale, task)


def execute_entries(
    entries: list[OpEntry], workload: Workload, pool: WorkerPool, tries: int = 8
) -> dict[str, str | None]:
    """Per entry name: None when a task with the entry passes every execution check of `pool`'s workers, its
    batch calibrated into the runtime window as `generate` does (its calibration settings); else why its tries
    failed.

    An entry is tried alone first; an operator too cheap to reach the window at any batch the workload allows
    (a view, an identity) is then tried after a linear layer, as it would occur in a generated chain. Each try
    runs all entries still failing at once, over the pool's workers."""
    reasons: dict[str, list[str]] = {e.name: [] for e in entries}
    passed: set[str] = set()
    for attempt in range(2 * tries):
        partner = attempt >= tries
        items = []
        for entry in entries:
            if entry.name in passed or (partner and (entry.kind == "transformers" or entry.name == PARTNER)):
                continue
            seed = zlib.crc32(f"{entry.name}/{workload.name}/execute".encode()) + attempt
            task = _task(entry, seed, workload, 1.0, partner)
            if isinstance(task, str):
                reasons[entry.name].append(task)
            else:
                items.append(_EntryTask(entry, seed, attempt, partner, 1.0, task))
        if not items:
            break
        results = run_calibrated(
            pool,
            items,
            job_of=lambda item: Job(item.entry.name, item.task.source, item.attempt),
            rescale=partial(_rescaled, workload=workload),
            window=pool.cfg.runtime_window_ms,
            tries=CALIBRATION_TRIES,
            max_factor=CALIBRATION_MAX_FACTOR,
            target=CALIBRATION_TARGET,
        )
        for item, verdict, _ in results:
            if verdict.kept:
                passed.add(item.entry.name)
            else:
                reasons[item.entry.name].append(f"{verdict.reason}: {verdict.detail}")
    return {name: None if name in passed else "; ".join(sorted(set(why)))[:500] for name, why in reasons.items()}
