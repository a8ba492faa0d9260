"""The run folder `--out`: made or reopened (a foreign folder refused), its options checked against the run's,
and locked for one run at a time. The lock, on `DIR/.opsynth/lock`, is held by the process that runs it and let
go by the operating system when that process dies (`kill -9` included): a second run into the folder is refused,
where it would have done all the work again and mixed its state with the first's.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

from opsynth.atomic import write_text_atomic
from opsynth.errors import UsageError
from opsynth.options import GenerateOptions

STATE_DIR = ".opsynth"
CONFIG_FILE = "config.json"
LOCK_FILE = "lock"
# The layout of the state folder, written into its config.json: a folder of another format is refused, not read.
STATE_FORMAT = 1


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


def state_dir(options: GenerateOptions) -> Path:
    """DIR's state folder, made if DIR is new or empty; a foreign folder is refused."""
    out = Path(options.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder path")
    state = out / STATE_DIR
    if out.exists() and any(entry.name != STATE_DIR for entry in out.iterdir()) and not state.is_dir():
        raise UsageError(f"{out} is not empty and holds no opsynth run; choose a new or empty --out folder")
    try:
        state.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot write to {out} ({e.strerror}); choose a writable --out folder") from None
    return state


def check_config(options: GenerateOptions, state: Path) -> None:
    """Reopen a run of the same options, or start one; refuse a run of other options or unreadable ones."""
    config_path = state / CONFIG_FILE
    wanted = options.fingerprint()
    if not config_path.exists():
        record = {"format": STATE_FORMAT, "options": wanted}
        write_text_atomic(config_path, json.dumps(record, indent=2, sort_keys=True))
        return
    try:
        record = json.loads(config_path.read_text())
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict):
        raise UsageError(
            f"{config_path} is damaged: the run's options cannot be read; remove {options.out} to start over"
        )
    made = record.get("format", 0)
    if made != STATE_FORMAT:
        by = "an earlier" if isinstance(made, int) and made < STATE_FORMAT else "another"
        raise UsageError(
            f"{options.out} holds a run of {by} opsynth (state format {made}; this one reads {STATE_FORMAT}); "
            "finish it with that version, or choose another --out"
        )
    stored = record.get("options")
    if not isinstance(stored, dict):
        raise UsageError(
            f"{config_path} is damaged: the run's options cannot be read; remove {options.out} to start over"
        )
    if stored != wanted:
        differing = sorted(k for k in set(stored) | set(wanted) if stored.get(k) != wanted.get(k))
        raise UsageError(
            f"{options.out} holds a run with other options ({', '.join(differing)} differ); "
            "rerun with the same options to resume, or choose another --out"
        )
