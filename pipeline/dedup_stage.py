"""The dedup stage: one candidate per key (a task: see pipeline.candidates.candidate_key) across the run, and no
more candidates of one operator graph than the selection could still take, the earlier rounds' state read from
files and joined by key."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

import apache_beam as beam
from apache_beam.metrics import Metrics

from opsynth.data_sources import kind
from opsynth.filters.dedup import op_graph_hash, split_group
from opsynth.pipeline.stages import COUNTER_NAMESPACE, KEPT, REJECTED, route
from opsynth.reasons import DUPLICATE, Verdict
from opsynth.records import Candidate

MEMBERS, EARLIER = "members", "earlier"  # the sides of a join of this round's candidates with earlier rounds' state


class _DedupGroupFn(beam.DoFn):
    def process(self, group: tuple[str, dict[str, Iterable]]) -> Iterator:
        _, joined = group
        members = list(joined[MEMBERS])
        if not members:
            # a key of an earlier round alone
            return
        kept, dropped = split_group(members, lambda c: c.order, any(True for _ in joined[EARLIER]))
        if kept is not None:
            Metrics.counter(COUNTER_NAMESPACE, "dedup_kept").inc()
            yield kept
        for c in dropped:
            yield from route(c, Verdict(DUPLICATE, "the same task as an earlier candidate"), "dedup")


class _GraphRoomFn(beam.DoFn):
    """Of the candidates sharing one operator graph, the lowest indices that selection could still take."""

    def __init__(self, caps: dict[str, int]):
        self.caps = caps

    def process(self, group: tuple[tuple[str, str], dict[str, Iterable]]) -> Iterator:
        (source, _), joined = group
        ordered = sorted(joined[MEMBERS], key=lambda c: c.index)
        if not ordered:
            # a graph of earlier rounds alone
            return
        taken = sum(joined[EARLIER])
        room = max(0, self.caps[source] - taken) if source in self.caps else len(ordered)
        yield from ordered[:room]
        for c in ordered[room:]:
            why = f"operator graph at its cap of {self.caps[source]}: {taken} rows, {room} candidates ahead"
            yield from route(c, Verdict(DUPLICATE, why), "dedup")


def _graph_key(c: Candidate) -> tuple[tuple[str, str], Candidate]:
    # Transformers variants share their class by design: each is its own group.
    return ((c.data_source, c.id if kind(c.data_source) == "transformers" else op_graph_hash(c.ops)), c)


def _graph_rows_entry(line: str) -> list[tuple[tuple[str, str], int]]:
    """((data source, operator graph), rows) of one line of a graph-rows file; nothing for a damaged line (the
    selection enforces the cap itself: this only spares the GPU work of candidates it would skip)."""
    try:
        source, graph, rows = json.loads(line)
        return [((str(source), str(graph)), int(rows))]
    except (ValueError, TypeError):
        return []


class DedupWithinSet(beam.PTransform):
    """Keep one candidate per key (`Candidate.dedup_key`: a task), also across the run's earlier rounds (the keys in
    `seen_files`, one per line); then, of the candidates sharing an operator graph, only as many as the selection
    could still take (`caps` per data source, less the rows already selected: the `[source, graph, rows]` lines
    of `graph_files`), so that no GPU time goes to rows the selection would skip. The earlier rounds' state is
    read from files and joined by key, so the pipeline's graph stays the same size however long the run."""

    def __init__(
        self, caps: dict[str, int] | None = None, seen_files: Iterable[str] = (), graph_files: Iterable[str] = ()
    ):
        super().__init__()
        self.caps = caps or {}
        self.seen_files = list(seen_files)
        self.graph_files = list(graph_files)

    def expand(self, candidates):
        p = candidates.pipeline
        seen = (
            p
            | "EarlierKeyFiles" >> beam.Create(self.seen_files)
            | "ReadEarlierKeys" >> beam.io.ReadAllFromText()
            | "KeyEarlierKeys" >> beam.FlatMap(lambda line: [(line.strip(), True)] if line.strip() else [])
        )
        taken = (
            p
            | "EarlierGraphFiles" >> beam.Create(self.graph_files)
            | "ReadEarlierGraphRows" >> beam.io.ReadAllFromText()
            | "ParseEarlierGraphRows" >> beam.FlatMap(_graph_rows_entry)
        )
        unique = (
            {MEMBERS: candidates | "KeyByTask" >> beam.Map(lambda c: (c.dedup_key, c)), EARLIER: seen}
            | "GroupByTask" >> beam.CoGroupByKey()
            | "KeepFirstOfGroup" >> beam.ParDo(_DedupGroupFn()).with_outputs(REJECTED, main=KEPT)
        )
        limited = (
            {MEMBERS: unique[KEPT] | "KeyByOperatorGraph" >> beam.Map(_graph_key), EARLIER: taken}
            | "GroupByOperatorGraph" >> beam.CoGroupByKey()
            | "KeepWhatSelectionCanTake" >> beam.ParDo(_GraphRoomFn(self.caps)).with_outputs(REJECTED, main=KEPT)
        )
        rejected = (unique[REJECTED], limited[REJECTED]) | "DedupRejections" >> beam.Flatten()
        return {KEPT: limited[KEPT], REJECTED: rejected}
