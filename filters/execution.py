"""Execution checks under the agent's conventions: finite, deterministic, distinguishable, timed, compiled.

`run_checks` is the whole check of one task; it runs inside a worker process of `WorkerPool` (on CPU or CUDA,
the same code path), so a crash, a hang or an out-of-memory costs only that task.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import warnings
from dataclasses import asdict, dataclass
from typing import Any

import torch

from opsynth.config import TIMING
from opsynth.filters.comparison import differing_elements, flatten_outputs, outputs_close
from opsynth.filters.task_loading import TaskLoadError, load_task
from opsynth.filters.timing import (
    PhaseClock,
    device_ms,
    host_time_ms,
    profile_forwards,
    timed_forward,
    timed_iters,
)
from opsynth.reasons import (
    COMPILE_ERROR,
    COMPILE_MISMATCH,
    INDISTINGUISHABLE_OUTPUTS,
    KEEP,
    LOAD_ERROR,
    NOT_DETERMINISTIC,
    NOT_FINITE,
    OUT_OF_MEMORY,
    RUNTIME_ABOVE_WINDOW,
    RUNTIME_BELOW_WINDOW,
    RUNTIME_ERROR,
    Verdict,
    one_line,
)

# Two input draws tell a task's outputs apart when this share of their elements differ beyond tolerance.
DISTINGUISHING_FRACTION = 1e-3
PRESCREEN_MARGIN = 3.0  # a forward timed this far above the window decides it without the profiler
COMPILE_FIRST_MARGIN = 1.25  # CUDA: checks' events this many times the window's low end: compiled before timing
# Where a worker's time goes, per task: building the model; waiting for the device lock; the first input draw
# and the first (untimed) forward; the other draws and the rerun; comparing their outputs; the eager timing;
# starting and stopping the profiler, and reading its events; torch.compile (host work); the compiled model's
# first run (on CUDA, Triton's autotuning benchmarks); its warm-up and its agreement with eager; its timing.
PHASES = (
    "load",
    "lock_wait",
    "first_forward",
    "eager_checks",
    "output_checks",
    "eager_timing",
    "profiler",
    "profile_parse",
    "compile",
    "compiled_first_run",
    "compiled_checks",
    "compiled_timing",
)
# CUDA: memory a worker's allocator keeps cached between tasks. Returning all of it after every task makes the
# next task's first forwards allocate from the driver again, under the device lock; more than this is returned,
# for the other workers of the GPU.
CACHE_KEEP_BYTES = 4 << 30
COMPILED_WARMUP = 2  # CUDA: after the compiling call, which ran the compiled model once already
CUDA_FATAL_MARKERS = (
    "CUDA error",
    "device-side assert",
    "illegal memory access",
    "CUBLAS_STATUS",
    "cuDNN error",
)


@dataclass(frozen=True)
class ExecutionConfig:
    """How a task is executed and judged."""

    device: str  # "cpu" or "cuda"
    runtime_window_ms: tuple[float, float]  # eager time must lie in [low, high]
    timeout_s: float  # wall-clock limit per task, enforced by the pool
    compile_check: bool = True  # also run under torch.compile and compare with eager
    compile_backend: str = "inductor"  # torch.compile backend of the compile check
    num_draws: int = 5  # fresh get_inputs() draws compared for distinguishability
    atol: float = 1e-2  # verification tolerance of the agent's checker
    rtol: float = 1e-2
    warmup: int = 5  # CPU: warm-up forwards of the compiled model's timing (CUDA: the checks' forwards warm up)
    iters: int = 10  # CUDA: the profiler's timed forwards; CPU: those of the compiled model's timing
    memory_fraction: float = 0.9  # share of the GPU's memory all workers of one GPU may use together
    shared_checks: bool = True  # CUDA: the checks of a few tasks may share a GPU (timings never do)
    workers: int = 1  # worker processes in the pool


def execution_config(
    device: str,
    runtime_window_ms: tuple[float, float],
    timeout_s: float,
    compile_check: bool,
    workers: int,
    shared_checks: bool = True,
) -> ExecutionConfig:
    """The execution settings, with the device's warm-up and timed iterations (`generate`, `validate`, `bench`)."""
    warmup, iters = TIMING[device]
    return ExecutionConfig(
        device=device,
        runtime_window_ms=runtime_window_ms,
        timeout_s=timeout_s,
        compile_check=compile_check,
        warmup=warmup,
        iters=iters,
        workers=workers,
        shared_checks=shared_checks,
    )


class CheckFailed(Exception):
    """A check decided: carries the verdict, with what was measured before it."""

    def __init__(self, reason: str, detail: str, measurements: dict[str, Any] | None = None):
        super().__init__(detail)
        self.verdict = Verdict(reason, detail, measurements or {})


def classify_error(error: BaseException) -> Verdict:
    """An exception raised while running a task: out_of_memory when it is one, else runtime_error."""
    text = str(error)
    if isinstance(error, torch.OutOfMemoryError | MemoryError) or "out of memory" in text or "can't allocate" in text:
        return Verdict(OUT_OF_MEMORY, one_line(error))
    return Verdict(RUNTIME_ERROR, one_line(error))


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, list | tuple):
        return type(value)(_to_device(v, device) for v in value)
    return value


class _Outputs:
    """The draws' outputs, judged as they come: the first draw's kept (the rerun and the compiled model are
    compared with it), every other one reduced at once to whether it agrees with the first and each floating
    output's size, min, max and mean (one fused reduction and a mean, no full-size temporaries). So a task's
    checks hold two draws' outputs at a time, not all of them; `decide` gives the first reason it fails."""

    def __init__(self, first: list[torch.Tensor], cfg: ExecutionConfig):
        self.first = first
        self.cfg = cfg
        self.ranges: list[tuple[int, float, float, float]] = []  # (numel, min, max, mean); min/max NaN where any is
        self.complex_finite = True
        self.agreeing: list[int] = []  # draws whose outputs agree with the first's within tolerance
        self.draws = 0
        self._reduce(first)

    def _reduce(self, out: list[torch.Tensor]) -> None:
        self.draws += 1
        for t in out:
            if t.is_floating_point() and t.numel():
                lo, hi = torch.aminmax(t)
                mean = float(t.mean()) if t.numel() > 1 else float(lo)
                self.ranges.append((t.numel(), float(lo), float(hi), mean))
            elif t.is_complex() and not bool(torch.isfinite(t).all()):
                self.complex_finite = False

    def add(self, out: list[torch.Tensor]) -> None:
        if not self.apart(out, self.first):
            self.agreeing.append(self.draws)
        self._reduce(out)

    def apart(self, out: list[torch.Tensor], other: list[torch.Tensor]) -> bool:
        """Whether two draws' outputs differ beyond tolerance in DISTINGUISHING_FRACTION of their elements (at
        least one). A task whose outputs are one value but for a few extremes (a saturated tanh) would be
        told apart by those extremes alone, and so by one seed and not another."""
        enough = max(1, math.ceil(DISTINGUISHING_FRACTION * sum(t.numel() for t in out)))
        return differing_elements(out, other, self.cfg.atol, self.cfg.rtol, enough) >= enough

    def decide(self, rerun: list[torch.Tensor]) -> None:
        cfg = self.cfg
        if not self.first:
            raise CheckFailed(RUNTIME_ERROR, "forward returns no tensor")
        if not (self.complex_finite and all(math.isfinite(lo) and math.isfinite(hi) for _, lo, hi, _ in self.ranges)):
            raise CheckFailed(NOT_FINITE, "an output holds NaN or infinity")
        if not outputs_close(rerun, self.first, cfg.atol, cfg.rtol):
            raise CheckFailed(NOT_DETERMINISTIC, "the same input gave different outputs")
        if self.agreeing:
            raise CheckFailed(
                INDISTINGUISHABLE_OUTPUTS,
                f"outputs of input draws 0 and {self.agreeing[0]} differ beyond tolerance in under "
                f"{DISTINGUISHING_FRACTION:.1%} of their elements",
            )
        if self.ranges:
            if all(max(-lo, hi) <= cfg.atol for _, lo, hi, _ in self.ranges):
                raise CheckFailed(INDISTINGUISHABLE_OUTPUTS, "outputs vanish: all zero within tolerance")
            # assert_close's rule against a constant c is max |t - c| <= atol + rtol |c|, with c the mean: the
            # largest |t - c| is at t's min or max. A single value is trivially constant: a scalar output (a
            # loss, a distance) is judged across draws only.
            spread = [(lo, hi, m) for n, lo, hi, m in self.ranges if n > 1]
            if spread and all(max(hi - m, m - lo) <= cfg.atol + cfg.rtol * abs(m) for lo, hi, m in spread):
                raise CheckFailed(INDISTINGUISHABLE_OUTPUTS, "each output is a constant within tolerance")


def run_checks(source: str, seed: int, cfg: ExecutionConfig, device_lock=None) -> Verdict:
    """Every execution check of one task, in-process; `WorkerPool` calls this inside its workers.

    `device_lock`, shared by the workers of one GPU, is held while the task runs on the device: alone for its
    timings, since kernels of two processes on one GPU slow each other, which would make a task's measured time
    depend on its neighbour; in its shared mode (alone too, unless the lock has several slots) for the rest of
    its device work. Loading and compiling (host work) hold nothing. Every verdict carries `phase_s`, the
    seconds spent in each of `PHASES`."""
    clock = PhaseClock()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a task's own warnings (deprecated spellings) say nothing about it
            verdict = Verdict(KEEP, "", _checks(source, seed, cfg, device_lock or contextlib.nullcontext(), clock))
    except CheckFailed as failed:
        verdict = failed.verdict
    except Exception as e:
        verdict = classify_error(e)
    finally:
        if cfg.device == "cuda" and torch.cuda.memory_reserved() > CACHE_KEEP_BYTES:
            torch.cuda.empty_cache()  # a large cache would hold memory the other workers of the GPU may need
    phase_s = {phase: round(s, 4) for phase, s in clock.seconds.items()}
    return Verdict(verdict.reason, verdict.detail, {**verdict.measurements, "phase_s": phase_s})


def _near_window(ms: float, window: tuple[float, float]) -> bool:
    """Within PRESCREEN_MARGIN of the window: only a finer measure can say whether it is in."""
    low, high = window
    return low / PRESCREEN_MARGIN <= ms <= high * PRESCREEN_MARGIN


def _check_events(measurements: dict[str, Any], window: tuple[float, float]) -> None:
    """CUDA: the checks' forwards timed by events decide a task below the window, or far above it, before the
    profiler. Events bound a forward's device time from above (they include the gaps between kernels, and the
    checks may share the GPU), so a task under the window by them is under it by the profiler too; above it,
    the gaps may be what puts it there, so only a task PRESCREEN_MARGIN above is decided."""
    low, high = window
    if measurements["eager_event_ms"] < low or measurements["eager_event_ms"] > high * PRESCREEN_MARGIN:
        _check_window({**measurements, "eager_ms": measurements["eager_event_ms"]}, window)


def _shared(lock):
    """The lock's shared mode where it has one (a GPU's DeviceLock), for the checks' device work."""
    return lock.shared() if hasattr(lock, "shared") else lock


def _draw(task, seed: int, i: int, device: torch.device) -> list:
    torch.manual_seed(seed + 1 + i)
    with torch.device(device):
        return list(_to_device(task.get_inputs(), device))


def _check_window(measurements: dict[str, Any], window: tuple[float, float]) -> None:
    low, high = window
    eager_ms = measurements["eager_ms"]
    if eager_ms < low:
        raise CheckFailed(RUNTIME_BELOW_WINDOW, f"eager {eager_ms:.4f} ms < {low} ms", measurements)
    if eager_ms > high:
        raise CheckFailed(RUNTIME_ABOVE_WINDOW, f"eager {eager_ms:.4f} ms > {high} ms", measurements)


def _check_outputs(outs: list[list[torch.Tensor]], rerun: list[torch.Tensor], cfg: ExecutionConfig) -> None:
    """Every output check of the draws `outs` and the rerun of the first; raises CheckFailed with the first
    reason they fail."""
    judged = _Outputs(outs[0], cfg)
    for out in outs[1:]:
        judged.add(out)
    judged.decide(rerun)


def _checks(source: str, seed: int, cfg: ExecutionConfig, device_lock, clock: PhaseClock) -> dict[str, Any]:
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
    # of another process would slow a task being timed.
    with clock.holding(_shared(device_lock)):
        with clock("load"):
            torch.manual_seed(seed)
            with torch.device(device):
                model = task.model_class(*task.get_init_inputs())
            model = model.to(device).eval()
        with torch.no_grad():
            with clock("first_forward"):
                inputs = _draw(task, seed, 0, device)  # kept for the rerun, the timing and the compile check
                first = flatten_outputs(model(*inputs))  # untimed: the first use of the task's memory and kernels
                if cuda:
                    torch.cuda.synchronize()  # its device work counted here, not in the next phase
            with clock("output_checks"):
                judged = _Outputs(first, cfg)
            with clock("eager_checks"):
                samples = []
                for i in range(1, cfg.num_draws):
                    out, ms = timed_forward(model, _draw(task, seed, i, device), cuda)
                    samples.append(ms)
                    if i == 1 and not _near_window(ms, cfg.runtime_window_ms):
                        measurements["eager_ms"] = ms
                        _check_window(measurements, cfg.runtime_window_ms)
                    with clock("output_checks"):
                        judged.add(flatten_outputs(out))
                    del out
                rerun, ms = timed_forward(model, inputs, cuda)
                samples.append(ms)
            with clock("output_checks"):
                judged.decide(flatten_outputs(rerun))
            eager_out = first
            measurements["output_shapes"] = [list(t.shape) for t in eager_out]
            del judged, rerun
            measurements["eager_ms"] = statistics.median(samples)
    if not cuda:
        _check_window(measurements, cfg.runtime_window_ms)
        if cfg.compile_check:
            measurements["compile_ms"] = _compile_check_cpu(model, inputs, eager_out, cfg, device_lock, clock,
                                                            measurements)  # fmt: skip
        return measurements
    measurements["eager_event_ms"] = measurements["eager_ms"]
    _check_events(measurements, cfg.runtime_window_ms)
    return _cuda_timings(model, inputs, eager_out, cfg, device_lock, clock, measurements)


def _profiled_ms(runs: list[tuple], inputs: list, iters: int, device_lock, clock: PhaseClock) -> list[float]:
    """The paper's measure of each (fn, phase) of `runs`: `iters` profiled forwards, all in one hold of the GPU
    alone."""
    profiles = profile_forwards(runs, inputs, iters, clock.holding(device_lock), clock)
    with clock("profile_parse"):
        return [device_ms(prof, iters) for prof in profiles]


def _cuda_timings(model, inputs: list, eager_out: list, cfg: ExecutionConfig, device_lock, clock: PhaseClock,
                  measurements: dict[str, Any], timer=_profiled_ms) -> dict[str, Any]:  # fmt: skip
    """CUDA, once the checks passed: the eager timing decides the window, and a task inside it is compiled,
    checked against eager (sharing the GPU) and timed compiled. A task whose checks' events put it
    COMPILE_FIRST_MARGIN inside the window is compiled first, so that both timings take one hold of the GPU
    (each hold drains the tasks sharing it); any other is compiled only once its eager timing is in. Each
    timing holds the GPU alone for its forwards only (the checks' forwards were the eager warm-up). `timer(runs,
    inputs, iters, lock, clock)` is the measure of each (fn, phase), in ms."""
    iters = timed_iters(cfg.iters, measurements["eager_ms"])
    compile_first = cfg.compile_check and measurements["eager_ms"] >= COMPILE_FIRST_MARGIN * cfg.runtime_window_ms[0]
    compiled, failed = None, None
    if compile_first:
        try:
            compiled = _compiled_for_timing(model, inputs, eager_out, cfg, device_lock, clock, measurements)
        except CheckFailed as e:
            if e.verdict.reason == OUT_OF_MEMORY or is_fatal_cuda_error(e.verdict):
                raise  # nothing more can run here (the pool retries the first alone)
            failed = e  # told once the window is
    runs = [(model, "eager_timing")] + ([(compiled, "compiled_timing")] if compiled is not None else [])
    times = timer(runs, inputs, iters, device_lock, clock)
    measurements["eager_ms"] = times[0]
    _check_window(measurements, cfg.runtime_window_ms)
    if failed is not None:
        raise CheckFailed(failed.verdict.reason, failed.verdict.detail, measurements)
    if compiled is None and cfg.compile_check:
        compiled = _compiled_for_timing(model, inputs, eager_out, cfg, device_lock, clock, measurements)
        times = [*times, *timer([(compiled, "compiled_timing")], inputs, iters, device_lock, clock)]
    if compiled is not None:
        measurements["compile_ms"] = times[1]
    return measurements


def _locked_backend(backend: str, lock, clock: PhaseClock | None = None):
    """The torch.compile backend `backend`, with each compiled graph run holding `lock`'s shared mode (unless
    this process holds the lock already), timed as `compiled_first_run` on `clock`. Compiling, host work,
    overlaps other tasks' timings; running the compiled kernels, the first run's autotuning of Triton's
    configurations included, does not. That first run may take seconds of benchmarking, so it is bound by the
    task's time limit, not the lock's hold limit."""
    from torch._dynamo.backends.registry import lookup_backend

    inner = lookup_backend(backend)
    clock = clock or PhaseClock()

    def compile_graph(graph, example_inputs):
        compiled = inner(graph, example_inputs)

        def run(*args):
            if getattr(lock, "held", True):  # held already, or no lock to hold
                return compiled(*args)
            unwatched = lock.unwatched_holds() if hasattr(lock, "unwatched_holds") else contextlib.nullcontext()
            with unwatched, clock.holding(_shared(lock)), clock("compiled_first_run"):
                out = compiled(*args)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()  # its kernels done before the lock is let go
                return out

        return run

    return compile_graph


def _compile_failure(error: Exception, measurements: dict[str, Any] | None = None) -> CheckFailed:
    reason = OUT_OF_MEMORY if classify_error(error).reason == OUT_OF_MEMORY else COMPILE_ERROR
    return CheckFailed(reason, one_line(error), measurements)


def _compile(model, inputs: list, cfg: ExecutionConfig, device_lock, clock: PhaseClock) -> tuple[Any, list]:
    """The compiled model and the flattened output of its first (compiling) call, timed as `compile`."""
    import torch._dynamo  # here, not above: the driver imports this module and never compiles

    torch._dynamo.reset()
    with clock("compile"), torch.no_grad():
        compiled = torch.compile(model, backend=_locked_backend(cfg.compile_backend, device_lock, clock))
        return compiled, flatten_outputs(compiled(*inputs))


MISMATCH_DETAIL = "torch.compile output differs from eager beyond tolerance"


def _compile_check_cpu(model, inputs: list, eager_out: list, cfg: ExecutionConfig, device_lock, clock,
                       measurements) -> float:  # fmt: skip
    """The compiled model's time by the host clock; raises CheckFailed (with what was measured) where it fails
    to compile or disagrees with eager."""
    try:
        compiled, compiled_out = _compile(model, inputs, cfg, device_lock, clock)
        with clock.holding(device_lock), clock("compiled_timing"):
            compile_ms = host_time_ms(compiled, inputs, cfg.warmup, cfg.iters)
            agree = outputs_close(compiled_out, eager_out, cfg.atol, cfg.rtol)
    except Exception as e:
        raise _compile_failure(e, measurements) from None
    if not agree:
        raise CheckFailed(COMPILE_MISMATCH, MISMATCH_DETAIL, measurements)
    return compile_ms


def _compiled_for_timing(model, inputs: list, eager_out: list, cfg: ExecutionConfig, device_lock, clock,
                         measurements) -> Any:  # fmt: skip
    """CUDA: the compiled model, warmed up and found to agree with eager (sharing the GPU like the eager checks),
    ready to be timed; raises CheckFailed, with what was measured, where it fails to compile or disagrees."""
    try:
        compiled, compiled_out = _compile(model, inputs, cfg, device_lock, clock)
        with clock.holding(_shared(device_lock)), clock("compiled_checks"), torch.no_grad():
            for _ in range(COMPILED_WARMUP):
                compiled(*inputs)
            agree = outputs_close(compiled_out, eager_out, cfg.atol, cfg.rtol)
    except Exception as e:
        raise _compile_failure(e, measurements) from None
    if not agree:
        raise CheckFailed(COMPILE_MISMATCH, MISMATCH_DETAIL, measurements)
    return compiled


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    import platform

    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def verdict_to_wire(v: Verdict) -> dict:
    return asdict(v)


def verdict_from_wire(d: dict) -> Verdict:
    return Verdict(**d)


def is_fatal_cuda_error(v: Verdict) -> bool:
    """A CUDA error poisons the worker's context: the pool replaces the worker after such a verdict, whether the
    eager model or the compiled one (an inductor kernel's device-side assert) raised it."""
    return v.reason in (RUNTIME_ERROR, COMPILE_ERROR) and any(m in v.detail for m in CUDA_FATAL_MARKERS)
