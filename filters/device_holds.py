"""How a task's device work holds a GPU's `DeviceLock` (filters.device_lock): shared for its steps, stepping aside
between them for the timings waiting, pausing between a model's modules, and giving its cached memory back where
no timing runs; and the lock's modes for callers that may hold any lock (none, a CPU run's).
"""

from __future__ import annotations

import contextlib

from opsynth.filters.device_lock import FREED_CLEARING_BYTES_PER_S, DeviceLock


def sharing(lock) -> bool:
    """Whether `lock` is a DeviceLock this process holds in its shared mode."""
    return getattr(lock, "sharing", False)


def yield_to_timings(lock, finish_device_work) -> bool:
    """Where `lock` is a DeviceLock this process shares and a timing waits for it: finish this process's device
    work (`finish_device_work()`, a synchronize) and let the timings go first (`DeviceLock.step_aside`).
    Whether it stepped aside; any other lock (none, a CPU run's, one held alone) is left as it is."""
    if not sharing(lock) or not lock.timing_waits():
        return False
    finish_device_work()
    lock.step_aside()
    return True


@contextlib.contextmanager
def stepped_out(lock, waiting=contextlib.nullcontext):
    """Where `lock` is a DeviceLock this process shares: holding nothing within the block (`DeviceLock.step_out`),
    sharing it again after it within `waiting()` (the phase its wait counts in); any other lock (none, a CPU
    run's, one held alone) as it is. This process's device work must be finished before it."""
    if not sharing(lock):
        yield
        return
    lock.step_out()
    try:
        yield
    finally:
        with waiting():
            lock.share_again()


@contextlib.contextmanager
def holding_for_device_work(lock, finish_device_work):
    """A piece of device work that may come while its task holds `lock` or while it holds nothing: held shared,
    a timing waiting goes first (`yield_to_timings`); holding nothing (inductor benchmarking a matmul with and
    without padding while it compiles, which holds nothing), the work takes the lock's shared mode, finished
    (`finish_device_work()`) before it lets go, so that it never runs beside another task's timing: such
    benchmarks saturate the GPU for milliseconds. Any other lock (none, a CPU run's) is left as it is."""
    if not isinstance(lock, DeviceLock) or lock.held:
        yield_to_timings(lock, finish_device_work)
        yield
        return
    with lock.shared():
        try:
            yield
        finally:
            finish_device_work()


@contextlib.contextmanager
def pausing_between_modules(pause):
    """Within the block, `pause()` is called as any module registers a submodule, a parameter or a buffer (a
    model being built) and before any module's forward (the submodules of a first forward): points between a
    task's device steps where a timing waiting may go first (`yield_to_timings`). Building a model and its first
    forward hold the GPU shared while mostly host work (a transformers module built in 2-3 s on one H200), and
    a timing waiting for them keeps every other task off the GPU meanwhile. A forward of one module is not split:
    on one H200, once these pauses were in, the GPU's idle stretches of a 600-row run were mostly a single task's
    first forward of 0.2-0.8 s (a library's first launch) with 6-12 others waiting. Each call is a flock probe
    where no timing waits."""
    from torch.nn.modules import module as nn_module

    def registered(*args) -> None:
        pause()

    handles = [
        nn_module.register_module_module_registration_hook(registered),
        nn_module.register_module_parameter_registration_hook(registered),
        nn_module.register_module_buffer_registration_hook(registered),
        nn_module.register_module_forward_pre_hook(registered),
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def give_back_cached(lock, cuda=None) -> None:
    """Return the GPU memory this process's allocator caches (`cuda`: torch.cuda) to the driver, never beside
    another task's timing: while none runs (`DeviceLock.briefly`), and a timing after it waits until the driver
    has cleared what it freed (`DeviceLock.clearing`). Any other lock (none, a CPU run's) is left as it is."""
    if cuda is None:
        import torch

        cuda = torch.cuda
    if not isinstance(lock, DeviceLock):
        cuda.empty_cache()
        return
    with lock.briefly():
        before = cuda.memory_reserved()
        cuda.empty_cache()
        freed = before - cuda.memory_reserved()
        if freed > 0:
            lock.clearing(freed / FREED_CLEARING_BYTES_PER_S)


def briefly(lock):
    """Where `lock` is a DeviceLock: a moment's device work that no timing runs beside (`DeviceLock.briefly`);
    any other lock (none, a CPU run's) as it is."""
    return lock.briefly() if isinstance(lock, DeviceLock) else contextlib.nullcontext()


def sharers(lock) -> int:
    """How many other tasks share the GPU with this process now, where `lock` is a DeviceLock it shares (see
    `DeviceLock.sharers`); 0 for any other lock."""
    return lock.sharers() if isinstance(lock, DeviceLock) else 0


def shared_mode(lock):
    """The lock's shared mode where it has one (a GPU's DeviceLock), for the checks' device work."""
    return lock.shared() if hasattr(lock, "shared") else lock


def unwatched(lock):
    """Where `lock` reports its holds (a GPU's DeviceLock): the holds taken meanwhile not reported (see
    `DeviceLock.unwatched_holds`); any other lock as it is."""
    return lock.unwatched_holds() if hasattr(lock, "unwatched_holds") else contextlib.nullcontext()
