"""How long inductor benchmarks each Triton configuration when a compiled model first runs.

Inductor's benchmarker runs a candidate configuration 5 times to estimate its time, then for up to 25 ms (at most
100 runs, each after a write that flushes the L2 cache) after 100 such writes, and the compiled model's first run
autotunes every kernel with more than one configuration that way: on an H200 it was the largest share of a compiled
task's GPU time (median 0.20 s per task over 147 tasks, next to about 0.05 s of timed forwards). A configuration
that wins does so by far more than the noise of a few runs, so the execution workers give each one
AUTOTUNE_ESTIMATION_RUNS runs, then AUTOTUNE_BENCHMARK_MS or AUTOTUNE_BENCHMARK_RUNS runs, whichever ends first,
after AUTOTUNE_CACHE_FLUSHES flushes (a 10 us kernel otherwise ran 100 times, each run with its flush). Tasks of a
600-row run on one H200, compiled again with inductor's defaults, ran at a median 1.000 of the compiled time
recorded that way (5th-95th percentile 0.88-1.12 over 77 tasks; two default compiles of a task differ by
0.93-1.08); the compiled models' first runs took 47 s of a 600-row run's worker time (74 s with 2 ms after 5 runs).

A kernel that writes one of its inputs (most of inductor's fused kernels write a buffer in place) is benchmarked
on a copy of it. Inductor makes the copy on the GPU only where the process's memory stays under its earlier
peak; else it copies the buffer into pinned host memory and back before every benchmark run. For a task of
several GiB, that was seconds of pinning host pages (one core, the driver's) and of copies, inside the shared
device hold, while timings waited for it and the GPU idled: the longest idle spells of 600-row runs on one H200
(up to 6.6 s, with the host's shared memory growing by 8.5 GiB). The workers make the copy on the GPU wherever
the worker's own memory budget holds it (`clone_on_device`).
"""

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
