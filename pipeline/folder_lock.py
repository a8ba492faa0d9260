"""One run per output folder: an exclusive lock on `DIR/.opsynth/lock`, held by the process that runs it and let go
by the operating system when that process dies (`kill -9` included). A second run into the folder is refused,
where it would have done all the work again and mixed its state with the first's.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from pipeline.errors import UsageError

LOCK_FILE = "lock"


class FolderLock:
    """The lock of one run folder's state directory; a context manager."""

    def __init__(self, state_dir: Path, out: Path):
        self.path = state_dir / LOCK_FILE
        self.out = out
        self._fd: int | None = None

    def __enter__(self) -> FolderLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise UsageError(
                f"{self.out} is in use by another opsynth run (process {holder}); wait for it to end, or choose "
                "another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
