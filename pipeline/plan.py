"""`opsynth generate --plan`: before any GPU time, whether each data source can yield its rows, by walking its
candidates in run order through the CPU stages and the selection's rules, and estimating what a source still short
holds; a source whose walk ran dry never passes (docs/recipe.md, "Plan")."""

from __future__ import annotations

import math
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

from opsynth.config import PLAN_EXECUTION_YIELD, PLAN_LONGEST_WALK, PLAN_REACH, PLAN_SAMPLE
from opsynth.data_sources import kind
from opsynth.errors import UsageError
from opsynth.filters.decontamination import decontaminate
from opsynth.filters.dedup import WithinSetFilter
from opsynth.filters.kernelbench_index import load_reference
from opsynth.operator_catalog.compose import CompositionError
from opsynth.options import GenerateOptions, quotas
from opsynth.pipeline.candidates import make_candidate, selection_key
from opsynth.pipeline.selection import rows_per_graph
from opsynth.records import CandidateSpec, candidate_seed
from opsynth.workload import TASK_DTYPES

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
    as many as the first, within two standard deviations of a count (its square root): no saturation shows."""
    if half <= 0:
        return distinct  # nothing passed in the first half: nothing to extrapolate from
    if half - (distinct - half) <= 2 * math.sqrt(half):
        return OPEN
    ratio = distinct / half - 1  # exp(-n / (2 tau))
    return max(distinct, round(half / (1 - ratio)))


def richness(draws: Counter) -> int:
    """Tasks a source can draw at all, seen and unseen, from how often each task was drawn (`draws`, task key ->
    times): Chao1's bias-corrected estimate, the tasks seen plus f1 (f1 - 1) / (2 (f2 + 1)), f1 and f2 the
    tasks drawn once and twice. Where few tasks repeat it is large: it bounds the growth fit from above, which
    cannot tell saturation in a short walk."""
    once = sum(1 for n in draws.values() if n == 1)
    twice = sum(1 for n in draws.values() if n == 2)
    return len(draws) + once * (once - 1) // (2 * (twice + 1))


def estimate(half: int, distinct: int, draws: Counter) -> int:
    """What a source holds: the growth fit, bounded by the richness of its draws."""
    fit, rich = capacity(half, distinct), richness(draws)
    return rich if fit is OPEN else min(fit, rich)


def tasks_needed(rows: int) -> int:
    """The distinct tasks a source must pass through the CPU stages for `rows` rows, PLAN_EXECUTION_YIELD of them
    expected to pass execution."""
    return math.ceil(rows / PLAN_EXECUTION_YIELD)


def walk_source(
    options: GenerateOptions, source: str, rows: int, sample: int = PLAN_SAMPLE, longest: int = PLAN_LONGEST_WALK
) -> SourcePlan:
    """One data source's plan: its candidates in a run's order, until it has what its rows need. After `sample`
    candidates, and after each doubling of them up to `longest`, the estimate decides: met, or short by more
    than PLAN_REACH; in between, the walk goes on (the estimate is least sure near the need)."""
    needed = tasks_needed(rows)
    index = load_reference(options.kernelbench)
    within = WithinSetFilter()
    cap = None if kind(source) == "transformers" else rows_per_graph(source, rows)
    seen: set[str] = set()
    draws: Counter = Counter()
    distinct = half = walked = 0
    checkpoint = sample
    while True:
        while walked < checkpoint and distinct < needed:
            if walked == checkpoint // 2:
                half = distinct
            spec = CandidateSpec(source, walked, candidate_seed(options.seed, source, walked))
            walked += 1
            try:
                candidate = make_candidate(spec, options.sizes, op_weights=options.op_weights)
            except CompositionError:
                continue
            key = selection_key(candidate)
            draws[key] += 1
            if candidate.dedup_key in seen:
                continue
            seen.add(candidate.dedup_key)
            # transformers rows are variants of one class by design: only exact duplicates apply to them
            if cap is not None and within.refusal(key, candidate.ops, cap) is not None:
                continue
            if decontaminate(candidate.code, index, options.similarity_threshold, options.jaccard_threshold).kept:
                if cap is not None:
                    within.admit(candidate.id, key, candidate.ops, cap)
                distinct += 1
        if distinct >= needed:
            return SourcePlan(source, rows, needed, walked, distinct, OPEN)
        held = estimate(half, distinct, draws)
        if held >= needed or held * PLAN_REACH < needed or 2 * checkpoint > longest:
            return SourcePlan(source, rows, needed, walked, distinct, held)
        checkpoint *= 2


def _walk(args: tuple) -> SourcePlan:
    return walk_source(*args)


def plan(options: GenerateOptions, sample: int | None = None) -> list[SourcePlan]:
    """The plan of every data source with rows to make, walked on several processes where there are cores; each
    walk's first estimate after `sample` candidates (PLAN_SAMPLE unless given)."""
    sample = sample or PLAN_SAMPLE
    jobs = [(options, s, n, sample) for s, n in quotas(options.num_samples, options.mixture).items() if n]
    processes = min(len(jobs), os.cpu_count() or 1)
    if processes < 2:
        return [_walk(job) for job in jobs]
    with ProcessPoolExecutor(processes, mp_context=get_context("spawn")) as pool:
        return list(pool.map(_walk, jobs))


def report(plans: list[SourcePlan], options: GenerateOptions) -> str:
    """The plan as a table, headed by what it was made for."""
    dtypes = "" if options.dtypes is None else ", dtypes " + ",".join(f"{d}={w:g}" for d, w in options.dtypes.items())
    lines = [
        f"plan for {options.num_samples} rows (seed {options.seed}, {options.workload} workload, "
        f"{options.op_weights} operator weights{dtypes}); needed = rows / {PLAN_EXECUTION_YIELD:.0%} expected to "
        "pass execution",
        f"{'source':<13}{'rows':>8}{'needed':>8}{'walked':>8}{'distinct':>10}{'holds':>10}  verdict",
    ]
    for p in plans:
        holds = "enough" if p.distinct >= p.needed else "open" if p.capacity is OPEN else f"~{p.capacity}"
        verdict = "ok" if p.met else "short"
        lines.append(f"{p.source:<13}{p.rows:>8}{p.needed:>8}{p.walked:>8}{p.distinct:>10}{holds:>10}  {verdict}")
    return "\n".join(lines)


def refuse_short(plans: list[SourcePlan], options: GenerateOptions) -> None:
    """A UsageError naming the first data source that cannot yield its rows, if any, and the largest
    --num-samples whose quotas every short source would meet at this mixture (`most_rows`)."""
    short = [p for p in plans if not p.met]
    if not short:
        return
    first, more_dtypes = short[0], len(options.sizes.dtypes) < len(TASK_DTYPES)
    raise UsageError(
        f"{first.source} holds about {first.capacity} distinct tasks, short of the {first.needed} its {first.rows} "
        f"rows need; ask --num-samples {most_rows(short, options.mixture)} or fewer, or lower its share in --mixture"
        + (", or draw tasks in more dtypes (--dtypes)" if more_dtypes else "")
    )


def most_rows(short: list[SourcePlan], mixture: dict[str, float]) -> int:
    """The largest number of rows at `mixture` whose quota of each of the `short` sources needs no more distinct
    tasks than it is estimated to hold (an estimate: a smaller set also caps its operator graphs lower)."""

    def fits(n: int) -> bool:
        quota = quotas(n, mixture)
        return all(tasks_needed(quota[p.source]) <= p.capacity for p in short)

    # a quota of one row more than a source can give cannot fit: start where each source's exact share reaches it
    n = min(math.ceil((p.capacity * PLAN_EXECUTION_YIELD + 1) * 100 / mixture[p.source]) for p in short)
    while n > 0 and not fits(n):
        n -= 1
    return n
