"""The same seed makes the same candidates: a fingerprint of what every data source makes from its first seeds,
in both workloads. A change to the catalog, composition or rendering changes it on purpose, and then this
fingerprint is updated in the same commit; a refactoring leaves it as it is."""

import hashlib
import json

from opsynth.config import DATA_SOURCES, WORKLOADS
from opsynth.operator_catalog.compose import CompositionError
from opsynth.pipeline.candidates import make_candidate
from opsynth.records import CandidateSpec

FINGERPRINT = "87b09f960b619bc10e625f52f3d4b1b37d396ae9fae41398e79d1acc478727b3"


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
    program but for its batch extent); transformers variants are each their own row (exact programs only)."""
    from opsynth.filters.dedup import dedup_key, task_key
    from opsynth.pipeline.candidates import rescale_candidate

    same_task = 0
    for source in ("torch#3", "transformers"):
        for index in range(6):
            original = make_candidate(CandidateSpec(source, index, 1000 + index), WORKLOADS["gpu"], 1.0, "ops6k")
            rescaled = rescale_candidate(original, 0.25, WORKLOADS["gpu"], "ops6k")
            for c in (original, rescaled) if rescaled is not None else (original,):
                assert c.dedup_key == (dedup_key(c.code) if source == "transformers" else task_key(c.code))
            if rescaled is not None and source != "transformers":
                same_task += rescaled.code != original.code and rescaled.dedup_key == original.dedup_key
    assert same_task  # another program, the same key: dropped before execution
