"""A worker process that runs task code: started by `WorkerPool` as `python -m filters.worker_process FD`, it
contains itself (filters.containment), in two processes, and serves jobs from the socket FD until told to stop
(docs/untrusted-code.md, "Where task code runs")."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from opsynth.filters.containment import Limits, apply_limits, die_with_parent, enter_namespaces, mount_own_proc
from opsynth.filters.worker_setup import (
    no_monitor_threads,
    quiet_library_notices,
    set_up_device,
    start_compile_pool,
)

EXECUTE = "execute"  # every execution check (filters.execution.run_checks)
SHAPES = "shapes"  # loading and the shape check on the meta device (filters.shape_check.check_shapes)
PARENT_POLL_S = 0.1  # how often the first process looks whether its child ended or the pool went away
ENDING_POLL_S = 0.005  # and how often once its child closed its end of their pipe (it is ending)
MAX_MESSAGE_BYTES = 1 << 20  # a worker's message, larger than any verdict; more is a broken worker
WARM_UP_SOURCE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, 64)

    def forward(self, x):
        return torch.relu(self.linear(x)).sum(dim=1)


def get_inputs():
    return [torch.randn(16, 64)]


def get_init_inputs():
    return []
"""


@dataclass(frozen=True)
class Cage:
    """What the first process applies before it starts the one that runs tasks."""

    limits: Limits
    namespaces: bool = True  # enter PID and network namespaces where Linux permits


@dataclass(frozen=True)
class WorkerSetup:
    """What the process that runs tasks needs from the pool."""

    config: Any  # filters.execution.ExecutionConfig
    gpu_index: int | None
    device_lock: Any  # filters.device_lock.DeviceLock of its GPU, or None
    watch_path: str  # where its device lock reports holds and waits (filters.device_lock.open_watch)
    scratch: str  # its own folder: each task runs in a fresh folder under it, removed afterwards
    recycle_jobs: int  # it retires after this many tasks
    recycle_growth_bytes: int  # or once its resident memory has grown this much since it was ready
    start_nice: int = 0  # niceness added while it starts (imports, device set-up, warm-up), given back once up
    preload: tuple[str, ...] = ()  # modules it imports before it says it is up (one that fails is skipped)


def send(conn: Connection, message: dict) -> None:
    conn.send_bytes(json.dumps(message, default=str).encode())


def main(fd: int) -> None:
    conn = Connection(fd)
    try:
        scratch = os.getcwd()  # the pool starts it in its scratch folder, and removes that folder as it closes
        cage: Cage = conn.recv()
    except (EOFError, OSError):
        sys.exit(1)  # the pool closed before it set this worker up (its run failed meanwhile): nothing to say
    enforced = apply_limits(cage.limits)
    namespaces = enter_namespaces() if cage.namespaces else []
    pool = os.getppid()
    answers, answer = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(answers)
        die_with_parent()
        if "pid" in namespaces and not mount_own_proc():
            namespaces = [n for n in namespaces if n != "mount"]
        status = 0
        try:
            _serve(conn, Connection(answer, readable=False), {"limits": enforced, "namespaces": namespaces})
        except BaseException:
            if os.path.isdir(scratch):  # else its pool closed under it, which is no news
                traceback.print_exc()
            status = 1
        os._exit(status)
    os.close(answer)
    sys.exit(_relay(conn, Connection(answers, writable=False), child, pool, scratch))


def _relay(conn: Connection, answers: Connection, child: int, pool: int, scratch: str) -> int:
    """Pass the answers of the child that runs tasks on to the pool, and end as the child ended: by the same
    signal, or with its exit status. If the pool goes away (killed outright), kill the child and remove what the
    pool would have: this worker's scratch folder, and the pool's folder once no worker's is left in it."""
    while True:
        if _pass_on(conn, answers, PARENT_POLL_S) is None:
            time.sleep(ENDING_POLL_S)  # it closed its end: it is ending
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid:
            while _pass_on(conn, answers, 0.0):
                pass  # what it answered before it ended
            if os.WIFSIGNALED(status):
                sig = os.WTERMSIG(status)
                signal.signal(sig, signal.SIG_DFL)
                os.kill(os.getpid(), sig)
                return 128 + sig
            return os.WEXITSTATUS(status)
        if os.getppid() != pool:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            _remove_folders(scratch)
            return 1


def _pass_on(conn: Connection, answers: Connection, timeout: float) -> bool | None:
    """Pass one answer of the child on to the pool, waiting up to `timeout` s for it; whether one was passed, or
    None once the child closed its end."""
    if not answers.poll(timeout):
        return False
    try:
        message = answers.recv_bytes(MAX_MESSAGE_BYTES)
    except EOFError:
        return None
    except OSError:
        message = b""  # too long to be an answer: passed on as one the pool cannot read, which ends this worker
    with contextlib.suppress(OSError):  # the pool closed its end: it went, as seen by the caller
        conn.send_bytes(message)
    return True


def _remove_folders(scratch: str) -> None:
    shutil.rmtree(scratch, ignore_errors=True)
    root = os.path.dirname(scratch)
    try:
        if any(entry.is_dir() for entry in os.scandir(root)):
            return  # another worker's folder: the last worker to go removes the pool's
        for entry in os.scandir(root):
            os.unlink(entry.path)  # the GPU locks' files
        os.rmdir(root)
    except OSError:
        pass  # another worker removed it first


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _serve(conn: Connection, answers: Connection, containment: dict) -> None:
    """Read the setup and jobs from the pool through `conn`; answer through `answers`, which the first process
    passes on."""
    try:
        setup: WorkerSetup = conn.recv()
    except (EOFError, OSError):
        return  # as in `main`
    os.set_inheritable(conn.fileno(), False)  # a process a task starts must not hold the pool's socket
    priority = os.getpriority(os.PRIO_PROCESS, 0)
    if setup.start_nice:
        os.nice(setup.start_nice)
    import torch
    import torch._dynamo  # before the snapshot below: importing it rebinds torch functions (torch.manual_seed)

    from opsynth.filters import integrity
    from opsynth.filters.device_lock import open_watch
    from opsynth.filters.execution import HANDING_BACK, phase_reporter
    from opsynth.filters.verdicts import is_fatal_cuda_error, verdict_to_wire
    from opsynth.reasons import TAMPERING, Verdict

    cfg = setup.config
    if setup.device_lock is not None:
        setup.device_lock.watch(open_watch(setup.watch_path))
    set_up_device(torch, cfg, setup.gpu_index, setup.device_lock)
    no_monitor_threads()
    quiet_library_notices()
    for module in setup.preload:
        with contextlib.suppress(Exception):  # only ahead of need: a task that imports it is told what fails
            importlib.import_module(module)
    warm_up = _run_job(EXECUTE, WARM_UP_SOURCE, 0, setup, window=(0.0, float("inf")))
    if setup.start_nice:
        with contextlib.suppress(PermissionError):  # without the privilege to raise it again, it stays lowered
            os.setpriority(os.PRIO_PROCESS, 0, priority)
    compile_processes = start_compile_pool()  # its processes at the worker's own priority
    watch = integrity.Watch()
    ready_rss = _resident_bytes()
    ready = {"pid": os.getpid(), "containment": containment, "warm_up": warm_up.reason, "at": time.monotonic()}
    ready["compile_pool_failed"] = compile_processes == 0  # asked for, not started: it compiles in-process
    send(answers, {"kind": "ready", **ready})
    report_phase = phase_reporter(setup.device_lock)
    for done in range(1, setup.recycle_jobs + 1):
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        verdict = _run_job(job.check, job.source, job.seed, setup, ceiling_ms=job.ceiling_ms)
        changed = watch.changes()
        if changed:
            verdict = Verdict(TAMPERING, integrity.describe(changed), verdict.measurements)
        retire = (
            bool(changed)
            or is_fatal_cuda_error(verdict)
            or done == setup.recycle_jobs
            or _resident_bytes() - ready_rss > setup.recycle_growth_bytes
        )
        if report_phase is not None:
            report_phase(HANDING_BACK)  # until the pool takes the verdict and clears the watch with the next job
        send(answers, {"kind": "done", "verdict": verdict_to_wire(verdict), "retire": retire})
        if retire:
            return


def _run_job(
    check: str,
    source: str,
    seed: int,
    setup: WorkerSetup,
    window: tuple[float, float] | None = None,
    ceiling_ms: float | None = None,
):
    """The verdict of one job, in a fresh scratch folder (removed afterwards). Whatever the task raises, exits
    with included, costs this task only."""
    import dataclasses

    from opsynth.filters.execution import run_checks
    from opsynth.filters.shape_check import check_shapes
    from opsynth.filters.worker_budgets import workers_per_gpu
    from opsynth.reasons import OUT_OF_MEMORY, RUNTIME_ERROR, Verdict, one_line

    cfg = setup.config if window is None else dataclasses.replace(setup.config, runtime_window_ms=window)
    folder = tempfile.mkdtemp(dir=setup.scratch)
    os.chdir(folder)
    try:
        if check == SHAPES:
            return check_shapes(source)
        verdict = run_checks(source, seed, cfg, setup.device_lock, ceiling_ms)
        if verdict.reason == OUT_OF_MEMORY and setup.gpu_index is not None and workers_per_gpu(cfg) > 1:
            verdict = _alone(source, seed, cfg, setup)
        return verdict
    except SystemExit as e:
        return Verdict(RUNTIME_ERROR, f"the task called exit({e.code!r})")
    except BaseException as e:  # a checker bug must cost one task, not the worker's queue
        return Verdict(RUNTIME_ERROR, f"checker failed: {one_line(e)}")
    finally:
        os.chdir(setup.scratch)
        shutil.rmtree(folder, ignore_errors=True)


def _alone(source: str, seed: int, cfg, setup: WorkerSetup):
    """A task that ran out of memory beside the other workers of its GPU, once more under the whole budget, all
    of its device work holding the GPU alone: other tasks' device work may have taken what it missed. It first
    waits, holding nothing, until a worker's budget of the GPU's memory is free (the others' tasks end and
    free theirs), or MEMORY_WAIT_S. Its compiling holds nothing, so the other workers of the GPU are not kept
    waiting through it."""
    import torch

    from opsynth.filters.execution import MEMORY_WAIT, device_bytes, phase_reporter, run_checks
    from opsynth.filters.worker_budgets import MEMORY_RETRY, await_free_memory, memory_share, workers_per_gpu
    from opsynth.reasons import Verdict

    share = memory_share(cfg.memory_fraction, workers_per_gpu(cfg))
    report_phase = phase_reporter(setup.device_lock)
    report_phase(MEMORY_WAIT)
    await_free_memory(int(share * device_bytes()), lambda: torch.cuda.mem_get_info()[0])
    report_phase(None)
    torch.cuda.set_per_process_memory_fraction(cfg.memory_fraction)
    try:
        with setup.device_lock.alone():
            verdict = run_checks(source, seed, cfg, setup.device_lock)
    finally:
        torch.cuda.set_per_process_memory_fraction(share)
    # which tasks needed this (on a GPU the workers' tasks left too full for its own), for the run's records
    return Verdict(verdict.reason, verdict.detail, {**verdict.measurements, MEMORY_RETRY: True})


if __name__ == "__main__":
    from opsynth.filters.worker_process import main as run_worker  # one copy of this module, under its own name

    run_worker(int(sys.argv[1]))
