"""Execution checks under the agent's conventions: finite, deterministic, distinguishable, timed, compiled.
`run_checks` is the whole check of one task, run inside a worker of `WorkerPool` (docs/execution.md, "The checks and
the timing")."""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from opsynth.config import COMPILE_PROCESSES, DISTINGUISHING_FRACTION, NUM_DRAWS, TIMING, VERIFY_ATOL, VERIFY_RTOL
from opsynth.filters.comparison import flatten_outputs, to_device
from opsynth.filters.compiled_model import compile_check_cpu, compiled_for_timing
from opsynth.filters.device_holds import give_back_cached, pausing_between_modules, shared_mode, yield_to_timings
from opsynth.filters.output_checks import DrawOutputs
from opsynth.filters.rehearsal import rehearsed
from opsynth.filters.task_loading import TaskLoadError, load_task
from opsynth.filters.timing import (
    PhaseClock,
    allocation_failures,
    counting_failures,
    profiled_ms,
    timed_forward,
    timed_iters,
)
from opsynth.filters.verdicts import CheckFailed, classify_error, is_fatal_cuda_error
from opsynth.filters.window_checks import check_events, check_window, near_window, over_ceiling
from opsynth.filters.worker_budgets import cache_keep_bytes
from opsynth.reasons import (
    KEEP,
    LOAD_ERROR,
    OUT_OF_MEMORY,
    RUNTIME_ABOVE_WINDOW,
    Verdict,
)

COMPILE_FIRST_MARGIN = 1.25  # CUDA: checks' events this many times the window's low end: compiled before timing
# Where a worker's time goes, per task: building the model; waiting for the device lock; the first input draw
# and the first (untimed) forward; on CUDA, its rehearsal (holding nothing, filters.rehearsal); the other draws
# and the rerun; comparing their outputs; the eager timing; starting and stopping the profiler, and reading its
# events; torch.compile (host work); the compiled model's first run (on CUDA, Triton's autotuning benchmarks;
# and what dynamo leaves to eager); its agreement with eager; its timing; giving back the GPU memory the task's
# allocator cached.
PHASES = (
    "load",
    "lock_wait",
    "first_forward",
    "rehearsal",
    "eager_checks",
    "output_checks",
    "eager_timing",
    "profiler",
    "profile_parse",
    "compile",
    "compiled_first_run",
    "compiled_checks",
    "compiled_timing",
    "release",
)
# What a worker's watch may report beyond its task's phases (see phase_reporter): a task that ran out of memory
# waiting for a worker's budget of the GPU's memory to be free before it runs again alone; its verdict sent, the
# pool yet to take it and hand over the next job.
MEMORY_WAIT = "memory_wait"
HANDING_BACK = "handing_back"
REPORTED_PHASES = (*PHASES, MEMORY_WAIT, HANDING_BACK)


@dataclass(frozen=True)
class ExecutionConfig:
    """How a task is executed and judged."""

    device: str  # "cpu" or "cuda"
    runtime_window_ms: tuple[float, float]  # eager time must lie in [low, high]
    timeout_s: float  # time limit per task, enforced by the pool: CPU time per intra-op thread (worker_budgets.overdue)
    compile_check: bool = True  # also run under torch.compile and compare with eager
    compile_backend: str = "inductor"  # torch.compile backend of the compile check
    compile_processes: int = COMPILE_PROCESSES  # a worker's own processes compiling its kernels (1: itself)
    num_draws: int = NUM_DRAWS  # fresh get_inputs() draws compared for distinguishability
    atol: float = VERIFY_ATOL  # verification tolerance of the agent's checker
    rtol: float = VERIFY_RTOL
    warmup: int = 5  # CPU: warm-up forwards of the compiled model's timing (CUDA: the checks' forwards warm up)
    iters: int = 10  # CUDA: the profiler's timed forwards; CPU: those of the compiled model's timing
    memory_fraction: float = 0.9  # share of the GPU's memory all workers of one GPU may use together
    shared_checks: bool = True  # CUDA: the checks of a few tasks may share a GPU (timings never do)
    workers: int = 1  # worker processes in the pool
    keep_margin: float = 0.0  # the final timing (profiler; CPU: median) must be this far inside the window
    distinguishing_fraction: float = DISTINGUISHING_FRACTION  # of their elements two draws' outputs must differ in
    # Outputs told apart beyond the tolerance times this, rerun and compiled outputs agreeing within it over this.
    tolerance_margin: float = 1.0
    every_pair: bool = False  # small outputs: every two draws told apart, not each draw from the first alone
    compile_draws: int = 1  # draws the compiled model must agree with eager on where an output is discrete


def execution_config(
    device: str,
    runtime_window_ms: tuple[float, float],
    timeout_s: float,
    compile_check: bool,
    workers: int,
    shared_checks: bool = True,
    keep_margin: float = 0.0,
    distinguishing_fraction: float = DISTINGUISHING_FRACTION,
    tolerance_margin: float = 1.0,
    every_pair: bool = False,
    compile_draws: int = 1,
) -> ExecutionConfig:
    """The execution settings, with the device's warm-up and timed iterations (`generate`, `validate`, `bench`);
    `generate` asks its margins of the timing and the checks (opsynth.config's KEEP_*)."""
    warmup, iters = TIMING[device]
    return ExecutionConfig(
        device=device,
        runtime_window_ms=runtime_window_ms,
        keep_margin=keep_margin,
        distinguishing_fraction=distinguishing_fraction,
        tolerance_margin=tolerance_margin,
        every_pair=every_pair,
        compile_draws=compile_draws,
        timeout_s=timeout_s,
        compile_check=compile_check,
        warmup=warmup,
        iters=iters,
        workers=workers,
        shared_checks=shared_checks,
    )


def run_checks(
    source: str, seed: int, cfg: ExecutionConfig, device_lock=None, ceiling_ms: float | None = None
) -> Verdict:
    """Every execution check of one task, in-process; `WorkerPool` calls this inside its workers.

    `device_lock`, shared by the workers of one GPU, is held while the task runs on the device: alone for its
    timings, since kernels of two processes on one GPU slow each other, which would make a task's measured time
    depend on its neighbour; in its shared mode (alone too, unless the lock has several slots) for the rest of
    its device work. Loading and compiling (host work) hold nothing. Every verdict carries `phase_s`, the
    seconds spent in each of `PHASES`. `ceiling_ms` (a first try's, filters.calibration): a task whose first
    timed forward is over it stops there, `runtime_above_window` with `ceiling_ms` among its measurements."""
    clock = PhaseClock(report=phase_reporter(device_lock))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a task's own warnings (deprecated spellings) say nothing about it
            lock = device_lock or contextlib.nullcontext()
            verdict = Verdict(KEEP, "", _checks(source, seed, cfg, lock, clock, ceiling_ms))
    except CheckFailed as failed:
        verdict = failed.verdict
    except Exception as e:
        verdict = classify_error(e)
    finally:
        if cfg.device == "cuda":
            release_cache(cfg, device_lock, clock)
    phase_s = {phase: round(s, 4) for phase, s in clock.seconds.items()}
    return Verdict(verdict.reason, verdict.detail, {**verdict.measurements, "phase_s": phase_s})


def release_cache(cfg: ExecutionConfig, device_lock, clock: PhaseClock) -> None:
    """CUDA: the memory this process's allocator caches given back (`give_back_cached`) where it is over what a
    worker keeps between tasks: a large cache would hold memory the other workers may need."""
    if torch.cuda.memory_reserved() > cache_keep_bytes(device_bytes(), cfg):
        with clock("release"):
            give_back_cached(device_lock)


def phase_reporter(device_lock):
    """What tells the pool the phase a task is in, through the watch of `device_lock` (a GPU's DeviceLock: its
    index in REPORTED_PHASES, plus one; see device_lock.PHASE); None for any other lock."""
    report = getattr(device_lock, "report_phase", None)
    if report is None:
        return None
    codes = {phase: k + 1 for k, phase in enumerate(REPORTED_PHASES)}
    return lambda phase: report(codes.get(phase, 0))  # a phase no code names reads as none: it is only a report


@functools.cache
def device_bytes() -> int:
    """The memory of this process's GPU, asked once (a worker's warm-up task asks first), so that the end of a
    task that broke the process's CUDA context makes no call into it."""
    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory


def draw_inputs(task, seed: int, i: int, device: torch.device) -> list:
    """Input draw `i` of a task seeded by `seed`, made on `device`."""
    torch.manual_seed(seed + 1 + i)
    with torch.device(device):
        return list(to_device(task.get_inputs(), device))


def _checks(
    source: str, seed: int, cfg: ExecutionConfig, device_lock, clock: PhaseClock, ceiling_ms: float | None = None
) -> dict[str, Any]:
    """The measurements of a task that passes; raises CheckFailed with the first reason it fails.

    The forwards of the draws and of the rerun are timed (CUDA events, or the host clock on the CPU): a task
    already far outside the window after the first of them is decided there, since it is rescaled and run again
    anyway; the median of them all is the CPU's eager time, and on CUDA decides the rest likewise. A task near
    the window is then timed by the profiler, those forwards having been its warm-up."""
    with clock("load"):
        try:
            task = load_task(source)
        except TaskLoadError as e:
            raise CheckFailed(LOAD_ERROR, str(e)[:300]) from None
    device = torch.device(cfg.device)
    cuda = cfg.device == "cuda"
    measurements: dict[str, Any] = {"device_name": device_name(cfg.device)}

    # Every piece of device work holds the lock, building the model (its parameters' initialization) too: work
    # of another process would slow a task being timed. Between the pieces, a timing waiting goes first.
    def pause() -> None:
        if cuda:
            with clock("lock_wait"):
                yield_to_timings(device_lock, torch.cuda.synchronize)

    def draw(i: int) -> list:
        return draw_inputs(task, seed, i, device)

    def between_modules():
        """Building the model and its first forward, mostly host work, pause between its modules too."""
        return pausing_between_modules(pause) if cuda else contextlib.nullcontext()

    def release() -> None:
        release_cache(cfg, device_lock, clock)

    def init_inputs() -> list:
        torch.manual_seed(seed)
        with torch.device(device):
            return task.get_init_inputs()

    def build(args: list):
        with clock("load"), between_modules():
            with torch.device(device):
                model = task.model_class(*args)
            return model.to(device).eval()

    with clock("load"):
        # Holding nothing: the model's arguments are host work (a transformers module's config, its first use
        # importing modules: on one H200 the GPU idled up to 1.3 s while a timing waited for one to be made).
        args = init_inputs()
    with clock.holding(shared_mode(device_lock)):
        model = build(args)
        with torch.no_grad():
            pause()
            with clock("first_forward"):
                inputs = draw(0)  # kept for the rerun, the timing and the compile check
                if cuda and not rehearsed(model, inputs, device_lock, clock, release):
                    task = load_task(source)  # its first forward set tensors that the rehearsal left unset
                    model = build(init_inputs())
                with between_modules():
                    first = flatten_outputs(model(*inputs))  # untimed: the first use of its memory and kernels
                if cuda:
                    torch.cuda.synchronize()  # its device work counted here, not in the next phase
            with clock("output_checks"):
                judged = DrawOutputs(first, cfg)
            with clock("eager_checks"):
                samples = []
                for i in range(1, cfg.num_draws):
                    pause()
                    out, ms = timed_forward(model, draw(i), cuda)
                    samples.append(ms)
                    stop = over_ceiling(ms, ceiling_ms, device_lock) if i == 1 else None
                    if stop is not None:
                        detail = f"eager {ms:.4f} ms > {ceiling_ms:g} ms x {1 + stop['sharers']}, a first try's ceiling"
                        raise CheckFailed(RUNTIME_ABOVE_WINDOW, detail, {**measurements, **stop})
                    if i == 1 and not near_window(ms, cfg.runtime_window_ms):
                        measurements["eager_ms"] = ms
                        check_window(measurements, cfg.runtime_window_ms)
                    with clock("output_checks"):
                        judged.add(flatten_outputs(out))
                    del out
                pause()
                rerun, ms = timed_forward(model, inputs, cuda)
                samples.append(ms)
            with clock("output_checks"):
                judged.decide(flatten_outputs(rerun))
            eager_out = first
            measurements["output_shapes"] = [list(t.shape) for t in eager_out]
            del judged, rerun
            measurements["eager_ms"] = statistics.median(samples)
    if not cuda:
        check_window(measurements, cfg.runtime_window_ms, cfg.keep_margin)
        if cfg.compile_check:
            measurements["compile_ms"] = compile_check_cpu(model, inputs, eager_out, cfg, device_lock, clock,
                                                           measurements, draw)  # fmt: skip
        return measurements
    measurements["eager_event_ms"] = measurements["eager_ms"]
    check_events(measurements, cfg.runtime_window_ms)
    return cuda_timings(model, inputs, eager_out, cfg, device_lock, clock, measurements, draw=draw)


def cuda_timings(model, inputs: list, eager_out: list, cfg: ExecutionConfig, device_lock, clock: PhaseClock,
                  measurements: dict[str, Any], timer=profiled_ms, failures=allocation_failures,
                  draw=None) -> dict[str, Any]:  # fmt: skip
    """CUDA, once the checks passed: the eager timing decides the window, and a task inside it is compiled,
    checked against eager (sharing the GPU) and timed compiled. A task whose checks' events put it
    COMPILE_FIRST_MARGIN inside the window is compiled first, so that both timings take one hold of the GPU
    (each hold drains the tasks sharing it); any other is compiled only once its eager timing is in. Each
    timing holds the GPU alone for its forwards only (the checks' forwards were the eager warm-up). `timer(runs,
    inputs, iters, lock, clock)` is the measure of each (fn, phase), in ms. Allocations that failed during the
    timings (`failures()`, counted before and after each) are recorded as `timing_allocation_failures`: a
    timing that ran a fallback for want of memory, for a run's verdicts to be counted by. `draw(i)`, input draw
    i, is what a discrete output's compiled agreement is checked on beyond the first."""
    timer = counting_failures(timer, failures, measurements)
    iters = timed_iters(cfg.iters, measurements["eager_ms"])
    compile_first = cfg.compile_check and measurements["eager_ms"] >= COMPILE_FIRST_MARGIN * cfg.runtime_window_ms[0]
    compiled, failed = None, None
    if compile_first:
        try:
            compiled = compiled_for_timing(model, inputs, eager_out, cfg, device_lock, clock, measurements, draw)
        except CheckFailed as e:
            if e.verdict.reason == OUT_OF_MEMORY or is_fatal_cuda_error(e.verdict):
                raise  # nothing more can run here (the pool retries the first alone)
            failed = e  # told once the window is
    runs = [(model, "eager_timing")] + ([(compiled, "compiled_timing")] if compiled is not None else [])
    times = timer(runs, inputs, iters, device_lock, clock)
    measurements["eager_ms"] = times[0]
    check_window(measurements, cfg.runtime_window_ms, cfg.keep_margin)
    if failed is not None:
        raise CheckFailed(failed.verdict.reason, failed.verdict.detail, measurements)
    if compiled is None and cfg.compile_check:
        compiled = compiled_for_timing(model, inputs, eager_out, cfg, device_lock, clock, measurements, draw)
        times = [*times, *timer([(compiled, "compiled_timing")], inputs, iters, device_lock, clock)]
    if compiled is not None:
        measurements["compile_ms"] = times[1]
    return measurements


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    import platform

    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
