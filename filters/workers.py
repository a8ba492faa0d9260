"""Isolated execution: a pool of worker processes that each own one device context.

A worker that segfaults, hangs past the time limit or hits a CUDA error is killed and replaced; only its
task is lost, as a `crash`, `timeout` or `runtime_error` verdict, like a dead-letter record. The time limit
counts a task's own work, not its waits for the GPU; and a task that holds its GPU past `hold_limit_s` at once
is killed there, since every other worker of the GPU waits for it meanwhile.
"""

from __future__ import annotations

import contextlib
import fcntl
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

from filters.execution import (
    ExecutionConfig,
    is_fatal_cuda_error,
    run_checks,
    verdict_from_wire,
    verdict_to_wire,
)
from filters.reasons import CRASH, OUT_OF_MEMORY, RUNTIME_ERROR, TIMEOUT, Verdict, one_line

STARTUP_TIMEOUT_S = 300.0  # importing torch and creating a CUDA context, once per worker
MEMORY_SHARERS = 3  # workers of one GPU whose memory budgets together make the allowed fraction
SLOT_POLL_S = 0.005  # how often a task waiting to share a GPU looks for a free slot
HOLD_LIMIT_S = 15.0  # the least time a task may hold its GPU at once (see hold_limit_s)
POLL_S = 0.25  # how often the pool looks at its busy workers' device holds and waits
# A worker's watch: what its DeviceLock reports, in a shared array the pool reads (monotonic clock seconds).
HOLD_SINCE, WAIT_SINCE, WAITED_S = range(3)


class DeviceLock:
    """An inter-process lock on a GPU, on files (flock): the OS releases it when its holder dies, so a worker
    that segfaults or is killed on a timeout while holding it cannot wedge the others.

    Entered as a context manager it is exclusive: for timings, which another process's kernels would slow.
    `shared()` is for the checks' device work, which may overlap with that of up to `slots - 1` other tasks
    (with `slots` 1, it is exclusive too). A waiting exclusive holder goes first: it takes a turnstile that new
    shared holders must pass, then waits for the shared holders inside to leave."""

    def __init__(self, path: str, slots: int = 1):
        self.path = path
        self.slots = slots
        self._fds: dict[str, int] | None = None  # opened lazily, in the process that uses them
        self._watch = None  # where this process reports its holds and waits (see `watch`)
        self._holds_watched = True
        self.held = False  # whether this process holds the lock (in either mode)

    def __getstate__(self) -> dict:
        return {"path": self.path, "slots": self.slots, "_fds": None, "_watch": None, "_holds_watched": True,
                "held": False}  # fmt: skip

    def watch(self, state) -> None:
        """Report this process's holds and waits into `state` (a shared array of HOLD_SINCE, WAIT_SINCE and
        WAITED_S), for the pool that set it up."""
        self._watch = state

    @contextlib.contextmanager
    def unwatched_holds(self):
        """Holds taken meanwhile are not reported (a task that holds the lock for all of its work, compiling
        included, is bound by the task's time limit only); waits still are."""
        self._holds_watched = False
        try:
            yield
        finally:
            self._holds_watched = True

    def _waiting(self) -> None:
        if self._watch is not None:
            self._watch[WAIT_SINCE] = time.monotonic()

    def _holding(self) -> None:
        self.held = True
        if self._watch is not None:
            now = time.monotonic()
            if self._watch[WAIT_SINCE]:
                self._watch[WAITED_S] += now - self._watch[WAIT_SINCE]
            self._watch[WAIT_SINCE] = 0.0
            if self._holds_watched:
                self._watch[HOLD_SINCE] = now

    def _released(self) -> None:
        self.held = False
        if self._watch is not None:
            self._watch[HOLD_SINCE] = 0.0

    def _fd(self, name: str) -> int:
        if self._fds is None:
            self._fds = {}
        if name not in self._fds:
            path = self.path if name == "rw" else f"{self.path}.{name}"
            self._fds[name] = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        return self._fds[name]

    def __enter__(self) -> DeviceLock:
        self._waiting()
        fcntl.flock(self._fd("turnstile"), fcntl.LOCK_EX)
        fcntl.flock(self._fd("rw"), fcntl.LOCK_EX)
        self._holding()
        return self

    def __exit__(self, *exc) -> None:
        self._released()
        fcntl.flock(self._fd("rw"), fcntl.LOCK_UN)
        fcntl.flock(self._fd("turnstile"), fcntl.LOCK_UN)

    @contextlib.contextmanager
    def shared(self):
        if self.slots <= 1:
            with self:
                yield self
            return
        self._waiting()
        slot = self._take_slot()
        try:
            fcntl.flock(self._fd("turnstile"), fcntl.LOCK_EX)  # wait behind an exclusive holder
            fcntl.flock(self._fd("rw"), fcntl.LOCK_SH)
            fcntl.flock(self._fd("turnstile"), fcntl.LOCK_UN)
            self._holding()
            try:
                yield self
            finally:
                self._released()
                fcntl.flock(self._fd("rw"), fcntl.LOCK_UN)
        finally:
            fcntl.flock(slot, fcntl.LOCK_UN)

    def _take_slot(self) -> int:
        """One of the `slots` slot files, locked: the first free one, looked for again every few ms until one is
        (flock cannot wait on any of several files)."""
        while True:
            for k in range(self.slots):
                fd = self._fd(f"slot{k}")
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return fd
                except BlockingIOError:
                    continue
            time.sleep(SLOT_POLL_S)


@dataclass(frozen=True)
class Job:
    key: str  # identifies the task in results and logs
    source: str  # the task program
    seed: int  # seeds the model's parameters and the input draws


def _worker_main(conn: Connection, cfg: ExecutionConfig, gpu_index: int | None, device_lock, watch) -> None:
    # A worker whose parent dies sees EOF on its pipe and exits: no orphan keeps a GPU context.
    import torch

    if device_lock is not None:
        device_lock.watch(watch)

    sharers = _workers_per_gpu(cfg)
    if gpu_index is None:
        # CPU workers split the cores: oversubscribed intra-op threads wait out scheduler ticks, which showed up
        # as ~10 ms forwards in tiny-workload timings.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // cfg.workers))
    else:
        torch.cuda.set_device(gpu_index)
        torch.cuda.set_per_process_memory_fraction(memory_share(cfg.memory_fraction, sharers))
    if cfg.compile_check:
        import torch._inductor.config

        # Compilation is what the workers do in parallel: each compiles its own task's kernels in-process
        # rather than with a pool of compile processes per worker, which would oversubscribe the cores.
        torch._inductor.config.compile_threads = max(1, (os.cpu_count() or 1) // cfg.workers)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if message is None:
            return
        job: Job = message
        verdict = _run_job(job, cfg, device_lock)
        if verdict.reason == OUT_OF_MEMORY and gpu_index is not None and sharers > 1:
            # Other workers' tensors may have been what was missing: once more, holding the GPU throughout,
            # under the whole budget.
            torch.cuda.set_per_process_memory_fraction(cfg.memory_fraction)
            with device_lock.unwatched_holds():  # the lock is held while it compiles, too
                verdict = _run_job(job, cfg, device_lock, exclusive=True)
            torch.cuda.set_per_process_memory_fraction(memory_share(cfg.memory_fraction, sharers))
        conn.send(("done", verdict_to_wire(verdict)))
        if is_fatal_cuda_error(verdict):
            return


def _run_job(job: Job, cfg: ExecutionConfig, device_lock, exclusive: bool = False) -> Verdict:
    try:
        return run_checks(job.source, job.seed, cfg, device_lock, exclusive)
    except Exception as e:  # a checker bug must cost one task, not the worker's queue
        return Verdict(RUNTIME_ERROR, f"checker failed: {one_line(e)}")


def hold_limit_s(cfg: ExecutionConfig) -> float:
    """The longest a task may hold its GPU at once: 100 forwards at the top of the runtime window, and at least
    HOLD_LIMIT_S (a first forward sets up kernels; the profiler starts). A task past it is far above the window,
    and every other worker of the GPU would wait for it: the pool kills it there."""
    return max(HOLD_LIMIT_S, 100 * cfg.runtime_window_ms[1] / 1e3)


def overdue(watch, started: float, now: float, timeout_s: float, hold_limit: float) -> str | None:
    """Why a worker's task, begun at `started`, is to be stopped at `now`, if it is: it has held its GPU past
    `hold_limit` at once, or worked (its waits for the GPU not counted) past `timeout_s`."""
    if watch[HOLD_SINCE] and now - watch[HOLD_SINCE] > hold_limit:
        return f"held the GPU for more than {hold_limit:g} s at once (its device work is far above the window)"
    waited = watch[WAITED_S] + (now - watch[WAIT_SINCE] if watch[WAIT_SINCE] else 0.0)
    if now - started - waited >= timeout_s:
        return f"no verdict within {timeout_s:g} s" + (
            f" (besides {waited:.0f} s waiting for the GPU)" if waited >= 1 else ""
        )
    return None


def memory_share(fraction: float, sharers: int) -> float:
    """The share of its GPU's memory one of `sharers` workers may allocate. The device lock lets one task at a
    time run its forwards, whose intermediates are the bulk of a task's memory; the others hold only their
    parameters, inputs and first outputs, or compile. So a worker gets the budget of one of at most
    `MEMORY_SHARERS`, not one of all: a task that still runs out is retried holding the GPU alone."""
    return fraction / max(1, min(sharers, MEMORY_SHARERS))


def _workers_per_gpu(cfg: ExecutionConfig) -> int:
    if cfg.device != "cuda":
        return cfg.workers
    import torch

    return max(1, -(-cfg.workers // max(1, torch.cuda.device_count())))


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"worker killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"worker killed by signal {-code}"
    return f"worker exited with code {code}"


class _Worker:
    def __init__(self, ctx, cfg: ExecutionConfig, gpu_index: int | None, device_lock):
        self.parent, child = ctx.Pipe()
        self.watch = ctx.RawArray("d", 3)  # HOLD_SINCE, WAIT_SINCE, WAITED_S of the job in hand
        self.process = ctx.Process(
            target=_worker_main, args=(child, cfg, gpu_index, device_lock, self.watch), daemon=True
        )
        self.process.start()
        child.close()
        self.gpu_index = gpu_index
        self.ready = False
        self.job: int | None = None  # the index of the job in hand
        self.started = time.monotonic()  # when the job in hand was handed over
        self.deadline = self.started + STARTUP_TIMEOUT_S  # to start

    def hand(self, index: int, job: Job) -> None:
        """Give the worker job `index` (raises BrokenPipeError or OSError where it has died)."""
        self.watch[:] = [0.0, 0.0, 0.0]  # the worker is idle: nothing else writes it now
        self.parent.send(job)
        self.job, self.started = index, time.monotonic()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=10)
        self.parent.close()


def _shut_down(workers: list[_Worker], lock_dir: str) -> None:
    for w in workers:
        with contextlib.suppress(BrokenPipeError, OSError):
            w.parent.send(None)
    for w in workers:
        w.process.join(timeout=5)
        w.kill()
    shutil.rmtree(lock_dir, ignore_errors=True)


class WorkerPool:
    """Runs `run_checks` for many tasks over `cfg.workers` processes (spread over all GPUs on CUDA)."""

    def __init__(self, cfg: ExecutionConfig):
        self.cfg = cfg
        self._ctx = mp.get_context("spawn")
        self._gpus = self._gpu_indices()
        # One lock per GPU: a task holds it while it runs on the device, so timings are not shared.
        self._lock_dir = tempfile.mkdtemp(prefix="opsynth-locks-")
        self._locks = {
            gpu: DeviceLock(os.path.join(self._lock_dir, f"gpu{gpu}"), MEMORY_SHARERS if cfg.shared_checks else 1)
            for gpu in self._gpus
            if gpu is not None
        }
        self.hold_limit_s = hold_limit_s(cfg)
        self._workers = [self._spawn(i) for i in range(cfg.workers)]
        self.replaced = 0
        self._run_lock = threading.Lock()  # threads of one process (Beam's multi_threading mode) take turns
        # A pool shared across pipelines (see ExecuteCandidates) is closed when the last reference goes, or at exit.
        self._finalizer = weakref.finalize(self, _shut_down, self._workers, self._lock_dir)

    def _gpu_indices(self) -> list[int | None]:
        if self.cfg.device != "cuda":
            return [None]
        import torch

        return list(range(torch.cuda.device_count())) or [0]

    def _spawn(self, slot: int) -> _Worker:
        gpu = self._gpus[slot % len(self._gpus)]
        return _Worker(self._ctx, self.cfg, gpu, self._locks.get(gpu))

    def _replace(self, slot: int) -> None:
        self._workers[slot].kill()
        self._workers[slot] = self._spawn(slot)
        self.replaced += 1

    def wait_ready(self) -> None:
        """Blocks until every worker is up (torch imported, its device set up): start-up kept apart from work."""
        with self._run_lock:
            while starting := [w for w in self._workers if not w.ready]:
                wait([w.parent for w in starting] + [w.process.sentinel for w in starting], timeout=POLL_S)
                now = time.monotonic()
                for slot, w in enumerate(self._workers):
                    if not w.ready:
                        self._collect(slot, w, now)

    def run(
        self,
        jobs: list[Job],
        follow_up: Callable[[int, Verdict], Job | None] | None = None,
        on_final: Callable[[int, Verdict], None] | None = None,
    ) -> list[Verdict]:
        """Verdicts in the order of `jobs`. `follow_up(i, verdict)`, called as job i's verdict comes in, may
        return another job for the same place i: it runs next, ahead of jobs not yet started, and its verdict
        replaces the first (so a chain of re-measures never waits for the rest of the list). `on_final(i,
        verdict)` is called as place i gets its final verdict (to checkpoint as results come in)."""
        with self._run_lock:
            return self._run(jobs, follow_up, on_final)

    def _run(self, jobs: list[Job], follow_up, on_final) -> list[Verdict]:
        results: list[Verdict | None] = [None] * len(jobs)
        pending = deque((i, job) for i, job in enumerate(jobs))

        def finish(index: int, verdict: Verdict) -> None:
            again = follow_up(index, verdict) if follow_up is not None else None
            if again is None:
                results[index] = verdict
                if on_final is not None:
                    on_final(index, verdict)
            else:
                pending.appendleft((index, again))

        while pending or any(w.job is not None for w in self._workers):
            for slot, w in enumerate(self._workers):
                if w.ready and w.job is None and pending:
                    index, job = pending.popleft()
                    try:
                        w.hand(index, job)
                    except (BrokenPipeError, OSError):
                        pending.appendleft((index, job))
                        self._replace(slot)
            busy = [w for w in self._workers if w.job is not None or not w.ready]
            if not busy:
                continue
            # Woken by a message or a death; else every POLL_S, to look at the jobs' holds and waits.
            wait([w.parent for w in busy] + [w.process.sentinel for w in busy], timeout=POLL_S)
            now = time.monotonic()
            for slot, w in enumerate(self._workers):
                done = self._collect(slot, w, now)
                if done is not None:
                    finish(*done)
        return [r if r is not None else Verdict(CRASH, "no verdict") for r in results]

    def _collect(self, slot: int, w: _Worker, now: float) -> tuple[int, Verdict] | None:
        """(job index, verdict) where worker `slot` finished, crashed or timed out on its job; else None."""
        message = None
        try:
            if w.parent.poll():
                message = w.parent.recv()
        except (EOFError, OSError):
            message = None
        if message is not None:
            kind, payload = message
            if kind == "ready":
                w.ready = True
            elif kind == "done" and w.job is not None:
                verdict = verdict_from_wire(payload)
                done, w.job = (w.job, verdict), None
                if is_fatal_cuda_error(verdict):
                    self._replace(slot)
                return done
            return None
        if not w.process.is_alive():
            done = None if w.job is None else (w.job, Verdict(CRASH, _describe_exit(w.process.exitcode)))
            if w.job is None and not w.ready:
                raise RuntimeError(f"an execution worker failed to start ({_describe_exit(w.process.exitcode)})")
            self._replace(slot)
            return done
        if w.job is not None:
            why = overdue(w.watch, w.started, now, self.cfg.timeout_s, self.hold_limit_s)
            if why is not None:
                done = (w.job, Verdict(TIMEOUT, why))
                self._replace(slot)
                return done
        if not w.ready and now >= w.deadline:
            raise RuntimeError(f"an execution worker did not start within {STARTUP_TIMEOUT_S:g} s")
        return None

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
