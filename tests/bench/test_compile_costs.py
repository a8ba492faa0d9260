"""The compile benchmark: it reads a run's checkpointed verdicts and compiles the tasks that were compiled in it
again alone, with inductor's own timers (here on the CPU; its measure is for a GPU)."""

import json

import pytest

from opsynth.bench import compile_costs
from opsynth.pipeline.progress import ExecutionProgress
from opsynth.reasons import Verdict
from opsynth.records import Candidate
from tests import fixtures


def _checkpoint(folder, tasks) -> None:
    """One checkpoint of (code, phase seconds) verdicts, as the execution stage writes them."""
    candidates = [
        Candidate("torch#1", k, 7 + k, ("torch.relu",), code, (), f"k{k}") for k, (code, _) in enumerate(tasks)
    ]
    verdicts = [Verdict(measurements={"phase_s": phases}) for _, phases in tasks]
    ExecutionProgress(str(folder)).record(candidates, [(c, v, 0) for c, v in zip(candidates, verdicts, strict=True)])


def test_the_runs_compiled_tasks_are_compiled_again_with_inductors_steps(tmp_path, capsys):
    work = tmp_path / "run" / ".opsynth"
    _checkpoint(work / "progress" / "round-00000",
                [(fixtures.GOOD, {"compile": 0.7}), (fixtures.CONSTANT, {"first_forward": 0.1})])  # fmt: skip
    _checkpoint(work / "progress" / "round-00001",
                [(fixtures.GOOD, {"compile": 1.2}), (fixtures.RAISES, {"compile": 0.3})])  # fmt: skip
    report = tmp_path / "compiles.jsonl"
    # In-process (1): a pool of compile processes would stay in the test's own process.
    compile_costs.main([str(tmp_path / "run"), "--device", "cpu", "--report", str(report), "--compile-processes", "1"])
    out = capsys.readouterr().out
    records = [json.loads(line) for line in report.read_text().splitlines()]
    assert sorted(r["in_run_s"] for r in records) == [0.3, 1.2], "each compiled program once, its longest compile"
    good = next(r for r in records if r["in_run_s"] == 1.2)
    assert good["here_s"] > 0 and good["steps"], "compiled here, with the steps inductor timed"
    assert "the first third: 1 tasks" in out and "inductor's steps" in out
    assert "not compiled: 1 (the first: ValueError: boom)" in out, "a task that fails is left uncompiled, saying why"


def test_a_run_that_compiled_nothing_is_refused_saying_what_to_give(tmp_path):
    with pytest.raises(SystemExit) as stop:
        compile_costs.main([str(tmp_path), "--device", "cpu"])
    assert "give a run's folder or its work folder" in str(stop.value)


def test_inductor_settings_are_set_for_the_compiles_and_a_bad_one_is_refused(tmp_path, monkeypatch, capsys):
    import torch._inductor.config

    work = tmp_path / "run" / ".opsynth"
    _checkpoint(work / "progress" / "round-00000", [(fixtures.GOOD, {"compile": 0.7})])
    seen = []
    alone = compile_costs.compile_alone
    monkeypatch.setattr(
        compile_costs,
        "compile_alone",
        lambda task, device: (
            seen.append((torch._inductor.config.triton.autotune_pointwise, torch._inductor.config.size_asserts))
            or alone(task, device)
        ),
    )
    settings = ["--inductor-config", "triton.autotune_pointwise=False", "--inductor-config", "size_asserts = False"]
    compile_costs.main([str(tmp_path / "run"), "--device", "cpu", "--compile-processes", "1", *settings])
    assert seen[-1] == (False, False), "the task compiled with both settings"
    assert seen[0] == (True, True), "the worker's warm-up task as a worker compiles it"
    assert torch._inductor.config.triton.autotune_pointwise, "set for the compiles only"
    assert "Triton kernels compiled: 0" in capsys.readouterr().out  # the CPU compiles C++
    for bad in ("triton.no_such_setting=1", "triton.autotune_pointwise"):
        with pytest.raises(SystemExit, match="give NAME=VALUE with NAME one of inductor's settings"):
            compile_costs.main([str(tmp_path / "run"), "--device", "cpu", "--inductor-config", bad])


@pytest.mark.parametrize(("flag", "split"), [([], True), (["--whole-kernels"], False)])
def test_whole_kernels_compiles_each_kernels_configurations_in_one_job(tmp_path, monkeypatch, flag, split):
    from opsynth.filters import worker_setup

    work = tmp_path / "run" / ".opsynth"
    _checkpoint(work / "progress" / "round-00000", [(fixtures.GOOD, {"compile": 0.7})])
    asked = []
    monkeypatch.setattr(worker_setup, "start_compile_pool", lambda split=True: asked.append(split))
    compile_costs.main([str(tmp_path / "run"), "--device", "cpu", "--compile-processes", "1", *flag])
    assert asked == [split], "the pool asked to split a kernel's configurations, or not"
