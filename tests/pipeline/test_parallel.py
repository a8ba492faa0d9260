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


def _sigterm_handler_and_group(_) -> tuple[str, int]:
    import os
    import signal

    return str(signal.getsignal(signal.SIGTERM)), os.getpgrp()


def test_signals_to_the_driver_are_the_drivers_and_its_pool_stops_a_helper_with_sigterm():
    """A helper is in a process group of its own, so that a signal to the driver's group (Ctrl-C, `timeout`'s
    SIGTERM) does not kill it while it holds the pool's task queue (the pool's stop then waited for ever); it keeps
    SIGTERM's default, as its pool stops it so, whatever handler the driver had when it was forked (the command's
    interrupt: a helper raised it inside the queue and printed its traceback)."""
    import os
    import signal

    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        with parallel.helping(2):
            # The helpers are forked with it; a helper the pool forks again as it stops them must not get it (it
            # could take the pool's SIGTERM before setting its own).
            signal.signal(signal.SIGTERM, previous)
            seen = set(parallel.mapped(_sigterm_handler_and_group, list(range(16))))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert {handler for handler, _ in seen} == {str(signal.SIG_DFL)}
    assert os.getpgrp() not in {group for _, group in seen}


def _pid(_) -> int:
    import os

    return os.getpid()


def test_a_helper_killed_outright_does_not_keep_the_run_from_ending(monkeypatch):
    """The one helper, idle, holds the pool's task queue as it waits on it: killed so (a scheduler, the out-of-memory
    killer), it left the pool's stop, and the run's end, waiting for ever."""
    import os
    import signal
    import threading

    monkeypatch.setattr(parallel, "STOP_TIMEOUT_S", 1.0)
    ended = threading.Event()

    def run() -> None:
        with parallel.helping(1):
            (helper,) = set(parallel.mapped(_pid, list(range(8))))
            os.kill(helper, signal.SIGKILL)
        ended.set()

    threading.Thread(target=run, daemon=True).start()
    assert ended.wait(120), "the helpers' stop waited for ever"


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
