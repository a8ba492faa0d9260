"""The pool's side of one contained worker process (filters.worker_process): how it is started, handed a job,
read from and killed, where it is (what its watch reports), and how a pool's workers are shut down. What a worker
sends or writes is data from a process that runs task code: read with a size limit and checked, never trusted.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

from opsynth.filters.containment import PidsCgroup, python_path, task_environment
from opsynth.filters.device_lock import ALONE, CLEARING, HOLD_MODE, PHASE, WAIT_MODE, clear_watch, open_watch
from opsynth.filters.execution import REPORTED_PHASES
from opsynth.filters.process_time import cpu_seconds
from opsynth.filters.worker_process import EXECUTE, Cage, WorkerSetup
from opsynth.reasons import Verdict

STARTUP_TIMEOUT_S = 300.0  # importing torch, creating a CUDA context and a first compile, once per worker
EXIT_GRACE_S = 5.0  # what a pool's idle workers are given together to exit when it closes
OUTPUT_TAIL_BYTES = 4096  # of a worker's output, what is read back to say why it failed to start
EXCEPTION_LINE = re.compile(r"[\w.]*(Error|Exception)\b.*:")  # "ValueError: ...", "torch.OutOfMemoryError: ..."


@dataclass(frozen=True)
class Job:
    key: str  # identifies the task in results and logs
    source: str  # the task program
    seed: int  # seeds the model's parameters and the input draws
    check: str = EXECUTE  # EXECUTE (every execution check) or SHAPES (loading and the shape check on meta)
    ceiling_ms: float | None = None  # a first try's: stopped once a timed forward is over it (filters.calibration)


def describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"worker killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"worker killed by signal {-code}"
    return f"worker exited with code {code}"


def read_message(payload: bytes) -> dict:
    """A worker's message, checked: a worker runs task code, so what it sends is data, never trusted."""
    message = json.loads(payload)
    if not isinstance(message, dict) or message.get("kind") not in ("ready", "done"):
        raise ValueError("not a worker message")
    if message["kind"] == "ready" and not isinstance(message.get("containment"), dict):
        raise ValueError("not a ready message")
    if message["kind"] == "done":
        verdict = message.get("verdict")
        if not isinstance(verdict, dict) or set(verdict) != {"reason", "detail", "measurements"}:
            raise ValueError("not a verdict")
        if not isinstance(verdict["detail"], str) or not isinstance(verdict["measurements"], dict):
            raise ValueError("not a verdict")
        message["verdict"] = Verdict(**verdict)  # an unknown reason raises ValueError
    return message


def reported_time(value, earliest: float, latest: float) -> float:
    """A time a worker reported (the system's monotonic clock, shared by its processes), kept within what the pool
    saw: the worker runs task code, so the value is only a hint."""
    return min(max(value, earliest), latest) if isinstance(value, int | float) and math.isfinite(value) else latest


class WorkerHandle:
    """The pool's handle on one worker process, its socket, its scratch folder and its watch."""

    def __init__(self, root: str, cage: Cage, setup: dict, name: str):
        self.scratch = tempfile.mkdtemp(prefix=f"{name}-", dir=root)
        watch_path = os.path.join(self.scratch, ".watch")
        self.watch = open_watch(watch_path)
        ours, theirs = socket.socketpair()
        self.cgroup = PidsCgroup.create(f"opsynth-{os.getpid()}-{name}", cage.limits.processes)
        # What the worker and its tasks print stays out of the user's terminal: task code is untrusted (a
        # task's own prints, escape sequences), and a compiled kernel's failed device-side assertion prints a line
        # per thread (246 lines from one task of a 600-row run on one H200). An unnamed file, read back only to
        # say why a worker failed to start, and emptied as each job is handed over (see `hand`).
        self.output = tempfile.TemporaryFile(dir=root)  # noqa: SIM115 (closed by kill)
        env = task_environment(os.environ, self.scratch, python_path())
        if setup["config"].device != "cuda":
            # A CPU worker (the shape check's on the meta device, a CPU run's) sees no GPU: no library it imports
            # sets up the CUDA driver, which on one H200's host made its start-up and first transformers task
            # take seconds longer while the execution workers created their contexts.
            env["CUDA_VISIBLE_DEVICES"] = ""
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "opsynth.filters.worker_process", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                env=env,
                cwd=self.scratch,
                stdin=subprocess.DEVNULL,
                stdout=self.output,
                stderr=self.output,
                start_new_session=True,  # its own process group, away from the terminal's Ctrl-C
            )
        self.conn = Connection(ours.detach())
        if self.cgroup is not None and not self.cgroup.add(self.process.pid):
            self.cgroup.kill()
            self.cgroup = None
        self.conn.send(cage)
        self.conn.send(WorkerSetup(watch_path=watch_path, scratch=self.scratch, **setup))
        self.ready = False
        self.ready_at: float | None = None  # when it said it was up, which the pool reads only once it looks
        self.job: int | None = None  # the index of the job in hand
        self.ahead: Job | None = None  # or the job in hand, which no run waits for (see `detach`)
        self.in_hand: Job | None = None  # the job in hand, either way
        self.started = time.monotonic()  # when the job in hand was handed over
        self.deadline = self.started + STARTUP_TIMEOUT_S  # to start
        self.task_pid: int | None = None  # the process that runs its tasks (the child of `process`), once up
        self.cpu_at_hand: float | None = None  # that process's CPU time when the job in hand was handed over

    def alive(self) -> bool:
        return self.process.poll() is None

    def hand(self, index: int | None, job: Job) -> None:
        """Give the worker job `index` of the run in hand, or (`index` None) a job started ahead of its run
        (raises BrokenPipeError or OSError where it has died)."""
        clear_watch(self.watch)  # the worker is idle: nothing else writes it now
        # Its output emptied too (the worker's descriptors share this one's offset): writes past the file size
        # limit fail, so what one task printed must not make the next one's prints fail.
        self.output.truncate(0)
        self.output.seek(0)
        self.cpu_at_hand = None if self.task_pid is None else cpu_seconds(self.task_pid)
        self.conn.send(job)
        self.started = time.monotonic()
        self.in_hand = job
        if index is None:
            self.ahead = job
        else:
            self.job = index

    def detach(self) -> int:
        """The index of the job in hand, which from now on no run waits for: it runs on as a job started ahead
        of its run does (its verdict dropped where no later run takes it)."""
        index, self.job, self.ahead = self.job, None, self.in_hand
        return index

    def idle(self) -> bool:
        return self.ready and self.job is None and self.ahead is None

    def working(self) -> bool:
        return self.job is not None or self.ahead is not None

    def cpu_spent(self) -> float | None:
        """The CPU time its task process took since the job in hand was handed over; None where unknown."""
        now = None if self.cpu_at_hand is None else cpu_seconds(self.task_pid)
        return None if now is None else now - self.cpu_at_hand

    def send_kill(self) -> None:
        """SIGKILL to the worker and everything it started, not waiting for them to go."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        if self.cgroup is not None:
            self.cgroup.kill()

    def last_output(self, limit: int = 300) -> str:
        """What the worker printed last, in one line of at most `limit` characters, control characters dropped:
        from the last line that names an exception (a traceback's end, whose message may span lines), else its
        last lines; "" where it printed nothing."""
        try:
            size = os.fstat(self.output.fileno()).st_size
            self.output.seek(max(0, size - OUTPUT_TAIL_BYTES))
            text = self.output.read().decode("utf-8", "replace")
        except (OSError, ValueError):  # closed
            return ""
        lines = [kept for line in text.splitlines() if (kept := "".join(c for c in line if c.isprintable()).strip())]
        raised = [i for i, line in enumerate(lines) if EXCEPTION_LINE.match(line)]
        said = " | ".join(lines[raised[-1] :] if raised else lines)
        return said[:limit] if raised else said[-limit:]

    def kill(self) -> None:
        """Kill the worker and everything it started, and remove its scratch folder."""
        self.send_kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        self.conn.close()
        self.output.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


def ask_to_exit(workers: list[WorkerHandle]) -> None:
    for w in workers:
        with contextlib.suppress(BrokenPipeError, OSError):
            w.conn.send(None)


def shut_down(workers: list[WorkerHandle], root: str) -> None:
    """Stop a pool's workers: one with a job in hand is killed at once (the pool is closing, as on Ctrl-C, so
    nothing will read its verdict, and it reads its pipe only between jobs); the others are asked to exit and
    given EXIT_GRACE_S together for their device contexts' teardown, then killed where still there. (A grace per
    worker in turn could keep a pool of 14 busy workers closing for over a minute.)"""
    idle = [w for w in workers if not w.working()]
    for w in workers:
        if w.working():
            w.send_kill()
    ask_to_exit(idle)
    deadline = time.monotonic() + EXIT_GRACE_S
    for w in idle:
        with contextlib.suppress(subprocess.TimeoutExpired):
            w.process.wait(timeout=max(0.0, deadline - time.monotonic()))
    for w in workers:
        w.send_kill()  # all of them dying together: each kill below then only waits for its own to go
    for w in workers:
        w.kill()
    shutil.rmtree(root, ignore_errors=True)


def worker_state(w: WorkerHandle) -> str:
    """Where a worker is: `starting`, `no_task`, waiting for its GPU (`waiting_to_share`, `waiting_to_time`:
    a timing or other exclusive hold; `waiting_for_clearing`: a timing waiting for memory freed before it to
    be cleared, holding it or not yet), holding it (`sharing:PHASE`, `alone:PHASE`) or in a phase of its task
    without it (`PHASE`, such as `compile`; `task` between phases; `handing_back`: its verdict sent, not yet
    taken). Its watch is written by a process that runs task code: a value it could not have written reads as
    `task`."""
    if not w.ready:
        return "starting"
    if not w.working():
        return "no_task"
    watch = w.watch
    code = watch[PHASE]
    phase = REPORTED_PHASES[int(code) - 1] if code in range(1, len(REPORTED_PHASES) + 1) else "task"
    if watch[WAIT_MODE]:
        waits = {ALONE: "waiting_to_time", CLEARING: "waiting_for_clearing"}
        return waits.get(watch[WAIT_MODE], "waiting_to_share")
    if watch[HOLD_MODE]:
        return f"{'alone' if watch[HOLD_MODE] == ALONE else 'sharing'}:{phase}"
    return phase


def said(w: WorkerHandle) -> str:
    """What a worker that failed to start last printed, for the message that says so."""
    output = w.last_output()
    return f"; it printed: {output}" if output else ""
