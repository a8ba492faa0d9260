"""The same seed makes the same candidates: a fingerprint of what every data source makes from its first seeds,
in both workloads. A change to the catalog, composition or rendering changes it on purpose, and then this
fingerprint is updated in the same commit; a refactoring leaves it as it is."""

import hashlib
import json

from opsynth.config import DATA_SOURCES, WORKLOADS
from opsynth.operator_catalog.compose import CompositionError
from opsynth.pipeline.candidates import make_candidate
from opsynth.records import CandidateSpec

FINGERPRINT = "cabf4472221cce11e2c4f64a9d5cda609b61be8daecf7febcc80d423e3296fd2"


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
