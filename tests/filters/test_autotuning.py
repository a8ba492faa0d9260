from types import SimpleNamespace

import torch
from torch._inductor.runtime.benchmarking import InductorBenchmarker
from torch._inductor.runtime.triton_heuristics import CachingAutotuner

from opsynth.filters.autotuning import bound_autotuning, clone_on_device


def test_each_configuration_gets_the_bounded_budget_unless_the_caller_names_one(monkeypatch):
    calls = []

    def benchmark_gpu(self, _callable, estimation_iters=5, memory_warmup_iters=100, benchmark_iters=100,
                      max_benchmark_duration=25, **kw):  # fmt: skip
        calls.append((estimation_iters, memory_warmup_iters, benchmark_iters, max_benchmark_duration))
        return 1.0

    monkeypatch.setattr(InductorBenchmarker, "benchmark_gpu", benchmark_gpu)
    assert bound_autotuning(5, 8, 10, 2)
    assert bound_autotuning(5, 8, 10, 2), "a second call leaves the first bound as it is"
    benchmarker = InductorBenchmarker()
    assert benchmarker.benchmark_gpu(lambda: None) == 1.0
    benchmarker.benchmark_gpu(lambda: None, max_benchmark_duration=40)
    assert calls == [(2, 10, 8, 5), (2, 10, 8, 40)]


def test_the_real_benchmarker_takes_every_setting():
    """The installed torch's benchmarker is bounded, not left alone (its signature names all four settings)."""
    original = InductorBenchmarker.benchmark_gpu
    try:
        assert bound_autotuning(5, 8, 10, 2)
        assert InductorBenchmarker.benchmark_gpu.bounded
    finally:
        InductorBenchmarker.benchmark_gpu = original


def test_a_benchmarker_without_those_settings_is_left_alone(monkeypatch):
    def benchmark_gpu(self, _callable, **kwargs):
        return 1.0

    monkeypatch.setattr(InductorBenchmarker, "benchmark_gpu", benchmark_gpu)
    assert not bound_autotuning(5, 8, 10, 2)
    assert InductorBenchmarker.benchmark_gpu is benchmark_gpu


def test_each_configurations_benchmark_runs_within_the_hold_it_is_given(monkeypatch):
    """Between two configurations the autotuning may let another task's timing go first; a benchmark of the
    compiling, which holds nothing, takes the GPU's shared hold (device_holds.holding_for_device_work)."""
    import contextlib

    calls = []

    def benchmark_gpu(self, _callable, estimation_iters=5, memory_warmup_iters=100, benchmark_iters=100,
                      max_benchmark_duration=25, **kwargs):  # fmt: skip
        calls.append("benchmark")
        return 1.0

    @contextlib.contextmanager
    def hold():
        calls.append("hold")
        yield
        calls.append("let go")

    monkeypatch.setattr(InductorBenchmarker, "benchmark_gpu", benchmark_gpu)
    assert bound_autotuning(5, 8, 10, 2, around_each=hold)
    benchmarker = InductorBenchmarker()
    benchmarker.benchmark_gpu(lambda: None)
    benchmarker.benchmark_gpu(lambda: None, warmup=5)  # as inductor's padding pass asks
    assert calls == ["hold", "benchmark", "let go"] * 2


def _autotuner_copies(monkeypatch, spare_bytes) -> list:
    """Which buffers inductor's own rule was asked about, for a kernel writing its first argument (1 MiB, on a
    device: meta here) and reading its second, with `spare_bytes` what the worker may still allocate."""
    asked = []

    def copy_args_to_cpu_if_needed(self, *args, **kwargs):
        asked.append(len(args))
        return {"in_out_ptr0": "host copy"}

    monkeypatch.setattr(CachingAutotuner, "copy_args_to_cpu_if_needed", copy_args_to_cpu_if_needed)
    assert clone_on_device(spare_bytes)
    assert clone_on_device(spare_bytes), "a second call leaves the first as it is"
    names = ["in_out_ptr0", "in_ptr1"]
    kernel = SimpleNamespace(fn=SimpleNamespace(arg_names=names), mutated_arg_names=names[:1])
    written, read = torch.empty(1 << 18, device="meta"), torch.empty(1 << 30, device="meta")
    copies = CachingAutotuner.copy_args_to_cpu_if_needed(kernel, written, read)
    return [copies, asked]


def test_a_written_buffer_that_fits_the_workers_budget_is_copied_on_the_device(monkeypatch):
    assert _autotuner_copies(monkeypatch, lambda: 4 << 20) == [{}, []]  # 1 MiB within half of 4 MiB


def test_a_written_buffer_too_large_for_it_is_left_to_inductors_own_rule(monkeypatch):
    assert _autotuner_copies(monkeypatch, lambda: 1 << 20) == [{"in_out_ptr0": "host copy"}, [2]]

    def unreadable():
        raise RuntimeError("no memory information")

    assert _autotuner_copies(monkeypatch, unreadable)[0] == {"in_out_ptr0": "host copy"}


def test_the_real_autotuner_has_the_choice_made_on_the_device(monkeypatch):
    """The installed torch's autotuner still decides its copies where `clone_on_device` hooks in (a torch that
    moved it would leave the host copies, and their GPU stalls, back in place)."""
    # the method as it is, restored after the test like the other patches here
    monkeypatch.setattr(CachingAutotuner, "copy_args_to_cpu_if_needed", CachingAutotuner.copy_args_to_cpu_if_needed)
    assert clone_on_device(lambda: 0)
    assert CachingAutotuner.copy_args_to_cpu_if_needed.on_device
