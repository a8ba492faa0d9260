"""The dedup stage: one candidate per key across the run, and no more of one operator graph than the selection can
still take; the earlier rounds' entries read from files against this round's keys only, so that what the join holds
is this round's (BENCHMARKS.md, "State and memory")."""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Iterable, Iterator
from functools import partial
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics

from opsynth.data_sources import kind
from opsynth.filters.dedup import op_graph_hash, split_group
from opsynth.pipeline import workfiles
from opsynth.pipeline.stages import COUNTER_NAMESPACE, EARLIER_ROUNDS, KEPT, REJECTED, route
from opsynth.reasons import DUPLICATE, Verdict
from opsynth.records import Candidate

MEMBERS, EARLIER = "members", "earlier"  # the sides of a join of this round's candidates with earlier rounds' state


def entries_for(path: str, parse: Callable[[str], list[tuple]], keys: Iterable[Hashable]) -> Iterator[tuple[Any, int]]:
    """The (key, int value) entries of an earlier round's file whose key is among `keys`; `parse` gives the
    entries of a line (none for a damaged one). The return hint says these are pairs: Beam checks a keyed
    transform's input against it (a bare `tuple` is refused by CombinePerKey from Beam 2.78 on)."""
    wanted = set(keys)
    for line in workfiles.read_text(path, errors="replace").splitlines():
        for key, value in parse(line):
            if key in wanted:
                yield key, int(value)


class _JoinEarlier(beam.PTransform):
    """This round's candidates grouped by `key_of`, each group beside the sum of the values that the earlier
    rounds' files (`files`, their lines read by `parse`) give its key, if any: (key, {MEMBERS: candidates,
    EARLIER: [sum] or []})."""

    def __init__(self, files: list[str], parse: Callable[[str], list[tuple]], key_of: Callable):
        super().__init__()
        self.files, self.parse, self.key_of = files, parse, key_of

    def expand(self, candidates):
        key_of = self.key_of
        keyed = candidates | "KeyByKey" >> beam.Map(lambda c: (key_of(c), c))
        keys = beam.pvalue.AsList(keyed | "Keys" >> beam.Keys())
        earlier = (
            candidates.pipeline
            | "EarlierFiles" >> beam.Create(self.files)
            | "EntriesForThisRound" >> beam.FlatMap(entries_for, self.parse, keys)
            | "SumByKey" >> beam.CombinePerKey(sum)
        )
        return {MEMBERS: keyed, EARLIER: earlier} | "GroupByKey" >> beam.CoGroupByKey()


class _DedupGroupFn(beam.DoFn):
    def process(self, group: tuple[str, dict[str, Iterable]]) -> Iterator:
        _, joined = group
        kept, dropped = split_group(joined[MEMBERS], lambda c: c.order, any(True for _ in joined[EARLIER]))
        if kept is not None:
            Metrics.counter(COUNTER_NAMESPACE, "dedup_kept").inc()
            yield kept
        for c in dropped:
            yield from route(c, Verdict(DUPLICATE, "the same task as an earlier candidate"), "dedup")


def _room(caps: dict[str, int], source: str, taken: int) -> int | None:
    """Candidates of one operator graph of `source` the selection could still take, `taken` rows of it already
    (None: the source has no cap)."""
    return max(0, caps[source] - taken) if source in caps else None


class _GraphRoomFn(beam.DoFn):
    """Of the candidates sharing one operator graph, the lowest indices that selection could still take."""

    def __init__(self, caps: dict[str, int]):
        self.caps = caps

    def process(self, group: tuple[tuple[str, str], dict[str, Iterable]]) -> Iterator:
        (source, _), joined = group
        ordered = sorted(joined[MEMBERS], key=lambda c: c.index)
        taken = sum(joined[EARLIER])
        room = _room(self.caps, source, taken)
        room = len(ordered) if room is None else room
        yield from ordered[:room]
        for c in ordered[room:]:
            why = f"operator graph at its cap of {self.caps[source]}: {taken} rows, {room} candidates ahead"
            yield from route(c, Verdict(DUPLICATE, why), "dedup")


def _graph_of(c: Candidate) -> tuple[str, str]:
    # Transformers variants share their class by design: each is its own group.
    return (c.data_source, c.id if kind(c.data_source) == "transformers" else op_graph_hash(c.ops))


def _task_of(c: Candidate) -> str:
    return c.dedup_key


def _seen_key_entry(line: str) -> list[tuple[str, int]]:
    """(key, 1) of one line of a seen-keys file; nothing for a blank line."""
    return [(line.strip(), 1)] if line.strip() else []


def _graph_rows_entry(line: str) -> list[tuple[tuple[str, str], int]]:
    """((data source, operator graph), rows) of one line of a graph-rows file; nothing for a damaged line (the
    selection enforces the cap itself: this only spares the GPU work of candidates it would skip)."""
    try:
        source, graph, rows = json.loads(line)
        return [((str(source), str(graph)), int(rows))]
    except (ValueError, TypeError):
        return []


def _graph_full(caps: dict[str, int], graph: tuple[str, str], earlier: Iterable[int]) -> str | None:
    """Why a candidate of `graph` can no longer be selected, its rows in earlier rounds `earlier`: no room left."""
    taken = sum(earlier)
    if _room(caps, graph[0], taken) != 0:
        return None
    return f"operator graph at its cap of {caps[graph[0]]}: {taken} rows in earlier rounds"


def _task_run(_: str, earlier: Iterable[int]) -> str | None:
    """Why a candidate of a task that earlier rounds' entries `earlier` name will be dropped: it ran before."""
    return "the same task as an earlier round's candidate" if any(True for _ in earlier) else None


class _RuledOutFn(beam.DoFn):
    """Every candidate of a group that `why(key, earlier entries)` names a reason for, dropped; the rest on."""

    def __init__(self, why: Callable[[Hashable, Iterable[int]], str | None]):
        self.why = why

    def process(self, group: tuple[Hashable, dict[str, Iterable]]) -> Iterator:
        key, joined = group
        why = self.why(key, joined[EARLIER])
        for c in joined[MEMBERS]:
            if why is None:
                yield c
            else:
                yield from route(c, Verdict(DUPLICATE, why), EARLIER_ROUNDS)


class RuledOutEarlier(beam.PTransform):
    """Before a round's shape checks: drop the candidates that `DedupWithinSet` would drop whatever those
    stages find, judged by the earlier rounds' files alone, so that no CPU work goes to them: those of an operator graph
    already at its cap (`caps`, the rows of `graph_files`: a candidate's operators never change), and, where
    `keys_final` (no stage before the dedup changes a program: no sizing), those of a task an earlier round ran
    (the keys of `seen_files`). Which candidates become rows is the same; in a large run most of a round's
    candidates are such repeats. Within the round nothing is decided here: the dedup keeps the first survivor."""

    def __init__(self, caps: dict[str, int] | None = None, seen_files: Iterable[str] = (),
                 graph_files: Iterable[str] = (), *, keys_final: bool = False):  # fmt: skip
        super().__init__()
        self.caps = caps or {}
        self.seen_files = list(seen_files) if keys_final else []
        self.graph_files = list(graph_files) if self.caps else []

    def expand(self, candidates):
        steps = [
            ("GraphsAtCap", self.graph_files, _graph_rows_entry, _graph_of, partial(_graph_full, self.caps)),
            ("TasksRunBefore", self.seen_files, _seen_key_entry, _task_of, _task_run),
        ]
        kept, rejected = candidates, []
        for name, files, parse, key_of, why in steps:
            if files:
                left = (
                    kept
                    | f"JoinEarlierFor{name}" >> _JoinEarlier(files, parse, key_of)
                    | f"Drop{name}" >> beam.ParDo(_RuledOutFn(why)).with_outputs(REJECTED, main=KEPT)
                )
                kept, rejected = left[KEPT], [*rejected, left[REJECTED]]
        if not rejected:
            rejected = [candidates.pipeline | "NoneRuledOut" >> beam.Create([])]
        return {KEPT: kept, REJECTED: tuple(rejected) | "RuledOutRejections" >> beam.Flatten()}


class DedupWithinSet(beam.PTransform):
    """Keep one candidate per key (`Candidate.dedup_key`: a task), also across the run's earlier rounds (the keys in
    `seen_files`, one per line); then, of the candidates sharing an operator graph, only as many as the selection
    could still take (`caps` per data source, less the rows already selected: the `[source, graph, rows]` lines
    of `graph_files`), so that no GPU time goes to rows the selection would skip. The earlier rounds' state is
    read from files, and only its entries for this round's keys are joined, so neither the pipeline's graph nor
    what the join holds grows with the run."""

    def __init__(
        self, caps: dict[str, int] | None = None, seen_files: Iterable[str] = (), graph_files: Iterable[str] = ()
    ):
        super().__init__()
        self.caps = caps or {}
        self.seen_files = list(seen_files)
        self.graph_files = list(graph_files)

    def expand(self, candidates):
        unique = (
            candidates
            | "JoinEarlierKeys" >> _JoinEarlier(self.seen_files, _seen_key_entry, _task_of)
            | "KeepFirstOfGroup" >> beam.ParDo(_DedupGroupFn()).with_outputs(REJECTED, main=KEPT)
        )
        limited = (
            unique[KEPT]
            | "JoinEarlierGraphRows" >> _JoinEarlier(self.graph_files, _graph_rows_entry, _graph_of)
            | "KeepWhatSelectionCanTake" >> beam.ParDo(_GraphRoomFn(self.caps)).with_outputs(REJECTED, main=KEPT)
        )
        rejected = (unique[REJECTED], limited[REJECTED]) | "DedupRejections" >> beam.Flatten()
        return {KEPT: limited[KEPT], REJECTED: rejected}
