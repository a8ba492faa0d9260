"""How a worker's task process prepares torch and the libraries around it before it runs tasks
(filters.worker_process): its threads, its GPU and memory share, inductor's autotuning and compile settings, and
what libraries would otherwise print or leave running."""

from __future__ import annotations

import logging
import threading

from opsynth.config import (
    AUTOTUNE_BENCHMARK_MS,
    AUTOTUNE_BENCHMARK_RUNS,
    AUTOTUNE_CACHE_FLUSHES,
    AUTOTUNE_ESTIMATION_RUNS,
)
from opsynth.filters.autotuning import bound_autotuning, clone_on_device
from opsynth.filters.kernel_configs import split_configurations

POOL_START_S = 30  # how long a worker waits for its compile pool to answer before it compiles in-process


def set_up_device(torch, cfg, gpu_index: int | None, device_lock=None) -> None:
    """Threads, GPU, memory share and inductor's settings of a process that runs tasks for `cfg`."""
    from opsynth.filters.device_holds import holding_for_device_work
    from opsynth.filters.worker_budgets import memory_share, spare_device_bytes, task_threads, workers_per_gpu

    # The workers split the cores: oversubscribed intra-op threads wait out scheduler ticks, which showed up as
    # ~10 ms forwards in tiny-workload timings; and the time limit counts a task's CPU time over these threads.
    torch.set_num_threads(task_threads(cfg))
    if gpu_index is not None:
        torch.cuda.set_device(gpu_index)
        torch.cuda.set_per_process_memory_fraction(memory_share(cfg.memory_fraction, workers_per_gpu(cfg)))
        if cfg.compile_check:
            # Autotuning runs in the compiled model's first run, sharing the GPU; between its configurations'
            # benchmarks (host work between short kernels) a timing waiting goes first. A benchmark of the
            # compiling itself (a matmul with and without padding) takes the shared hold it lacks.
            bound_autotuning(
                AUTOTUNE_BENCHMARK_MS,
                AUTOTUNE_BENCHMARK_RUNS,
                AUTOTUNE_CACHE_FLUSHES,
                AUTOTUNE_ESTIMATION_RUNS,
                around_each=lambda: holding_for_device_work(device_lock, torch.cuda.synchronize),
            )

            def spare_bytes() -> int:
                free, total = torch.cuda.mem_get_info()
                fraction = getattr(torch.cuda, "get_per_process_memory_fraction", lambda: 1.0)()
                limit = int(fraction * total)
                return spare_device_bytes(limit, torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), free)

            clone_on_device(spare_bytes)
    if cfg.compile_check:
        compile_in(cfg.compile_processes)


def compile_in(processes: int) -> None:
    """Where inductor compiles a task's Triton kernels: in this process (1), or in a pool of `processes` forked from
    it (`start_compile_pool`), which compile a task's kernels side by side on the cores the other workers leave
    idle while they wait for the GPU. Forked, the pool's processes import nothing and start in milliseconds (and
    never touch the GPU: inductor reads the device's properties before it forks); inductor's default, a fresh
    process importing torch that then starts the pool, left 6 of 14 workers still starting after 100 s on one
    H100."""
    import torch._inductor.config

    torch._inductor.config.compile_threads = max(1, processes)
    if processes > 1:
        torch._inductor.config.worker_start_method = "fork"


def start_compile_pool(split: bool = True) -> int | None:
    """Start the compile pool (where `compile_in` asked for one) and wait until it answers: its processes, and
    the threads inductor runs beside them (which it would otherwise start one by one as a task's compile needs
    them). A worker does so once it is up, before the snapshot its integrity checks compare with, so that none
    of them is taken for a task's. The pool then compiles a kernel's configurations side by side, unless `split`
    is False (filters.kernel_configs). Returns the pool's processes; 0 where it could not start (the worker then
    compiles in-process); None where none was asked for."""
    import torch._inductor.config

    processes = torch._inductor.config.compile_threads
    if torch._inductor.config.worker_start_method != "fork" or not processes or processes <= 1:
        return None  # no pool asked for (inductor's own default, a pool of as many processes as cores, never starts)
    from torch._inductor.async_compile import AsyncCompile

    try:
        AsyncCompile.wait_pool_ready(timeout=POOL_START_S)
        all_started = threading.Barrier(processes + 1, timeout=POOL_START_S)
        for _ in range(processes):
            AsyncCompile.pool().submit(all_started.wait)  # each waits for the others: a thread started for each
        all_started.wait()
    except Exception:  # a pool that cannot start (its processes refused, or never answering): compile in-process
        compile_in(1)
        return 0
    if split:
        split_configurations(AsyncCompile.process_pool())
    return processes


def no_monitor_threads() -> None:
    """tqdm starts a monitor thread the first time a progress bar is made (inductor makes some): it would read
    as a thread a task left running."""
    try:
        import tqdm
    except ImportError:
        return
    tqdm.tqdm.monitor_interval = 0


class _StandaloneAttentionNotice(logging.Filter):
    """transformers warns, once per process, that an attention module runs outside a model with no attention
    implementation set: which is what a transformers task is. Left alone, every worker says so to the user."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "`AttentionInterface`" not in record.getMessage()


def quiet_library_notices() -> None:
    logging.getLogger("transformers.modeling_utils").addFilter(_StandaloneAttentionNotice())
