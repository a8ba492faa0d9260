"""`opsynth generate --plan`: before any GPU time, whether each data source can yield its rows.

A data source yields as many rows as it has distinct tasks that pass the CPU stages: once its programs repeat
(single operators reach this first, their configurations being few), more candidates add nothing. The plan
walks each source's candidates in the order a run makes them (the same seeds), through composition, the exact
and near-duplicate dedup, the operator-graph cap of its quota and KernelBench decontamination, and counts the
distinct tasks admitted. It stops once a source has what its rows need (the rows over PLAN_EXECUTION_YIELD,
the share the execution stage is expected to keep), or after PLAN_SAMPLE candidates. A source still short
then gets an estimate of what it holds: admitted tasks grow like C (1 - exp(-n / tau)) in the candidates
walked, and the counts at n / 2 and n give C; where the second half admitted as many as the first, no end is
in sight and the source is taken to hold enough. That fit undercounts a long tail, so a refusal near the
boundary may be pessimistic; it never passes a source whose walk saw it run dry.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

from opsynth.config import NEAR_DUPLICATE_JACCARD, PLAN_EXECUTION_YIELD, PLAN_SAMPLE
from opsynth.data_sources import kind
from opsynth.errors import UsageError
from opsynth.filters.decontamination import decontaminate, load_reference
from opsynth.filters.dedup import WithinSetFilter
from opsynth.operator_catalog.compose import CompositionError
from opsynth.options import GenerateOptions, quotas
from opsynth.pipeline.candidates import make_candidate
from opsynth.pipeline.selection import rows_per_graph
from opsynth.records import CandidateSpec, candidate_seed

OPEN = None  # a capacity with no end in sight


@dataclass(frozen=True)
class SourcePlan:
    source: str
    rows: int  # its quota
    needed: int  # distinct tasks the CPU stages must pass for those rows
    walked: int  # candidates made
    distinct: int  # of them, distinct tasks past the CPU stages
    capacity: int | None  # distinct tasks the source is estimated to hold; OPEN where it met its need or no
    # end was in sight

    @property
    def met(self) -> bool:
        return self.capacity is OPEN or self.capacity >= self.needed


def capacity(half: int, distinct: int) -> int | None:
    """Distinct tasks a source holds, from those admitted among the first half of the candidates walked
    (`half`) and among all of them (`distinct`), under saturating growth; OPEN where the second half admitted
    as many as the first."""
    if half <= 0:
        return distinct  # nothing passed in the first half: nothing to extrapolate from
    ratio = distinct / half - 1  # exp(-n / (2 tau))
    if ratio >= 1:
        return OPEN
    return max(distinct, round(half / (1 - ratio)))


def walk_source(options: GenerateOptions, source: str, rows: int, sample: int = PLAN_SAMPLE) -> SourcePlan:
    """One data source's plan: its candidates in a run's order, until it has what its rows need or `sample`
    were made."""
    needed = math.ceil(rows / PLAN_EXECUTION_YIELD)
    index = load_reference(options.kernelbench)
    near = WithinSetFilter(NEAR_DUPLICATE_JACCARD)
    cap = None if kind(source) == "transformers" else rows_per_graph(source, rows)
    seen: set[str] = set()
    distinct = half = walked = 0
    while walked < sample and distinct < needed:
        spec = CandidateSpec(source, walked, candidate_seed(options.seed, source, walked))
        walked += 1
        try:
            candidate = make_candidate(spec, options.sizes, op_weights=options.op_weights)
        except CompositionError:
            candidate = None
        if candidate is not None and candidate.dedup_key not in seen:
            seen.add(candidate.dedup_key)
            clean = decontaminate(candidate.code, index, options.similarity_threshold, options.jaccard_threshold)
            # transformers rows are variants of one class by design: only exact duplicates apply to them
            if clean.kept and (cap is None or near.admit(candidate.id, candidate.code, candidate.ops, cap) is None):
                distinct += 1
        if walked == sample // 2:
            half = distinct
    held = capacity(half, distinct) if distinct < needed else OPEN
    return SourcePlan(source, rows, needed, walked, distinct, held)


def _walk(args: tuple) -> SourcePlan:
    return walk_source(*args)


def plan(options: GenerateOptions, sample: int = PLAN_SAMPLE) -> list[SourcePlan]:
    """The plan of every data source with rows to make, walked on several processes where there are cores."""
    jobs = [(options, s, n, sample) for s, n in quotas(options.num_samples, options.mixture).items() if n]
    processes = min(len(jobs), os.cpu_count() or 1)
    if processes < 2:
        return [_walk(job) for job in jobs]
    with ProcessPoolExecutor(processes, mp_context=get_context("spawn")) as pool:
        return list(pool.map(_walk, jobs))


def report(plans: list[SourcePlan], options: GenerateOptions) -> str:
    """The plan as a table, headed by what it was made for."""
    lines = [
        f"plan for {options.num_samples} rows (seed {options.seed}, {options.workload} workload, "
        f"{options.op_weights} operator weights); needed = rows / {PLAN_EXECUTION_YIELD:.0%} expected to pass "
        "execution",
        f"{'source':<13}{'rows':>8}{'needed':>8}{'walked':>8}{'distinct':>10}{'holds':>10}  verdict",
    ]
    for p in plans:
        holds = "enough" if p.distinct >= p.needed else "open" if p.capacity is OPEN else f"~{p.capacity}"
        verdict = "ok" if p.met else "short"
        lines.append(f"{p.source:<13}{p.rows:>8}{p.needed:>8}{p.walked:>8}{p.distinct:>10}{holds:>10}  {verdict}")
    return "\n".join(lines)


def refuse_short(plans: list[SourcePlan]) -> None:
    """A UsageError naming the first data source that cannot yield its rows, if any."""
    for p in plans:
        if not p.met:
            raise UsageError(
                f"{p.source} holds about {p.capacity} distinct tasks, short of the {p.needed} its {p.rows} rows "
                f"need; lower its share in --mixture or --num-samples"
            )
