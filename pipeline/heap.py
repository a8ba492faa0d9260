"""The driver's heap. glibc's malloc gives the threads that allocate their own arenas (up to eight per core), and
memory freed in one arena serves no other; Beam's in-process runner starts new threads for every pipeline, so
over a long run's rounds the driver's resident memory crept up 3.5-5 MiB a round, though what it held did not
grow. Held to two arenas the threads share from the process's start, it stopped; set after the threads had
taken theirs, it went on (BENCHMARKS.md, "State and memory"). The execution's workers are processes of their
own and keep glibc's default."""

from __future__ import annotations

import ctypes
import os
import sys

from opsynth.config import DRIVER_MALLOC_ARENAS

M_ARENA_MAX = -8  # glibc's mallopt parameter for the most arenas (malloc.h)
ARENA_ENV = "MALLOC_ARENA_MAX"  # glibc's own setting of it, read at a process's start: a user's choice, kept


def hold_malloc_arenas(arenas: int = DRIVER_MALLOC_ARENAS) -> bool:
    """Let this process's threads allocate from at most `arenas` glibc arenas from now on (arenas its threads
    already took stay in use: call it before they start). False where it changes nothing: not glibc, or
    MALLOC_ARENA_MAX set by the user."""
    if not sys.platform.startswith("linux") or ARENA_ENV in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt(M_ARENA_MAX, arenas) == 1
