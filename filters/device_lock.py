"""An inter-process lock on a GPU, exclusive for timings and shared for the checks, that reports its holder's
holds and waits into a small shared array, so that the worker pool can tell work from waiting.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import time

SLOT_POLL_S = 0.005  # how often a task waiting to share a GPU looks for a free slot
# How long a timing that finds tasks sharing the GPU waits for another timing to start draining them before it
# starts the drain itself (joining one as soon as it starts): see `DeviceLock`. Two 600-row runs on one H200 (one
# machine, fresh compile caches each): 248 drains with 2.8 timings each, against 539 with 1.3 without gathering;
# the GPU busy over 87.5 % of the execution, against 80.8 %; the execution as long (124 s, 122 s).
TIMING_GATHER_S = 0.15
# The driver clears GPU memory that a process frees after the free has returned, for a time that grows with its
# size, and the clearing slows other processes' memory-bound kernels: on one H100, an elementwise forward of
# 1.43 ms ran 16 % longer in the 20 ms after another process freed 8 GiB, and as long as ever otherwise (its
# allocations slowed nothing). A timing waits for memory freed before it to be cleared, at this rate (the slowest
# that measure allows), and at most CLEARING_WAIT_MAX_S (a value written by task code is not trusted further).
FREED_CLEARING_BYTES_PER_S = 150e9
CLEARING_WAIT_MAX_S = 1.0
# A worker's watch: what its DeviceLock reports, in a shared array the pool reads: since when it holds the GPU and
# since when it waits for it (monotonic clock seconds, 0 where it does not), the seconds it waited in all; how it
# holds and how it waits (SHARING or ALONE, 0 where it does not; CLEARING while a timing waits for freed memory's
# clearing, holding the GPU or before it drains the sharers), and the phase its task is in (its index in the pool's
# list of phases, plus one; 0 for none), for the pool to tell where the workers are while the GPU idles.
HOLD_SINCE, WAIT_SINCE, WAITED_S, HOLD_MODE, WAIT_MODE, PHASE = range(6)
WATCH_FIELDS = 6
SHARING, ALONE, CLEARING = 1.0, 2.0, 3.0  # a shared hold (the checks' device work), an exclusive one (a timing)


class DeviceLock:
    """An inter-process lock on a GPU, on files (flock): the OS releases it when its holder dies, so a worker
    that segfaults or is killed on a timeout while holding it cannot wedge the others.

    Entered as a context manager it is exclusive: for timings, which another process's kernels would slow.
    `shared()` is for the checks' device work, which may overlap with that of up to `slots - 1` other tasks
    (with `slots` 1, it is exclusive too). Exclusive holders go first, as a batch: each marks itself pending (a
    shared flock on the `pending` file) before it waits for the shared holders inside to leave, and no new
    shared holder enters while any is pending. So the GPU drains of shared work once for all the timings
    waiting at that moment, not once for each; shared holders enter again when the last of them is done.

    A shared holder's work between two device steps may be host work (building a model, Triton's autotuning
    between its benchmarks), during which the GPU would idle while a timing waits for it to leave: at such
    points it calls `yield_to_timings`, which lets any timing waiting go first and then shares again. So a
    timing waits for the sharers' current device step, not for the whole of their checks.

    Memory a worker gives back to the driver is cleared after the free (see FREED_CLEARING_BYTES_PER_S): the
    free runs while no timing does (`briefly`), says for how long its memory is being cleared (`clearing`), and
    a timing that enters before then sleeps that out first: before it drains the sharers, which go on meanwhile
    (where no drain is on), and, for memory freed while it waited, once it holds the GPU.

    That wait is the cost of a drain: the GPU runs only the steps the sharers are finishing, often host work (a
    first forward's set-up), while every other task waits. So a timing that finds tasks sharing the GPU first
    waits up to `gather_s`, the sharers going on meanwhile, for another timing to start a drain, and joins it at
    once; only then does it start one itself. Timings drain the sharers a few at a time, not one by one. A
    timing that finds no task on the GPU goes at once."""

    def __init__(self, path: str, slots: int = 1, gather_s: float = TIMING_GATHER_S):
        self.path = path
        self.slots = slots
        self.gather_s = gather_s
        self._fds: dict[str, int] | None = None  # opened lazily, in the process that uses them
        self._clearing = None  # until when the memory freed by the lock's holders is being cleared
        self._watch = None  # where this process reports its holds and waits (see `watch`)
        self._holds_watched = True
        self._alone = False  # see `alone`
        self.held = False  # whether this process holds the lock (in either mode)
        self.sharing = False  # whether it holds it in the shared mode (see `step_aside`)
        self._slot: int | None = None  # the slot it shares the GPU in, while it does

    def __getstate__(self) -> dict:
        return {"path": self.path, "slots": self.slots, "gather_s": self.gather_s, "_fds": None, "_clearing": None,
                "_watch": None, "_holds_watched": True, "_alone": False, "held": False, "sharing": False,
                "_slot": None}  # fmt: skip

    @contextlib.contextmanager
    def alone(self):
        """Within the block, this process's shared holds are exclusive too: no other task's device work runs
        beside its own (its host work, compiling, still holds nothing)."""
        self._alone = True
        try:
            yield
        finally:
            self._alone = False

    def watch(self, state) -> None:
        """Report this process's holds, waits and phases into `state` (a shared array of WATCH_FIELDS, see
        HOLD_SINCE), for the pool that set it up."""
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

    def report_phase(self, code: int) -> None:
        """Report the phase this process's task is in (see PHASE) into its watch, if it has one."""
        if self._watch is not None:
            self._watch[PHASE] = float(code)

    def _waiting(self, mode: float) -> None:
        if self._watch is not None:
            self._watch[WAIT_SINCE] = time.monotonic()
        self._wait_mode(mode)

    def _wait_mode(self, mode: float) -> None:
        if self._watch is not None:
            self._watch[WAIT_MODE] = mode

    def _holding(self, mode: float) -> None:
        self.held = True
        if self._watch is not None:
            now = time.monotonic()
            if self._watch[WAIT_SINCE]:
                self._watch[WAITED_S] += now - self._watch[WAIT_SINCE]
            self._watch[WAIT_SINCE] = self._watch[WAIT_MODE] = 0.0
            self._watch[HOLD_MODE] = mode
            if self._holds_watched:
                self._watch[HOLD_SINCE] = now

    def _released(self) -> None:
        self.held = False
        if self._watch is not None:
            self._watch[HOLD_SINCE] = self._watch[HOLD_MODE] = 0.0

    def _fd(self, name: str) -> int:
        if self._fds is None:
            self._fds = {}
        if name not in self._fds:
            path = self.path if name == "rw" else f"{self.path}.{name}"
            self._fds[name] = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        return self._fds[name]

    def __enter__(self) -> DeviceLock:
        self._waiting(ALONE)
        most = CLEARING_WAIT_MAX_S  # the clearing waits' sum, however long the clearings are said to be
        if self.slots > 1 and not self._alone:
            self._gather()
            if not self.timing_waits():
                # No drain is on: the clearing of memory freed before now is slept out while the sharers go on
                # (and new ones enter), not once they are drained, the GPU then idle. A drain that is on is joined
                # at once: the timings ahead in it outlast most clearings.
                most -= self._await_clearing(most)
                self._wait_mode(ALONE)
        fcntl.flock(self._fd("pending"), fcntl.LOCK_SH)  # from now on, no new shared holder enters
        fcntl.flock(self._fd("rw"), fcntl.LOCK_EX)
        self._await_clearing(most)  # what was freed since: no one frees while a timing holds the GPU
        self._holding(ALONE)
        return self

    def __exit__(self, *exc) -> None:
        self._released()
        fcntl.flock(self._fd("rw"), fcntl.LOCK_UN)
        fcntl.flock(self._fd("pending"), fcntl.LOCK_UN)

    @contextlib.contextmanager
    def shared(self):
        if self.slots <= 1 or self._alone:
            with self:
                yield self
            return
        self._waiting(SHARING)
        slot = self._take_slot()
        try:
            # Held exclusive only while no exclusive holder is pending or inside, and so only an instant: the
            # shared flock on `rw` is then granted at once.
            fcntl.flock(self._fd("pending"), fcntl.LOCK_EX)
            fcntl.flock(self._fd("rw"), fcntl.LOCK_SH)
            fcntl.flock(self._fd("pending"), fcntl.LOCK_UN)
            self._holding(SHARING)
            self.sharing = True
            try:
                yield self
            finally:
                self.sharing = False
                self._released()
                fcntl.flock(self._fd("rw"), fcntl.LOCK_UN)
        finally:
            self._slot = None
            fcntl.flock(slot, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def briefly(self):
        """For a moment's device work outside a task's holds (giving memory back to the driver, see
        `device_holds.give_back_cached`; a profiler's first launch, filters.timing): no timing runs meanwhile,
        the `rw` file held shared as the checks hold it but with no slot and not behind the timings pending (it
        takes milliseconds; a timing waiting for a free then waits for its clearing, see `clearing`). Where this
        process holds the lock already, as it is."""
        if self.held:
            yield
            return
        fcntl.flock(self._fd("rw"), fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(self._fd("rw"), fcntl.LOCK_UN)

    def clearing(self, seconds: float) -> None:
        """Within `briefly` (or a hold): memory this process freed is cleared for `seconds` from now, which no
        timing may overlap (see FREED_CLEARING_BYTES_PER_S)."""
        fd, until = self._fd("clearing"), time.monotonic() + seconds
        fcntl.flock(fd, fcntl.LOCK_EX)  # freeing processes may write at once: the later deadline stays
        try:
            deadline = self._clearing_deadline()
            deadline[0] = max(deadline[0], until)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _await_clearing(self, most: float) -> float:
        """Wait until the memory freed so far is cleared, `most` seconds at most: holding the GPU alone, or before
        a timing drains the sharers (see `__enter__`). Returns the seconds waited."""
        wait = min(self._clearing_deadline()[0] - time.monotonic(), most)
        if wait <= 0:
            return 0.0
        self._wait_mode(CLEARING)  # told apart from the wait for the lock
        time.sleep(wait)
        return wait

    def _clearing_deadline(self):
        if self._clearing is None:
            self._clearing = open_watch(f"{self.path}.clearing", 1)
        return self._clearing

    def sharers(self) -> int:
        """While this process shares the GPU: how many other tasks share it now (their slots taken), asked without
        waiting; 0 otherwise."""
        if not self.sharing or self._slot is None:
            return 0
        return sum(self._taken(f"slot{k}") for k in range(self.slots) if k != self._slot)

    def _gather(self) -> None:
        """Before a timing drains the tasks sharing the GPU: return once another timing has started a drain, or
        no task holds the GPU (`rw`), or after `gather_s` (see the class)."""
        deadline = time.monotonic() + self.gather_s
        while not self.timing_waits() and self._taken("rw"):
            if time.monotonic() >= deadline:
                return
            time.sleep(SLOT_POLL_S)

    def _taken(self, name: str) -> bool:
        """Whether another process holds the lock file `name`, in either mode: asked without waiting, the probe's
        own hold let go at once (held, it would block a shared holder entering, which holds `pending` meanwhile).
        Never asked of a file this process holds: the probe would convert its hold."""
        fd = self._fd(name)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False

    def timing_waits(self) -> bool:
        """Whether an exclusive holder (a timing) waits for the GPU or holds it: asked without waiting."""
        return self._taken("pending")

    def step_aside(self) -> None:
        """While sharing: leave the GPU to the exclusive holders waiting, and share it again once they are done
        (the slot kept meanwhile). The caller's device work must be finished: the timings start at once."""
        self.step_out()
        self.share_again()

    def step_out(self) -> None:
        """While sharing: hold nothing until `share_again`, the slot kept (host work that launches no kernel, a
        capture: see filters.rehearsal), so that timings go on meanwhile. The caller's device work must be
        finished."""
        self._released()
        fcntl.flock(self._fd("rw"), fcntl.LOCK_UN)

    def share_again(self) -> None:
        """After `step_out`: share the GPU again, behind any exclusive holder pending or inside."""
        self._waiting(SHARING)
        fcntl.flock(self._fd("pending"), fcntl.LOCK_EX)  # granted once no exclusive holder is pending or inside
        fcntl.flock(self._fd("rw"), fcntl.LOCK_SH)
        fcntl.flock(self._fd("pending"), fcntl.LOCK_UN)
        self._holding(SHARING)

    def _take_slot(self) -> int:
        """One of the `slots` slot files, locked: the first free one, looked for again every few ms until one is
        (flock cannot wait on any of several files)."""
        while True:
            for k in range(self.slots):
                fd = self._fd(f"slot{k}")
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    self._slot = k
                    return fd
                except BlockingIOError:
                    continue
            time.sleep(SLOT_POLL_S)


def open_watch(path: str, fields: int = WATCH_FIELDS) -> memoryview:
    """The watch at `path`: a file of `fields` doubles (zeros if new), mapped shared, so that the lock of a
    worker process writes it and the pool (or another worker's lock) reads it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_size != fields * 8:
            os.ftruncate(fd, fields * 8)
        mapping = mmap.mmap(fd, fields * 8)
    finally:
        os.close(fd)
    return memoryview(mapping).cast("d")


def clear_watch(watch) -> None:
    for field in range(WATCH_FIELDS):
        watch[field] = 0.0
