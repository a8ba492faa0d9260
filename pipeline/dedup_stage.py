"""The dedup stage: one candidate per key (a task: see pipeline.candidates.candidate_key) across the run, and no
more candidates of one operator graph than the selection could still take, the earlier rounds' state read from
files and joined by key.

The join goes by bucket of keys (KEY_BUCKETS of them), each earlier round's file read into one element per
bucket, its entries one text: every key the run has seen goes through each round's join, and as one element
each, 600,000 keys took Beam's local runner 319 MiB and 8.2 CPU-s a round (now 189 MiB and 0.9 CPU-s)."""

from __future__ import annotations

import json
import zlib
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator

import apache_beam as beam
from apache_beam.metrics import Metrics

from opsynth.data_sources import kind
from opsynth.filters.dedup import op_graph_hash, split_group
from opsynth.pipeline import workfiles
from opsynth.pipeline.stages import COUNTER_NAMESPACE, KEPT, REJECTED, route
from opsynth.reasons import DUPLICATE, Verdict
from opsynth.records import Candidate

MEMBERS, EARLIER = "members", "earlier"  # the sides of a join of this round's candidates with earlier rounds' state
KEY_BUCKETS = 64  # the groups the join's keys fall in: its parallelism on a distributed runner
SEPARATOR = "\x1f"  # between the parts of a key and its value in a bucket's text (no key holds it)


def _bucket(key: str | tuple[str, ...]) -> int:
    text = key if isinstance(key, str) else SEPARATOR.join(key)
    return zlib.crc32(text.encode()) % KEY_BUCKETS


def _read_by_bucket(path: str, parse: Callable[[str], list[tuple]]) -> Iterator[tuple[int, str]]:
    """An earlier round's file as (bucket, its entries as text, a line each: the key's parts and the value),
    one element per bucket; `parse` gives the (key, int value) entries of a line (none for a damaged one)."""
    buckets: dict[int, list[str]] = defaultdict(list)
    for line in workfiles.read_text(path, errors="replace").splitlines():
        for key, value in parse(line):
            parts = [key] if isinstance(key, str) else list(key)
            buckets[_bucket(key)].append(SEPARATOR.join([*parts, str(int(value))]))
    for bucket, lines in buckets.items():
        yield bucket, "\n".join(lines)


def _by_key(group: tuple[int, dict[str, Iterable]], key_of: Callable) -> Iterator[tuple[Hashable, dict[str, list]]]:
    """A bucket's join split by key, as a join by key would give it, for the keys this round's candidates have."""
    _, joined = group
    members: dict[Hashable, list] = defaultdict(list)
    for c in joined[MEMBERS]:
        members[key_of(c)].append(c)
    earlier: dict[Hashable, list] = defaultdict(list)
    for text in joined[EARLIER]:
        for line in text.split("\n"):
            *parts, value = line.split(SEPARATOR)
            key = parts[0] if len(parts) == 1 else tuple(parts)
            if key in members:
                earlier[key].append(int(value))
    for key, group_members in members.items():
        yield key, {MEMBERS: group_members, EARLIER: earlier.get(key, [])}


class _JoinEarlier(beam.PTransform):
    """This round's candidates grouped by `key_of`, each group beside the values that the earlier rounds' files
    (`files`, their lines read by `parse`) give its key: (key, {MEMBERS: candidates, EARLIER: values})."""

    def __init__(self, files: list[str], parse: Callable[[str], list[tuple]], key_of: Callable):
        super().__init__()
        self.files, self.parse, self.key_of = files, parse, key_of

    def expand(self, candidates):
        key_of = self.key_of
        earlier = (
            candidates.pipeline
            | "EarlierFiles" >> beam.Create(self.files)
            | "ReadByBucket" >> beam.FlatMap(_read_by_bucket, self.parse)
        )
        return (
            {MEMBERS: candidates | "KeyByBucket" >> beam.Map(lambda c: (_bucket(key_of(c)), c)), EARLIER: earlier}
            | "GroupByBucket" >> beam.CoGroupByKey()
            | "SplitByKey" >> beam.FlatMap(_by_key, key_of)
        )


class _DedupGroupFn(beam.DoFn):
    def process(self, group: tuple[str, dict[str, Iterable]]) -> Iterator:
        _, joined = group
        kept, dropped = split_group(joined[MEMBERS], lambda c: c.order, any(True for _ in joined[EARLIER]))
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
        taken = sum(joined[EARLIER])
        room = max(0, self.caps[source] - taken) if source in self.caps else len(ordered)
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


class DedupWithinSet(beam.PTransform):
    """Keep one candidate per key (`Candidate.dedup_key`: a task), also across the run's earlier rounds (the keys in
    `seen_files`, one per line); then, of the candidates sharing an operator graph, only as many as the selection
    could still take (`caps` per data source, less the rows already selected: the `[source, graph, rows]` lines
    of `graph_files`), so that no GPU time goes to rows the selection would skip. The earlier rounds' state is
    read from files and joined by bucket of keys, so the pipeline's graph stays the same size however long the
    run."""

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
