"""The run's work files (round outputs, spools, checkpoints) through Beam's FileSystems, so that the work
folder can be anywhere the runner's workers can write: a local folder, a shared mount, or an object store such
as `gs://`. Files are written whole under a temporary name and renamed, so none is ever seen half-written."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

from apache_beam.io.filesystems import FileSystems

from opsynth.atomic import TMP_PREFIX

join = FileSystems.join


def exists(path: str) -> bool:
    return FileSystems.exists(path)


def mkdirs(path: str) -> None:
    """Create a folder unless present; another process creating it meanwhile is fine."""
    if not FileSystems.exists(path):
        try:
            FileSystems.mkdirs(path)
        except OSError:
            if not FileSystems.exists(path):
                raise


def delete(path: str) -> None:
    """Remove a file or a folder and everything under it, if present."""
    if FileSystems.exists(path):
        FileSystems.delete([path])


def write_text(path: str, text: str) -> None:
    directory, name = FileSystems.split(path)
    tmp = join(directory, f"{TMP_PREFIX}{name}")
    with FileSystems.create(tmp) as f:
        f.write(text.encode("utf-8"))
    FileSystems.rename([tmp], [path])


def read_text(path: str, errors: str = "strict") -> str:
    """A file's text; `errors` as bytes.decode takes it ("replace": a damaged byte reads as U+FFFD)."""
    with FileSystems.open(path) as f:
        return f.read().decode("utf-8", errors=errors)


def read_json(path: str, default=None):
    """The JSON value of a state file; `default` where it is missing or damaged (its work is then redone)."""
    try:
        return json.loads(read_text(path))
    except (OSError, ValueError):
        return default


def write_jsonl(path: str, records: Iterable) -> None:
    """Records with `to_json()`, one JSON object per line."""
    write_json_lines(path, (r.to_json() for r in records))


def write_json_lines(path: str, objects: Iterable[dict]) -> None:
    """JSON objects, one per line."""
    write_text(path, "".join(json.dumps(o, sort_keys=True) + "\n" for o in objects))


def iter_jsonl(path: str) -> Iterator[dict]:
    with FileSystems.open(path) as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def match(pattern: str) -> list[str]:
    """The paths matching a glob, in name order; files being written (TMP_PREFIX) never match."""
    paths = (m.path for m in FileSystems.match([pattern])[0].metadata_list)
    return sorted(p for p in paths if not FileSystems.split(p)[1].startswith(TMP_PREFIX))


def delete_matching(pattern: str) -> None:
    paths = match(pattern)
    if paths:
        FileSystems.delete(paths)


def read_jsonl_glob(pattern: str) -> list[dict]:
    """Every line of every file matching `pattern`, files in name order."""
    return [row for path in match(pattern) for row in iter_jsonl(path)]
