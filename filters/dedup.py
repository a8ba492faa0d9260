"""Within-set dedup: no two candidates with the same normalized code.

The key is a hash of the normalized program, so candidates that differ only in comments, docstrings or
layout collide; of each group the candidate that comes first in the run's order is kept.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from filters.normalize import content_hash, normalize_code

T = TypeVar("T")


def dedup_key(source: str) -> str:
    return content_hash(normalize_code(source))


def split_group(members: Iterable[T], order_key, already_seen: bool) -> tuple[T | None, list[T]]:
    """(the member kept, the members dropped) of one group of equal keys; none is kept if seen before."""
    ordered = sorted(members, key=order_key)
    if already_seen:
        return None, ordered
    return ordered[0], ordered[1:]
