"""Parquet shards in the Hugging Face layout (`train-00000-of-00003.parquet`), written atomically.

All shards of a split are written under temporary names first, then older shards of that split are removed
and the new ones renamed into place, so a reader sees either the old complete set or the new one. Rows are
streamed: memory holds one shard's rows, whatever the split's size.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from opsynth.atomic import TMP_PREFIX

MAX_SHARD_BYTES = 500 * 2**20  # per file, uncompressed estimate (compressed files are smaller)
MAX_ROW_GROUP_BYTES = 100 * 2**20


def shard_name(split: str, index: int, total: int) -> str:
    return f"{split}-{index:05d}-of-{total:05d}.parquet"


def _row_bytes(row: dict) -> int:
    """An upper-bound estimate of a row's uncompressed size (its values as text)."""
    return sum(len(v) if isinstance(v, str) else 8 for v in row.values())


def _write_part(part: list[dict], schema: pa.Schema, path: Path, row_group_rows: int, max_row_group_bytes: int):
    table = pa.Table.from_pylist(part, schema=schema)
    mean_row = max(1, sum(_row_bytes(r) for r in part) // max(1, len(part)))
    group_rows = max(1, min(row_group_rows, max_row_group_bytes // mean_row))
    pq.write_table(table, path, row_group_size=group_rows, compression="zstd")


def write_shards(
    rows: Iterable[dict],
    schema: pa.Schema,
    folder: Path,
    split: str,
    max_rows: int,
    row_group_rows: int,
    max_bytes: int = MAX_SHARD_BYTES,
    max_row_group_bytes: int = MAX_ROW_GROUP_BYTES,
    keep_empty: bool = True,
) -> list[Path]:
    """Write `rows` (any iterable, consumed once) as shards of at most `max_rows` rows and about `max_bytes`
    bytes each: at least one shard, or none for no rows unless `keep_empty` (`datasets` cannot load a split
    whose only shard is empty, so such a split is better left out). Only one shard's rows are held at a time:
    each is written under a temporary name as soon as it is full, and all are renamed into place once their
    total count is known."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(f"{TMP_PREFIX}{split}-*.parquet"):  # staged by a write that failed (a full disk, a kill)
        stale.unlink()
    staged: list[Path] = []
    part: list[dict] = []
    size = 0

    def flush() -> None:
        tmp = folder / f"{TMP_PREFIX}{split}-{len(staged):05d}.parquet"
        _write_part(part, schema, tmp, row_group_rows, max_row_group_bytes)
        staged.append(tmp)

    for row in rows:
        row_size = _row_bytes(row)
        if part and (len(part) >= max_rows or size + row_size > max_bytes):
            flush()
            part, size = [], 0
        part.append(row)
        size += row_size
    if part or (not staged and keep_empty):
        flush()
    finals = [folder / shard_name(split, i, len(staged)) for i in range(len(staged))]
    for old in folder.glob(f"{split}-*-of-*.parquet"):
        if old not in finals:
            old.unlink()
    for tmp, final in zip(staged, finals, strict=True):
        os.replace(tmp, final)
    return finals
