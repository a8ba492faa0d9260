"""`opsynth generate` end to end on the tiny workload, and the folder checked the way a user would."""

import json
import re
import shutil

import pytest
import torch
import yaml
from datasets import load_dataset

from opsynth.commands.cli import main
from opsynth.filters.comparison import flatten_outputs, outputs_close
from opsynth.filters.execution import PHASES
from opsynth.filters.task_loading import load_task
from opsynth.operator_catalog.faithfulness import ops_faithful

TINY = ["--device", "cpu", "--workload", "tiny", "--workers", "2"]


def _generated_argv(out, kernelbench_parquet) -> list[str]:
    """The shared run's command line. An AST similarity threshold under the paper's 0.9 drops a few candidates as
    KernelBench near-duplicates, so that the folder has a rejected split whatever the timings (a run may otherwise
    reject nothing)."""
    return ["generate", "--out", str(out), "--num-samples", "24", "--seed", "3", *TINY,
            "--kernelbench", str(kernelbench_parquet), "--similarity-threshold", "0.7"]  # fmt: skip


@pytest.fixture(scope="module")
def generated(tmp_path_factory, kernelbench_parquet):
    out = tmp_path_factory.mktemp("gen") / "out"
    assert main(_generated_argv(out, kernelbench_parquet)) == 0
    return out


def test_folder_layout(generated):
    assert (generated / "data" / "train-00000-of-00001.parquet").exists()
    assert (generated / "rejected" / "rejected-00000-of-00001.parquet").exists()
    assert (generated / "README.md").exists() and (generated / "stats.json").exists()
    assert not list(generated.rglob(".tmp-*"))


def test_loads_with_datasets_with_exact_mixture(generated):
    ds = load_dataset(str(generated), split="train")
    assert len(ds) == 24
    assert ds.features["input_shapes"].feature["shape"].feature.dtype == "int64"  # typed, as the card says
    counts = {s: ds["data_source"].count(s) for s in set(ds["data_source"])}
    assert counts == {"torch#1": 1, "torch#2": 20, "torch#3": 2, "torch#4": 1}
    assert len(set(ds["id"])) == 24 and len(set(ds["code"])) == 24
    for row in ds:
        assert row["num_ops"] == len(json.loads(row["ops"])) == int(row["data_source"][-1])
        assert row["compile_ms"] > 0 and row["eager_ms"] > 0


def test_every_task_reexecutes_independently(generated):
    ds = load_dataset(str(generated), split="train")
    for row in ds:
        assert ops_faithful(row["code"], json.loads(row["ops"]))
        task = load_task(row["code"])
        torch.manual_seed(0)
        model = task.model_class(*task.get_init_inputs()).eval()
        with torch.no_grad():
            draws = [task.get_inputs() for _ in range(5)]
            outs = [flatten_outputs(model(*d)) for d in draws]
            again = flatten_outputs(model(*draws[0]))
        # `input_shapes` is typed (a list of {dtype, shape}) and says what get_inputs() gives
        assert [(s["dtype"], tuple(s["shape"])) for s in row["input_shapes"]] == [
            (str(t.dtype).removeprefix("torch."), tuple(t.shape)) for t in draws[0] if isinstance(t, torch.Tensor)
        ]
        assert outputs_close(again, outs[0], 1e-2, 1e-2), row["id"]
        assert all(torch.isfinite(t).all() for o in outs for t in o if t.is_floating_point())
        assert not any(outputs_close(o, outs[0], 1e-2, 1e-2) for o in outs[1:]), row["id"]


def test_figures_are_pngs_shown_in_the_card(generated):
    from PIL import Image

    card = (generated / "README.md").read_text()
    for name in ("ops_per_task", "top_operators", "eager_time", "kb_similarity"):
        path = generated / "figures" / f"{name}.png"
        with Image.open(path) as image:
            assert image.format == "PNG" and image.size[0] > 300
        assert f"(figures/{name}.png)" in card


def test_card_and_stats_agree(generated):
    card = (generated / "README.md").read_text()
    meta = yaml.safe_load(card.split("---")[1])
    assert meta["configs"][0]["data_files"][0]["path"] == "data/train-*"
    assert meta["size_categories"] == ["n<1K"]
    stats = json.loads((generated / "stats.json").read_text())
    assert stats["counts"]["rows"] == 24
    select = stats["funnel"]["select"]
    assert stats["counts"]["candidates"] + select["in"] - select["kept"] == (
        stats["counts"]["accepted"] + stats["counts"]["rejected"] + stats["counts"]["not_needed"]
    )
    assert stats["counts"]["rows"] + stats["counts"]["accepted_not_selected"] == select["kept"]
    rejected = load_dataset(str(generated), "rejected", split="train")
    assert len(rejected) == stats["counts"]["rejected"]
    assert sum(stats["dropped_by_reason"].values()) == len(rejected)
    assert stats["funnel"]["execute"]["kept"] == stats["counts"]["accepted"]
    work = stats["timings_s"]["stage_work"]
    assert {"compose", "shape_check", "decontaminate", "execute"} <= set(work) and work["execute"] > 0
    phases = stats["timings_s"]["execution_worker_phases"]
    assert {"load", "eager_checks", "compile"} <= set(phases) <= set(PHASES) and phases["compile"] > 0
    every = stats["timings_s"]["checkpointed_worker_phases"]  # a run not resumed made every verdict itself
    # Past a round's fill point candidates were skipped (no verdict) or ran (their verdicts set aside); the
    # funnel counts them at the execution stage, the rejected split does not hold them.
    assert "not_needed" not in set(rejected["reason"]) and "not_needed" not in stats["dropped_by_reason"]
    execute = stats["funnel"]["execute"]
    assert execute["in"] - execute["dropped"].get("not_needed", 0) <= every["verdicts"] <= execute["in"]
    assert every["compile"] == pytest.approx(phases["compile"], rel=0.01, abs=0.01)
    assert not any("phase_s" in json.loads(row["measurements"]) for row in rejected)  # noise stays out of rows
    # Every candidate the execution stage needed was executed once, and once more per re-measure.
    needed = [row for row in rejected if row["stage"] == "execute"]
    steps = [json.loads(row["measurements"]).get("calibration_steps", 0) for row in needed]
    assert stats["counts"]["executions"] >= stats["counts"]["accepted"] + len(needed) + sum(steps)
    assert stats["counts"]["executions_per_row"] == round(stats["counts"]["executions"] / 24, 3)
    assert f"{stats['counts']['executions']} executions on the device" in card
    assert stats["gpu_busy"] is None  # a CPU run watches no GPU


def test_rerun_of_a_finished_folder_does_nothing_and_other_options_are_refused(generated, kernelbench_parquet, capsys):
    same = _generated_argv(generated, kernelbench_parquet)
    before = (generated / "data" / "train-00000-of-00001.parquet").read_bytes()
    assert main(same) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert (generated / "data" / "train-00000-of-00001.parquet").read_bytes() == before
    other = [*same[:6], "4", *same[7:]]
    assert main(other) == 2
    assert "seed" in capsys.readouterr().err


@pytest.fixture
def beam_worker_pool():
    """An external pool of Beam SDK workers, as a portable runner's machines run them: its address."""
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main", f"--service_port={port}"]
    pool = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):  # up once it listens
            with socket.socket() as s:
                if s.connect_ex(("localhost", port)) == 0:
                    break
            assert pool.poll() is None, "the worker pool exited"
            time.sleep(0.1)
        yield f"localhost:{port}"
    finally:
        pool.kill()
        pool.wait()


def test_same_seed_same_dataset_on_every_runner_and_resume_after_losing_the_outputs(
    tmp_path, capsys, beam_worker_pool, monkeypatch
):
    import opsynth.pipeline.planning
    import opsynth.pipeline.round_pipelines

    # A pilot of 4 candidates: several rounds, the next one's CPU stages made during each execution. A window no
    # task can leave: timing noise at a window's edge may legitimately change a verdict.
    monkeypatch.setattr(opsynth.pipeline.planning, "PILOT_CANDIDATES", 4)
    jobs = []
    one_pipeline = opsynth.pipeline.round_pipelines.run_pipeline
    monkeypatch.setattr(
        opsynth.pipeline.round_pipelines, "run_pipeline", lambda *a: jobs.append(a[0]) or one_pipeline(*a)
    )
    argv = ["--num-samples", "10", "--seed", "11", *TINY, "--no-compile-check", "--runtime-window-ms", "0,10000"]
    assert main(["generate", "--out", str(tmp_path / "a"), *argv]) == 0
    shown = capsys.readouterr()
    assert "round 0:" in shown.err and shown.out.startswith("wrote 10 rows to ")
    rounds = len(json.loads((tmp_path / "a" / "stats.json").read_text())["rounds"])
    assert rounds >= 2 and len(jobs) >= 2 * rounds  # in this process: its CPU stages and its execution apart
    multi = ["--direct_num_workers", "2", "--direct_running_mode", "multi_processing"]
    assert main(["generate", "--out", str(tmp_path / "c"), *argv, *multi, "--quiet"]) == 0
    shown = capsys.readouterr()
    assert shown.out.startswith("wrote 10 rows to ") and shown.out.count("\n") == 1 and not shown.err
    # The portable runner, with its SDK workers in an external pool, rounds and checkpoints in a separate work
    # folder (an object store on a distributed runner); its progress reaches this terminal from the checkpoints.
    portable = ["--runner", "PortableRunner", "--job_endpoint", "embed", "--environment_type", "EXTERNAL",
                "--environment_config", beam_worker_pool]  # fmt: skip
    jobs.clear()
    assert main(["generate", "--out", str(tmp_path / "d"), "--work-dir", str(tmp_path / "work"), *argv, *portable]) == 0
    shown = capsys.readouterr()
    # One job per round on a distributed runner (its execution and the next round's CPU stages), and round 0's
    # CPU stages; no other round is prepared apart (a round planned ahead but not needed may add one job).
    assert "prepared in the round before's job" in shown.err
    assert rounds + 1 <= len(jobs) <= rounds + 2
    assert re.search(r"\n  executed \d+ of at most \d+ candidates, kept \d+ of the \d+ needed", shown.err), shown.err
    assert sorted(p.name for p in (tmp_path / "d" / ".opsynth").iterdir()) == ["config.json", "lock"]
    assert (tmp_path / "work" / "round-00000" / "_SUCCESS").exists()
    ids = [load_dataset(str(tmp_path / d), split="train")["id"] for d in "acd"]
    assert ids[0] == ids[1] == ids[2]  # in-process, multi-process and portable runs: the same dataset
    capsys.readouterr()  # what loading them printed (datasets' own progress bars)
    # A run killed after its rounds but before its final files resumes from the finished rounds; asked for
    # JSON, it says so in one line on stdout, and nothing else anywhere.
    for name in ("stats.json", "README.md"):
        (tmp_path / "a" / name).unlink()
    assert main(["generate", "--out", str(tmp_path / "a"), *argv, "--json"]) == 0
    shown = capsys.readouterr()
    summary = json.loads(shown.out)
    assert (
        summary["rows"] == 10
        and summary["folder"] == str(tmp_path / "a")
        and sum(summary["rows_per_data_source"].values()) == 10
    )
    assert summary["funnel"]["select"] == 10 and summary["funnel"]["compose"] >= 10 and not shown.err
    stats = json.loads((tmp_path / "a" / "stats.json").read_text())
    assert all(r["resumed"] for r in stats["rounds"])
    assert load_dataset(str(tmp_path / "a"), split="train")["id"] == ids[0]


def test_transformers_rows_are_standalone_tasks(tmp_path):
    out = tmp_path / "tf"
    argv = ["generate", "--out", str(out), "--num-samples", "6", "--mixture", "torch2=50,transformers=50", *TINY,
            "--no-compile-check"]  # fmt: skip
    assert main(argv) == 0
    ds = load_dataset(str(out), split="train")
    rows = [r for r in ds if r["data_source"] == "transformers"]
    assert len(rows) == 3
    for row in rows:
        (name,) = json.loads(row["ops"])
        assert row["num_ops"] == 1 and name in row["code"]
        task = load_task(row["code"])
        with torch.no_grad():
            task.model_class(*task.get_init_inputs()).eval()(*task.get_inputs())


def test_compare_reports_the_folder_beside_the_released_set(generated, ops6k_examples, tmp_path, capsys):
    report = tmp_path / "validate.jsonl"
    report.write_text(json.dumps({"verdict": "keep", "eager_ms": 2.0, "kb_ast_similarity": 0.3}) + "\n")
    out = tmp_path / "report"
    argv = ["compare", str(generated), "--released", str(ops6k_examples), "--released-report", str(report),
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    text = (out / "comparison.md").read_text()
    assert "| torch#2 | 20 | 83.33 % | 5,026 | 83.77 % |" in text  # this set's mixture beside the released one
    # Every generated row's ops match its code, by either reading; the released examples' do less often.
    assert "| every listed operator occurs in the code | 24 of 24 (100.0 %) | " in text
    assert "| `ops` lists exactly the operators `forward` applies, in order | 24 of 24 (100.0 %) | " in text
    assert "Spearman" in text
    # A 24-row set leaves most released operators out: named, the most used first, by whether the catalog has them.
    assert "Excluded from the catalog (the reason is in `opsynth catalog`), " in text
    assert "torch.masked_select (47)" in text  # its output length depends on its input's values
    assert re.search(r"In the catalog, but in no row kept, \d+, the most used first \(uses in the released set\): "
                     r"[\w.]+ \(\d+\), ", text)  # fmt: skip
    assert text.count("input tensors by dtype {'float32': ") == 2  # this set's inputs and the released ones
    for name in ("top_operators", "eager_time", "kb_similarity"):
        assert (out / "figures" / f"{name}.png").stat().st_size > 1000
    assert re.search(r"Wall time \d+ s over \d+ rounds\.", text)
    assert main(["compare", str(tmp_path), "--out", str(out)]) == 2  # not a dataset folder
    assert "not a generated dataset folder" in capsys.readouterr().err


def test_compare_gives_a_resumed_runs_wall_time_over_its_processes(generated, tmp_path):
    resumed = tmp_path / "resumed"
    shutil.copytree(generated, resumed, ignore=shutil.ignore_patterns(".opsynth"))
    stats = json.loads((resumed / "stats.json").read_text())
    stats["timings_s"]["sessions"] = [{"started": "a", "wall_s": 500.0, "finished": False},
                                      {"started": "b", "wall_s": 120.4, "finished": True}]  # fmt: skip
    stats["timings_s"]["sessions_total"] = 620.4
    (resumed / "stats.json").write_text(json.dumps(stats))
    assert main(["compare", str(resumed), "--out", str(tmp_path / "report")]) == 0
    assert "Wall time 620 s over" in (tmp_path / "report" / "comparison.md").read_text()
    assert "in 2 processes (stopped and resumed): 500 + 120 s." in (tmp_path / "report" / "comparison.md").read_text()


def test_a_large_rounds_cpu_stages_use_several_processes_unless_the_user_chose(monkeypatch):
    import opsynth.pipeline.round_pipelines
    from opsynth.pipeline.round_pipelines import prepare_args

    monkeypatch.setattr(opsynth.pipeline.round_pipelines.os, "cpu_count", lambda: 16)
    assert prepare_args([], 4096) == ["--direct_num_workers", "8", "--direct_running_mode", "multi_processing",
                                       "--default_sdk_harness_log_level", "WARNING"]  # fmt: skip
    assert prepare_args([], 500) == []  # a small round: starting processes costs more than it saves
    chosen = ["--direct_num_workers", "2"]
    assert prepare_args(chosen, 4096) == chosen
    assert prepare_args(["--runner", "DataflowRunner"], 4096) == ["--runner", "DataflowRunner"]
    monkeypatch.setattr(opsynth.pipeline.round_pipelines.os, "cpu_count", lambda: 2)
    assert prepare_args([], 4096) == []


def test_workers_start_early_only_where_the_pipelines_run_in_this_process():
    from opsynth.pipeline.round_pipelines import runs_in_this_process

    assert runs_in_this_process([])
    assert runs_in_this_process(["--direct_running_mode", "multi_threading", "--direct_num_workers", "2"])
    assert not runs_in_this_process(["--direct_running_mode", "multi_processing", "--direct_num_workers", "2"])
    assert not runs_in_this_process(["--runner", "DataflowRunner"])


def test_a_run_in_this_process_starts_its_two_pools_once(pools_made, tmp_path):
    """The execution's workers and the shape check's, each started once for all the rounds' pipelines (Beam's
    Shared alone would keep only the last one acquired alive, and the other would start again each pipeline)."""
    made = pools_made
    argv = ["generate", "--out", str(tmp_path / "o"), "--num-samples", "6", "--seed", "4", *TINY, "--no-compile-check",
            "--runtime-window-ms", "0,10000"]  # fmt: skip
    assert main(argv) == 0
    assert sorted(pool.cfg.device for pool in made) == ["cpu", "cpu"] and len({pool.cfg for pool in made}) == 2
    assert not any(pool._finalizer.alive for pool in made)


def test_both_pools_import_what_the_run_preloads_as_their_workers_start(pools_made):
    from opsynth.filters.execution import ExecutionConfig
    from opsynth.pipeline.run import run_pools

    cfg = ExecutionConfig(device="cpu", runtime_window_ms=(0.0, 20.0), timeout_s=10.0, compile_check=False, workers=1)
    with run_pools(cfg, True, ("json",)) as workers:
        assert workers.execution_pool.preload == workers.shape_pool.preload == ("json",)
        assert workers.execution_pool.start_nice > 0 == workers.shape_pool.start_nice  # the execution's start yields
    assert len(pools_made) == 2


def test_a_round_is_one_batch_where_the_pipelines_run_in_this_process():
    from opsynth.commands.generate import default_batch_size
    from opsynth.config import MAX_ROUND_CANDIDATES

    assert default_batch_size(14, []) > MAX_ROUND_CANDIDATES + 100  # a round's plan may pass the cap a little
    assert default_batch_size(14, ["--direct_running_mode", "multi_processing"]) == 64 * 14
    assert default_batch_size(2, ["--runner", "DataflowRunner"]) == 128


def test_cpu_stages_fall_back_to_this_process_when_several_processes_fail(monkeypatch, tmp_path, capsys):
    import opsynth.pipeline.round_pipelines

    monkeypatch.setattr(
        opsynth.pipeline.round_pipelines, "prepare_args", lambda args, n: [*args, "--runner", "NoSuchRunner"]
    )
    argv = ["generate", "--out", str(tmp_path / "o"), "--num-samples", "4", "--seed", "2", *TINY, "--no-compile-check"]
    assert main(argv) == 0
    assert "the CPU stages on several processes failed" in capsys.readouterr().err
    assert len(load_dataset(str(tmp_path / "o"), split="train")) == 4


def test_the_next_rounds_cpu_stages_run_beside_this_ones_execution_and_make_the_same_dataset(
    tmp_path, monkeypatch, capsys
):
    """A pilot of 4 candidates for 12 rows: round 1 is planned and prepared while round 0 executes. A run that
    prepares it only once round 0 is done (as a resumed one may) makes the same dataset."""
    import opsynth.pipeline.planning
    import opsynth.pipeline.round_pipelines

    monkeypatch.setattr(opsynth.pipeline.planning, "PILOT_CANDIDATES", 4)
    argv = ["--num-samples", "12", "--mixture", "torch2=100", "--seed", "5", *TINY, "--no-compile-check",
            "--runtime-window-ms", "0,10000"]  # fmt: skip
    assert main(["generate", "--out", str(tmp_path / "beside"), *argv]) == 0
    assert "round 1: 47 candidates, prepared beside the round before" in capsys.readouterr().err
    monkeypatch.setattr(opsynth.pipeline.round_pipelines.Beside, "start", lambda self, prepare, log: None)
    assert main(["generate", "--out", str(tmp_path / "after"), *argv]) == 0
    assert "prepared beside" not in capsys.readouterr().err
    beside, after = (load_dataset(str(tmp_path / d), split="train")["id"] for d in ("beside", "after"))
    assert beside == after and len(beside) == 12
    plans = [
        json.loads((tmp_path / "beside" / ".opsynth" / f"round-{r:05d}" / "plan.json").read_text()) for r in (0, 1)
    ]
    assert plans == [{"torch#2": 4}, {"torch#2": 47}]


def test_an_exhausted_source_is_retired_and_the_set_keeps_its_size(tmp_path, monkeypatch, kernelbench_parquet):
    import opsynth.pipeline.planning

    # Pilots of half the missing rows leave both sources short after round 0, and a yield floor above 100 %
    # retires every short source that made a candidate: torch#1 first, its rows going to torch#2, which has no
    # heir left and so is filled by later rounds.
    monkeypatch.setattr(opsynth.pipeline.planning, "INITIAL_OVERSAMPLING", 0.5)
    monkeypatch.setattr(opsynth.pipeline.planning, "EXHAUSTION_YIELD", 1.01)
    monkeypatch.setattr(opsynth.pipeline.planning, "EXHAUSTION_MIN_CANDIDATES", 1)
    out = tmp_path / "out"
    argv = ["generate", "--out", str(out), "--num-samples", "12", "--mixture", "torch1=50,torch2=50", "--seed", "4",
            "--no-compile-check", *TINY, "--kernelbench", str(kernelbench_parquet)]  # fmt: skip
    assert main(argv) == 0
    stats = json.loads((out / "stats.json").read_text())
    rows = stats["rows_per_data_source"]
    (retired,) = stats["exhausted_data_sources"].items()
    assert retired[0] == "torch#1" and retired[1]["after_round"] == 0 and retired[1]["moved_to"] == "torch#2"
    assert rows["torch#1"] == retired[1]["rows"] <= 4 and rows["torch#1"] + rows["torch#2"] == 12
    requested = stats["requested_quota_per_data_source"]
    assert {s: n for s, n in requested.items() if n} == {"torch#1": 6, "torch#2": 6}
    assert stats["quota_per_data_source"] == rows
    card = (out / "README.md").read_text()
    assert f"torch#1 was asked for 6 rows but stopped at {rows['torch#1']}" in card
    assert len(load_dataset(str(out), split="train")) == 12
    for round_dir in sorted((out / ".opsynth").glob("round-*")):
        assert json.loads((round_dir / "plan.json").read_text())  # every round wrote the plan it followed


def test_tasks_of_other_dtypes_compute_in_them_and_the_card_says_so(tmp_path):
    out = tmp_path / "dt"
    argv = ["generate", "--out", str(out), "--num-samples", "6", "--mixture", "torch2=100", "--seed", "8", *TINY,
            "--no-compile-check", "--dtypes", "bfloat16=1,float16=1"]  # fmt: skip
    assert main(argv) == 0
    seen = set()
    for row in load_dataset(str(out), split="train"):
        (dtype,) = {s["dtype"] for s in row["input_shapes"]}
        seen.add(dtype)
        assert f"dtype=torch.{dtype}" in row["code"]
        task = load_task(row["code"])
        with torch.no_grad():
            outs = flatten_outputs(task.model_class(*task.get_init_inputs()).eval()(*task.get_inputs()))
        assert all(t.dtype == getattr(torch, dtype) for t in outs if t.is_floating_point())
    assert seen <= {"bfloat16", "float16"} and seen
    assert json.loads((out / "stats.json").read_text())["config"]["dtypes"] == {"bfloat16": 1.0, "float16": 1.0}
    assert "bfloat16 50 %, float16 50 % of tasks" in (out / "README.md").read_text()
