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
from tests import fixtures

TINY = fixtures.TINY_RUN


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
    assert stats["config"]["compile_draws"] == 5
    assert "on 5 input draws where an output is discrete" in card


def test_rerun_of_a_finished_folder_does_nothing_and_other_options_are_refused(generated, kernelbench_parquet, capsys):
    same = _generated_argv(generated, kernelbench_parquet)
    before = (generated / "data" / "train-00000-of-00001.parquet").read_bytes()
    assert main(same) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert (generated / "data" / "train-00000-of-00001.parquet").read_bytes() == before
    other = [*same[:6], "4", *same[7:]]
    assert main(other) == 2
    assert "seed" in capsys.readouterr().err


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
