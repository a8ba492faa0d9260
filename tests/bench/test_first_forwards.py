"""The first-forward benchmark: it reads a run's checkpointed verdicts, picks the tasks whose first forwards were
longest with others at random, and times them again alone (here on the CPU; its measure is for a GPU)."""

from opsynth.bench import first_forwards
from opsynth.pipeline.progress import ExecutionProgress
from opsynth.reasons import Verdict
from opsynth.records import Candidate
from tests import fixtures


def _checkpoint(folder, tasks) -> None:
    """One checkpoint of (code, first forward seconds) verdicts, as the execution stage writes them."""
    candidates = [
        Candidate("torch#1", k, 7 + k, ("torch.relu",), code, (), f"k{k}") for k, (code, _) in enumerate(tasks)
    ]
    verdicts = [Verdict(measurements={"phase_s": {"first_forward": s}}) for _, s in tasks]
    ExecutionProgress(str(folder)).record(candidates, [(c, v, 0) for c, v in zip(candidates, verdicts, strict=True)])


def test_the_longest_first_forwards_and_others_are_timed_again_alone(tmp_path, capsys):
    work = tmp_path / "run" / ".opsynth"
    _checkpoint(work / "progress" / "round-00000", [(fixtures.GOOD, 0.5), (fixtures.RAISES, 0.9)])
    _checkpoint(work / "progress" / "round-00001", [(fixtures.GOOD, 0.2), (fixtures.CONSTANT, 0.01)])
    tasks = first_forwards.run_tasks(str(work))
    assert sorted(t["in_run_s"] for t in tasks) == [0.01, 0.5, 0.9], "one task per program, its longest first forward"

    picked = first_forwards.chosen(tasks, longest=2, others=5, seed=1)
    assert {t["in_run_s"] for t in picked if t["longest"]} == {0.5, 0.9}
    assert [t["in_run_s"] for t in picked if not t["longest"]] == [0.01], "as many others as there are"

    report = tmp_path / "times.jsonl"
    first_forwards.main([str(tmp_path / "run"), "--device", "cpu", "--longest", "2", "--report", str(report)])
    out = capsys.readouterr().out
    assert "longest in the run: 1 tasks" in out and "others: 1 tasks" in out
    assert "not timed: 1 (the first: ValueError: boom)" in out, "a task that fails is left untimed, saying why"
    assert report.read_text().count("\n") == 3


def test_a_folder_without_checkpoints_is_refused_saying_what_to_give(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit) as stop:
        first_forwards.main([str(tmp_path), "--device", "cpu"])
    assert "give a run's folder or its work folder" in str(stop.value)


def test_rehearsing_on_the_cpu_is_a_usage_error(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit) as stop:
        first_forwards.main([str(tmp_path), "--device", "cpu", "--rehearse"])
    assert stop.value.code == 2
    assert "give --device cuda" in capsys.readouterr().err
