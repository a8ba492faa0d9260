"""Selection: exactly the quota of each data source, taken from the accepted candidates in index order.

Near-duplicates of earlier rows of the same data source and rows past the cap of their operator graph are
skipped (reason `duplicate`, stage `select`); transformers rows, variants of one class by design, are exempt.
The walk is in index order and later rounds only add higher indices. The dedup stage sends a round only as
many candidates per operator graph as the cap leaves, so which candidates reach the selection depends on the
round plan too; that plan depends only on the seed and earlier rounds' verdicts, so a resumed or repeated run
makes the same dataset.
"""

from __future__ import annotations

import math
from collections import Counter

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


class Selector:
    """Admits accepted candidates round by round: per data source in index order, up to its quota.

    Each round's candidates come after every earlier round's in their source's index order, so admitting them
    round by round selects what one walk over all of them would. Near-duplicates are looked for within a data
    source (chains of different lengths are not near-duplicates of each other). It keeps, per admitted row,
    the MinHash signature and the operator-graph count, never the code."""

    def __init__(self, quota: dict[str, int]):
        self.quota = dict(quota)
        self.filters = {s: WithinSetFilter(NEAR_DUPLICATE_JACCARD) for s in quota}
        self.rows: Counter = Counter()
        self.last_index: dict[str, int] = {}

    def graph_caps(self) -> dict[str, int]:
        """The cap on rows per operator graph of each torch data source."""
        return {s: rows_per_graph(s, n) for s, n in self.quota.items() if s != "transformers"}

    def missing(self) -> dict[str, int]:
        return {s: n - self.rows[s] for s, n in self.quota.items() if self.rows[s] < n}

    def retire(self, source: str, exhausted: set[str]) -> tuple[str, int] | None:
        """Stop filling an exhausted data source: its quota becomes the rows it has, and what it lacks goes to
        the largest quota among the sources not exhausted. Returns (that source, rows moved), or None where
        every other source is exhausted too (the source then keeps its quota, and the run fails short)."""
        heirs = [s for s in self.quota if s != source and s not in exhausted and self.quota[s]]
        if not heirs:
            return None
        heir = max(heirs, key=lambda s: (self.quota[s], s))
        moved = max(0, self.quota[source] - self.rows[source])
        self.quota[source] -= moved
        self.quota[heir] += moved
        return heir, moved

    def admit(self, candidates: list[Candidate]) -> tuple[list[Candidate], list[Rejection]]:
        """(the candidates selected, those skipped as duplicates); the others were not needed."""
        chosen: list[Candidate] = []
        skipped: list[Rejection] = []
        for source in DATA_SOURCES:
            batch = sorted((c for c in candidates if c.data_source == source), key=lambda c: c.index)
            if not batch:
                continue
            if batch[0].index <= self.last_index.get(source, -1):
                raise ValueError(f"{source}: candidates must come in index order, round after round")
            self.last_index[source] = batch[-1].index
            for candidate in batch:
                if self.rows[source] >= self.quota.get(source, 0):
                    break
                # A transformers task's variants share the inlined class by construction (the released set's
                # `Class_N` rows); only exact duplicates, dropped before execution, apply to them.
                why = (
                    None
                    if source == "transformers"
                    else self.filters[source].admit(
                        candidate.id, candidate.code, candidate.ops, rows_per_graph(source, self.quota[source])
                    )
                )
                if why is None:
                    chosen.append(candidate)
                    self.rows[source] += 1
                else:
                    skipped.append(Rejection(candidate, DUPLICATE, "select", why))
        return chosen, skipped


def select(
    accepted: dict[str, list[Candidate]], quota: dict[str, int]
) -> tuple[dict[str, list[Candidate]], list[Rejection]]:
    """(rows per data source, candidates skipped as duplicates on the way), in one walk."""
    chosen, skipped = Selector(quota).admit([c for rows in accepted.values() for c in rows])
    selected: dict[str, list[Candidate]] = {s: [] for s in quota}
    for c in chosen:
        selected[c.data_source].append(c)
    return selected, skipped
