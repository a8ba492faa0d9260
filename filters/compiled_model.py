"""The compiled model of the compile check: `torch.compile`, its first (compiling) call's device work holding the
GPU's lock (shared, never while compiling), its first run's autotuning bound (filters.autotuning), its agreement
with eager and its timing on the CPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from opsynth.filters.comparison import discrete, flatten_outputs, outputs_close
from opsynth.filters.device_holds import give_back_cached, shared_mode, unwatched
from opsynth.filters.timing import PhaseClock, host_time_ms
from opsynth.filters.verdicts import CheckFailed, classify_error
from opsynth.reasons import COMPILE_ERROR, COMPILE_MISMATCH, OUT_OF_MEMORY, one_line

if TYPE_CHECKING:
    from opsynth.filters.execution import ExecutionConfig

Draw = Callable[[int], list]  # input draw i of the task being checked


def compile_failure(error: Exception, measurements: dict[str, Any] | None = None) -> CheckFailed:
    reason = OUT_OF_MEMORY if classify_error(error).reason == OUT_OF_MEMORY else COMPILE_ERROR
    return CheckFailed(reason, one_line(error), measurements)


def compile_model(model, inputs: list, cfg: ExecutionConfig, device_lock, clock: PhaseClock) -> tuple[Any, list]:
    """The compiled model and the flattened output of its first (compiling) call (see `first_call_holding`)."""
    import torch._dynamo  # here, not above: the driver imports this module and never compiles

    with clock("compile"):
        if torch.cuda.is_initialized():
            # What the checks' forwards left in this worker's allocator is free to no other worker while this one
            # compiles (seconds), holding nothing: the memory tasks beside it run out of.
            give_back_cached(device_lock)
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=cfg.compile_backend)
    with first_call_holding(device_lock, clock), torch.no_grad():
        return compiled, flatten_outputs(compiled(*inputs))


@contextlib.contextmanager
def first_call_holding(lock, clock: PhaseClock):
    """The compiled model's first call: dynamo's and inductor's compiling of each frame (host work) holds
    nothing, timed as `compile`; everything else it runs holds `lock`'s shared mode, timed as
    `compiled_first_run`: the compiled graphs, and what dynamo leaves to run eagerly (a recurrent module it does
    not trace, the operators around a graph break), device work that must not run beside another task's timing.
    The lock is taken at the end of the first compiling, before which the call runs nothing, and let go (its
    device work finished) at the start of any other. Its holds are bound by the task's time limit, not the lock's
    hold limit (Triton's autotuning in a first run may take seconds)."""
    from torch._dynamo.callback import callback_handler

    held, compiling = contextlib.ExitStack(), contextlib.ExitStack()

    def let_go() -> None:
        try:
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()  # its kernels done before another task's timing may start
        finally:
            held.close()  # let go even where the synchronize raises (a broken context: the worker retires)

    def compile_started(*args) -> None:
        if not dynamo_compiling(args):
            return
        let_go()
        compiling.close()  # one compiling at a time is timed, were a torch to nest them
        compiling.enter_context(clock("compile"))

    def compile_ended(*args) -> None:
        if not dynamo_compiling(args):
            return
        compiling.close()
        held.close()
        held.enter_context(clock.holding(shared_mode(lock)))

    with unwatched(lock), clock("compiled_first_run"):
        callback_handler.register_start_callback(compile_started)
        callback_handler.register_end_callback(compile_ended)
        try:
            yield
        finally:
            callback_handler.start_callbacks.remove(compile_started)
            callback_handler.end_callbacks.remove(compile_ended)
            compiling.close()
            let_go()


def dynamo_compiling(callback_args: tuple) -> bool:
    """Whether dynamo's compile callbacks were called for dynamo compiling a frame: newer torch says what for
    (inductor may also call them around device work: CUDA graph recording, autotuning), older torch nothing,
    calling them for dynamo alone."""
    trigger = getattr(callback_args[0], "callback_trigger", None) if callback_args else None
    return trigger is None or trigger.name == "DYNAMO"


MISMATCH_DETAIL = "torch.compile output differs from eager beyond tolerance"


def compile_check_cpu(model, inputs: list, eager_out: list, cfg: ExecutionConfig, device_lock, clock,
                      measurements, draw: Draw | None = None) -> float:  # fmt: skip
    """The compiled model's time by the host clock; raises CheckFailed (with what was measured) where it fails
    to compile or disagrees with eager (see `_agreeing` for `draw`)."""

    def timed(compiled) -> float:
        return host_time_ms(compiled, inputs, cfg.warmup, cfg.iters)

    return _agreeing(model, inputs, eager_out, cfg, device_lock, clock, measurements, device_lock,
                     "compiled_timing", timed, draw)[1]  # fmt: skip


def compiled_for_timing(model, inputs: list, eager_out: list, cfg: ExecutionConfig, device_lock, clock,
                        measurements, draw: Draw | None = None) -> Any:  # fmt: skip
    """CUDA: the compiled model, found to agree with eager (sharing the GPU like the eager checks), ready to be
    timed; raises CheckFailed, with what was measured, where it fails to compile or disagrees. Its compiling call
    ran it once, autotuning included: that is its warm-up, the profiler counting kernel time only (what a first
    run does more is host work)."""
    return _agreeing(model, inputs, eager_out, cfg, device_lock, clock, measurements, shared_mode(device_lock),
                     "compiled_checks", None, draw)[0]  # fmt: skip


def _agreeing(model, inputs, eager_out, cfg, device_lock, clock, measurements, hold, phase,
              then: Callable | None = None, draw: Draw | None = None) -> tuple[Any, Any]:  # fmt: skip
    """The compiled model and what `then(compiled)` gave (None without `then`), run holding `hold` and timed as
    `phase`, with the compiled output's agreement with eager; raises CheckFailed (with what was measured) where
    it fails to compile or disagrees. Where an output is discrete (bool or integer) and `draw(i)` gives input
    draw i, the compiled model must agree on draws 1 to `cfg.compile_draws` - 1 too: a value that compiled
    arithmetic puts on the other side of a threshold flips an element whatever the tolerance (one H200: a
    layer norm's output compared with a parameter, 458 million elements, agreed on the checked draw and
    differed in 1 to 3 elements on each of four others)."""
    margin = cfg.tolerance_margin
    atol, rtol = cfg.atol / margin, cfg.rtol / margin
    try:
        compiled, compiled_out = compile_model(model, inputs, cfg, device_lock, clock)
        with clock.holding(hold), clock(phase), torch.no_grad():
            result = then(compiled) if then is not None else None
            agree = outputs_close(compiled_out, eager_out, atol, rtol)
            del compiled_out
            if agree and draw is not None and any(discrete(t) for t in eager_out):
                agree = all(_agree_on(model, compiled, draw(i), atol, rtol) for i in range(1, cfg.compile_draws))
    except Exception as e:
        raise compile_failure(e, measurements) from None
    if not agree:
        within = "" if margin == 1 else f" / {margin:g}"
        raise CheckFailed(COMPILE_MISMATCH, MISMATCH_DETAIL + within, measurements)
    return compiled, result


def _agree_on(model, compiled, inputs: list, atol: float, rtol: float) -> bool:
    eager_out = flatten_outputs(model(*inputs))
    return outputs_close(flatten_outputs(compiled(*inputs)), eager_out, atol, rtol)
