import pytest

from filters.calibration import rescale_factor, run_calibrated
from filters.execution import ExecutionConfig
from filters.reasons import KEEP, RUNTIME_BELOW_WINDOW
from filters.workers import Job, WorkerPool
from tests import fixtures

# A task whose forward takes 0.1 ms per batch row: its batch decides whether it lands in the window.
SLEEPY = fixtures.task("import time\ntime.sleep(x.shape[0] * 1e-4)\nreturn x * 2").replace(
    "torch.randn(8, 32)", "torch.randn(BATCH, 32)"
)


def test_rescale_factor_aims_at_the_windows_geometric_middle():
    assert rescale_factor(1.0, (1.0, 100.0), 64) == pytest.approx(10.0)
    assert rescale_factor(0.1, (1.0, 100.0), 64) == 64  # one step is bounded
    assert rescale_factor(1000.0, (1.0, 100.0), 64) == pytest.approx(1 / 64)
    assert rescale_factor(1e-9, (1.0, 100.0), 64) == 64


def test_a_task_below_the_window_is_rescaled_until_it_lands_in_it():
    cfg = ExecutionConfig(device="cpu", runtime_window_ms=(20.0, 80.0), timeout_s=30, compile_check=False,
                          warmup=1, iters=3, workers=2)  # fmt: skip
    with WorkerPool(cfg) as pool:
        results = run_calibrated(
            pool,
            [4, 2000],
            job_of=lambda batch: Job(str(batch), SLEEPY.replace("BATCH", str(batch)), 0),
            rescale=lambda batch, factor: max(1, round(batch * factor)) if batch * factor < 5000 else None,
            window=cfg.runtime_window_ms,
            tries=3,
            max_factor=64,
        )
    (small, small_verdict, small_steps), (huge, huge_verdict, huge_steps) = results
    assert huge_steps >= 1
    assert small_verdict.reason == KEEP and small_steps >= 1 and small > 4
    assert 20.0 <= small_verdict.measurements["eager_ms"] <= 80.0
    # Far above the window: shrunk until it fits.
    assert huge_verdict.reason == KEEP and huge < 2000


def test_rescaling_stops_when_the_caller_says_it_cannot():
    cfg = ExecutionConfig(device="cpu", runtime_window_ms=(20.0, 80.0), timeout_s=30, compile_check=False,
                          warmup=1, iters=2, workers=1)  # fmt: skip
    with WorkerPool(cfg) as pool:
        ((batch, verdict, steps),) = run_calibrated(
            pool, [2], job_of=lambda b: Job("t", SLEEPY.replace("BATCH", str(b)), 0),
            rescale=lambda b, f: None, window=cfg.runtime_window_ms, tries=3, max_factor=64,
        )  # fmt: skip
    assert (batch, verdict.reason, steps) == (2, RUNTIME_BELOW_WINDOW, 0)
