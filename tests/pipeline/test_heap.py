"""The driver's glibc arenas: held to a few that its threads share, unless the user chose otherwise."""

import ctypes
import os
import subprocess
import sys

import pytest

_THREADS_ALLOCATE = """
import ctypes, sys, threading
from opsynth.pipeline.heap import hold_malloc_arenas

held = hold_malloc_arenas(2) if sys.argv[2] == "held" else None
barrier, kept = threading.Barrier(8), []

def allocate():
    kept.append([bytearray(1000) for _ in range(200)])  # past pymalloc's small objects: glibc's malloc
    barrier.wait()  # all eight alive at once, each with its own allocations

threads = [threading.Thread(target=allocate) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
libc = ctypes.CDLL(None)
libc.fopen.restype, libc.fopen.argtypes = ctypes.c_void_p, (ctypes.c_char_p, ctypes.c_char_p)
out = libc.fopen(sys.argv[1].encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(out))
libc.fclose(ctypes.c_void_p(out))
print(held)
"""


def _glibc() -> bool:
    try:
        return sys.platform.startswith("linux") and bool(ctypes.CDLL(None).gnu_get_libc_version)
    except (OSError, AttributeError):
        return False


@pytest.mark.skipif(not _glibc(), reason="malloc arenas are glibc's")
def test_the_drivers_threads_share_two_arenas_where_they_would_each_take_one(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    arenas = {}
    for mode in ("held", "default"):
        info = tmp_path / f"{mode}.xml"
        done = subprocess.run([sys.executable, "-c", _THREADS_ALLOCATE, str(info), mode],
                              env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        arenas[mode] = (done.stdout.strip(), info.read_text().count("<heap nr="))
    assert arenas["held"] == ("True", 2)
    assert arenas["default"][1] > 2, "without it, the threads take arenas of their own"


def test_a_users_malloc_arena_max_is_left_as_it_is(monkeypatch):
    from opsynth.pipeline.heap import hold_malloc_arenas

    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert hold_malloc_arenas() is False
