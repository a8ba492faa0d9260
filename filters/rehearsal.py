"""A task's first forward rehearsed on a GPU without running it, captured into a CUDA graph that is thrown away: the
host work of a first use (kernels loaded, library plans made) done holding nothing (docs/execution.md, "The
checks and the timing")."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch

from opsynth.filters.device_holds import sharing, stepped_out


def rehearsed(model, inputs: list, device_lock, clock, release) -> bool:
    """CUDA: a task's first forward rehearsed (`rehearse`) holding nothing, where the task shares the GPU
    (`device_lock`), so that the timings go on meanwhile; the wait to share it again counts as `lock_wait` on
    `clock`, the rehearsal as `rehearsal`; then `release()`, which gives the capture's memory back if the process
    caches more than it keeps between tasks. Whether the model and its task's module are as they were (else the
    task is to be loaded and built again)."""
    if not sharing(device_lock):
        return True  # held alone (a task retried alone for want of memory): no second copy of its intermediates
    torch.cuda.synchronize()  # this process's device work finished before it lets the GPU go
    with stepped_out(device_lock, lambda: clock("lock_wait")):
        with clock("rehearsal"):
            untouched = rehearse(model, inputs)
        release()
    return untouched


def rehearse(model, inputs: list) -> bool:
    """Capture `model(*inputs)` into a CUDA graph, never run it, and throw it away. Whether the capture left the
    model and its task's module as they were (see `model_state`): a forward that makes or changes tensors on its
    first call (a lazily made parameter or cache) leaves them unset by a capture, and the task is to be loaded and
    built again.

    A forward that cannot be captured stops the rehearsal there, which says nothing about the task: the uses
    before that point were rehearsed, and the forward itself is judged after. Synchronizations (`.item()`,
    `nonzero`) are stopped by torch before they reach CUDA, so that the capture ends cleanly. The CPU's and the
    default CUDA generator's states are as before it."""
    before = model_state(model)
    device = torch.cuda.current_device()
    generator = torch.cuda.default_generators[device]
    own_state, cpu_state = generator.graphsafe_get_state(), torch.get_rng_state()
    sync_mode = torch.cuda.get_sync_debug_mode()
    graph, pool = torch.cuda.CUDAGraph(), torch.cuda.graph_pool_handle()
    # A capture that fails ends before the generator is told it is over, and the generator then refuses every later
    # draw ("Offset increment outside graph capture"): the capture draws from a copy of its state.
    generator.graphsafe_set_state(generator.clone_state())
    try:
        with torch.cuda.stream(_side_stream()):
            graph.capture_begin(pool=pool, capture_error_mode="relaxed")  # a first use may allocate
            torch.cuda.set_sync_debug_mode("error")
            try:
                model(*inputs)
            finally:
                torch.cuda.set_sync_debug_mode(sync_mode)
                _end_capture(graph, device, pool)
    except Exception:
        pass
    finally:
        generator.graphsafe_set_state(own_state)
        torch.set_rng_state(cpu_state)
        graph.reset()
    return model_state(model) == before


def _end_capture(graph, device: int, pool) -> None:
    """End the capture. Where it was spoilt (a CUDA call that a capture does not allow), `capture_end` raises before
    it counts the capture as ended, and `reset` then leaves its memory pool alone: the pool's memory would never
    be freed (and, depending on torch's version, the allocator would go on routing allocations past it), so it
    is given back to the allocator here."""
    try:
        graph.capture_end()
    except Exception:
        try:
            graph.pool()  # only a capture counted as ended has one, and `reset` gives it back
        except Exception:
            with contextlib.suppress(Exception):  # torch ends allocating to it before or after the capture
                torch._C._cuda_endAllocateToPool(device, pool)
            with contextlib.suppress(Exception):
                torch._C._cuda_releasePool(device, pool)
        raise


@functools.cache
def _side_stream():
    """The stream captures run on, one per process: cuBLAS keeps a workspace per stream, made in the capture's
    pool, which a stream of its own would make again for every rehearsal."""
    return torch.cuda.Stream()


def model_state(model) -> list[tuple[Any, ...]]:
    """What a forward could change of a model and of its task's module without running a kernel: each module's
    attribute names, tensors (identity and version counter: an in-place write counts when it is queued) and plain
    values (numbers, strings, flags); and the same of the globals its forward sees (a cache the task fills on its
    first call), containers by identity and length."""
    state = [("globals", _values(getattr(type(model).forward, "__globals__", {})))]
    for name, module in model.named_modules(remove_duplicate=False):
        attributes = vars(module)
        tensors = {**attributes.get("_parameters", {}), **attributes.get("_buffers", {})}
        state.append((name, _values(attributes), _values({k: t for k, t in tensors.items() if t is not None})))
    return state


def _values(namespace: dict) -> tuple:
    """A namespace's names, and what identifies its tensors, containers and plain values."""
    described = []
    for key, value in namespace.items():
        if isinstance(value, torch.Tensor):
            described.append((key, id(value), value._version))
        elif isinstance(value, dict | list | set):
            described.append((key, id(value), len(value)))
        elif isinstance(value, bool | int | float | str):
            described.append((key, value))
        else:
            described.append((key,))
    return tuple(sorted(described, key=lambda entry: entry[0]))
