"""How a run sizes candidates for its GPUs: the speed corrected by what earlier rounds measured."""

from dataclasses import replace

import pytest

from opsynth.config import GPU_SPEED, OPS6K_MIXTURE, SPEED_SAMPLES
from opsynth.options import GenerateOptions
from opsynth.pipeline.sizing import round_sizing, timed_predictions, with_gpu_budget
from opsynth.reasons import RUNTIME_BELOW_WINDOW
from opsynth.records import Candidate, Rejection

OPTIONS = GenerateOptions(
    out="o", num_samples=20, seed=1, preset="ops6k", mixture=OPS6K_MIXTURE, op_weights="ops6k", device="cuda",
    workload="gpu", runtime_window_ms=(1.0, 100.0), kernelbench="embedded", similarity_threshold=0.9,
    jaccard_threshold=0.85, compile_check=True, timeout_s=60, workers=14, batch_size=64,
)  # fmt: skip
COST = {"bytes": 3e9, "flops": 1e10, "kernels": 4}


def _executed(eager_ms: float, predicted_ms: float, steps: int = 0) -> Candidate:
    return Candidate("torch#2", 0, 0).measured(
        {"eager_ms": eager_ms, "predicted_ms": predicted_ms, "calibration_steps": steps}
    )


def test_the_speed_is_corrected_by_the_median_of_measured_over_predicted_once_there_are_enough():
    logged = []
    assert round_sizing(replace(OPTIONS, device="cpu"), [2.0] * SPEED_SAMPLES) is None  # sized on CUDA only
    first = round_sizing(OPTIONS, [2.0] * (SPEED_SAMPLES - 1), logged.append)
    assert first.speed == GPU_SPEED and not logged
    later = round_sizing(OPTIONS, [2.0] * SPEED_SAMPLES + [100.0], logged.append)
    assert later.speed.predicted_ms(COST) == pytest.approx(2 * GPU_SPEED.predicted_ms(COST))
    assert logged == [f"sizing: measured / predicted time 2.00 (median of {SPEED_SAMPLES + 1} executions)"]


def test_a_long_run_corrects_the_speed_by_its_latest_executions_and_keeps_no_more_of_them(monkeypatch):
    from opsynth.pipeline import run_state
    from opsynth.pipeline.selection import Selector

    monkeypatch.setattr(run_state, "SPEED_WINDOW", 100)
    state = run_state.RunState(Selector({"torch#2": 10}))
    state.timed += [4.0] * 1_000  # early rounds, on a speed that has since changed
    state.timed += [2.0] * 100
    assert len(state.timed) == 100
    corrected = round_sizing(OPTIONS, state.timed).speed
    assert corrected.predicted_ms(COST) == pytest.approx(2 * GPU_SPEED.predicted_ms(COST))


def test_only_executions_at_their_predicted_sizes_correct_the_speed():
    accepted = [_executed(3.0, 2.0), _executed(9.0, 1.0, steps=1)]  # the second was rescaled after its prediction
    rejected = [
        Rejection(_executed(0.5, 1.0), RUNTIME_BELOW_WINDOW, "execute", ""),
        Rejection(Candidate("torch#2", 1, 1), "duplicate", "dedup", ""),  # never executed
    ]
    assert timed_predictions(accepted, rejected) == [1.5, 0.5]


def test_the_element_budget_follows_the_gpus_memory_and_is_the_workloads_elsewhere():
    from opsynth.filters.execution import ExecutionConfig
    from opsynth.filters.worker_budgets import element_budget

    cuda = ExecutionConfig("cuda", (1.0, 100.0), 60, workers=14)  # 3 of them share a GPU's memory at most
    assert element_budget(150_000_000_000, cuda) == 1 << 31  # an H200: five fp32 copies in 45 GB
    assert element_budget(24_000_000_000, cuda) == 1 << 28
    for options in (replace(OPTIONS, device="cpu"), replace(OPTIONS, workload="tiny")):
        assert with_gpu_budget(options) is options and options.max_elements is None
    budgeted = replace(OPTIONS, max_elements=1 << 30)  # a run resumed keeps the budget it started with
    assert with_gpu_budget(budgeted) is budgeted and budgeted.sizes.max_elements == 1 << 30
