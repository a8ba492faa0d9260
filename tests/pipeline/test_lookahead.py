"""The next round's first candidates, started as this round's execution ends: only those its fill point asks
for whatever this round's verdicts to come, and the dataset the same as without them."""

import shutil

from datasets import load_dataset

from opsynth.commands.cli import main
from opsynth.filters.workers import WorkerPool
from opsynth.pipeline import lookahead
from opsynth.pipeline.lookahead import NextRound, StartAhead, certainly_asked
from opsynth.pipeline.selection import FillPoint
from opsynth.records import Candidate
from tests import fixtures


def test_the_next_round_is_asked_for_what_this_round_cannot_fill_whatever_its_last_verdicts():
    # 8 accepted and 1 still running of the 12 asked: this round adds at most 9 of the 10 missing rows, so the
    # next round misses at least 1 and asks for at least wanted(1) = 3 of its first candidates
    assert certainly_asked({"torch#2": 10}, {"torch#2": 12}, {"torch#2": 8}, {"torch#2": 1}) == {"torch#2": 3}
    # enough accepted (or still running) to fill the source: nothing is certain
    assert certainly_asked({"torch#2": 10}, {"torch#2": 12}, {"torch#2": 9}, {"torch#2": 1}) == {}
    # accepted past this round's own fill point add no row
    assert certainly_asked({"torch#1": 3}, {"torch#1": 2}, {"torch#1": 40}, {}) == {"torch#1": 3}
    assert certainly_asked({}, {}, {}, {}) == {}


def _candidate(source: str, index: int) -> Candidate:
    return Candidate(source, index, index, code=f"# {source} {index}")


def test_start_ahead_offers_the_certainly_asked_candidates_once_each_in_the_next_rounds_order():
    this_round = [_candidate("torch#2", i) for i in range(4)]
    fill = FillPoint({"torch#2": 4})
    for c in this_round[:2]:
        fill.add(c, True)
    ready: list = []
    # the next round's candidates in its execution order (not index order)
    order = [_candidate("torch#3", 7), _candidate("torch#2", 21), _candidate("torch#2", 20), _candidate("torch#2", 22)]
    nxt = NextRound(lambda: ready[0] if ready else None, missing={"torch#2": 5, "torch#3": 0}, wanted={"torch#2": 7})
    start = StartAhead(nxt, fill, this_round[2:], job_of=lambda c: c.order)
    assert start() is None, "its CPU stages are not done"
    ready.append(order)
    # 2 accepted and 2 undecided of 5 missing: at least 1 missing, so its first wanted(1) = 3 by index are asked
    assert [start(), start(), start(), start()] == [("torch#2", 21), ("torch#2", 20), ("torch#2", 22), None]
    start.decided(this_round[2])
    assert start() is None, "each once"


def test_the_dataset_is_the_same_with_and_without_candidates_started_ahead(tmp_path, monkeypatch):
    """The second run also composes and decontaminates on helper processes (pipeline.parallel), which a 2-core
    machine has none of by default: the same dataset again."""
    import opsynth.pipeline.planning
    import opsynth.pipeline.run
    from opsynth.pipeline.round_pipelines import Beside

    # Two rounds at least: a pilot of 30 candidates cannot make 48 rows
    monkeypatch.setattr(opsynth.pipeline.planning, "PILOT_CANDIDATES", 30)
    argv = ["--num-samples", "48", "--mixture", "torch2=100", "--seed", "5", *fixtures.TINY_RUN, "--no-compile-check",
            "--runtime-window-ms", "0,10000", "--quiet"]  # fmt: skip
    with monkeypatch.context() as plain:
        plain.setattr(lookahead, "register", lambda progress, next_round: None)
        assert main(["generate", "--out", str(tmp_path / "plain"), *argv]) == 0

    started = []
    candidates, call = Beside.candidates, StartAhead.__call__

    def ready(self):  # the next round's CPU stages waited for, so that its candidates are there to start
        if self.thread is not None:
            self.thread.join()
        return candidates(self)

    def counted(self):
        job = call(self)
        started.extend([job] if job is not None else [])
        return job

    monkeypatch.setattr(Beside, "candidates", ready)
    monkeypatch.setattr(StartAhead, "__call__", counted)
    monkeypatch.setattr(opsynth.pipeline.run, "helpers_for", lambda: 2)
    # A worker asks for a job ahead when it is idle while the other still runs round 0's last; on a loaded
    # machine the pool may collect both last verdicts in one look and ask for none: a run then starts nothing
    # ahead, and is made again (the dataset it compares is one that did).
    for _ in range(3):
        shutil.rmtree(tmp_path / "ahead", ignore_errors=True)
        assert main(["generate", "--out", str(tmp_path / "ahead"), *argv]) == 0
        if started:
            break
    assert started, "some of round 1's candidates started while round 0's last ones ran"
    _same_dataset(tmp_path / "plain", tmp_path / "ahead")

    # Round 1's candidates known only once round 0's execution is over: they start between the two rounds' stages,
    # while the driver passes from one round to the next (WorkerPool.run), its stage torn down meanwhile.
    over, run = [], WorkerPool.run

    def run_marked(self, jobs, *args, **kwargs):
        verdicts = run(self, jobs, *args, **kwargs)
        if (args[3] if len(args) > 3 else kwargs.get("ahead")) is not None:  # an execution's run, not a shape check's
            over.append(len(jobs))
        return verdicts

    monkeypatch.setattr(WorkerPool, "run", run_marked)
    monkeypatch.setattr(Beside, "candidates", lambda self: ready(self) if over else None)
    started.clear()
    assert main(["generate", "--out", str(tmp_path / "between"), *argv]) == 0
    assert started, "round 1's candidates started between the rounds"
    _same_dataset(tmp_path / "plain", tmp_path / "between")


def _same_dataset(one, other) -> None:
    plain, ahead = (load_dataset(str(d), split="train") for d in (one, other))
    assert plain["id"] == ahead["id"]
    plain, ahead = (load_dataset(str(d), "rejected", split="train") for d in (one, other))
    assert [(r["data_source"], r["candidate_index"], r["reason"], r["stage"]) for r in plain] == [
        (r["data_source"], r["candidate_index"], r["reason"], r["stage"]) for r in ahead
    ]
