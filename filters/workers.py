"""Isolated execution: a pool of contained worker processes (filters.worker_process), each owning one device
context; a worker that crashes, hangs or holds its GPU too long costs only its task and is replaced (docs/execution.md,
"Workers and the GPU"). Task code never runs in the pool's process."""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection, wait

from opsynth.bytecode import wait_compiled
from opsynth.filters.containment import Limits, host_memory_share
from opsynth.filters.device_lock import DeviceLock
from opsynth.filters.execution import ExecutionConfig
from opsynth.filters.jobs_ahead import Bridge, JobsAhead
from opsynth.filters.process_time import only_child
from opsynth.filters.worker_budgets import hold_limit_s, overdue, task_threads
from opsynth.filters.worker_handle import (
    STARTUP_TIMEOUT_S,
    Job,
    WorkerHandle,
    ask_to_exit,
    describe_exit,
    read_message,
    reported_time,
    said,
    shut_down,
    worker_state,
)
from opsynth.filters.worker_process import MAX_MESSAGE_BYTES, Cage
from opsynth.reasons import CRASH, TIMEOUT, Verdict

SHARED_SLOTS = 3  # tasks whose checks may run on one GPU at once (`--exclusive-checks`: one)
POLL_S = 0.25  # how often the pool looks at its busy workers' device holds and waits
RECYCLE_JOBS = 1000  # a worker retires after this many tasks
RECYCLE_GROWTH_BYTES = 2 << 30  # or once its resident memory grew this much since it was ready
CUDA_WORKER_MEMORY_FLOOR = 8 << 30  # host memory a CUDA worker may always use (inductor's compile needs a few GiB)
# Niceness of execution workers started ahead of the work they wait for (the first round's CPU stages, which
# need the cores more meanwhile), given back once each is up where the process may raise its priority again.
AHEAD_NICE = 10


class WorkerPool:
    """Runs `run_checks` (or the shape check) for many tasks over `cfg.workers` contained processes, spread over
    all GPUs on CUDA."""

    def __init__(
        self, cfg: ExecutionConfig, limits: Limits | None = None, start_nice: int = 0, preload: tuple[str, ...] = ()
    ):
        self.cfg = cfg
        self.start_nice = start_nice  # see WorkerSetup.start_nice
        self.preload = preload  # see WorkerSetup.preload
        if limits is None and cfg.device == "cuda":  # CUDA reserves far more address space than it maps
            limits = Limits(data_bytes=host_memory_share(cfg.workers, floor=CUDA_WORKER_MEMORY_FLOOR))
        elif limits is None:
            limits = Limits(address_space_bytes=host_memory_share(cfg.workers))
        self.limits = limits
        self._gpus = self._gpu_indices()
        self._root = tempfile.mkdtemp(prefix="opsynth-workers-")
        # One lock per GPU: a task holds it while it runs on the device, so timings are not shared.
        self._locks = {
            gpu: DeviceLock(os.path.join(self._root, f"gpu{gpu}"), SHARED_SLOTS if cfg.shared_checks else 1)
            for gpu in self._gpus
            if gpu is not None
        }
        self.hold_limit_s = hold_limit_s(cfg)
        self._cage = Cage(self.limits)
        self._spawned = 0
        # The libraries' bytecode, where the command compiles it (opsynth.bytecode): the seconds waited for it.
        self.bytecode_wait_s = wait_compiled()
        self.started_at = time.monotonic()  # when the pool began to start its workers
        self._workers = [self._spawn(i) for i in range(cfg.workers)]
        self.replaced = 0
        # Workers that asked for compile processes of their own and compile in-process, their pool not started.
        self.compiling_in_process = 0
        # When the first job was handed out and the last verdict came in (monotonic): the span of the pool's work.
        self.first_handed: float | None = None
        self.last_done: float | None = None
        self.ready_at: float | None = None  # when the last of the first workers was up (monotonic)
        self.containment: dict = {}  # what the first worker reported of its containment
        self.handed = 0  # jobs handed to workers, follow-ups and jobs started ahead included
        self._ahead = JobsAhead()  # jobs started ahead of the run they belong to (see `run`)
        self._run_lock = threading.Lock()  # threads of one process (Beam's multi_threading mode) take turns
        self._bridge: Bridge | None = None  # started ahead between two runs (see `run`)
        # A pool shared across pipelines (see ExecuteCandidates) is closed when the last reference goes, or at exit.
        self._finalizer = weakref.finalize(self, shut_down, self._workers, self._root)

    def _gpu_indices(self) -> list[int | None]:
        if self.cfg.device != "cuda":
            return [None]
        import torch

        return list(range(torch.cuda.device_count())) or [0]

    def _spawn(self, slot: int) -> WorkerHandle:
        gpu = self._gpus[slot % len(self._gpus)]
        self._spawned += 1
        setup = {
            "config": self.cfg,
            "gpu_index": gpu,
            "device_lock": self._locks.get(gpu),
            "recycle_jobs": RECYCLE_JOBS,
            "recycle_growth_bytes": RECYCLE_GROWTH_BYTES,
            "start_nice": self.start_nice,
            "preload": self.preload,
        }
        return WorkerHandle(self._root, self._cage, setup, f"w{self._spawned}")

    def _replace(self, slot: int) -> None:
        self._workers[slot].kill()
        self._workers[slot] = self._spawn(slot)
        self.replaced += 1

    def wait_ready(self) -> None:
        """Blocks until every worker is up (torch imported, its device set up): start-up kept apart from work."""
        self._end_bridge()  # the pool's work between runs holds the run's lock
        with self._run_lock:
            while starting := [w for w in self._workers if not w.ready]:
                wait([w.conn for w in starting], timeout=POLL_S)
                now = time.monotonic()
                for slot, w in enumerate(self._workers):
                    if not w.ready:
                        self._collect(slot, w, now)

    def run(
        self,
        jobs: list[Job],
        follow_up: Callable[[int, Verdict], Job | None] | None = None,
        on_final: Callable[[int, Verdict], None] | None = None,
        skip: Callable[[int], Verdict | None] | None = None,
        ahead: Callable[[], Job | None] | None = None,
    ) -> list[Verdict]:
        """Verdicts in the order of `jobs`, which are handed out in that order. `follow_up(i, verdict)`, called
        as job i's verdict comes in, may return another job for the same place i: it runs next, ahead of jobs
        not yet started, and its verdict replaces the first (so a chain of re-measures never waits for the rest
        of the list). `on_final(i, verdict)` is called as place i gets its final verdict (to checkpoint as
        results come in). `skip(i)`, asked as place i's job is about to be handed out, may return its verdict
        instead: the job does not run; asked again while it runs, as other verdicts come in, it may decide the
        place then: the run no longer waits for that job, which runs on as one started ahead (see below).

        `ahead()`, asked for a worker left idle once every job of this run is handed out, may return a job of
        a later run: it starts now, this run does not wait for it, and a later run given the same job takes
        its verdict (or the job in flight) instead of running it again. So the workers do not idle at the end
        of a run, waiting for its slowest task. A verdict no run takes is dropped at the next run. Once this run
        is done, a thread of the pool's goes on asking `ahead()` for the workers left idle and taking their
        verdicts, until the next run begins or the pool retires: the workers do not idle either while the
        caller passes from one run to the next (on one H100 a 600-row run's two rounds were a second apart,
        11 of its 14 workers holding a verdict meanwhile)."""
        self._end_bridge()
        with self._run_lock:
            verdicts = self._run(jobs, follow_up, on_final, skip, ahead)
        if ahead is not None:
            self._bridge = Bridge(lambda stop: self._between_runs(ahead, stop))
        return verdicts

    def _between_runs(self, ahead: Callable[[], Job | None], stop: Connection) -> None:
        with self._run_lock:
            self._run([], None, None, None, ahead, stop=stop)

    def _end_bridge(self, raising: bool = True) -> None:
        """The jobs started ahead since the last run left to the next one; an error of the thread raised here
        (`raising`)."""
        bridge, self._bridge = self._bridge, None
        if bridge is not None:
            bridge.end()
            if raising and bridge.error is not None:
                raise bridge.error

    def _run(self, jobs: list[Job], follow_up, on_final, skip, ahead=None, stop=None) -> list[Verdict]:
        """See `run`; with `stop` (the reading end of a pipe), also goes on until it can be read."""
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

        if stop is None:
            self._ahead.adopt(pending, finish, self._workers)  # (between runs they wait for the next run)
        while pending or any(w.job is not None for w in self._workers) or (stop is not None and not stop.poll()):
            for slot, w in enumerate(self._workers):
                while w.idle() and pending and skip is not None:
                    skipped = skip(pending[0][0])
                    if skipped is None:
                        break
                    finish(pending.popleft()[0], skipped)
                if w.idle() and (pending or ahead is not None):
                    index, job = pending.popleft() if pending else (None, ahead())
                    if job is None:
                        continue  # nothing to start ahead now; asked again when this worker is next seen idle
                    try:
                        w.hand(index, job)
                    except (BrokenPipeError, OSError):
                        if index is not None:
                            pending.appendleft((index, job))
                        self._replace(slot)
                        continue
                    self.handed += 1
                    if index is None:
                        self._ahead.started(job)
                    self.first_handed = self.first_handed or w.started
            busy = [w for w in self._workers if w.working() or not w.ready]
            if not busy and stop is None:
                continue
            # Woken by a message or a closed socket; else every POLL_S, to look at deaths, holds and waits.
            wait([w.conn for w in busy] + ([stop] if stop is not None else []), timeout=POLL_S)
            now = time.monotonic()
            for slot, w in enumerate(self._workers):
                started_ahead = w.ahead
                done = self._collect(slot, w, now)
                if done is not None:
                    self.last_done = now
                    if started_ahead is not None:
                        self._ahead.done(started_ahead, done[1])
                    else:
                        finish(*done)
            if skip is not None:
                self._ahead.let_go_unneeded(self._workers, skip, finish)
        return [r if r is not None else Verdict(CRASH, "no verdict") for r in results]

    def _collect(self, slot: int, w: WorkerHandle, now: float) -> tuple[int | None, Verdict] | None:
        """(job index, verdict) where worker `slot` finished, crashed or timed out on its job (index None: on
        a job started ahead); else None."""
        try:
            payload = w.conn.recv_bytes(MAX_MESSAGE_BYTES) if w.conn.poll() else None
        except EOFError:
            payload = None  # its end is closed: it died, as seen below
        except OSError:
            return self._lost(slot, w, "the worker sent an unreadable message")
        if payload is not None:
            try:
                message = read_message(payload)
            except (ValueError, TypeError):
                return self._lost(slot, w, "the worker sent an unreadable message")
            if message["kind"] == "ready":
                w.ready = True
                w.task_pid = only_child(w.process.pid)
                w.ready_at = reported_time(message.get("at"), w.started, now)  # started: when it was spawned
                if self.ready_at is None and all(other.ready for other in self._workers):
                    self.ready_at = max(other.ready_at for other in self._workers)
                self.containment = self.containment or {**message["containment"], "pids_cgroup": w.cgroup is not None}
                self.compiling_in_process += bool(message.get("compile_pool_failed"))
            elif w.working():
                done, w.job, w.ahead = (w.job, message["verdict"]), None, None
                if message.get("retire"):
                    self._replace(slot)
                return done
            return None
        if not w.alive():
            if not w.working() and not w.ready:
                return self._failed_to_start(slot, w)
            return self._lost(slot, w, describe_exit(w.process.returncode))
        if w.working():
            # its CPU time read only once the clock says it may be due
            cpu = w.cpu_spent() if now - w.started >= self.cfg.timeout_s else None
            why = overdue(w.watch, w.started, now, self.cfg.timeout_s, self.hold_limit_s, cpu, task_threads(self.cfg))
            if why is not None:
                done = (w.job, Verdict(TIMEOUT, why))
                self._replace(slot)
                return done
        if not w.ready and now >= w.deadline:
            raise RuntimeError(f"an execution worker did not start within {STARTUP_TIMEOUT_S:g} s{said(w)}")
        return None

    def _failed_to_start(self, slot: int, w: WorkerHandle) -> None:
        """A worker died before it was ready: where it ran in namespaces of its own, which some drivers refuse (a
        CUDA driver that cannot see itself), the pool's workers run without them from now on; else it is fatal."""
        why = describe_exit(w.process.returncode) + said(w)
        if not self._cage.namespaces:
            raise RuntimeError(f"an execution worker failed to start ({why})")
        print(f"opsynth: a worker failed to start in namespaces of its own ({why}); workers run without them",
              file=sys.stderr)  # fmt: skip
        self._cage = Cage(self.limits, namespaces=False)
        self._replace(slot)

    def _lost(self, slot: int, w: WorkerHandle, why: str) -> tuple[int | None, Verdict] | None:
        """Worker `slot` died or broke: replaced; its job, if it had one, is a crash."""
        working = w.working()
        self._replace(slot)
        return (w.job, Verdict(CRASH, why)) if working else None

    def worker_states(self) -> list[tuple[int | None, str]]:
        """(GPU, state) of each worker now, as its watch reports it (see `worker_state`): for a caller that
        samples where the workers are while the GPU idles. Read without the run's lock, so only a snapshot."""
        return [(self._gpus[slot % len(self._gpus)], worker_state(w)) for slot, w in enumerate(list(self._workers))]

    def worker_pids(self) -> list[int]:
        """The process ids of the workers now in the pool."""
        return [w.process.pid for w in self._workers]

    def retire(self) -> None:
        """Ask every worker to exit, without waiting for it (its device context's teardown takes a while):
        `close` then finds them gone. The pool runs nothing more (jobs started ahead since the last run are no
        run's: an error among them is not the caller's)."""
        self._end_bridge(raising=False)
        ask_to_exit(self._workers)

    def close(self) -> None:
        self._end_bridge(raising=False)  # as `retire`
        self._finalizer()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
