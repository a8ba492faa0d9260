"""The CPU stages' own work, composing candidates and decontaminating them, spread over helper processes forked from
the driver; the same results, in the same order, as in the calling thread (docs/execution.md, "Rounds")."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

MIN_CORES = 4
MAX_HELPERS = 8  # a share of the cores: the execution workers start and compile beside them
CHUNK = 4  # items a helper takes at once
# A batch the helpers have not finished in this long (one item takes well under a second) is done here instead,
# and the run goes on without helpers: a helper that died or hung would otherwise keep `map` waiting for ever.
BATCH_TIMEOUT_S = 300.0
# A pool's stop takes milliseconds, but waits for ever where a helper was killed outright (a scheduler, the kernel's
# out-of-memory killer) as it held the pool's task queue: it is given this long, then left to end with the driver
# (whose death the helpers follow).
STOP_TIMEOUT_S = 10.0

_pool = None
_state: dict[str, Any] = {}  # what the helpers inherit from the driver (see `helping`)


def helpers_for(cores: int | None = None) -> int:
    """How many helpers a machine of `cores` cores gets: none under MIN_CORES, else half its cores, at most
    MAX_HELPERS."""
    cores = cores or os.cpu_count() or 1
    return 0 if cores < MIN_CORES else min(MAX_HELPERS, cores // 2)


def _start_helper() -> None:
    from opsynth.filters.containment import die_with_parent

    die_with_parent()  # a helper never outlives the run
    # A signal to the driver's process group (a terminal's Ctrl-C, `timeout`'s SIGTERM) is the driver's to handle:
    # a helper killed by one while it held the pool's task queue would leave the pool's stop waiting for ever.
    os.setpgrp()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # how its pool stops it (the driver's handler was forked with it)


@contextlib.contextmanager
def helping(processes: int, **state: Any) -> Iterator[None]:
    """Helpers for the enclosed block, forked now with `state` (read by the functions `mapped` runs, through
    `inherited`). Fork before any thread starts: a forked process holds only the thread that forked it."""
    global _pool
    if processes < 1 or _pool is not None:
        yield
        return
    _state.update(state)
    _pool = multiprocessing.get_context("fork").Pool(processes, initializer=_start_helper)
    started = _pool
    try:
        yield
    finally:
        _pool = None
        if _stopped(started):
            started.join()
        _state.clear()


def _stopped(pool) -> bool:
    """Stop `pool`'s helpers; whether the stop ended within STOP_TIMEOUT_S."""
    stopping = threading.Thread(target=pool.terminate, name="opsynth-helpers-stop", daemon=True)
    stopping.start()
    stopping.join(STOP_TIMEOUT_S)
    return not stopping.is_alive()


def inherited(key: str) -> Any:
    """What the driver handed its helpers under `key` (None where there are none, or in the driver without)."""
    return _state.get(key)


def mapped(fn: Callable, items: list, timeout_s: float = BATCH_TIMEOUT_S) -> list:
    """`fn` over `items`, in order: on the helpers where there are, else here. `fn` must be picklable (a
    module-level function, or a partial of one). Helpers that do not finish within `timeout_s` are given up
    (only an optimization failed: the work is done here, and from then on all of it)."""
    global _pool
    pool = _pool
    if pool is None or len(items) < 2:
        return [fn(item) for item in items]
    try:
        return pool.map_async(fn, items, chunksize=CHUNK).get(timeout_s)
    except multiprocessing.TimeoutError:
        if _pool is pool:
            _pool = None
            _stopped(pool)
            print(f"opsynth: the CPU stages' helper processes gave no result in {timeout_s:g} s; going on without "
                  "them", file=sys.stderr)  # fmt: skip
        return [fn(item) for item in items]
