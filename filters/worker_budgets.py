"""What one worker of a pool may use, and when its task is stopped: its share of the machine's cores and of its
GPU's memory, the largest tensor a task may make in that share, and the rules of the time limit (CPU time, hangs,
waits for the GPU, holds of it)."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from opsynth.filters.device_lock import HOLD_SINCE, WAIT_SINCE, WAITED_S

if TYPE_CHECKING:
    from opsynth.filters.execution import ExecutionConfig

MEMORY_SHARERS = 3  # workers of one GPU whose memory budgets together make the allowed fraction
HOLD_LIMIT_S = 15.0  # the least time a task may hold its GPU at once (see hold_limit_s)
WALL_LIMIT_FACTOR = 10  # a task's wall time, its waits for the GPU included, never exceeds this many time limits
HANG_FACTOR = 4  # nor, its waits not counted, this many, whatever CPU time it took (see overdue)
IDLE_SHARE = 0.05  # a task computing less than this share of its time, once past its limit, is hung
# Copies of a task's largest tensor alive at once in its checks: the kept input, a draw's, the first and the
# current draw's outputs, the rerun's (an elementwise chain's intermediates are no larger).
LIVE_COPIES = 5
# A task that ran out of memory with the GPU full (other workers' memory, not its own) waits at most this long, not
# holding the GPU, for a worker's budget of it to be free before it is retried (see await_free_memory).
MEMORY_WAIT_S = 20.0
MEMORY_POLL_S = 0.05
MEMORY_RETRY = "memory_retry"  # in a verdict's measurements: its task ran again so, out of memory beside the others
# All the workers of one GPU together keep at most this share of its memory cached between tasks (see
# cache_keep_bytes).
CACHED_SHARE = 0.1


def hold_limit_s(cfg: ExecutionConfig) -> float:
    """The longest a task may hold its GPU at once: 100 forwards at the top of the runtime window, and at least
    HOLD_LIMIT_S (a first forward sets up kernels; the profiler starts). A task past it is far above the window,
    and every other worker of the GPU would wait for it: the pool kills it there."""
    return max(HOLD_LIMIT_S, 100 * cfg.runtime_window_ms[1] / 1e3)


def overdue(watch, started: float, now: float, timeout_s: float, hold_limit: float, cpu_s: float | None = None,
            threads: int = 1) -> str | None:  # fmt: skip
    """Why a worker's task, begun at `started`, is to be stopped at `now`, if it is: it has held its GPU past
    `hold_limit` at once; or computed for `timeout_s` (the CPU time of its `threads` threads, `cpu_s`, against
    `timeout_s` each), or spent `timeout_s` (its waits for the GPU not counted) mostly idle, or HANG_FACTOR
    time limits all told; or taken WALL_LIMIT_FACTOR time limits waits included (the watch is written by the
    worker, which runs task code). Where its CPU time is unknown (`cpu_s` None), `timeout_s` of the wall clock.

    CPU time is what makes a verdict independent of the machine's load: a task that other processes keep from
    the cores takes longer by the clock but not by its CPU time; a hung task (asleep, blocked) barely computes,
    and is stopped by the clock once it has spent its time limit computing less than IDLE_SHARE of it."""
    if watch[HOLD_SINCE] and now - watch[HOLD_SINCE] > hold_limit:
        return f"held the GPU for more than {hold_limit:g} s at once (its device work is far above the window)"
    if now - started >= WALL_LIMIT_FACTOR * timeout_s:
        return f"no verdict within {WALL_LIMIT_FACTOR * timeout_s:g} s, waits for the GPU included"
    waited = watch[WAITED_S] + (now - watch[WAIT_SINCE] if watch[WAIT_SINCE] else 0.0)
    worked = now - started - waited
    besides = f" (besides {waited:.0f} s waiting for the GPU)" if waited >= 1 else ""
    if cpu_s is None:
        return f"no verdict within {timeout_s:g} s{besides}" if worked >= timeout_s else None
    if cpu_s >= timeout_s * threads:
        return f"computed for more than {timeout_s:g} s (CPU time{'' if threads == 1 else f' of {threads} threads'})"
    if worked >= HANG_FACTOR * timeout_s:
        return f"no verdict within {HANG_FACTOR * timeout_s:g} s{besides}"
    if worked >= timeout_s and cpu_s < IDLE_SHARE * worked:
        return f"no verdict within {timeout_s:g} s{besides}"
    return None


def task_threads(cfg: ExecutionConfig) -> int:
    """The intra-op threads of one worker: the workers split the machine's cores."""
    return max(1, (os.cpu_count() or 1) // cfg.workers)


def memory_share(fraction: float, sharers: int) -> float:
    """The share of its GPU's memory one of `sharers` workers may allocate. The device lock lets one task at a
    time run its forwards, whose intermediates are the bulk of a task's memory; the others hold only their
    parameters, inputs and first outputs, or compile. So a worker gets the budget of one of at most
    `MEMORY_SHARERS`, not one of all: a task that still runs out is retried holding the GPU alone."""
    return fraction / max(1, min(sharers, MEMORY_SHARERS))


def cache_keep_bytes(device_bytes: int, cfg: ExecutionConfig) -> int:
    """The memory one worker's allocator may keep cached between tasks on a GPU of `device_bytes`: its share of
    CACHED_SHARE of it. Memory cached by one worker is free to no other: on one H200 whose 14 workers could keep
    4 GiB each (56 GiB), tasks well under their own budget ran out of memory with the GPU full (139.3 of its
    139.8 GiB in use), and so did their retries holding the GPU alone. Returning more than this after a task
    makes the next one's first forwards allocate from the driver again, under the device lock: milliseconds."""
    return int(device_bytes * CACHED_SHARE / workers_per_gpu(cfg))


def await_free_memory(
    needed: int,
    free_bytes: Callable[[], int],
    timeout_s: float = MEMORY_WAIT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Wait until `free_bytes()` (the GPU's free memory) is at least `needed`, or `timeout_s` has passed; whether
    it is. The other workers of the GPU free theirs as their tasks end: on one H200 every out-of-memory verdict
    of a traced 600-row run came with the GPU full (64-520 MiB free) and the task at 33 MiB-6 GiB of its
    41.9 GiB budget, and its immediate retry failed the same way within 40 ms."""
    deadline = clock() + timeout_s
    while free_bytes() < needed:
        if clock() >= deadline:
            return False
        sleep(MEMORY_POLL_S)
    return True


def spare_device_bytes(limit: int, allocated: int, reserved: int, free: int) -> int:
    """What a worker may still allocate on its GPU: within its own `limit`, and within what the GPU has `free`
    (its allocator's cached blocks, `reserved` but not `allocated`, are free to it)."""
    return max(0, min(limit - allocated, free + reserved - allocated))


def element_budget(device_bytes: int, cfg: ExecutionConfig) -> int:
    """The most fp32 elements one tensor of a task may hold on a GPU of `device_bytes`: LIVE_COPIES of it fit
    one worker's memory budget; a power of two."""
    share = device_bytes * memory_share(cfg.memory_fraction, workers_per_gpu(cfg))
    return 1 << int(math.log2(share / (4 * LIVE_COPIES)))


def workers_per_gpu(cfg: ExecutionConfig) -> int:
    if cfg.device != "cuda":
        return cfg.workers
    import torch

    return max(1, -(-cfg.workers // max(1, torch.cuda.device_count())))
