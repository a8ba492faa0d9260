"""The CPU stages' own work on helper processes: the same results, in the same order, as in the driver."""

from functools import partial

from opsynth.config import WORKLOADS
from opsynth.pipeline import parallel
from opsynth.pipeline.parallel import helpers_for
from opsynth.pipeline.stages import composed, decontaminated, reference_index
from opsynth.records import CandidateSpec, candidate_seed


def test_helpers_compose_and_decontaminate_as_the_driver_does():
    specs = [CandidateSpec(f"torch#{1 + i % 3}", i, candidate_seed(7, "torch", i)) for i in range(12)]
    compose = partial(composed, workload=WORKLOADS["tiny"], op_weights="ops6k")
    judge = partial(decontaminated, reference="embedded", ast_threshold=0.9, jaccard_threshold=0.85)
    here = parallel.mapped(compose, specs)
    verdicts_here = parallel.mapped(judge, [(c.code, None, 0) for c, _ in here])
    with parallel.helping(2, **{"kernelbench:embedded": reference_index("embedded")}):
        there = parallel.mapped(compose, specs)
        verdicts_there = parallel.mapped(judge, [(c.code, None, 0) for c, _ in there])
    assert [c.code for c, _ in there] == [c.code for c, _ in here] and all(f is None for _, f in there)
    assert verdicts_there == verdicts_here
    assert parallel.inherited("kernelbench:embedded") is None, "the helpers' state goes with them"


def test_a_machine_gets_helpers_for_half_its_cores_from_four_on():
    assert [helpers_for(n) for n in (1, 2, 3, 4, 16, 64)] == [0, 0, 0, 2, 8, 8]
