"""Parquet shards in the Hugging Face layout (`train-00000-of-00003.parquet`), written atomically.

All shards of a split are written under temporary names first, then older shards of that split are removed
and the new ones renamed into place, so a reader sees either the old complete set or the new one.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

MAX_SHARD_BYTES = 500 * 2**20  # per file, uncompressed estimate (compressed files are smaller)
MAX_ROW_GROUP_BYTES = 100 * 2**20


def shard_name(split: str, index: int, total: int) -> str:
    return f"{split}-{index:05d}-of-{total:05d}.parquet"


def _row_bytes(row: dict) -> int:
    """An upper-bound estimate of a row's uncompressed size (its values as text)."""
    return sum(len(v) if isinstance(v, str) else 8 for v in row.values())


def plan_shards(rows: list[dict], max_rows: int, max_bytes: int) -> list[tuple[int, int]]:
    """(start, end) of each shard: at most `max_rows` rows and about `max_bytes` bytes, at least one row."""
    bounds, start, size = [], 0, 0
    for i, row in enumerate(rows):
        row_size = _row_bytes(row)
        if i > start and (i - start >= max_rows or size + row_size > max_bytes):
            bounds.append((start, i))
            start, size = i, 0
        size += row_size
    bounds.append((start, len(rows)))
    return bounds


def write_shards(
    rows: list[dict],
    schema: pa.Schema,
    folder: Path,
    split: str,
    max_rows: int,
    row_group_rows: int,
    max_bytes: int = MAX_SHARD_BYTES,
    max_row_group_bytes: int = MAX_ROW_GROUP_BYTES,
) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    bounds = plan_shards(rows, max_rows, max_bytes)
    staged: list[tuple[Path, Path]] = []
    for i, (start, end) in enumerate(bounds):
        part = rows[start:end]
        table = pa.Table.from_pylist(part, schema=schema)
        mean_row = max(1, sum(_row_bytes(r) for r in part) // max(1, len(part)))
        group_rows = max(1, min(row_group_rows, max_row_group_bytes // mean_row))
        final = folder / shard_name(split, i, len(bounds))
        tmp = folder / f".tmp-{final.name}"
        pq.write_table(table, tmp, row_group_size=group_rows, compression="zstd")
        staged.append((tmp, final))
    finals = {final for _, final in staged}
    for old in folder.glob(f"{split}-*-of-*.parquet"):
        if old not in finals:
            old.unlink()
    for tmp, final in staged:
        os.replace(tmp, final)
    return [final for _, final in staged]


def write_text_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
