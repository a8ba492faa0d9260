"""How long inductor benchmarks each Triton configuration when a compiled model first runs, and where it copies
the buffers a kernel writes for those benchmarks: bounded, and on the GPU where the worker's budget holds them
(why, and the compiled times measured both ways: docs/execution.md, "The checks and the timing")."""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable


def bound_autotuning(max_ms: float, max_runs: int, cache_flushes: int, estimation_runs: int,
                     around_each: Callable[[], contextlib.AbstractContextManager] | None = None) -> bool:  # fmt: skip
    """Make inductor's GPU benchmarker give each configuration at most `max_ms` and `max_runs` runs after
    `cache_flushes` writes that flush the L2 cache, its time estimated from `estimation_runs` runs first, in
    this process, unless a caller asks otherwise; False where this torch's benchmarker does not take these
    settings (it is then left as it is). Each benchmark, where `around_each` is given, runs within the context
    `around_each()` makes: the GPU's hold it needs (see device_holds.holding_for_device_work), since inductor
    also benchmarks while it compiles (a matmul with and without padding), when the task holds nothing."""
    try:
        from torch._inductor.runtime.benchmarking import InductorBenchmarker
    except ImportError:
        return False
    original = InductorBenchmarker.benchmark_gpu
    if getattr(original, "bounded", False):
        return True
    settings = {"max_benchmark_duration": max_ms, "benchmark_iters": max_runs, "memory_warmup_iters": cache_flushes,
                "estimation_iters": estimation_runs}  # fmt: skip
    if not set(settings) <= set(inspect.signature(original).parameters):
        return False

    @functools.wraps(original)
    def benchmark_gpu(self, _callable, *args, **kwargs):
        with around_each() if around_each is not None else contextlib.nullcontext():
            return original(self, _callable, *args, **settings | kwargs)

    benchmark_gpu.bounded = True
    InductorBenchmarker.benchmark_gpu = benchmark_gpu
    return True


def clone_on_device(spare_bytes: Callable[[], int]) -> bool:
    """Make inductor's autotuning copy the GPU buffers a kernel writes on the GPU whenever they fit in half of
    `spare_bytes()` (what this worker may still allocate), not through pinned host memory; inductor's own rule
    decides where they do not. False where this torch's autotuner has no such choice (it is left as it is)."""
    try:
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    except ImportError:
        return False
    original = getattr(CachingAutotuner, "copy_args_to_cpu_if_needed", None)
    if original is None:
        return False
    if getattr(original, "on_device", False):
        return True

    @functools.wraps(original)
    def copy_args_to_cpu_if_needed(self, *args, **kwargs):
        mutated = getattr(self, "mutated_arg_names", ())
        named = [*zip(self.fn.arg_names, args, strict=False), *kwargs.items()]  # as inductor pairs them
        needed = sum(
            arg.untyped_storage().nbytes()
            for name, arg in named
            if name in mutated and hasattr(arg, "untyped_storage") and arg.device.type != "cpu"
        )
        try:
            fits = needed <= spare_bytes() // 2  # half: the other workers of the GPU allocate meanwhile
        except Exception:  # the memory could not be read: inductor's own rule, as if this were not here
            fits = False
        if fits:
            return {}  # no host copies: inductor then copies each written buffer on the GPU for each run
        return original(self, *args, **kwargs)

    copy_args_to_cpu_if_needed.on_device = True
    CachingAutotuner.copy_args_to_cpu_if_needed = copy_args_to_cpu_if_needed
    return True
