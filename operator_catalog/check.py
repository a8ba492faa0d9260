"""`opsynth catalog check`: build and run every entry on the meta device, in every workload.

An entry passes when, among a few seeded tries, its sampled call composes and the rendered one-op task
loads and runs forward on meta; the failure of an entry says why.
"""

from __future__ import annotations

import random
import zlib

from filters.shape_check import check_shapes
from operator_catalog.codegen import render
from operator_catalog.compose import chain
from operator_catalog.entry import NotApplicable, OpEntry, Workload
from operator_catalog.faithfulness import ops_faithful
from operator_catalog.transformers_modules import TransformersEntry, render_transformers

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
        except (NotApplicable, RuntimeError, ValueError, TypeError, IndexError) as e:
            error = f"{type(e).__name__}: {e}"
            continue
        verdict = check_shapes(task.source)
        if not ops_faithful(task.source, task.ops) or task.ops != (entry.name,):
            return f"rendered ops {task.ops} differ from the operators in forward"
        if verdict.kept:
            return None
        error = f"rendered task fails the shape check: {verdict.reason} {verdict.detail}"
    return error
