"""The execution checks through the worker pool on CPU: the code path the GPU stage uses."""

import contextlib
import dataclasses
import functools

import pytest
import torch
import torch._dynamo

from opsynth.config import KEEP_CHECKS
from opsynth.filters.execution import ExecutionConfig, run_checks
from opsynth.filters.timing import timed_iters
from opsynth.filters.worker_budgets import (
    MEMORY_POLL_S,
    await_free_memory,
    cache_keep_bytes,
    memory_share,
    spare_device_bytes,
    workers_per_gpu,
)
from opsynth.filters.workers import Job, WorkerPool
from opsynth.reasons import (
    COMPILE_ERROR,
    COMPILE_MISMATCH,
    CRASH,
    INDISTINGUISHABLE_OUTPUTS,
    KEEP,
    LOAD_ERROR,
    NOT_DETERMINISTIC,
    NOT_FINITE,
    OUT_OF_MEMORY,
    RUNTIME_ABOVE_WINDOW,
    RUNTIME_BELOW_WINDOW,
    RUNTIME_ERROR,
    TIMEOUT,
)
from tests import fixtures

CPU = ExecutionConfig(
    device="cpu", runtime_window_ms=(0.0, 20.0), timeout_s=10.0, compile_check=False, warmup=1, iters=3, workers=2
)

CASES = [
    ("good", fixtures.GOOD, KEEP),
    ("stochastic", fixtures.STOCHASTIC, NOT_DETERMINISTIC),
    ("constant", fixtures.CONSTANT, INDISTINGUISHABLE_OUTPUTS),
    ("scalar_loss", fixtures.SCALAR_LOSS, KEEP),  # one value per draw: judged across draws, not as a constant
    ("constant_scalar", fixtures.CONSTANT_SCALAR, INDISTINGUISHABLE_OUTPUTS),
    ("vanishing", fixtures.VANISHING, INDISTINGUISHABLE_OUTPUTS),
    ("nan", fixtures.NAN, NOT_FINITE),
    ("segfault", fixtures.SEGFAULT, CRASH),
    ("hang", fixtures.HANG, TIMEOUT),
    ("too_slow", fixtures.TOO_SLOW, RUNTIME_ABOVE_WINDOW),
    ("unloadable", fixtures.UNLOADABLE, LOAD_ERROR),
    ("raises", fixtures.RAISES, RUNTIME_ERROR),
    ("out_of_memory", fixtures.OUT_OF_MEMORY, OUT_OF_MEMORY),
    ("good_after_crashes", fixtures.GOOD, KEEP),
]


@pytest.fixture(scope="module")
def pool_verdicts():
    with WorkerPool(CPU) as pool:
        verdicts = pool.run([Job(name, source, 7) for name, source, _ in CASES])
        replaced = pool.replaced
    return dict(zip([c[0] for c in CASES], verdicts, strict=True)), replaced


@pytest.mark.parametrize(("name", "expected"), [(c[0], c[2]) for c in CASES])
def test_each_fixture_gets_its_reason(pool_verdicts, name, expected):
    verdicts, _ = pool_verdicts
    assert verdicts[name].reason == expected, verdicts[name]


def test_crash_and_hang_cost_only_their_task_and_workers_are_replaced(pool_verdicts):
    verdicts, replaced = pool_verdicts
    assert replaced == 2  # the segfaulted worker and the hung one
    assert "SIGSEGV" in verdicts["segfault"].detail
    assert verdicts["good_after_crashes"].kept


def test_kept_task_carries_its_measurements(pool_verdicts):
    verdicts, _ = pool_verdicts
    m = verdicts["good"].measurements
    assert m["eager_ms"] > 0
    assert m["device_name"].startswith("CPU")
    assert "compile_ms" not in m


def test_runtime_below_window():
    cfg = ExecutionConfig(device="cpu", runtime_window_ms=(1000.0, 2000.0), timeout_s=10, compile_check=False,
                          warmup=1, iters=2)  # fmt: skip
    verdict = run_checks(fixtures.GOOD, 1, cfg)
    assert verdict.reason == RUNTIME_BELOW_WINDOW
    assert verdict.measurements["eager_ms"] < 1000.0


def test_a_first_try_stops_at_its_ceiling_with_its_first_timed_forward_and_the_ceiling_it_passed():
    stopped = run_checks(fixtures.GOOD, 1, CPU, ceiling_ms=0.0)  # any forward is over a ceiling of 0 ms
    assert stopped.reason == RUNTIME_ABOVE_WINDOW and "a first try's ceiling" in stopped.detail
    assert stopped.measurements["ceiling_ms"] == 0.0 and stopped.measurements["eager_ms"] > 0
    assert "phase_s" in stopped.measurements and "compile_ms" not in stopped.measurements
    kept = run_checks(fixtures.GOOD, 1, CPU, ceiling_ms=1e9)
    assert kept.kept and "ceiling_ms" not in kept.measurements


def test_verdict_does_not_depend_on_the_seed_for_a_good_task():
    assert all(run_checks(fixtures.GOOD, seed, CPU).kept for seed in (0, 1, 2**62))


@torch._dynamo.register_backend
def failing_backend(graph_module, example_inputs):
    raise RuntimeError("code generation failed")


@pytest.mark.parametrize(
    ("source", "backend", "expected"),
    [
        (fixtures.GOOD, "aot_eager", KEEP),
        (fixtures.COMPILE_MISMATCH, "aot_eager", COMPILE_MISMATCH),
        (fixtures.GOOD, "failing_backend", COMPILE_ERROR),
    ],
)
def test_compile_check_logic(source, backend, expected):
    # aot_eager traces with dynamo like inductor does but skips code generation, which keeps CI fast.
    cfg = ExecutionConfig(device="cpu", runtime_window_ms=(0.0, 100.0), timeout_s=60, compile_check=True,
                          compile_backend=backend, warmup=1, iters=2)  # fmt: skip
    verdict = run_checks(source, 3, cfg)
    assert verdict.reason == expected, verdict
    assert verdict.measurements["eager_ms"] > 0  # a compile failure keeps what was measured before it
    if expected == KEEP:
        assert verdict.measurements["compile_ms"] > 0


GENERATE_MARGINS = {k: v for k, v in KEEP_CHECKS.items() if k != "keep_margin"}  # the checks', not the timing's


def test_generate_asks_the_margins_the_cases_below_sit_between():
    assert GENERATE_MARGINS == {
        "distinguishing_fraction": 1e-2,
        "tolerance_margin": 2.0,
        "every_pair": True,
        "compile_draws": 5,
    }


def test_generate_compares_a_discrete_output_compiled_on_more_draws_than_the_first():
    """A bool output that compiled code flips on some draws only: validate, which compares the first draw (the
    checker's rule), keeps it where that draw agrees; generate compares every draw and drops it."""
    from opsynth.filters.execution import execution_config

    def largest(seed: int, i: int) -> float:
        torch.manual_seed(seed + 1 + i)  # filters.execution.draw_inputs' seeding
        return torch.randn(8, 32).max().item()

    seed = next(s for s in range(1000) if largest(s, 0) < 2.9 and max(largest(s, 1), largest(s, 2)) > 3.1)
    validate = execution_config("cpu", (0.0, 100.0), 60, True, 1)
    generate = execution_config("cpu", (0.0, 100.0), 60, True, 1, **GENERATE_MARGINS)
    source = fixtures.COMPILE_FLIPS_ON_SOME_DRAWS
    kept = run_checks(source, seed, dataclasses.replace(validate, compile_backend="aot_eager"))
    assert kept.reason == KEEP, kept
    failed = run_checks(source, seed, dataclasses.replace(generate, compile_backend="aot_eager"))
    assert failed.reason == COMPILE_MISMATCH, failed


@pytest.mark.parametrize(
    ("source", "reason", "detail"),
    [
        (fixtures.COMPILE_NEAR_TOLERANCE, COMPILE_MISMATCH, "beyond tolerance / 2"),
        (fixtures.BARELY_DISTINGUISHABLE, INDISTINGUISHABLE_OUTPUTS, "under 1.0% of their elements"),
    ],
)
def test_generate_keeps_a_task_only_where_its_checks_pass_with_room_to_spare(source, reason, detail):
    """A compiled output within the tolerance but not within half of it, draws told apart in 0.8 % of their
    elements: validate keeps such a task (the checker's thresholds), generate does not (its row is checked again
    with other draws and a fresh compile)."""
    from opsynth.filters.execution import execution_config

    validate = execution_config("cpu", (0.0, 100.0), 60, True, 1)
    generate = execution_config("cpu", (0.0, 100.0), 60, True, 1, **GENERATE_MARGINS)
    for seed in (3, 4):
        kept = run_checks(source, seed, dataclasses.replace(validate, compile_backend="aot_eager"))
        assert kept.reason == KEEP, kept
        failed = run_checks(source, seed, dataclasses.replace(generate, compile_backend="aot_eager"))
        assert (failed.reason, detail in failed.detail) == (reason, True), failed


@pytest.mark.parametrize(
    ("draws", "rerun", "reason", "detail"),
    [
        # a small output whose draws 1 and 3 agree, each told apart from the first
        ([[0.0], [1.0], [2.0], [1.001], [3.0]], [0.0], INDISTINGUISHABLE_OUTPUTS, "draws 1 and 3 differ"),
        # draws 1.5 times the tolerance apart
        ([[0.0], [0.015], [-0.015], [0.03], [-0.03]], [0.0], INDISTINGUISHABLE_OUTPUTS, "draws 0 and 1 differ"),
        # a rerun 0.7 times the tolerance off its first draw
        ([[0.0], [1.0], [2.0], [3.0], [4.0]], [0.007], NOT_DETERMINISTIC, "beyond tolerance / 2"),
    ],
)
def test_generate_judges_the_draws_with_a_margin_and_every_pair_of_a_small_output(draws, rerun, reason, detail):
    """The checker compares each draw with the first, at the tolerance: validate keeps these outputs; generate,
    whose rows are checked again with other draws, asks more of them."""
    from opsynth.filters.output_checks import check_outputs
    from opsynth.filters.verdicts import CheckFailed

    outs = [[torch.tensor(d)] for d in draws]
    check_outputs(outs, [torch.tensor(rerun)], CPU)  # validate's checks: kept
    with pytest.raises(CheckFailed) as failed:
        check_outputs(outs, [torch.tensor(rerun)], dataclasses.replace(CPU, **GENERATE_MARGINS))
    assert (failed.value.verdict.reason, detail in failed.value.verdict.detail) == (reason, True)


def test_every_pair_is_compared_only_where_the_outputs_are_small(monkeypatch):
    """A large output is judged against the first draw alone: keeping every draw of it would hold five outputs."""
    from opsynth.filters import output_checks

    monkeypatch.setattr(output_checks, "EVERY_PAIR_ELEMENTS", 1)
    outs = [[torch.tensor(d)] for d in ([0.0, 5.0], [1.0, 6.0], [2.0, 7.0], [1.0, 6.0], [3.0, 8.0])]
    output_checks.check_outputs(outs, outs[0], dataclasses.replace(CPU, **GENERATE_MARGINS))  # 1 and 3 never met


def test_inductor_compile_check_in_a_worker():
    cfg = ExecutionConfig(device="cpu", runtime_window_ms=(0.0, 100.0), timeout_s=240, compile_check=True,
                          warmup=1, iters=2, workers=1)  # fmt: skip
    with WorkerPool(cfg) as pool:
        (verdict,) = pool.run([Job("good", fixtures.GOOD, 1)])
    assert verdict.kept, verdict
    assert verdict.measurements["compile_ms"] > 0


@pytest.mark.gpu
def test_checks_on_cuda():
    cfg = ExecutionConfig(device="cuda", runtime_window_ms=(0.0, 100.0), timeout_s=120, compile_check=True, workers=2)
    with WorkerPool(cfg) as pool:
        jobs = [Job("good", fixtures.GOOD, 1), Job("random", fixtures.STOCHASTIC, 1), Job("segv", fixtures.SEGFAULT, 1)]
        jobs += [Job("nan", fixtures.NAN, 1), Job("constant", fixtures.CONSTANT, 1)]
        good, stochastic, segfault, nan, constant = pool.run(jobs)
    assert good.kept and good.measurements["device_name"].startswith("NVIDIA")
    # The profiler saw the forwards' kernels, eager and compiled, timed in one hold of the lock.
    assert good.measurements["eager_ms"] > 0 and good.measurements["compile_ms"] > 0
    phases = {"eager_timing", "compiled_first_run", "compiled_checks", "compiled_timing", "profiler"}
    assert phases <= set(good.measurements["phase_s"])
    assert stochastic.reason == NOT_DETERMINISTIC
    assert segfault.reason == CRASH
    assert nan.reason == NOT_FINITE  # the device's min and max see the NaN, as the CPU's do
    assert constant.reason == INDISTINGUISHABLE_OUTPUTS


def test_a_task_far_outside_the_window_is_decided_before_its_other_checks(tmp_path):
    """The window comes first: a stochastic task too slow for it is rejected as too slow (and would be
    rescaled), without the draws that would find it stochastic."""
    forwards = tmp_path / "forwards"  # each forward adds a dot: counted, not timed, on however loaded a machine
    slow_and_random = fixtures.task(
        f"import time\nopen({str(forwards)!r}, 'a').write('.')\ntime.sleep(0.2)\nreturn torch.rand_like(x)"
    )  # 10x the window
    cfg = ExecutionConfig(device="cpu", runtime_window_ms=(0.0, 20.0), timeout_s=10.0, compile_check=False,
                          warmup=0, iters=1)  # fmt: skip
    verdict = run_checks(slow_and_random, 0, cfg)
    assert verdict.reason == RUNTIME_ABOVE_WINDOW
    assert forwards.read_text() == ".."  # the first draw's and the second's, not five draws and a rerun


def test_heavy_tasks_are_timed_over_fewer_forwards():
    assert [timed_iters(10, ms) for ms in (0.5, 3.0, 5.0, 10.0, 80.0)] == [10, 4, 2, 2, 2]
    assert timed_iters(10, 1.15) == 9  # the keep margin's low end
    assert timed_iters(2, 80.0) == 2


def test_each_gpu_worker_may_use_the_budget_of_one_of_at_most_three():
    assert memory_share(0.9, 1) == pytest.approx(0.9)
    assert memory_share(0.9, 2) == pytest.approx(0.45)
    assert memory_share(0.9, 12) == pytest.approx(0.3)


def test_the_workers_of_a_gpu_keep_a_tenth_of_its_memory_cached_between_tasks_at_most():
    gib = 1 << 30
    for workers in (1, 2, 14):
        cfg = ExecutionConfig(device="cuda", runtime_window_ms=(1.0, 100.0), timeout_s=60.0, workers=workers)
        sharers = workers_per_gpu(cfg)  # the workers of one GPU: all of them on a machine of one
        assert 13.9 * gib <= sharers * cache_keep_bytes(140 * gib, cfg) <= 14 * gib


def test_a_worker_may_allocate_within_its_limit_and_what_the_gpu_has_free_its_own_cache_included():
    gib = 1 << 30
    assert spare_device_bytes(limit=40 * gib, allocated=10 * gib, reserved=12 * gib, free=50 * gib) == 30 * gib
    assert spare_device_bytes(limit=40 * gib, allocated=10 * gib, reserved=12 * gib, free=5 * gib) == 7 * gib
    assert spare_device_bytes(limit=8 * gib, allocated=10 * gib, reserved=10 * gib, free=5 * gib) == 0


def test_a_task_retried_after_running_out_of_memory_first_waits_for_a_budget_of_it_to_be_free():
    now = [0.0]
    free = iter([1, 2, 5, 9, 12])

    def sleep(s):
        now[0] += s

    assert await_free_memory(9, lambda: next(free), timeout_s=10.0, clock=lambda: now[0], sleep=sleep)
    assert now[0] == pytest.approx(3 * MEMORY_POLL_S)  # polled until the fourth reading had enough
    now[0] = 0.0
    assert not await_free_memory(9, lambda: 1, timeout_s=1.0, clock=lambda: now[0], sleep=sleep)  # gives up
    assert now[0] == pytest.approx(1.0, abs=MEMORY_POLL_S)


class _LockedCPUPool(WorkerPool):
    """A CPU pool whose workers share one device lock, as the workers of a GPU do."""

    def _spawn(self, slot):
        import os

        from opsynth.filters.device_lock import DeviceLock

        self._locks.setdefault(None, DeviceLock(os.path.join(self._root, "cpu")))
        return super()._spawn(slot)


SLOW_TO_LOAD = "import time\ntime.sleep(0.3)\n" + fixtures.task("return x * 2")  # before it needs the GPU


def test_tasks_waiting_for_a_hung_gpu_holder_are_not_timed_out_and_a_long_holder_is_stopped():
    cfg = ExecutionConfig(device="cpu", runtime_window_ms=(0.0, 20.0), timeout_s=2.0, compile_check=False,
                          warmup=1, iters=2, workers=2)  # fmt: skip
    with _LockedCPUPool(cfg) as pool:
        pool.hold_limit_s = 60.0
        pool.wait_ready()
        # The hung task takes the lock while the other loads, which then waits past its time limit.
        hung, waiting = pool.run([Job("hang", fixtures.HANG, 1), Job("slow", SLOW_TO_LOAD, 1)])
        assert hung.reason == TIMEOUT and hung.detail == "no verdict within 2 s"
        assert waiting.kept, waiting
        assert waiting.measurements["phase_s"]["lock_wait"] > 1.5
        pool.hold_limit_s = 1.0
        (hung,) = pool.run([Job("hang", fixtures.HANG, 1)])
    assert hung.reason == TIMEOUT and "held the GPU for more than 1 s at once" in hung.detail


def test_the_time_limit_counts_work_not_waits_for_the_gpu():
    from opsynth.filters.device_lock import HOLD_SINCE, WAIT_SINCE, WAITED_S
    from opsynth.filters.worker_budgets import overdue

    def watch(hold=0.0, wait=0.0, waited=0.0):
        w = [0.0] * 3
        w[HOLD_SINCE], w[WAIT_SINCE], w[WAITED_S] = hold, wait, waited
        return w

    assert overdue(watch(), 100.0, 105.0, 10.0, 15.0) is None
    assert overdue(watch(), 100.0, 111.0, 10.0, 15.0) == "no verdict within 10 s"
    assert overdue(watch(waited=4.0), 100.0, 111.0, 10.0, 15.0) is None  # 7 s of work
    assert overdue(watch(wait=103.0), 100.0, 130.0, 10.0, 15.0) is None  # waiting since 3 s in
    # The watch is written by the worker, which runs task code: ten time limits all told end any task.
    assert overdue(watch(waited=1e9), 100.0, 200.0, 10.0, 15.0) == "no verdict within 100 s, waits for the GPU included"
    assert "besides 4 s waiting" in overdue(watch(waited=4.0), 100.0, 115.0, 10.0, 15.0)
    assert overdue(watch(hold=101.0), 100.0, 109.0, 10.0, 15.0) is None
    assert "held the GPU for more than 5 s" in overdue(watch(hold=101.0), 100.0, 107.0, 10.0, 5.0)


def test_the_time_limit_counts_cpu_time_so_a_task_kept_from_the_cores_by_a_loaded_machine_is_not_stopped():
    from opsynth.filters.worker_budgets import HANG_FACTOR, overdue

    idle = [0.0, 0.0, 0.0]
    # Unloaded, a task computes for 8 of its 10 s; with the cores shared four ways it takes 32 s: the same verdict.
    assert overdue(idle, 0.0, 9.0, 10.0, 15.0, cpu_s=8.0) is None
    assert overdue(idle, 0.0, 32.0, 10.0, 15.0, cpu_s=8.0) is None
    # Computing past the limit is stopped whatever the clock says; over two threads, twice the CPU time.
    assert overdue(idle, 0.0, 12.0, 10.0, 15.0, cpu_s=10.0) == "computed for more than 10 s (CPU time)"
    assert overdue(idle, 0.0, 12.0, 10.0, 15.0, cpu_s=10.0, threads=2) is None
    assert "of 2 threads" in overdue(idle, 0.0, 25.0, 10.0, 15.0, cpu_s=20.0, threads=2)
    # A hung task barely computes: stopped by the clock at its limit; any task at HANG_FACTOR limits.
    assert overdue(idle, 0.0, 10.0, 10.0, 15.0, cpu_s=0.1) == "no verdict within 10 s"
    assert overdue(idle, 0.0, 10.0 * HANG_FACTOR, 10.0, 15.0, cpu_s=9.0) == f"no verdict within {10 * HANG_FACTOR} s"


def test_outputs_judged_from_probes_and_ranges_are_judged_as_in_full():
    from opsynth.filters.comparison import tensors_close
    from opsynth.filters.output_checks import check_outputs
    from opsynth.filters.verdicts import CheckFailed

    base = torch.randn(64, 128)  # past the probe: 8,192 elements
    late = base.clone()
    late[-1, -1] += 1.0  # differs only after the probed elements
    assert tensors_close(base, base.clone(), 1e-2, 1e-2)
    assert not tensors_close(base, late, 1e-2, 1e-2)
    assert not tensors_close(base, base + 1.0, 1e-2, 1e-2)
    assert tensors_close(base.t(), base.clone().t(), 1e-2, 1e-2)  # not contiguous: compared in full
    assert not tensors_close(base.t(), late.t(), 1e-2, 1e-2)

    def judged(outputs):
        try:
            check_outputs([[t] for t in outputs], [outputs[0]], CPU)
        except CheckFailed as failed:
            return failed.verdict.detail
        return "distinguishable"

    zeros, ones = torch.zeros(10_000), torch.ones(10_000)
    alike = "outputs of input draws 0 and 1 differ beyond tolerance in under 0.1% of their elements"
    assert judged([zeros, zeros + 1e-3]) == alike
    spike = zeros.clone()
    spike[-1] = 5.0  # zero on the probe, not beyond it
    assert judged([zeros + 1.0, spike]) == "distinguishable"
    assert judged([spike, spike * 2]) == alike  # one element of 10,000 apart: a seed's extremes, not the task
    tail = zeros.clone()
    tail[-20:] = 5.0  # 0.2 % of the elements, all beyond the probe
    assert judged([tail, tail * 2]) == "distinguishable"
    assert judged([ones, ones * 2]) == "each output is a constant within tolerance"
    step = ones.clone()
    step[-1] = 3.0
    assert judged([ones, step * 2]) == "distinguishable"
    for bad in (float("nan"), float("inf"), float("-inf")):
        holed = base.clone()
        holed[-1, -1] = bad
        with pytest.raises(CheckFailed) as failed:
            check_outputs([[base], [holed]], [base], CPU)
        assert failed.value.verdict.reason == NOT_FINITE


def test_differing_elements_are_counted_chunk_by_chunk_up_to_enough(monkeypatch):
    from opsynth.filters import comparison
    from opsynth.filters.comparison import differing_elements

    monkeypatch.setattr(comparison, "COUNT_CHUNK", 1000)
    a = torch.zeros(10_000)
    b = a.clone()
    b[::100] = 1.0  # 100 elements apart, ten per chunk
    assert differing_elements([a], [b], 1e-2, 1e-2, 10**6) == 100
    assert differing_elements([a], [b], 1e-2, 1e-2, 15) == 15
    assert differing_elements([a.int()], [b.int()], 0, 0, 10**6) == 100  # integers: unequal
    assert differing_elements([a], [a.reshape(100, 100)], 1e-2, 1e-2, 10**6) == 10_000  # another shape
    assert differing_elements([a], [a, a], 1e-2, 1e-2, 7) == 7


def test_a_saturated_output_is_indistinguishable_whatever_the_seed():
    """tanh of a log_softmax over 2,048 values is -1 within tolerance but for a seed's largest inputs."""
    from opsynth.filters.output_checks import check_outputs
    from opsynth.filters.verdicts import CheckFailed

    draws = []
    for seed in range(3):
        torch.manual_seed(seed)
        x = torch.randn(256, 2048)
        x[0, 0] = 6.0  # one extreme input, as a large draw has: its output element is told apart
        draws.append([torch.tanh(torch.log_softmax(x, dim=1))])
    with pytest.raises(CheckFailed) as failed:
        check_outputs(draws, draws[0], CPU)
    assert failed.value.verdict.reason == "indistinguishable_outputs"


def test_the_profiler_starts_before_the_device_lock_and_collects_after_it():
    """Timings taken together share one hold of the lock and one profile, recording before the lock is taken and
    stopped after it is let go; the mark between the runs splits their events."""

    from torch._C._autograd import _profiler_enabled
    from torch.profiler import ProfilerActivity

    from opsynth.filters.timing import PhaseClock, profile_forwards, split_runs

    seen = []

    @contextlib.contextmanager
    def hold():
        seen.append(("entry", _profiler_enabled()))
        yield
        seen.append(("exit", _profiler_enabled()))

    @contextlib.contextmanager
    def warm_hold():
        seen.append(("warm-up", _profiler_enabled()))  # the profile's first step, which it drops
        yield

    clock = PhaseClock()
    calls = []
    runs = [(lambda x: calls.append(torch.relu(x)), "eager_timing"),
            (lambda x: calls.append(torch.tanh(x)), "compiled_timing")]  # fmt: skip
    prof = profile_forwards(runs, [torch.randn(8)], 3, clock.holding(hold()), clock,
                            activities=[ProfilerActivity.CPU], warm_hold=warm_hold)  # fmt: skip
    assert len(calls) == 6
    assert seen == [("warm-up", False), ("entry", True), ("exit", True)]  # one hold, recording across its ends
    assert not _profiler_enabled()
    first, second = split_runs(list(prof.events()), 2)
    names = [{e.name for e in run} for run in (first, second)]
    assert any("relu" in n for n in names[0]) and not any("tanh" in n for n in names[0])
    assert any("tanh" in n for n in names[1]) and not any("relu" in n for n in names[1])
    assert set(clock.seconds) == {"eager_timing", "compiled_timing", "profiler", "lock_wait"}
    assert all(s >= 0 for s in clock.seconds.values())


def test_a_profile_whose_task_made_the_runs_mark_too_is_not_split():
    """Task code that opens the mark's range (or launches its kernel) leaves more marks than runs less one:
    the split is refused (the timing then takes each run in a hold of its own), never guessed."""
    from torch.profiler import ProfilerActivity

    from opsynth.filters.timing import SEPARATOR, PhaseClock, profile_forwards, split_runs

    def marking(x):
        with torch.profiler.record_function(SEPARATOR):
            return torch.relu(x)

    runs = [(marking, "eager_timing"), (torch.tanh, "compiled_timing")]
    prof = profile_forwards(runs, [torch.randn(8)], 2, contextlib.nullcontext(), PhaseClock(),
                            activities=[ProfilerActivity.CPU])  # fmt: skip
    assert split_runs(list(prof.events()), 2) is None
    (alone,) = split_runs(list(prof.events()), 1)  # one run: a mark of its own is its work
    assert any(e.name == SEPARATOR for e in alone)


@pytest.mark.gpu
def test_one_profile_of_two_runs_times_each_as_its_own_profile_does():
    """CUDA: the eager and compiled runs of one hold, split at the mark's kernel, sum the device time each would
    alone; a run that launches the mark's kernel itself makes the timing fall back to a hold per run."""
    from opsynth.filters.timing import PhaseClock, device_ms, profile_forwards, profiled_ms, split_runs

    x = torch.randn(1 << 24, device="cuda")
    light, heavy = (lambda t: torch.sin(t)), (lambda t: torch.cos(torch.exp(torch.sin(t))))
    for fn in (light, heavy):
        fn(x)
    torch.cuda.synchronize()
    alone = [device_ms(profile_forwards([(fn, "t")], [x], 5, contextlib.nullcontext(), PhaseClock()).events(), 5)
             for fn in (light, heavy)]  # fmt: skip
    prof = profile_forwards([(light, "eager_timing"), (heavy, "compiled_timing")], [x], 5,
                            contextlib.nullcontext(), PhaseClock())  # fmt: skip
    first, second = split_runs(list(prof.events()), 2)
    assert len(second) == 3 * len(first)  # one kernel a forward against three
    free = contextlib.nullcontext()
    together = profiled_ms([(light, "eager_timing"), (heavy, "compiled_timing")], [x], 5, free, PhaseClock())
    assert [round(t / a, 1) for t, a in zip(together, alone, strict=True)] == [1.0, 1.0]

    def sleeper(t):
        torch.cuda._sleep(1)
        return torch.sin(t)

    prof = profile_forwards([(sleeper, "eager_timing"), (heavy, "compiled_timing")], [x], 5,
                            contextlib.nullcontext(), PhaseClock())  # fmt: skip
    assert split_runs(list(prof.events()), 2) is None
    fallback = profiled_ms([(sleeper, "eager_timing"), (heavy, "compiled_timing")], [x], 5, free, PhaseClock())
    assert round(fallback[1] / alone[1], 1) == 1.0 and fallback[0] > 0


def test_nested_phases_count_once():
    import time

    from opsynth.filters.timing import PhaseClock

    clock = PhaseClock()
    start = time.perf_counter()
    with clock("compile"):
        time.sleep(0.02)
        with clock("compiled_first_run"):
            time.sleep(0.05)
    wall = time.perf_counter() - start  # around the clock's own: however long the sleeps took on a loaded machine
    assert clock.seconds["compiled_first_run"] >= 0.05 and clock.seconds["compile"] >= 0.02
    assert clock.seconds["compile"] + clock.seconds["compiled_first_run"] <= wall  # the inner time counted once


def test_a_phase_clock_tells_the_phase_a_task_is_in_as_it_changes():
    from opsynth.filters.timing import PhaseClock

    told = []
    clock = PhaseClock(report=told.append)
    with clock("compile"):
        with clock("compiled_first_run"):
            pass
        with clock("lock_wait"):
            pass
    assert told == ["compile", "compiled_first_run", "compile", "lock_wait", "compile", None]


def test_a_worker_s_phase_reaches_its_watch_by_its_index_in_the_phases():
    from opsynth.filters.device_lock import PHASE, WATCH_FIELDS, DeviceLock
    from opsynth.filters.execution import PHASES, phase_reporter

    lock = DeviceLock("unused")
    watch = [0.0] * WATCH_FIELDS
    lock.watch(watch)
    report = phase_reporter(lock)
    report("compile")
    assert PHASES[int(watch[PHASE]) - 1] == "compile"
    report(None)
    assert watch[PHASE] == 0
    report("compile")
    report("a phase of a later version")
    assert watch[PHASE] == 0
    assert phase_reporter(None) is None


@pytest.mark.parametrize(
    ("events_ms", "eager_ms", "source", "reason", "holds"),
    [
        # Near the window's low end by the checks' events: timed eager first, compiled only inside the window.
        (1.1, 0.5, fixtures.GOOD, RUNTIME_BELOW_WINDOW, [["eager_timing"]]),
        (1.1, 5.0, fixtures.GOOD, None, [["eager_timing"], ["compiled_timing"]]),
        (1.1, 5.0, fixtures.COMPILE_MISMATCH, COMPILE_MISMATCH, [["eager_timing"]]),
        # Well inside it: compiled first, both timed in one hold; the window is still told first.
        (9.0, 5.0, fixtures.GOOD, None, [["eager_timing", "compiled_timing"]]),
        (9.0, 150.0, fixtures.GOOD, RUNTIME_ABOVE_WINDOW, [["eager_timing", "compiled_timing"]]),
        (9.0, 0.5, fixtures.COMPILE_MISMATCH, RUNTIME_BELOW_WINDOW, [["eager_timing"]]),
        (9.0, 5.0, fixtures.COMPILE_MISMATCH, COMPILE_MISMATCH, [["eager_timing"]]),
    ],
)
def test_on_cuda_the_eager_timing_decides_the_window_before_a_compile_is_told(events_ms, eager_ms, source, reason,
                                                                             holds):  # fmt: skip
    """The CUDA order after the checks, run on the CPU with a stand-in timer (one call per hold of the GPU)."""

    from opsynth.filters.execution import COMPILE_FIRST_MARGIN, cuda_timings
    from opsynth.filters.task_loading import load_task
    from opsynth.filters.timing import PhaseClock
    from opsynth.filters.verdicts import CheckFailed

    cfg = ExecutionConfig(device="cuda", runtime_window_ms=(1.0, 100.0), timeout_s=10, compile_backend="aot_eager")
    task = load_task(source)
    torch.manual_seed(0)
    model, inputs = task.model_class().eval(), task.get_inputs()
    with torch.no_grad():
        eager_out = [model(*inputs)]
    seen = []

    def timer(runs, inputs, iters, lock, clock):
        seen.append([phase for _, phase in runs])
        with torch.no_grad():
            for fn, _ in runs:
                fn(*inputs)
        return [eager_ms if phase == "eager_timing" else eager_ms / 2 for _, phase in runs]

    clock = PhaseClock()
    measurements = {"eager_ms": events_ms}
    if reason is None:
        measured = cuda_timings(model, inputs, eager_out, cfg, contextlib.nullcontext(), clock, measurements, timer)
        assert (measured["eager_ms"], measured["compile_ms"]) == (eager_ms, eager_ms / 2)
    else:
        with pytest.raises(CheckFailed) as failed:
            cuda_timings(model, inputs, eager_out, cfg, contextlib.nullcontext(), clock, measurements, timer)
        assert failed.value.verdict.reason == reason
        assert failed.value.verdict.measurements["eager_ms"] == eager_ms  # what was measured stays with it
    assert seen == holds
    compiled_first = events_ms >= COMPILE_FIRST_MARGIN * cfg.runtime_window_ms[0]
    assert ("compile" in clock.seconds) == (compiled_first or eager_ms == 5.0)  # never below the window
    no_check = ExecutionConfig(device="cuda", runtime_window_ms=(1.0, 100.0), timeout_s=10, compile_check=False)
    seen.clear()
    if reason is None:
        assert "compile_ms" not in cuda_timings(model, inputs, eager_out, no_check, None, PhaseClock(),
                                                 {"eager_ms": events_ms}, timer)  # fmt: skip
        assert seen == [["eager_timing"]]


@pytest.mark.parametrize(
    ("eager_ms", "reason"),
    [(1.1, RUNTIME_BELOW_WINDOW), (1.15, None), (50.0, None), (86.9, None), (87.0, RUNTIME_ABOVE_WINDOW)],
)
def test_generate_keeps_a_task_only_its_margin_inside_the_window(eager_ms, reason):
    """A final timing within the keep margin of an end is outside for generate (it would fall out when measured
    again), inside for validate, which judges by the window itself; the events' prescreen uses the window."""

    from opsynth.config import KEEP_MARGIN
    from opsynth.filters.execution import cuda_timings, execution_config
    from opsynth.filters.timing import PhaseClock
    from opsynth.filters.verdicts import CheckFailed

    def timer(runs, inputs, iters, lock, clock):
        return [eager_ms for _ in runs]

    generate = execution_config("cuda", (1.0, 100.0), 10, False, 1, keep_margin=KEEP_MARGIN)
    validate = execution_config("cuda", (1.0, 100.0), 10, False, 1)
    assert KEEP_MARGIN == 0.15  # the cases above sit on either side of it
    judge = [(validate, None), (generate, reason)]
    for cfg, expected in judge:
        timed = functools.partial(cuda_timings, None, [], [], cfg, contextlib.nullcontext(), PhaseClock(),
                                  {"eager_ms": eager_ms}, timer)  # fmt: skip
        if expected is None:
            assert timed()["eager_ms"] == eager_ms
        else:
            with pytest.raises(CheckFailed) as failed:
                timed()
            assert failed.value.verdict.reason == expected and "15% margin" in failed.value.verdict.detail


def test_allocations_failed_during_a_timing_are_recorded_with_its_verdict():
    """A convolution short of memory for a fast algorithm's workspace falls back to a slower one (the allocator
    counts the failed allocation): its timing is recorded with the count, for a run's verdicts to be counted by,
    a kept one's and a rejected one's alike. Run on the CPU with a stand-in timer and counter."""
    from opsynth.filters.execution import cuda_timings, execution_config
    from opsynth.filters.timing import PhaseClock, allocation_failures
    from opsynth.filters.verdicts import CheckFailed

    failed = [0]

    def timer_failing(n: int, ms: float):
        def timer(runs, inputs, iters, lock, clock):
            failed[0] += n
            return [ms for _ in runs]

        return timer

    cfg = execution_config("cuda", (1.0, 100.0), 10, False, 1)

    def timed(timer):
        return cuda_timings(None, [], [], cfg, contextlib.nullcontext(), PhaseClock(), {"eager_ms": 5.0}, timer,
                            lambda: failed[0])  # fmt: skip

    assert "timing_allocation_failures" not in timed(timer_failing(0, 5.0))
    assert timed(timer_failing(2, 5.0))["timing_allocation_failures"] == 2
    with pytest.raises(CheckFailed) as below:
        timed(timer_failing(3, 0.5))
    assert below.value.verdict.measurements["timing_allocation_failures"] == 3
    if not torch.cuda.is_available():
        assert allocation_failures() == 0  # the real counter, without CUDA


def test_a_draws_outputs_are_reduced_as_they_come_and_not_kept():
    """The checks hold the first draw's outputs and the current one's, not all five: memory for larger tasks."""
    import weakref

    from opsynth.filters.output_checks import DrawOutputs

    judged = DrawOutputs([torch.randn(100)], CPU)
    out = torch.randn(100)
    alive = weakref.ref(out)
    judged.add([out])
    del out
    assert alive() is None and judged.draws == 2 and judged.agreeing == []


def test_on_cuda_the_events_decide_a_task_below_the_window_before_the_profiler():
    from opsynth.filters.verdicts import CheckFailed
    from opsynth.filters.window_checks import check_events

    window = (1.0, 100.0)
    for events_ms, reason in ((0.9, RUNTIME_BELOW_WINDOW), (301.0, RUNTIME_ABOVE_WINDOW)):
        with pytest.raises(CheckFailed) as failed:
            check_events({"eager_event_ms": events_ms}, window)
        assert failed.value.verdict.reason == reason
        assert failed.value.verdict.measurements["eager_ms"] == events_ms  # what calibration rescales from
    for events_ms in (1.0, 50.0, 250.0):  # in the window, or above it by no more than the gaps may make up
        check_events({"eager_event_ms": events_ms}, window)


class SharedLock:
    """A stand-in for a GPU's DeviceLock: whether this process holds it, and how many times it took it."""

    held = False
    runs = 0

    @contextlib.contextmanager
    def shared(self):
        self.held, self.runs = True, self.runs + 1
        yield
        self.held = False

    @contextlib.contextmanager
    def unwatched_holds(self):
        yield


class LeftToEager(torch.nn.Module):
    """A compiled model's first call: one graph (`plain`), or device work dynamo does not compile besides: an LSTM
    (it does not trace recurrent modules, so the whole forward runs eagerly) or an eager function between two
    compiled graphs (a graph break)."""

    def __init__(self, seen: list, lock: SharedLock, kind: str):
        super().__init__()
        self.kind = kind
        self.lstm = torch.nn.LSTM(8, 8, batch_first=True)
        self.lstm.register_forward_pre_hook(lambda *_: seen.append(("eager", lock.held)))

        @torch._dynamo.disable
        def between(x):
            seen.append(("eager", lock.held))
            return x.nonzero().float().sum() + x

        self.between = between

    def forward(self, x):
        x = torch.relu(x)
        if self.kind == "lstm":
            x = self.lstm(x)[0]
        elif self.kind == "graph-break":
            x = self.between(x)
        return x * 2


def test_a_worker_gives_back_its_cached_gpu_memory_before_it_compiles_holding_nothing(monkeypatch):
    """What the checks' forwards left cached in its allocator is free to no other worker while it compiles."""
    from opsynth.filters.compiled_model import compile_model
    from opsynth.filters.timing import PhaseClock

    seen, lock = [], SharedLock()
    phase = []
    clock = PhaseClock(report=phase.append)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # as in a CUDA worker
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: seen.append((phase[-1], lock.held)))

    def backend(graph, example_inputs):
        seen.append(("compiled", lock.held))
        return graph.forward

    cfg = ExecutionConfig(device="cpu", runtime_window_ms=(0.0, 100.0), timeout_s=60, compile_backend=backend)
    with torch.no_grad():
        compile_model(torch.nn.Linear(4, 4).eval(), [torch.randn(2, 4)], cfg, lock, clock)
    assert seen[:2] == [("compile", False), ("compiled", False)]


@pytest.mark.parametrize("kind", ["plain", "lstm", "graph-break"])
@pytest.mark.parametrize("real_lock", [False, True], ids=["stand-in", "device-lock"])
def test_a_first_calls_graphs_and_what_it_leaves_to_eager_hold_the_device_lock_and_its_compiling_does_not(
    kind, real_lock, tmp_path
):
    """Another process's kernels (compiled graphs, Triton's autotuning runs, what dynamo leaves to eager) would
    slow a task being timed; compiling, host work, overlaps timings."""
    from opsynth.filters.compiled_model import compile_model
    from opsynth.filters.device_lock import DeviceLock
    from opsynth.filters.timing import PhaseClock

    seen, lock = [], DeviceLock(str(tmp_path / "gpu0"), slots=3) if real_lock else SharedLock()

    def recording_backend(graph, example_inputs):  # a backend callable where a name would be: torch.compile takes both
        seen.append(("compile", lock.held))

        def run(*args):
            seen.append(("graph", lock.held))
            return graph.forward(*args)

        return run

    cfg = ExecutionConfig(device="cpu", runtime_window_ms=(0.0, 100.0), timeout_s=60, compile_backend=recording_backend)
    model, x, clock = LeftToEager(seen, lock, kind).eval(), torch.randn(2, 5, 8), PhaseClock()
    with torch.no_grad():
        expected = model(x)
        seen.clear()
        out = compile_model(model, [x], cfg, lock, clock)[1]
    assert torch.allclose(out[0], expected)
    assert ("eager", True) in seen or kind == "plain"
    assert ("graph", True) in seen or kind == "lstm"  # dynamo compiles no graph of a forward with an LSTM
    assert ("eager", False) not in seen and ("graph", False) not in seen
    assert ("compile", True) not in seen and not lock.held
    assert {"compile", "compiled_first_run"} <= set(clock.seconds)
    if real_lock:  # let go entirely: a timing would take it at once (asked without waiting: held, it raises)
        import fcntl
        import os

        fd = os.open(tmp_path / "gpu0", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    else:
        assert lock.runs >= 1


def test_only_dynamo_compiling_a_frame_lets_the_first_calls_hold_go():
    """Inductor may call the same callbacks around device work (CUDA graph recording, autotuning)."""
    from torch._dynamo.callback import CallbackArgs, CallbackTrigger

    from opsynth.filters.compiled_model import dynamo_compiling

    assert dynamo_compiling((CallbackArgs(CallbackTrigger.DYNAMO, "0/0"),))
    assert dynamo_compiling(())  # an older torch says nothing, and calls them for dynamo alone
    assert not dynamo_compiling((CallbackArgs(CallbackTrigger.CUDAGRAPH_RECORDING, "0/0"),))
    assert not dynamo_compiling((CallbackArgs(CallbackTrigger.TRITON_AUTOTUNING, "0/0"),))


def test_a_cuda_error_in_the_compiled_model_also_retires_the_worker():
    from opsynth.filters.verdicts import is_fatal_cuda_error
    from opsynth.reasons import Verdict

    assert is_fatal_cuda_error(Verdict(COMPILE_ERROR, "RuntimeError: CUDA error: device-side assert triggered"))
    assert is_fatal_cuda_error(Verdict(RUNTIME_ERROR, "RuntimeError: CUDA error: an illegal memory access"))
    spoilt = "RuntimeError: Offset increment outside graph capture encountered unexpectedly."
    assert is_fatal_cuda_error(Verdict(RUNTIME_ERROR, spoilt)), "a generator a failed capture left refusing draws"
    assert not is_fatal_cuda_error(Verdict(COMPILE_ERROR, "BackendCompilerFailed: unsupported op"))
    assert not is_fatal_cuda_error(Verdict(RUNTIME_ABOVE_WINDOW, "eager 300 ms > 100.0 ms (CUDA error)"))
