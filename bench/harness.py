"""`opsynth bench`: throughput of the pipeline's stages, measured, written as JSON, compared with SPEC targets.

- `cpu`: sample + compose + render + shape check, one process, after a warm-up of other candidates
  (candidates/s per core; target >= 200).
- `decontam`: the four KernelBench signals against all 250 tasks, one process, the AST search checked against
  brute force (candidates/s per core, CPU time; target >= 50). The operator graphs compared are recorded by the
  shape check beforehand, as in the pipeline, outside the measured time.
- `execute`: the execution stage, shape calibration included, through the worker pool on the chosen device
  (candidates/s, and on CUDA the fraction of wall time the GPU was busy, sampled from NVML; targets >= 10/s and
  >= 50 %).
- `selection`: what the selection keeps across a run's rounds for its rows (the state that grows with them):
  synthetic torch#2 rows of two catalog operators, admitted in rounds of 4,096, measured with tracemalloc (bytes
  a row).
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import time

from opsynth.config import (
    COMPOSE_ATTEMPTS,
    OPS6K_MIXTURE,
    WORKLOADS,
)
from opsynth.data_sources import torch_source
from opsynth.filters.ast_search import best_match
from opsynth.filters.ast_similarity import brute_force, profile
from opsynth.filters.decontamination import similarity
from opsynth.filters.execution import PHASES, device_name, execution_config
from opsynth.filters.gpu_busy import GpuBusyMonitor
from opsynth.filters.kernelbench_index import fingerprint, load_reference
from opsynth.filters.shape_check import check_shapes
from opsynth.filters.workers import WorkerPool
from opsynth.operator_catalog.codegen import render
from opsynth.operator_catalog.compose import compose
from opsynth.pipeline.candidates import make_candidate
from opsynth.pipeline.execution_stage import execution_job, run_candidates
from opsynth.records import CandidateSpec, candidate_seed

TARGETS = {"cpu": 200.0, "decontam": 50.0, "execute": 10.0, "gpu_busy": 0.5}
# `cpu`: other candidates composed and checked first, untimed (reported as warmup_s): each operator's first use
# loads torch's meta-device paths for it once per process (300 of them took 2.0 s where the next 300 took 1.2 s on
# the development machine), which a run's long-lived processes pay once, not per candidate.
CPU_WARMUP = 300


def _machine() -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(), "cores": os.cpu_count()}


def _num_ops(i: int) -> int:
    """Chain lengths in the released set's proportions (torch#1..5), cycling deterministically."""
    shares = [OPS6K_MIXTURE[torch_source(k)] for k in range(1, 6)]
    position = (i * 0.618034) % 1.0 * sum(shares)
    for k, share in enumerate(shares, start=1):
        position -= share
        if position < 0:
            return k
    return 5


def sample_tasks(n: int, workload: str, seed: int = 0) -> list[str]:
    return [
        render(compose(candidate_seed(seed, "bench", i), _num_ops(i), WORKLOADS[workload], COMPOSE_ATTEMPTS)).source
        for i in range(n)
    ]


def bench_cpu(n: int, workload: str) -> dict:
    warmup = min(n, CPU_WARMUP)
    start = time.perf_counter()
    for source in sample_tasks(warmup, workload, seed=0):
        check_shapes(source)
    warmup_s = time.perf_counter() - start
    start = time.perf_counter()
    kept = sum(check_shapes(source).kept for source in sample_tasks(n, workload, seed=1))
    wall = time.perf_counter() - start
    return {
        "stage": "cpu (sample, compose, render, shape check)",
        "workload": workload,
        "warmup_candidates": warmup,
        "warmup_s": round(warmup_s, 3),
        "candidates": n,
        "shape_check_passed": kept,
        "wall_s": round(wall, 3),
        "candidates_per_s_per_core": round(n / wall, 1),
        "target_per_s_per_core": TARGETS["cpu"],
    }


def bench_decontam(n: int, workload: str, brute_force_sample: int = 50) -> dict:
    sources = sample_tasks(n, workload, seed=2)
    graphs = [check_shapes(s).measurements for s in sources]  # what the shape check hands the stage
    t0 = time.perf_counter()
    index = load_reference("embedded")
    load_s = time.perf_counter() - t0
    start, cpu_start = time.perf_counter(), time.process_time()
    results = [
        similarity(s, index, m.get("graph"), m.get("graph_nodes", 0)) for s, m in zip(sources, graphs, strict=True)
    ]
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    # Exactness: the pruned search must give what scoring every reference gives.
    mismatches = 0
    for source in sources[:brute_force_sample]:
        fp = fingerprint(index.table, source)
        for root, refs, bounded in (
            (fp.raw_root, index.raw_profiles, index.raw_references),
            (fp.normalized_root, index.normalized_profiles, index.normalized_references),
        ):
            p = profile(index.table, root)
            mismatches += best_match(index.table, p, bounded) != brute_force(index.table, p, refs)
    scores = [r.ast for r in results]
    return {
        "stage": "decontamination (AST, normalized AST, MinHash, operator graph vs 250 KernelBench tasks)",
        "workload": workload,
        "candidates": n,
        "index_load_s": round(load_s, 3),
        "wall_s": round(wall, 3),
        "candidates_per_s_per_core": round(n / cpu, 1),
        "target_per_s_per_core": TARGETS["decontam"],
        "graphs_compared": sum(r.graph is not None for r in results),
        "brute_force_checked": min(n, brute_force_sample),
        "brute_force_mismatches": mismatches,
        "kb_ast_similarity_median": statistics.median(scores),
        "kb_ast_similarity_max": max(scores),
    }


def _mean_phases(verdicts: list) -> dict[str, float]:
    if not verdicts:
        return {}
    phases = [v.measurements.get("phase_s", {}) for v in verdicts]
    return {p: round(sum(ph.get(p, 0.0) for ph in phases) / len(verdicts), 4) for p in PHASES}


def bench_execute(
    n: int, workload: str, device: str, workers: int, compile_check: bool, shared_checks: bool = True
) -> dict:
    wl = WORKLOADS[workload]
    candidates = [
        make_candidate(CandidateSpec(torch_source(_num_ops(i)), i, candidate_seed(3, "bench", i)), wl) for i in range(n)
    ]
    cfg = execution_config(device, wl.runtime_window_ms, wl.timeout_s, compile_check, workers, shared_checks)

    t0 = time.perf_counter()
    with WorkerPool(cfg) as pool:
        pool.run([execution_job(c) for c in candidates[:workers]])  # start-up and first-use costs, not in the rate
        startup_s = time.perf_counter() - t0
        monitor = GpuBusyMonitor(period_s=0.05) if device == "cuda" else contextlib.nullcontext()
        start, started = time.perf_counter(), time.monotonic()
        with monitor:
            results = run_candidates(pool, candidates, wl, "uniform", wl.runtime_window_ms)
        wall = time.perf_counter() - start
    per_gpu = monitor.busy(started, time.monotonic()) if device == "cuda" else None
    busy = statistics.mean(per_gpu) if per_gpu else None
    reasons: dict[str, int] = {}
    for _, v, _ in results:
        reasons[v.reason] = reasons.get(v.reason, 0) + 1
    eager = [v.measurements["eager_ms"] for _, v, _ in results if "eager_ms" in v.measurements]
    measured = sum(1 + steps for _, _, steps in results)
    return {
        "stage": "execution (load, 5 draws, determinism, distinguishability, timing, shape calibration"
        + (", compile)" if compile_check else ")"),
        "workload": workload,
        "device": device_name(device),
        "workers": workers,
        "candidates": n,
        "measurements": measured,
        "calibrated": sum(1 for _, _, steps in results if steps),
        "startup_s": round(startup_s, 2),
        "wall_s": round(wall, 3),
        "candidates_per_s": round(n / wall, 2),
        "measurements_per_s": round(measured / wall, 2),
        "target_per_s": TARGETS["execute"] if device == "cuda" else None,
        "gpu_busy_fraction": None if busy is None else round(busy, 3),
        "target_gpu_busy_fraction": TARGETS["gpu_busy"] if device == "cuda" else None,
        "verdicts": dict(sorted(reasons.items())),
        "eager_ms_median": round(statistics.median(eager), 4) if eager else None,
        # Seconds per candidate in each phase of a worker's task (all steps of its calibration), over all candidates
        # and over those kept: what the device lock is held for, and what the workers wait or compile.
        "phase_s_per_candidate": _mean_phases([v for _, v, _ in results]),
        "phase_s_per_kept": _mean_phases([v for _, v, _ in results if v.kept]),
        # On CUDA, eager_ms is the profiler's summed device time wherever the events pre-screen was near the
        # window; the pairs show how the two measures compare on the same tasks.
        "profiled_vs_events_ms": [
            [round(v.measurements["eager_ms"], 4), round(v.measurements["eager_event_ms"], 4)]
            for _, v, _ in results
            if "eager_event_ms" in v.measurements and v.measurements["eager_ms"] != v.measurements["eager_event_ms"]
        ][:40],
    }


def bench_selection(n: int, round_size: int = 4096) -> dict:
    """The selection's state after admitting `n` distinct torch#2 rows, each round's candidates made (their keys,
    ids and codes new strings, as a round's records read back) and let go after it, as in a run."""
    import hashlib
    import random
    import tracemalloc

    from opsynth.operator_catalog.registry import sampleable
    from opsynth.pipeline.selection import Selector
    from opsynth.records import Candidate

    ops = sorted(entry.name for entry in sampleable("torch"))
    rng = random.Random(0)

    def made(i: int) -> Candidate:
        code = f"# task {i}"
        key = hashlib.sha256(f"key {i}".encode()).hexdigest()
        return Candidate("torch#2", i, i, (rng.choice(ops), rng.choice(ops)), code, (), key)

    selector = Selector({"torch#2": n})
    tracemalloc.start()
    try:
        start, t0 = tracemalloc.get_traced_memory()[0], time.perf_counter()
        for first in range(0, n, round_size):
            selector.admit([made(i) for i in range(first, min(n, first + round_size))])
        held, seconds = tracemalloc.get_traced_memory()[0] - start, time.perf_counter() - t0
    finally:
        tracemalloc.stop()
    rows = selector.rows["torch#2"]
    return {"candidates": n, "rows": rows, "state_mib": round(held / 2**20, 1),
            "bytes_per_row": round(held / max(1, rows)), "seconds": round(seconds, 1)}  # fmt: skip


def run_bench(
    what: str, n: int, workload: str, device: str, workers: int, compile_check: bool, shared_checks: bool = True
) -> dict:
    if what == "selection":
        return {"bench": what, "machine": _machine(), **bench_selection(n)}
    if what == "cpu":
        result = bench_cpu(n, workload)
    elif what == "decontam":
        result = bench_decontam(n, workload)
    else:
        result = bench_execute(n, workload, device, workers, compile_check, shared_checks)
    return {"bench": what, "machine": _machine(), **result}
