"""Selection: exactly the quota of each data source, taken from the accepted candidates in index order.

Near-duplicates of earlier rows and rows past the cap of their operator graph are skipped (reason
`duplicate`, stage `select`); transformers rows, variants of one class by design, are exempt. Because the walk
is in index order and later rounds only add higher indices, the selection depends on the seed alone, not on
how the run was split into rounds.
"""

from __future__ import annotations

import math

from filters.dedup import WithinSetFilter
from filters.reasons import DUPLICATE
from operator_catalog.registry import sampleable
from pipeline.config import DATA_SOURCES, MAX_ROWS_PER_OP_GRAPH, NEAR_DUPLICATE_JACCARD
from pipeline.records import Candidate, Rejection


def rows_per_graph(source: str, quota: int) -> int:
    """The cap on rows sharing one ordered operator list: MAX_ROWS_PER_OP_GRAPH, raised where the quota asks
    for more rows than the catalog has such lists (torch#1 in a 60K set has only as many lists as operators),
    with room to spare for what the filters drop."""
    k = int(source.split("#", 1)[1])
    lists = math.perm(len(sampleable("torch")), k)
    return max(MAX_ROWS_PER_OP_GRAPH, math.ceil(2 * quota / lists))


def select(
    accepted: dict[str, list[Candidate]], quota: dict[str, int]
) -> tuple[dict[str, list[Candidate]], list[Rejection]]:
    """(rows per data source, candidates skipped as duplicates on the way)."""
    within = WithinSetFilter(NEAR_DUPLICATE_JACCARD)
    selected: dict[str, list[Candidate]] = {s: [] for s in quota}
    skipped: list[Rejection] = []
    for source in DATA_SOURCES:
        for candidate in sorted(accepted.get(source, []), key=lambda c: c.index):
            if len(selected[source]) >= quota.get(source, 0):
                break
            # A transformers task's variants share the inlined class by construction (the released set's
            # `Class_N` rows); only exact duplicates, dropped before execution, apply to them.
            why = (
                None
                if source == "transformers"
                else within.admit(candidate.id, candidate.code, candidate.ops, rows_per_graph(source, quota[source]))
            )
            if why is None:
                selected[source].append(candidate)
            else:
                skipped.append(Rejection(candidate, DUPLICATE, "select", why))
    return selected, skipped
