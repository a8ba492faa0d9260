"""Execution checks under the agent's conventions: finite, deterministic, distinguishable, timed, compiled.

`run_checks` is the whole check of one task; it runs inside a worker process of `WorkerPool` (on CPU or CUDA,
the same code path), so a crash, a hang or an out-of-memory costs only that task.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch._dynamo

from filters.reasons import (
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
from filters.task_loading import TaskLoadError, load_task

PRESCREEN_MARGIN = 3.0  # events time this far outside the window decides without the profiler
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
    warmup: int = 5  # timing warm-up iterations
    iters: int = 10  # timed iterations (the median is reported)
    memory_fraction: float = 0.9  # share of the GPU's memory all workers of one GPU may use together
    workers: int = 1  # worker processes in the pool


class CheckFailed(Exception):
    """A check decided: carries the verdict, with what was measured before it."""

    def __init__(self, reason: str, detail: str, measurements: dict[str, Any] | None = None):
        super().__init__(detail)
        self.verdict = Verdict(reason, detail, measurements or {})


def flatten_outputs(out: Any) -> list[torch.Tensor]:
    """All tensors of a forward's result, in order (nested tuples, lists and dicts included)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, list | tuple):
        return [t for item in out for t in flatten_outputs(item)]
    if isinstance(out, int | float | bool):
        return [torch.tensor(out)]
    return []


def tensors_close(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> bool:
    """assert_close's rule without the message: |a - b| <= atol + rtol * |b|, exact for integers and bools."""
    if a.shape != b.shape:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(torch.allclose(a, b.to(a.dtype), atol=atol, rtol=rtol))
    return bool(torch.equal(a, b.to(a.dtype)))


def outputs_close(a: list[torch.Tensor], b: list[torch.Tensor], atol: float, rtol: float) -> bool:
    return len(a) == len(b) and all(tensors_close(x, y, atol, rtol) for x, y in zip(a, b, strict=True))


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


def _kernel_time_ms(fn, inputs: list, iters: int) -> float:
    """The paper's measure: summed device time of the CUDA work of one forward, from torch.profiler, averaged
    over `iters` forwards (CPU launch overhead excluded). Call after warm-up."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn(*inputs)
        torch.cuda.synchronize()
    device_us = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == DeviceType.CUDA)
    return device_us / 1e3 / iters


def _time_forward_ms(fn, inputs: list, cfg: ExecutionConfig) -> float:
    """Median wall time of one forward: CUDA events on the GPU, the host clock on the CPU."""
    with torch.no_grad():
        for _ in range(cfg.warmup):
            fn(*inputs)
        samples = []
        if cfg.device == "cuda":
            torch.cuda.synchronize()
            for _ in range(cfg.iters):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn(*inputs)
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end))
        else:
            for _ in range(cfg.iters):
                t0 = time.perf_counter()
                fn(*inputs)
                samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def _check_distinguishable(outs: list[list[torch.Tensor]], cfg: ExecutionConfig) -> None:
    for j in range(1, len(outs)):
        if outputs_close(outs[j], outs[0], cfg.atol, cfg.rtol):
            raise CheckFailed(INDISTINGUISHABLE_OUTPUTS, f"outputs of input draws 0 and {j} agree within tolerance")
    # assert_close's rule against a constant c is max |t - c| <= atol + rtol |c|; reductions, no full-size copies.
    floats = [t for o in outs for t in o if t.is_floating_point() and t.numel()]
    if floats:
        if all(float(t.abs().max()) <= cfg.atol for t in floats):
            raise CheckFailed(INDISTINGUISHABLE_OUTPUTS, "outputs vanish: all zero within tolerance")
        # A single value is trivially constant: a scalar output (a loss, a distance) is judged across draws only.
        spread = [t for t in floats if t.numel() > 1]
        means = [float(t.mean()) for t in spread]
        if spread and all(
            float((t - m).abs().max()) <= cfg.atol + cfg.rtol * abs(m) for t, m in zip(spread, means, strict=True)
        ):
            raise CheckFailed(INDISTINGUISHABLE_OUTPUTS, "each output is a constant within tolerance")


def run_checks(source: str, seed: int, cfg: ExecutionConfig, device_lock=None) -> Verdict:
    """Every execution check of one task, in-process; `WorkerPool` calls this inside its workers.

    `device_lock`, shared by the workers of one GPU, is held while the task runs on the device (its draws and
    its timings): kernels of two processes on one GPU slow each other, which would make a task's measured time
    depend on its neighbour. Loading, and compiling (mostly CPU), overlap freely."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a task's own warnings (deprecated spellings) say nothing about it
            return Verdict(KEEP, "", _checks(source, seed, cfg, device_lock or contextlib.nullcontext()))
    except CheckFailed as failed:
        return failed.verdict
    except Exception as e:
        return classify_error(e)
    finally:
        if cfg.device == "cuda":
            torch.cuda.empty_cache()  # under a per-worker memory budget, cached blocks of this task must not stay


def _checks(source: str, seed: int, cfg: ExecutionConfig, device_lock) -> dict[str, Any]:
    """The measurements of a task that passes; raises CheckFailed with the first reason it fails."""
    try:
        task = load_task(source)
    except TaskLoadError as e:
        raise CheckFailed(LOAD_ERROR, str(e)[:300]) from None
    device = torch.device(cfg.device)
    torch.manual_seed(seed)
    with torch.device(device):
        model = task.model_class(*task.get_init_inputs())
    model = model.to(device).eval()
    outs: list[list[torch.Tensor]] = []
    with device_lock, torch.no_grad():
        for i in range(cfg.num_draws):
            torch.manual_seed(seed + 1 + i)
            with torch.device(device):
                inputs = list(_to_device(task.get_inputs(), device))
            outs.append(flatten_outputs(model(*inputs)))
            if i == 0:
                first_inputs = inputs  # kept for the rerun, the timing and the compile check; later draws are not
        rerun = flatten_outputs(model(*first_inputs))
    if not outs[0]:
        raise CheckFailed(RUNTIME_ERROR, "forward returns no tensor")
    for o in outs:
        for t in o:
            if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()):
                raise CheckFailed(NOT_FINITE, "an output holds NaN or infinity")
    if not outputs_close(rerun, outs[0], cfg.atol, cfg.rtol):
        raise CheckFailed(NOT_DETERMINISTIC, "the same input gave different outputs")
    _check_distinguishable(outs, cfg)
    eager_out = outs[0]
    del outs, rerun

    measurements: dict[str, Any] = {
        "output_shapes": [list(t.shape) for t in eager_out],
        "device_name": device_name(cfg.device),
    }
    low, high = cfg.runtime_window_ms
    with device_lock:
        eager_ms = _time_forward_ms(model, first_inputs, cfg)
        if cfg.device == "cuda":
            # CUDA events pre-screen; the profiler decides where a task may be near the window.
            measurements["eager_event_ms"] = eager_ms
            if low / PRESCREEN_MARGIN <= eager_ms <= high * PRESCREEN_MARGIN:
                eager_ms = _kernel_time_ms(model, first_inputs, cfg.iters)
    measurements["eager_ms"] = eager_ms
    if eager_ms < low:
        raise CheckFailed(RUNTIME_BELOW_WINDOW, f"eager {eager_ms:.4f} ms < {low} ms", measurements)
    if eager_ms > high:
        raise CheckFailed(RUNTIME_ABOVE_WINDOW, f"eager {eager_ms:.4f} ms > {high} ms", measurements)

    if cfg.compile_check:
        torch._dynamo.reset()
        try:
            compiled = torch.compile(model, backend=cfg.compile_backend)
            with torch.no_grad():
                compiled_out = flatten_outputs(compiled(*first_inputs))
            with device_lock:
                compile_ms = _time_forward_ms(compiled, first_inputs, cfg)  # also the profiled run's warm-up
                if cfg.device == "cuda":
                    compile_ms = _kernel_time_ms(compiled, first_inputs, cfg.iters)
            measurements["compile_ms"] = compile_ms
        except Exception as e:
            verdict = classify_error(e)
            reason = OUT_OF_MEMORY if verdict.reason == OUT_OF_MEMORY else COMPILE_ERROR
            raise CheckFailed(reason, one_line(e), measurements) from None
        if not outputs_close(compiled_out, eager_out, cfg.atol, cfg.rtol):
            raise CheckFailed(
                COMPILE_MISMATCH, "torch.compile output differs from eager beyond tolerance", measurements
            )
    return measurements


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
    """A CUDA error poisons the worker's context: the pool replaces the worker after such a verdict."""
    return v.reason == RUNTIME_ERROR and any(m in v.detail for m in CUDA_FATAL_MARKERS)
