"""A candidate from its spec: composed from its seed and rendered, or made again with its batch rescaled. Plain
functions, no Beam: the pipeline's stages, the plan and the benchmarks make candidates alike."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

from opsynth.config import COMPOSE_ATTEMPTS, RESCALE_TOLERANCE
from opsynth.data_sources import kind, operator_count
from opsynth.filters.dedup import dedup_key, task_key
from opsynth.operator_catalog.codegen import render
from opsynth.operator_catalog.compose import CompositionError, compose
from opsynth.operator_catalog.transformers_modules import compose_transformers
from opsynth.records import Candidate, CandidateSpec
from opsynth.workload import Workload


def make_candidate(
    spec: CandidateSpec, workload: Workload, batch_scale: float = 1.0, op_weights: str = "uniform"
) -> Candidate:
    """Compose and render one candidate; raises CompositionError when no chain fits."""
    if kind(spec.data_source) == "transformers":
        task = compose_transformers(spec.seed, workload, batch_scale)
    else:
        k = operator_count(spec.data_source)
        task = render(compose(spec.seed, k, workload, COMPOSE_ATTEMPTS, batch_scale, op_weights))
    return Candidate(
        data_source=spec.data_source,
        index=spec.index,
        seed=spec.seed,
        ops=task.ops,
        code=task.source,
        input_shapes=tuple({"shape": list(s.shape), "dtype": s.dtype} for s in task.input_shapes),
        dedup_key=candidate_key(spec.data_source, task.source),
        batch_scale=batch_scale,
    )


def candidate_key(source: str, code: str) -> str:
    """What the dedup stage keeps one candidate of: a task (`task_key`, the program but for its batch extent), as
    the selection counts them, so that no execution goes to a candidate the selection would skip as the same
    task; for transformers, whose variants the selection takes as they come, the exact program."""
    return dedup_key(code) if kind(source) == "transformers" else task_key(code)


def selection_key(candidate: Candidate) -> str:
    """The task the selection counts `candidate` as (`task_key` of its code). A torch candidate carries it as its
    dedup key from when it was made (`candidate_key`), so the driver does not parse its code again each round
    and on each resume; a transformers candidate, keyed by its exact program, has it computed."""
    if candidate.dedup_key and kind(candidate.data_source) != "transformers":
        return candidate.dedup_key
    return task_key(candidate.code)


def input_elements(candidate: Candidate) -> int:
    """Elements of a candidate's inputs, all of them together."""
    return sum(math.prod(s["shape"]) for s in candidate.input_shapes)


def _rescaled_at_shares(
    candidate: Candidate, factor: float, workload: Workload, op_weights: str
) -> Iterator[Candidate]:
    """The candidate made again with its batch scaled by `factor` at each share of the element budget it may
    take, the workload's own first, then the wider ones, where its operators stay and its input moves the way
    `factor` asks (not another chain, drawn where this one did not fit; nor one grown where it was to shrink)."""
    spec, before = CandidateSpec(candidate.data_source, candidate.index, candidate.seed), input_elements(candidate)
    torch_chain = kind(candidate.data_source) != "transformers"
    for share in reversed(input_shares(workload)) if torch_chain else (workload.input_share,):
        try:
            rescaled = make_candidate(spec, dataclasses.replace(workload, input_share=share),
                                      candidate.batch_scale * factor, op_weights)  # fmt: skip
        except CompositionError:
            continue
        if tuple(rescaled.ops) == tuple(candidate.ops) and (input_elements(rescaled) - before) * (factor - 1) >= 0:
            yield rescaled


def input_shares(workload: Workload) -> tuple[int, ...]:
    """The shares of the element budget a torch chain's input may take when it is rescaled, the largest first:
    1, 1/2, 1/4 ... to the workload's own (`Workload.input_share`), which leaves its tensors room to grow; the
    chain's check that no tensor of it exceeds the budget decides which one fits."""
    own = workload.input_share
    return (*(1 << k for k in range(own.bit_length()) if 1 << k < own), own)


def rescale_candidate(
    candidate: Candidate, factor: float, workload: Workload, op_weights: str = "uniform"
) -> Candidate | None:
    """The same candidate with its batch scaled by `factor`, or None where sizes cannot move that way.
    `op_weights` must be those it was made with, or the seed would compose another task. A torch chain takes the
    share of the element budget (`input_shares`: the workload's own, or wider up to the whole budget, as a
    reduction reads its input alone) at which its input moves nearest `factor`: grown, a wider share lets it
    reach the window; shrunk, or grown a little, the own share keeps its extents where a wider one would double
    them (a batch held at min_largest_dim shrinks those extents). A transformers module, whose inner tensors no
    budget checks, keeps the workload's share."""
    before = input_elements(candidate)

    def miss(c: Candidate) -> float:  # how far its input moved from `factor`, in log terms
        return abs(math.log(input_elements(c) / before / factor))

    rescaled = None
    for made in _rescaled_at_shares(candidate, factor, workload, op_weights):
        rescaled = made if rescaled is None or miss(made) < miss(rescaled) else rescaled
        if miss(rescaled) <= math.log(RESCALE_TOLERANCE):
            break  # near enough: the wider shares are not made
    if rescaled is None:
        return None
    if rescaled.input_shapes == candidate.input_shapes:
        return None  # the element budget (or rounding) holds the batch where it is
    largest = max(max(s["shape"]) for s in rescaled.input_shapes)
    if factor < 1 and largest < workload.min_largest_dim:
        return None
    return rescaled.measured(candidate.measurements)
