"""`opsynth score` from the command line: a row of a folder, a folder of solutions with the paper's metrics, and
the usage errors a careless user meets."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opsynth.commands.cli import main
from tests.filters.test_scoring import CORRECT, TASK, WRONG


@pytest.fixture()
def folder(tmp_path):
    """A generated folder's shard, as far as scoring reads it: ids, code and the recorded times."""
    data = tmp_path / "set" / "data"
    data.mkdir(parents=True)
    table = pa.table({"id": ["a1", "b2", "c3"], "code": [TASK] * 3, "eager_ms": [1000.0] * 3,
                      "compile_ms": [1000.0, None, 1000.0]})  # fmt: skip
    pq.write_table(table, data / "train-00000-of-00001.parquet")
    return tmp_path / "set"


def test_a_folder_of_solutions_is_scored_with_the_papers_metrics(folder, tmp_path, capsys):
    solutions = tmp_path / "solutions"
    solutions.mkdir()
    (solutions / "a1.py").write_text(CORRECT)
    (solutions / "b2.py").write_text(WRONG)  # c3 has none
    report = tmp_path / "scores.jsonl"
    args = ["score", str(folder), str(solutions), "--device", "cpu", "--baseline", "recorded", "--report", str(report)]
    assert main([*args, "--json"]) == 0
    totals = json.loads(capsys.readouterr().out)
    assert totals["tasks"] == 3 and totals["pass_rate"] == pytest.approx(1 / 3)
    assert totals["faster_than_compile_rate"] == pytest.approx(1 / 3) and totals["geomean_speedup_over_eager"] > 1
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    assert [(x["task"], x["reward"]) for x in lines[:-1]] == [("a1", 3), ("b2", -1), ("c3", -1)]
    assert lines[-1]["summary"] == totals and lines[2]["reason"] == "no solution"


def test_one_row_of_a_folder_by_its_id(folder, tmp_path, capsys):
    solution = tmp_path / "mine.py"
    solution.write_text(CORRECT)
    assert main(["score", f"{folder}:b2", str(solution), "--device", "cpu", "--baseline", "recorded"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("reward 2: correct; more than 5 % faster than eager, not than torch.compile (no")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{folder}:zz", "{solution}"], "has no row zz"),
        (["{folder}:a1", "{folder}"], "holds model_new.py"),
        (["{task}", "{solution}", "--baseline", "recorded"], "no recorded eager time"),
        (["{task}", "{solution}", "--report", "r.jsonl"], "--report is for a folder of solutions"),
        (["nowhere:a1", "{solution}"], "nowhere: no such file or folder"),
        (["{task}", "{solution}", "--timeout-s", "0"], "--timeout-s must be a positive number"),
    ],
)
def test_usage_errors_say_how_to_fix_them(args, message, folder, tmp_path, capsys):
    solution, task = tmp_path / "mine.py", tmp_path / "task.py"
    solution.write_text(CORRECT)
    task.write_text(TASK)
    argv = [a.format(folder=folder, solution=solution, task=task) for a in args]
    assert main(["score", *argv, "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
