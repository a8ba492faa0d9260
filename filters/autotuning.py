"""How long inductor benchmarks each Triton configuration when a compiled model first runs.

Inductor's benchmarker runs a candidate configuration for up to 25 ms, after 100 cache-flushing writes, and the
compiled model's first run autotunes every kernel with more than one configuration that way: on an H200 it was
the largest share of a compiled task's GPU time (median 0.20 s per task over 147 tasks, next to about 0.05 s of
timed forwards). A configuration that wins does so by far more than the noise of a few runs, so the execution
workers give each one AUTOTUNE_BENCHMARK_MS after AUTOTUNE_CACHE_FLUSHES flushes: the same 147 tasks compiled
again that way ran at a median 1.000 of their compiled time (5th-95th percentile 0.93-1.11, as two default
compiles of them differ: 0.93-1.08), in 0.08 s of autotuning per task.
"""

from __future__ import annotations

import functools
import inspect


def bound_autotuning(max_ms: float, cache_flushes: int) -> bool:
    """Make inductor's GPU benchmarker give each configuration at most `max_ms` after `cache_flushes` writes
    that flush the L2 cache, in this process, unless a caller asks otherwise; False where this torch's
    benchmarker takes neither setting (it is then left as it is)."""
    try:
        from torch._inductor.runtime.benchmarking import InductorBenchmarker
    except ImportError:
        return False
    original = InductorBenchmarker.benchmark_gpu
    if getattr(original, "bounded", False):
        return True
    if not {"max_benchmark_duration", "memory_warmup_iters"} <= set(inspect.signature(original).parameters):
        return False

    @functools.wraps(original)
    def benchmark_gpu(self, _callable, *args, **kwargs):
        kwargs.setdefault("max_benchmark_duration", max_ms)
        kwargs.setdefault("memory_warmup_iters", cache_flushes)
        return original(self, _callable, *args, **kwargs)

    benchmark_gpu.bounded = True
    InductorBenchmarker.benchmark_gpu = benchmark_gpu
    return True
