"""The driver's heap, held to a few glibc arenas (DRIVER_MALLOC_ARENAS) that its threads share from the process's
start, so that the threads Beam starts for every round's pipeline do not creep its resident memory up
(docs/development.md, "Workarounds")."""

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
