"""Parquet shards in the Hugging Face layout (`train-00000-of-00003.parquet`), written atomically.

All shards of a split are written under temporary names first, then older shards of that split are removed
and the new ones renamed into place, so a reader sees either the old complete set or the new one.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def shard_name(split: str, index: int, total: int) -> str:
    return f"{split}-{index:05d}-of-{total:05d}.parquet"


def write_shards(
    rows: list[dict], schema: pa.Schema, folder: Path, split: str, max_rows: int, row_group_rows: int
) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    total = max(1, math.ceil(len(rows) / max_rows))
    staged: list[tuple[Path, Path]] = []
    for i in range(total):
        table = pa.Table.from_pylist(rows[i * max_rows : (i + 1) * max_rows], schema=schema)
        final = folder / shard_name(split, i, total)
        tmp = folder / f".tmp-{final.name}"
        pq.write_table(table, tmp, row_group_size=row_group_rows, compression="zstd")
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
