"""Selection: exactly the quota of each data source, taken from the accepted candidates in index order, skipping a
task already among its rows and rows past their operator graph's cap, so that a resumed or repeated run makes the
same dataset (docs/recipe.md, "Selection")."""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import Counter

from opsynth.config import (
    DATA_SOURCES,
    GRAPH_CAP_SLACK,
    MAX_ROWS_PER_OP_GRAPH,
    NEEDED_SPARE,
)
from opsynth.data_sources import kind, operator_count
from opsynth.filters.dedup import WithinSetFilter, compact, dedup_key, spelled
from opsynth.operator_catalog.registry import sampleable
from opsynth.pipeline.candidates import selection_key
from opsynth.reasons import DUPLICATE, NOT_NEEDED, Verdict
from opsynth.records import Candidate, Rejection

NOT_NEEDED_DETAIL = "enough earlier candidates of its data source were accepted"


def rows_per_graph(source: str, quota: int) -> int:
    """The cap on rows sharing one ordered operator list: MAX_ROWS_PER_OP_GRAPH, raised where the quota asks
    for more rows than the catalog has such lists (torch#1 in a 60K set has only as many lists as operators),
    GRAPH_CAP_SLACK times the even share: the operators are not drawn evenly (ops6k weights), and the rarely
    drawn ones leave their share to the others."""
    lists = math.perm(len(sampleable("torch")), operator_count(source))
    return max(MAX_ROWS_PER_OP_GRAPH, math.ceil(GRAPH_CAP_SLACK * quota / lists))


class Selector:
    """Admits accepted candidates round by round: per data source in index order, up to its quota.

    Each round's candidates come after every earlier round's in their source's index order, so admitting them
    round by round selects what one walk over all of them would. Repeated tasks are looked for within a data
    source (chains of different lengths are never the same task). It keeps, per admitted row, its task key and
    the operator-graph count, never the code."""

    def __init__(self, quota: dict[str, int]):
        self.quota = dict(quota)
        self.filters = {s: WithinSetFilter() for s in quota}
        self.programs: dict[int | str, int | str] = {}  # a transformers row's program (dedup key) -> its id, `compact`
        self.rows: Counter = Counter()
        self.last_index: dict[str, int] = {}

    def graph_caps(self) -> dict[str, int]:
        """The cap on rows per operator graph of each torch data source."""
        return {s: rows_per_graph(s, n) for s, n in self.quota.items() if s != "transformers"}

    def missing(self) -> dict[str, int]:
        return {s: n - self.rows[s] for s, n in self.quota.items() if self.rows[s] < n}

    def quota_total(self) -> int:
        return sum(self.quota.values())

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
                # `Class_N` rows); only the very same program is one task.
                why = (
                    self._repeated_program(candidate)
                    if kind(source) == "transformers"
                    else self.filters[source].admit(
                        candidate.id,
                        selection_key(candidate),
                        candidate.ops,
                        rows_per_graph(source, self.quota[source]),
                    )
                )
                if why is None:
                    chosen.append(candidate)
                    self.rows[source] += 1
                else:
                    skipped.append(Rejection(candidate, DUPLICATE, "select", why))
        return chosen, skipped

    def _repeated_program(self, candidate: Candidate) -> str | None:
        """Why a transformers candidate is refused (its program already a row's), or None, remembering it. A
        candidate of one round, rescaled in execution, can become a row of an earlier round: both drawn at a batch
        of 64, say, and shrunk to 1 (a tiny 600K run held two such rows)."""
        key = compact(candidate.dedup_key or dedup_key(candidate.code))
        if (row := self.programs.get(key)) is not None:
            return f"the same program as {spelled(row)}"
        self.programs[key] = compact(candidate.id)
        return None


def select(
    accepted: dict[str, list[Candidate]], quota: dict[str, int]
) -> tuple[dict[str, list[Candidate]], list[Rejection]]:
    """(rows per data source, candidates skipped as duplicates on the way), in one walk."""
    chosen, skipped = Selector(quota).admit([c for rows in accepted.values() for c in rows])
    selected: dict[str, list[Candidate]] = {s: [] for s in quota}
    for c in chosen:
        selected[c.data_source].append(c)
    return selected, skipped


def wanted(missing: dict[str, int]) -> dict[str, int]:
    """Accepted candidates a round asks of each data source: the rows it misses, and NEEDED_SPARE more for what
    the selection may skip as duplicates."""
    return {s: n + NEEDED_SPARE for s, n in missing.items() if n > 0}


class FillPoint:
    """Where a round's candidates stop being needed: a candidate of a data source is needed while fewer of
    its candidates of lower index were accepted than `wanted` asks (nothing, for a source it does not name).
    Verdicts come in any order; a candidate found not needed by those in hand is not needed by all of them, so
    the execution stage may skip it early, and the selection (`trim`) finds the same point from the complete
    records, however many were skipped."""

    def __init__(self, wanted: dict[str, int]):
        self.wanted = wanted
        self.accepted: dict[str, list[int]] = {s: [] for s in wanted}

    def add(self, candidate: Candidate, kept: bool) -> None:
        if kept and candidate.data_source in self.accepted:
            insort(self.accepted[candidate.data_source], candidate.index)

    def missing(self) -> int:
        """Accepted candidates still asked for, over every data source (none counted twice or below zero)."""
        return sum(max(0, n - len(self.accepted[s])) for s, n in self.wanted.items())

    def needed(self, candidate: Candidate) -> bool:
        indices = self.accepted.get(candidate.data_source, [])
        return bisect_left(indices, candidate.index) < self.wanted.get(candidate.data_source, 0)

    def skipped(self, candidate: Candidate) -> Verdict | None:
        """The verdict of a candidate the execution stage need not run, or None."""
        return None if self.needed(candidate) else Verdict(NOT_NEEDED, NOT_NEEDED_DETAIL)


def trim(
    accepted: list[Candidate], rejected: list[Rejection], wanted: dict[str, int], prepared: dict[tuple, Candidate]
) -> tuple[list[Candidate], list[Rejection], list[Candidate]]:
    """A round's records (accepted, rejected) without the candidates past their data source's fill point, and
    those candidates as they were `prepared` (by order) for the execution stage, whether that stage skipped
    them or ran them: which one depends on timing, so the result does not."""
    fill = FillPoint(wanted)
    for c in accepted:
        fill.add(c, True)
    past = [c for c in accepted if not fill.needed(c)]
    past += [x.candidate for x in rejected if x.stage == "execute" and not fill.needed(x.candidate)]
    rejections = [x for x in rejected if x.stage != "execute" or fill.needed(x.candidate)]
    aside = sorted((prepared.get(c.order, c) for c in past), key=lambda c: c.order)
    return [c for c in accepted if fill.needed(c)], rejections, aside
