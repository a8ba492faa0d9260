"""The catalog: every entry of every family, looked up by name.

Entry names are unique; the catalog version changes whenever the set of entries or their families changes.
"""

from __future__ import annotations

import hashlib
from functools import cache

from opsynth.operator_catalog import (
    activations,
    arithmetic,
    containers,
    convolution,
    creation,
    indexing,
    linear,
    logical,
    losses,
    normalization,
    pooling,
    reductions,
    scans,
    sequence,
    shape_ops,
    spectral,
    transformers_modules,
)
from opsynth.operator_catalog.entry import OpEntry

FAMILIES = (
    activations,
    arithmetic,
    normalization,
    convolution,
    linear,
    pooling,
    reductions,
    scans,
    shape_ops,
    logical,
    indexing,
    losses,
    sequence,
    spectral,
    creation,
    containers,
    transformers_modules,
)


class UnknownOperator(KeyError):
    pass


@cache
def all_entries() -> tuple[OpEntry, ...]:
    entries = tuple(e for family in FAMILIES for e in family.ENTRIES)
    seen: set[str] = set()
    for e in entries:
        if e.name in seen:
            raise ValueError(f"duplicate catalog entry {e.name}")
        seen.add(e.name)
    return entries


@cache
def _by_name() -> dict[str, OpEntry]:
    return {e.name: e for e in all_entries()}


def get(name: str) -> OpEntry:
    try:
        return _by_name()[name]
    except KeyError:
        raise UnknownOperator(name) from None


def sampleable(kind: str) -> tuple[OpEntry, ...]:
    """Entries of one kind (`torch` or `transformers`) that the composer may draw."""
    return tuple(e for e in all_entries() if e.kind == kind and e.excluded is None)


@cache
def catalog_version() -> str:
    digest = hashlib.sha256("\n".join(f"{e.family}/{e.name}" for e in all_entries()).encode()).hexdigest()
    return f"{len(all_entries())}-{digest[:8]}"
