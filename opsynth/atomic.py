"""Files written whole or not at all: under a temporary name beside their final one, then renamed over it, so a
reader never sees half a file. A kill or a full disk may leave a temporary file behind; it is never read."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

TMP_PREFIX = ".tmp-"


def temporary(path: Path) -> Path:
    """Where `path` is written before it is renamed into place."""
    return path.with_name(f"{TMP_PREFIX}{path.name}")


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path to write `path`'s content to; renamed over `path` when the block ends, removed when it
    raises."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary(path)
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def write_text_atomic(path: Path, text: str) -> None:
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
