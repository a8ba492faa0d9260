"""Each composite under Beam's TestPipeline, asserted on its kept and rejected outputs."""

import logging
import math
import shutil

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.utils.shared import Shared

from opsynth.config import WORKLOADS
from opsynth.filters.execution import ExecutionConfig
from opsynth.pipeline import host_costs, parallel
from opsynth.pipeline.dedup_stage import DedupWithinSet, RuledOutEarlier
from opsynth.pipeline.engines import local_engine
from opsynth.pipeline.execution_stage import ExecuteCandidates, execution_order
from opsynth.pipeline.progress import Checkpointer, Tally
from opsynth.pipeline.stages import (
    KEPT,
    REJECTED,
    CheckShapes,
    ComposeCandidates,
    composed,
    shape_verdicts,
    warm_composition,
)
from opsynth.reasons import KEEP, RUNTIME_BELOW_WINDOW, Verdict
from opsynth.records import Candidate, CandidateSpec, candidate_seed
from tests import fixtures


def _test_pipeline() -> BeamTestPipeline:
    """Beam's TestPipeline on the engine a run pins (pipeline.engines): left to itself, Beam's local runner tries
    to download another engine for each pipeline and leaves a folder in the temporary directory each time."""
    return BeamTestPipeline(runner=local_engine(PipelineOptions()))


def _candidate(index: int, code: str) -> Candidate:
    from opsynth.filters.dedup import dedup_key

    return Candidate("torch#1", index, index, ("nn.Linear",), code, (), dedup_key(code))


def test_compose_candidates_yields_one_rendered_candidate_per_spec():
    specs = [CandidateSpec("torch#2", i, candidate_seed(0, "torch#2", i)) for i in range(6)]
    with _test_pipeline() as p:
        out = p | beam.Create(specs) | ComposeCandidates(WORKLOADS["tiny"])
        assert_that(out[KEPT] | beam.Map(lambda c: (c.index, len(c.ops), "class Model" in c.code)),
                    equal_to([(i, 2, True) for i in range(6)]))  # fmt: skip
        assert_that(out[REJECTED], equal_to([]), label="no rejections")


def test_composing_throwaway_candidates_first_changes_no_candidate():
    specs = [
        CandidateSpec(s, i, candidate_seed(3, s, i)) for s in ("torch#1", "torch#3", "transformers") for i in range(4)
    ]
    before = [composed(spec, WORKLOADS["tiny"], "ops6k") for spec in specs]
    warm_composition(["torch#1", "torch#3", "transformers"], WORKLOADS["tiny"], "ops6k")
    assert [composed(spec, WORKLOADS["tiny"], "ops6k") for spec in specs] == before


def test_check_shapes_routes_a_mismatch_to_rejected_with_its_reason_and_a_crash_costs_its_candidate_only():
    cfg = ExecutionConfig(device="cpu", runtime_window_ms=(0.0, 1e4), timeout_s=30, compile_check=False, workers=1)
    sources = (fixtures.GOOD, fixtures.SHAPE_MISMATCH, fixtures.SEGFAULT, fixtures.CONSTANT)
    candidates = [_candidate(i, source) for i, source in enumerate(sources)]
    with _test_pipeline() as p:
        out = p | beam.Create(candidates) | CheckShapes(cfg)
        assert_that(out[KEPT] | beam.Map(lambda c: c.index), equal_to([0, 3]))
        assert_that(out[REJECTED] | beam.Map(lambda r: (r.candidate.index, r.reason, r.stage)),
                    equal_to([(1, "shape_error", "shape_check"), (2, "crash", "shape_check")]),
                    label="rejected")  # fmt: skip


def test_dedup_keeps_the_first_of_each_program_and_drops_keys_seen_before(tmp_path):
    edited = fixtures.GOOD.replace("return torch", "# same program\n        return torch")
    candidates = [_candidate(5, fixtures.GOOD), _candidate(2, edited), _candidate(7, fixtures.CONSTANT),
                  _candidate(9, fixtures.VANISHING)]  # fmt: skip
    earlier = tmp_path / "seen-keys.txt"  # what an earlier round left: the keys it executed
    earlier.write_text(f"{_candidate(0, fixtures.VANISHING).dedup_key}\n")
    with _test_pipeline() as p:
        out = p | beam.Create(candidates) | DedupWithinSet(seen_files=[str(earlier)])
        assert_that(out[KEPT] | beam.Map(lambda c: c.index), equal_to([2, 7]))
        assert_that(out[REJECTED] | beam.Map(lambda r: (r.candidate.index, r.reason)),
                    equal_to([(5, "duplicate"), (9, "duplicate")]), label="rejected")  # fmt: skip


def test_dedup_finds_every_earlier_key_among_many_rounds_files_and_passes_on_no_other(tmp_path):
    """Each candidate meets its own key's entries, whatever file they are in, a damaged line matches nothing,
    and of the earlier rounds' entries only those of this round's keys go on to the join (however many keys
    the run has seen, the join holds this round's)."""
    from opsynth.pipeline.dedup_stage import entries_for

    candidates = [Candidate("torch#2", i, i, (f"op{i}",), "", (), f"key-{i}") for i in range(300)]
    files = []
    for r, keys in enumerate((range(0, 100), range(100, 150), range(1000, 5000))):
        files.append(tmp_path / f"seen-{r}.txt")
        files[-1].write_text("".join(f"key-{k}\n" for k in keys) + "\ufffdkey-299\n\n")
    with _test_pipeline() as p:
        out = p | beam.Create(candidates) | DedupWithinSet(seen_files=[str(f) for f in files])
        assert_that(out[KEPT] | beam.Map(lambda c: c.index), equal_to(list(range(150, 300))))
    wanted, keys = [c.dedup_key for c in candidates], lambda line: [(line, 1)] if line else []
    assert list(entries_for(str(files[2]), keys, wanted)) == []
    assert list(entries_for(str(files[1]), keys, wanted)) == [(f"key-{k}", 1) for k in range(100, 150)]


def test_dedup_sends_no_more_candidates_of_an_operator_graph_than_selection_can_take(tmp_path):
    from opsynth.filters.dedup import op_graph_hash

    relu = fixtures.GOOD.replace("torch.relu", "torch.sigmoid")
    linear = [_candidate(4, fixtures.GOOD), _candidate(1, relu)]  # two programs, one graph: ("nn.Linear",)
    other = Candidate("torch#2", 3, 3, ("nn.Linear", "torch.relu"), fixtures.CONSTANT, (), "k3")
    graph = op_graph_hash(("nn.Linear",))
    earlier = tmp_path / "graph-rows.jsonl"  # rows two earlier rounds selected per graph, and a damaged line
    before = tmp_path / "graph-rows-0.jsonl"  # a round before them, which selected none of this graph
    before.write_text(f'["torch#1", "{graph}", 0]\n')
    for rows, kept in ((0, [1, 3]), (1, [3])):  # none selected yet: the lowest index goes; at the cap: none
        earlier.write_text(f'["torch#1", "{graph}", {rows}]\n["torch#2", "{graph}", 5]\n["torch#1", 7\n')
        with _test_pipeline() as p:
            out = (
                p
                | beam.Create([*linear, other])
                | DedupWithinSet({"torch#1": 2, "torch#2": 1}, graph_files=[str(before), str(earlier), str(earlier)])
            )
            assert_that(out[KEPT] | beam.Map(lambda c: c.index), equal_to(kept))
            assert_that(out[REJECTED] | beam.Map(lambda r: (r.reason, r.stage)),
                        equal_to([("duplicate", "dedup")] * (3 - len(kept))), label="rejected")  # fmt: skip


@pytest.mark.parametrize("keys_final", [True, False])
def test_what_earlier_rounds_rule_out_goes_before_the_shape_check_and_the_same_candidates_come_through(
    tmp_path, keys_final
):
    """Candidates of a graph that earlier rounds' rows hold at its cap, and (where no sizing can change a key)
    of a task an earlier round ran, are dropped before the CPU stages; the dedup after them keeps exactly what it
    keeps without that, repeats within the round included."""
    from opsynth.filters.dedup import op_graph_hash

    graphs = [("op-a",), ("op-b",), ("op-c",)]
    candidates = [Candidate("torch#2", i, i, graphs[i % 3], "", (), f"key-{i % 7}") for i in range(21)]
    seen = tmp_path / "seen-keys.txt"
    seen.write_text("key-1\nkey-5\n")
    rows = tmp_path / "graph-rows.jsonl"  # op-a at the cap of 2, op-b one row short of it
    rows.write_text(f'["torch#2", "{op_graph_hash(graphs[0])}", 2]\n["torch#2", "{op_graph_hash(graphs[1])}", 1]\n')
    caps, files = {"torch#2": 2}, ([str(seen)], [str(rows)])
    with _test_pipeline() as p:
        made = p | beam.Create(candidates)
        alone = made | "Alone" >> DedupWithinSet(caps, *files)
        early = made | RuledOutEarlier(caps, *files, keys_final=keys_final)
        after = early[KEPT] | "After" >> DedupWithinSet(caps, *files)
        index = lambda c: c.index  # noqa: E731
        assert_that(after[KEPT] | "AfterKept" >> beam.Map(index), equal_to([2, 4]), label="after")
        assert_that(alone[KEPT] | "AloneKept" >> beam.Map(index), equal_to([2, 4]), label="alone")
        ruled_out = [i for i in range(21) if i % 3 == 0 or (keys_final and i % 7 in (1, 5))]
        assert_that(early[REJECTED] | beam.Map(lambda r: (r.candidate.index, r.reason, r.stage)),
                    equal_to([(i, "duplicate", "earlier_rounds") for i in ruled_out]), label="early")  # fmt: skip


def test_pipelines_given_one_pool_handle_start_execution_workers_once(pools_made, tmp_path):
    """A run's rounds are separate pipelines: with one handle their execution stages share a worker pool."""
    made = pools_made
    cfg = ExecutionConfig(device="cpu", runtime_window_ms=(0.0, 1e4), timeout_s=30, compile_check=False,
                          warmup=0, iters=1, workers=1)  # fmt: skip
    handle = Shared()
    for index in (1, 2):
        with _test_pipeline() as p:
            out = (
                p
                | beam.Create([_candidate(index, fixtures.GOOD)])
                | ExecuteCandidates(cfg, 1, WORKLOADS["tiny"], str(tmp_path / "progress"), pool=handle)
            )
            assert_that(out[KEPT] | beam.Map(lambda c: c.index), equal_to([index]))
    assert len(made) == 1 and made[0]._finalizer.alive
    made[0].close()
    assert not made[0]._finalizer.alive and not any(w.alive() for w in made[0]._workers)


def test_a_batch_is_checkpointed_as_its_results_come_in_and_the_progress_reported(monkeypatch, capsys):
    import sys

    import opsynth.pipeline.progress
    from opsynth.pipeline.display import LINES, Display

    monkeypatch.setattr(opsynth.pipeline.display, "_active", Display(LINES, file=sys.stderr))
    recorded: list[list[int]] = []

    class Progress:
        def record(self, entered, results):
            recorded.append([c.index for c in entered])

    candidates = [_candidate(i, fixtures.GOOD) for i in range(3)]
    tally = Tally()
    tally.start(3, 2)
    checkpoint = Checkpointer(Progress(), candidates, tally)
    checkpoint.add(2, (candidates[2], Verdict(KEEP, ""), 0))
    checkpoint.add(0, (candidates[0], Verdict(RUNTIME_BELOW_WINDOW, "eager 0.1 ms < 1.0 ms"), 2))
    assert recorded == []  # within the interval: held
    checkpoint.flush()
    assert recorded == [[2, 0]]
    assert "executed 2 of at most 3 candidates, kept 1 of the 2 needed (50%)" in capsys.readouterr().err
    monkeypatch.setattr(opsynth.pipeline.progress, "CHECKPOINT_EVERY_S", 0.0)
    checkpoint.add(1, (candidates[1], Verdict(KEEP, ""), 0))
    checkpoint.flush()  # nothing left to write
    assert recorded == [[2, 0], [1]]
    assert "executed 3 of at most 3 candidates, kept 2 of the 2 needed (100%)" in capsys.readouterr().err


def test_the_progress_line_says_what_is_left_at_the_rate_kept_candidates_come_in():
    tally = Tally()
    tally.start(400, 100)
    for reason in [KEEP] * 25 + [RUNTIME_BELOW_WINDOW] * 15:
        tally.add(Verdict(reason, ""))
    line = tally.line(60.0)  # 25 of 100 kept in a minute: three more minutes
    assert (
        line == "executed 40 of at most 400 candidates, kept 25 of the 100 needed (25%) (60 s, 0.7/s, about 3 min left)"
    )
    unbounded = Tally()
    unbounded.start(10, None)  # every candidate runs: all of them are needed
    unbounded.add(Verdict(KEEP, ""))
    assert unbounded.line(2.0).endswith("kept 1 of the 10 needed (10%) (2 s, 0.5/s, about 18 s left)")


def test_an_execution_stage_asked_for_one_accepted_candidate_runs_no_more_than_it_needs(tmp_path, monkeypatch):
    """One worker: each candidate's verdict is in before the next is handed out, so after the first accepted
    one every later candidate of its data source is skipped, checkpointing nothing."""
    from opsynth.pipeline.progress import ExecutionProgress

    cfg = ExecutionConfig(device="cpu", runtime_window_ms=(0.0, 1e4), timeout_s=30, compile_check=False,
                          warmup=0, iters=1, workers=1)  # fmt: skip
    first = [_candidate(0, fixtures.CONSTANT), _candidate(1, fixtures.GOOD)]
    rest = [_candidate(i, fixtures.GOOD.replace("return", f"# {i}\n        return")) for i in range(2, 5)]
    progress = tmp_path / "progress"
    with _test_pipeline() as p:
        out = (
            p
            | beam.Create([*rest, *first])
            | ExecuteCandidates(cfg, 5, WORKLOADS["tiny"], str(progress), wanted={"torch#1": 1})
        )
        assert_that(out[KEPT] | beam.Map(lambda c: c.index), equal_to([1]))
        assert_that(out[REJECTED] | beam.Map(lambda r: (r.candidate.index, r.reason, r.stage)),
                    equal_to([(0, "indistinguishable_outputs", "execute")]
                             + [(i, "not_needed", "execute") for i in range(2, 5)]), label="rejected")  # fmt: skip
    assert len(ExecutionProgress(str(progress)).load().done) == 2
    assert host_costs.for_run(str(progress)).executions() == 2  # what ran taught the run's costs; skipped, nothing
    monkeypatch.setattr(host_costs, "_runs", {})  # resumed in a new process: its checkpoints teach the same
    with _test_pipeline() as p:
        (
            p
            | beam.Create([*rest, *first])
            | ExecuteCandidates(cfg, 5, WORKLOADS["tiny"], str(progress), wanted={"torch#1": 1})
        )
    assert host_costs.for_run(str(progress)).executions() == 2


def test_a_first_try_has_a_ceiling_on_cuda_only_four_times_the_calibration_aim_however_it_is_started():
    import dataclasses

    from opsynth.pipeline.execution_stage import execution_job, first_job, first_try_ceiling

    cuda = ExecutionConfig(device="cuda", runtime_window_ms=(1.0, 100.0), timeout_s=30, compile_check=True)
    assert first_try_ceiling(cuda) == pytest.approx(8.0, rel=0.01)  # the aim is 2.0 ms
    assert first_try_ceiling(dataclasses.replace(cuda, device="cpu")) is None  # load-dependent there
    candidate = _candidate(0, fixtures.GOOD)
    assert first_job(candidate, cuda) == dataclasses.replace(
        execution_job(candidate), ceiling_ms=first_try_ceiling(cuda)
    )


def test_a_round_counts_its_executions_and_of_them_the_first_tries_stopped_at_their_ceiling_or_run_alone():
    from opsynth.filters.calibration import CEILING_STOP
    from opsynth.filters.worker_budgets import MEMORY_RETRY
    from opsynth.pipeline.rounds import executions, marked
    from opsynth.records import Rejection

    def executed(steps: int, stopped: bool, alone: bool = False) -> Candidate:
        return _candidate(steps, fixtures.GOOD).measured(
            {"calibration_steps": steps}
            | ({CEILING_STOP: 9.5} if stopped else {})
            | ({MEMORY_RETRY: True} if alone else {})
        )

    accepted = [executed(0, False), executed(1, True), executed(2, True, alone=True)]
    rejected = [Rejection(executed(1, False), RUNTIME_BELOW_WINDOW, "execute", ""),
                Rejection(executed(0, False, alone=True), "not_needed", "execute", ""),  # never ran
                Rejection(executed(0, False), "duplicate", "dedup", "")]  # fmt: skip
    assert executions(accepted, rejected) == 8
    assert marked(CEILING_STOP, accepted, rejected) == 2 and marked(MEMORY_RETRY, accepted, rejected) == 1


def test_a_batch_runs_its_heaviest_data_sources_first_and_each_source_in_index_order():
    from dataclasses import replace

    light = [replace(_candidate(i, fixtures.GOOD), data_source="torch#2") for i in range(40)]
    heavy = [replace(_candidate(i, fixtures.GOOD), data_source="transformers") for i in range(4)]
    order = execution_order([*reversed(heavy), *reversed(light)])
    assert [c.index for c in order if c.data_source == "torch#2"] == list(range(40))
    assert [c.index for c in order if c.data_source == "transformers"] == list(range(4))
    last_heavy = max(k for k, c in enumerate(order) if c.data_source == "transformers")
    assert last_heavy < len(order) / 4  # none of them at the end, where the round would wait for it
    assert order[-1].data_source == "torch#2"


def test_the_shape_check_hands_out_transformers_candidates_first_and_gives_verdicts_in_the_batchs_order():
    class Recorder:
        handed = ()

        def run(self, jobs):
            self.handed = [job.key for job in jobs]
            return [Verdict(KEEP, job.key) for job in jobs]

    batch = [Candidate(source, i, i, (), f"# {source} {i}") for i, source in
             enumerate(["torch#1", "transformers", "torch#2", "transformers", "torch#1"])]  # fmt: skip
    pool = Recorder()
    verdicts = shape_verdicts(pool, batch)
    assert pool.handed == ["transformers/1", "transformers/3", "torch#1/0", "torch#2/2", "torch#1/4"]
    assert [v.detail for v in verdicts] == [f"{c.data_source}/{c.index}" for c in batch]


@pytest.mark.parametrize("helpers", [0, 2])
def test_the_shape_check_sizes_candidates_toward_the_window_by_their_predicted_time(helpers):
    """At a (made-up) speed, every candidate's forward cost predicts its time: those far from the calibration aim
    are made again from their seeds at a scaled batch (on the CPU stages' helpers, where there are), within the
    element budget; every kept one carries its prediction, and a rescaled one its new sizes."""
    from opsynth.config import CALIBRATION_TARGET, SIZE_SLACK
    from opsynth.device_speed import DeviceSpeed
    from opsynth.pipeline.candidates import make_candidate
    from opsynth.pipeline.stages import Sizing

    workload = WORKLOADS["tiny"]
    window = (1.0, 100.0)
    aim = window[0] ** (1 - CALIBRATION_TARGET) * window[1] ** CALIBRATION_TARGET
    sizing = Sizing(DeviceSpeed(bytes_per_s=1e8, flops_per_s=1e9, kernel_ms=0.001), window, workload)
    specs = [CandidateSpec("torch#2", i, candidate_seed(4, "torch#2", i)) for i in range(12)]
    candidates = [make_candidate(spec, workload) for spec in specs]
    before = {c.index: _predicted(c.code, sizing.speed) for c in candidates}
    cfg = ExecutionConfig(device="cpu", runtime_window_ms=(0.0, 1e4), timeout_s=30, compile_check=False, workers=1)
    with parallel.helping(helpers), _test_pipeline() as p:
        out = p | beam.Create(candidates) | CheckShapes(cfg, Shared(), sizing=sizing)
        kept = out[KEPT] | beam.Map(lambda c: (c.index, c.batch_scale, c.measurements.get("predicted_ms"),
                                               sizing.speed.predicted_ms(c.measurements["cost"])))  # fmt: skip

        def check(rows):
            assert len(rows) == 12
            assert all(recorded == round(now, 4) for _, _, recorded, now in rows)
            moved = [(index, scale, ms) for index, scale, ms, _ in rows if scale != 1.0]
            assert len(moved) >= 6  # most of the tiny workload is far from this window at this speed
            for index, scale, ms in moved:  # moved toward the aim, never past it by more than the slack
                assert abs(math.log(ms / aim)) < abs(math.log(before[index] / aim))
                assert aim / SIZE_SLACK[0] <= ms <= aim * SIZE_SLACK[1] or (scale > 1) == (ms < aim)

        assert_that(kept, check)


def test_a_candidate_the_sizing_leaves_far_above_the_window_is_rejected_unrun():
    """Its sizes could not be made smaller (at this made-up speed, each kernel alone takes 10 ms): run, its first
    forwards would hold the GPU for long while other tasks' timings waited."""
    from opsynth.config import PREDICTED_ABOVE_FACTOR
    from opsynth.device_speed import DeviceSpeed
    from opsynth.pipeline.candidates import make_candidate
    from opsynth.pipeline.stages import Sizing
    from opsynth.reasons import RUNTIME_ABOVE_WINDOW

    workload = WORKLOADS["tiny"]
    window = (1.0, 2.0)
    sizing = Sizing(DeviceSpeed(bytes_per_s=1e12, flops_per_s=1e13, kernel_ms=10.0), window, workload)
    candidates = [make_candidate(CandidateSpec("torch#2", i, candidate_seed(5, "torch#2", i)), workload)
                  for i in range(12)]  # fmt: skip
    cfg = ExecutionConfig(device="cpu", runtime_window_ms=(0.0, 1e4), timeout_s=30, compile_check=False, workers=1)
    too_slow = PREDICTED_ABOVE_FACTOR * window[1]
    with _test_pipeline() as p:
        out = p | beam.Create(candidates) | CheckShapes(cfg, Shared(), sizing=sizing)
        kept = out[KEPT] | "Kept" >> beam.Map(lambda c: c.measurements["predicted_ms"])
        dropped = out[REJECTED] | "Dropped" >> beam.Map(
            lambda r: (r.reason, r.stage, r.detail.startswith("predicted"), r.candidate.measurements["predicted_ms"])
        )

        def check_dropped(rows):
            assert rows, "some candidates have more kernels than the window's top allows at this speed"
            for reason, stage, predicted, ms in rows:
                assert (reason, stage, predicted) == (RUNTIME_ABOVE_WINDOW, "shape_check", True) and ms > too_slow

        assert_that(dropped, check_dropped, label="dropped")
        assert_that(kept, lambda rows: all(ms <= too_slow for ms in rows), label="kept")


VIEW_ONLY = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x.t()


def get_inputs():
    return [torch.randn(64, 32)]


def get_init_inputs():
    return []
"""


def test_a_candidate_whose_forward_launches_no_kernel_is_rejected_unrun_as_below_the_window():
    """Views of its input alone (a transpose): no size brings its time into the window (measured on one H200:
    about 2 us), so it is not run; a candidate that computes is kept and sized."""
    from opsynth.device_speed import DeviceSpeed
    from opsynth.pipeline.candidates import make_candidate
    from opsynth.pipeline.stages import Sizing

    workload = WORKLOADS["tiny"]
    sizing = Sizing(DeviceSpeed(bytes_per_s=1e8, flops_per_s=1e9, kernel_ms=0.001), (1.0, 100.0), workload)
    view = Candidate("torch#1", 0, 7, ("torch.t",), VIEW_ONLY, ({"shape": [64, 32], "dtype": "float32"},))
    computing = make_candidate(CandidateSpec("torch#2", 1, candidate_seed(5, "torch#2", 1)), workload)
    cfg = ExecutionConfig(device="cpu", runtime_window_ms=(0.0, 1e4), timeout_s=30, compile_check=False, workers=1)
    with _test_pipeline() as p:
        out = p | beam.Create([view, computing]) | CheckShapes(cfg, Shared(), sizing=sizing)
        kept = out[KEPT] | "Kept" >> beam.Map(lambda c: (c.index, c.measurements["predicted_ms"] > 0))
        dropped = out[REJECTED] | "Dropped" >> beam.Map(lambda r: (r.candidate.index, r.reason, r.stage, r.detail))
        assert_that(kept, equal_to([(1, True)]), label="kept")
        assert_that(dropped, equal_to([(0, RUNTIME_BELOW_WINDOW, "shape_check", "its forward launches no kernel "
                                       "(views of its input only): it cannot reach the window, not run")]),
                    label="dropped")  # fmt: skip


def _predicted(code: str, speed) -> float:
    from opsynth.filters.shape_check import check_shapes

    return speed.predicted_ms(check_shapes(code).measurements["cost"])


HINT = "type:nvidia-l4;count:1;install-nvidia-driver"


@pytest.fixture
def built_pipelines():
    """A round's two parts (its CPU stages, its execution) as two pipelines, and both in one, as a distributed
    runner gets a round's execution and the next round's CPU stages; built but not run (so their temporary
    folders, which running removes, are removed here)."""
    from opsynth.config import OPS6K_MIXTURE
    from opsynth.filters.execution import execution_config
    from opsynth.options import GenerateOptions
    from opsynth.pipeline.graph import build_execute, build_prepare
    from opsynth.pipeline.round_pipelines import shape_check_config

    options = GenerateOptions(
        out="o", num_samples=20, seed=1, preset="ops6k", mixture=OPS6K_MIXTURE, op_weights="ops6k", device="cpu",
        workload="tiny", runtime_window_ms=(0.005, 50.0), kernelbench="embedded", similarity_threshold=0.9,
        jaccard_threshold=0.85, compile_check=False, timeout_s=60, workers=2, batch_size=64, accelerator=HINT,
    )  # fmt: skip
    execution = execution_config("cpu", (0.005, 50.0), 60, False, 2)
    prepare, execute, both = beam.Pipeline(), beam.Pipeline(), beam.Pipeline()
    for p in (prepare, both):
        build_prepare(p, [CandidateSpec("torch#1", 0, 0)], options, [], "r1", shape_check_config(execution))
    for p in (execute, both):
        build_execute(p, ["r/prepared-0.jsonl"], options, execution, "r", "progress")
    yield prepare, execute, both
    for p in (prepare, execute, both):
        shutil.rmtree(p.local_tempdir, ignore_errors=True)


def test_building_the_pipelines_prints_no_beam_warning(caplog, request):
    """Beam warns of a DoFn whose process method both yields and returns a value, into the user's terminal."""
    with caplog.at_level(logging.WARNING):
        request.getfixturevalue("built_pipelines")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_only_the_execution_carries_the_accelerator_hint_and_its_candidates_are_reshuffled(built_pipelines):
    """A distributed runner may then run the CPU stages on CPU workers, and spreads a round's candidates."""
    for pipelines in (built_pipelines[:2], built_pipelines[2:]):
        hinted, names = set(), set()
        for p in pipelines:
            proto = p.to_runner_api()
            for transform in proto.components.transforms.values():
                names.add(transform.unique_name)
                environment = proto.components.environments.get(transform.environment_id)
                if environment is not None and environment.resource_hints:
                    assert environment.resource_hints["beam:resources:accelerator:v1"] == HINT.encode()
                    hinted.add("/".join(transform.unique_name.split("/")[:2]))
        assert hinted == {"ExecuteRound/ExecuteCandidates"}
        assert {"ExecuteRound/SpreadOverWorkers", "PrepareRound/CheckShapes"} <= names
