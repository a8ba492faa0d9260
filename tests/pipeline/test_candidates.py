"""The same seed makes the same candidates: a fingerprint of what every data source makes from its first seeds,
in both workloads. A change to the catalog, composition or rendering changes it on purpose, and then this
fingerprint is updated in the same commit; a refactoring leaves it as it is."""

import hashlib
import json
import math

from opsynth.config import DATA_SOURCES, WORKLOADS
from opsynth.operator_catalog.compose import CompositionError
from opsynth.pipeline.candidates import make_candidate
from opsynth.records import CandidateSpec

FINGERPRINT = "87b09f960b619bc10e625f52f3d4b1b37d396ae9fae41398e79d1acc478727b3"


def composed(sources, count: int, first_seed: int, workload):
    """(source, candidate) for the first `count` indices of each source, seeded from `first_seed` on, those that
    compose."""
    for source in sources:
        for index in range(count):
            try:
                yield source, make_candidate(CandidateSpec(source, index, first_seed + index), workload, 1.0, "ops6k")
            except CompositionError:
                continue


def test_the_first_candidates_of_every_data_source_are_those_of_the_catalog_version():
    digest = hashlib.sha256()
    for workload in ("tiny", "gpu"):
        for source in DATA_SOURCES:
            for index in range(12):
                try:
                    c = make_candidate(CandidateSpec(source, index, 1000 + index), WORKLOADS[workload], 1.0, "ops6k")
                except CompositionError:
                    digest.update(b"x")
                    continue
                digest.update(json.dumps([c.code, list(c.ops), list(c.input_shapes), c.dedup_key]).encode())
    assert digest.hexdigest() == FINGERPRINT


def test_the_dedup_key_is_the_selections_task_so_a_rescaled_torch_candidate_keeps_it():
    """The dedup stage drops, before any execution, what the selection would skip as the same task (a torch
    program but for its batch extent); transformers variants are each their own row (exact programs only). The
    selection reads a torch candidate's task from its key, so the two must agree on every candidate made."""
    from opsynth.filters.dedup import dedup_key, task_key
    from opsynth.pipeline.candidates import rescale_candidate, selection_key

    same_task = 0
    for source in ("torch#3", "transformers"):
        for index in range(6):
            original = make_candidate(CandidateSpec(source, index, 1000 + index), WORKLOADS["gpu"], 1.0, "ops6k")
            rescaled = rescale_candidate(original, 0.25, WORKLOADS["gpu"], "ops6k")
            for c in (original, rescaled) if rescaled is not None else (original,):
                assert c.dedup_key == (dedup_key(c.code) if source == "transformers" else task_key(c.code))
                assert selection_key(c) == task_key(c.code)
            if rescaled is not None and source != "transformers":
                same_task += rescaled.code != original.code and rescaled.dedup_key == original.dedup_key
    assert same_task  # another program, the same key: dropped before execution


def test_a_torch_chain_grown_may_take_the_whole_budget_for_its_input_a_transformers_module_its_share():
    """A chain rescaled up takes the largest share of the element budget (1, 1/2, 1/4) at which none of its
    tensors exceeds the budget, with its operators unchanged (a reduction on half the budget moves too few bytes
    to reach 1 ms on one H200); a transformers module, whose inner tensors no budget checks, keeps the
    workload's share. Shrunk, no chain grows (a batch cut below min_largest_dim grows back to it, and its
    extents would take the wider share: 4x the input, seen on one H200)."""
    from dataclasses import replace

    from opsynth.pipeline.candidates import input_elements, input_shares, rescale_candidate

    workload = replace(WORKLOADS["gpu"], max_elements=1 << 31)
    assert input_shares(workload) == (1, 2, 4) and input_shares(replace(workload, input_share=3)) == (1, 2, 3)
    share = workload.max_elements // workload.input_share
    past_share = 0
    for source, original in composed(("torch#1", "torch#2", "transformers"), 8, 1000, workload):
        shrunk = rescale_candidate(original, 1e-3, workload, "ops6k")
        assert shrunk is None or input_elements(shrunk) < input_elements(original)
        rescaled = rescale_candidate(original, 1e6, workload, "ops6k")
        if rescaled is None:
            continue
        assert rescaled.ops == original.ops
        assert input_elements(rescaled) <= workload.max_elements * len(rescaled.input_shapes)
        if source == "transformers":
            assert all(math.prod(s["shape"]) <= share for s in rescaled.input_shapes)
        else:
            past_share += input_elements(rescaled) > share
    assert past_share >= 4


def test_a_rescaled_candidates_input_moves_by_about_the_factor_asked():
    """Sized toward the window, a torch chain's input moves by about the factor asked: shrunk, a batch held at
    min_largest_dim gives way to the extents (on one H200 such tasks stayed over the 2 ms aimed at, a median of
    7.8 ms); grown a little, the chain keeps its share of the budget, where a wider one would have doubled the
    extents it was cut to (a Conv3d asked 1.18x grew 2.4x)."""
    from dataclasses import replace

    from opsynth.pipeline.candidates import input_elements, rescale_candidate

    workload = replace(WORKLOADS["gpu"], max_elements=1 << 31)
    moved = {0.1: [], 0.4: [], 1.3: []}
    for _, original in composed(("torch#1", "torch#2", "torch#3"), 20, 5000, workload):
        for factor, ratios in moved.items():
            rescaled = rescale_candidate(original, factor, workload, "ops6k")
            if rescaled is not None:
                assert rescaled.ops == original.ops
                ratios.append(input_elements(rescaled) / input_elements(original) / factor)
    for factor, ratios in moved.items():
        near = sum(1 / 1.25 <= r <= 1.25 for r in ratios)
        assert len(ratios) >= 40 and near >= 0.9 * len(ratios), (factor, sorted(ratios))
