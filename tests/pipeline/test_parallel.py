"""The CPU stages' own work on helper processes: the same results, in the same order, as in the driver."""

from functools import partial

from opsynth.config import WORKLOADS
from opsynth.pipeline import parallel
from opsynth.pipeline.parallel import helpers_for
from opsynth.pipeline.stages import composed, decontaminated, reference_state
from opsynth.records import CandidateSpec, candidate_seed


def test_helpers_compose_and_decontaminate_as_the_driver_does():
    specs = [CandidateSpec(f"torch#{1 + i % 3}", i, candidate_seed(7, "torch", i)) for i in range(12)]
    compose = partial(composed, workload=WORKLOADS["tiny"], op_weights="ops6k")
    judge = partial(decontaminated, reference="embedded", ast_threshold=0.9, jaccard_threshold=0.85)
    here = parallel.mapped(compose, specs)
    verdicts_here = parallel.mapped(judge, [(c.code, None, 0) for c, _ in here])
    with parallel.helping(2, **reference_state("embedded")):
        there = parallel.mapped(compose, specs)
        verdicts_there = parallel.mapped(judge, [(c.code, None, 0) for c, _ in there])
    assert [c.code for c, _ in there] == [c.code for c, _ in here] and all(f is None for _, f in there)
    assert verdicts_there == verdicts_here
    assert not any(parallel.inherited(key) for key in reference_state("embedded")), "the state goes with them"


def test_a_machine_gets_helpers_for_half_its_cores_from_four_on():
    assert [helpers_for(n) for n in (1, 2, 3, 4, 16, 64)] == [0, 0, 0, 2, 8, 8]


def _sigterm_handler(_) -> str:
    import signal

    return str(signal.getsignal(signal.SIGTERM))


def test_a_helper_keeps_sigterms_default_whatever_the_driver_does_with_it():
    """The command's SIGTERM handler (an interrupt, see opsynth.commands.cli) is the driver's: a forked helper
    keeps the default, which is how its pool stops it (inheriting the handler, a helper told to stop raised an
    interrupt inside the pool's queue, printed its traceback and could leave the queue locked)."""
    import signal

    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        with parallel.helping(2):
            assert set(parallel.mapped(_sigterm_handler, list(range(16)))) == {str(signal.SIG_DFL)}
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stuck(item: int) -> int:
    import os
    import time

    if item == 0 and os.getpid() != parallel.inherited("driver"):
        time.sleep(60)  # a helper that never answers in time (killed with the pool); the driver answers at once
    return item * 2


def test_helpers_that_give_no_result_in_time_are_given_up_and_the_work_done_here(capsys):
    import os

    with parallel.helping(2, driver=os.getpid()):
        assert parallel.mapped(_stuck, [1, 2, 3], timeout_s=30) == [2, 4, 6]
        # the batch that hangs a helper: done here, and the run goes on without helpers
        assert parallel.mapped(_stuck, [0, 5], timeout_s=0.5) == [0, 10]
        assert parallel.mapped(_stuck, [7, 8]) == [14, 16]
    assert "going on without them" in capsys.readouterr().err
