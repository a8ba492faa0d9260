"""The stages of the Beam graph, one named composite each, in the order the pipeline applies them.

Every filter stage returns its kept candidates under `KEPT` and its rejections under `REJECTED`, and counts
both per reason, so the top of the pipeline reads as a short chain of labelled steps.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import partial

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput
from apache_beam.utils.shared import Shared

from opsynth.config import (
    CALIBRATION_MAX_FACTOR,
    CALIBRATION_TARGET,
    CALIBRATION_TRIES,
    EXECUTION_SPREAD,
    SIZE_MAX_FACTOR,
    SIZE_SLACK,
    WORKER_PREFIX,
)
from opsynth.data_sources import kind
from opsynth.device_speed import DeviceSpeed
from opsynth.filters.calibration import rescale_factor, run_calibrated
from opsynth.filters.decontamination import decontaminate, load_reference
from opsynth.filters.dedup import op_graph_hash, split_group
from opsynth.filters.execution import ExecutionConfig
from opsynth.filters.worker_process import SHAPES
from opsynth.filters.workers import Job, WorkerPool
from opsynth.operator_catalog.compose import CompositionError
from opsynth.pipeline import display, lookahead, parallel
from opsynth.pipeline.candidates import input_elements, make_candidate, rescale_candidate
from opsynth.pipeline.progress import Checkpointer, ExecutionProgress, Tally
from opsynth.pipeline.selection import FillPoint
from opsynth.reasons import DUPLICATE, NOT_NEEDED, SHAPE_ERROR, Verdict
from opsynth.records import Candidate, CandidateSpec, Rejection
from opsynth.workload import Workload

KEPT = "kept"
REJECTED = "rejected"
MEMBERS, EARLIER = "members", "earlier"  # the sides of a join of this round's candidates with earlier rounds' state
COUNTER_NAMESPACE = "opsynth"
TIME_SUFFIX = "_work_us"
# Candidates handed to the shape check's workers at once: a fixed size, the last batch of a bundle smaller. Beam's
# adaptive batching, left to itself, kept the batches at one or two candidates (timed per batch, they looked cheap),
# so the shape check of a round ran on one worker at a time.
SHAPE_BATCH = 256
CPU_BATCH = 64  # candidates composed or decontaminated at once (over the helper processes, where there are)


@contextlib.contextmanager
def stage_clock(stage: str):
    """Adds the wall time of the enclosed work to the counter `<stage>_work_us`; stats.json reports the sums.
    Only a stage's own work is enclosed, never its yields, behind which fused downstream stages run."""
    start = time.perf_counter()
    yield
    Metrics.counter(COUNTER_NAMESPACE, f"{stage}{TIME_SUFFIX}").inc(round((time.perf_counter() - start) * 1e6))


def stage_work_seconds(result) -> dict[str, float]:
    """Seconds of work per stage, from a finished pipeline's counters."""
    from apache_beam.metrics.metric import MetricsFilter

    work: dict[str, float] = {}
    for counter in result.metrics().query(MetricsFilter().with_namespace(COUNTER_NAMESPACE))["counters"]:
        name = counter.key.metric.name
        if name.endswith(TIME_SUFFIX):
            value = counter.committed if counter.committed is not None else counter.attempted
            stage = name.removesuffix(TIME_SUFFIX)
            work[stage] = work.get(stage, 0.0) + value / 1e6
    return work


CPU_STAGES = ("compose", "shape_check", "decontaminate")  # a candidate's own CPU stages, before the dedup's join


def route(candidate: Candidate, verdict: Verdict, stage: str) -> Iterator:
    """Send a judged candidate on: kept to the main output, dropped to `REJECTED`; count either way. A candidate
    done with its own CPU stages (dropped by one, or kept by the last) moves its round's bar (display)."""
    candidate = candidate.measured(verdict.measurements)
    if stage in CPU_STAGES and (not verdict.kept or stage == CPU_STAGES[-1]):
        bar = display.active().current()
        if bar is not None:
            bar.advance()
    if verdict.kept:
        Metrics.counter(COUNTER_NAMESPACE, f"{stage}_kept").inc()
        yield candidate
    else:
        Metrics.counter(COUNTER_NAMESPACE, f"dropped_{verdict.reason}").inc()
        yield TaggedOutput(REJECTED, Rejection(candidate, verdict.reason, stage, verdict.detail))


def composed(spec: CandidateSpec, workload: Workload, op_weights: str) -> tuple[Candidate, str | None]:
    """A spec's candidate, or (an empty candidate, why no chain fits)."""
    try:
        return make_candidate(spec, workload, op_weights=op_weights), None
    except CompositionError as e:
        return Candidate(spec.data_source, spec.index, spec.seed), str(e)[:300]


class _ComposeFn(beam.DoFn):
    def __init__(self, workload: Workload, op_weights: str):
        self.workload = workload
        self.op_weights = op_weights

    def process(self, specs: list[CandidateSpec]) -> Iterator:
        with stage_clock("compose"):
            made = parallel.mapped(partial(composed, workload=self.workload, op_weights=self.op_weights), specs)
        for candidate, failure in made:
            if failure is not None:
                yield from route(candidate, Verdict(SHAPE_ERROR, failure), "compose")
                continue
            Metrics.counter(COUNTER_NAMESPACE, "candidates").inc()
            yield candidate


class ComposeCandidates(beam.PTransform):
    """Candidate specs -> composed, rendered candidates (`KEPT`), or a `shape_error` when no chain fits; in
    batches, spread over the run's helper processes where it has some (pipeline.parallel)."""

    def __init__(self, workload: Workload, op_weights: str = "uniform"):
        super().__init__()
        self.workload = workload
        self.op_weights = op_weights

    def expand(self, specs):
        return (
            specs
            | "BatchSpecs" >> beam.BatchElements(min_batch_size=CPU_BATCH, max_batch_size=CPU_BATCH)
            | "Compose" >> beam.ParDo(_ComposeFn(self.workload, self.op_weights)).with_outputs(REJECTED, main=KEPT)
        )


@dataclass(frozen=True)
class Sizing:
    """How the shape check sizes candidates toward the runtime window before they run: each one's forward cost
    (filters.cost), at `speed`, predicts its time; one whose batch would have to move more than SIZE_SLACK to
    reach the calibration aim is made again from its seed with its batch scaled toward it (within the element
    budget)."""

    speed: DeviceSpeed
    window: tuple[float, float]
    workload: Workload
    op_weights: str = "uniform"

    def factor(self, cost: dict) -> float:
        """The batch scale toward the aim. Only the bytes and operations grow with the sizes, not the kernels'
        launches: a small candidate whose prediction is mostly launches is grown by what its sizes' part needs."""
        predicted, fixed = self.speed.predicted_ms(cost), self.speed.fixed_ms(cost)
        return rescale_factor(predicted, self.window, SIZE_MAX_FACTOR, CALIBRATION_TARGET, fixed)


def _shape_jobs(batch: list[Candidate]) -> list[Job]:
    return [Job(f"{c.data_source}/{c.index}", c.code, c.seed, SHAPES) for c in batch]


class _ShapeCheckFn(beam.DoFn):
    def __init__(self, config: ExecutionConfig, pool: Shared, sizing: Sizing | None):
        self.config = config
        self.shared_pool = pool
        self.sizing = sizing
        self.pool: WorkerPool | None = None

    def setup(self) -> None:
        self.pool = self.shared_pool.acquire(lambda: WorkerPool(self.config), tag=self.config)

    def process(self, batch: list[Candidate]) -> Iterator:
        with stage_clock("shape_check"):
            verdicts = self.pool.run(_shape_jobs(batch))
            if self.sizing is not None:
                batch, verdicts = self._sized(batch, verdicts)
        for candidate, verdict in zip(batch, verdicts, strict=True):
            yield from route(candidate, verdict, "shape_check")

    def _sized(self, batch: list[Candidate], verdicts: list[Verdict]) -> tuple[list[Candidate], list[Verdict]]:
        """The batch with each candidate predicted far from the aim replaced by its rescaled self, where that
        passes the shape check too; every kept candidate's prediction in its measurements."""
        batch, verdicts = list(batch), list(verdicts)
        moved: dict[int, Candidate] = {}
        for i, (candidate, verdict) in enumerate(zip(batch, verdicts, strict=True)):
            cost = verdict.measurements.get("cost")
            if verdict.kept and cost and not 1 / SIZE_SLACK <= (factor := self.sizing.factor(cost)) <= SIZE_SLACK:
                rescaled = rescale_candidate(candidate, factor, self.sizing.workload, self.sizing.op_weights)
                if rescaled is not None:
                    moved[i] = rescaled
        checked = self.pool.run(_shape_jobs(list(moved.values())))
        for (i, rescaled), verdict in zip(moved.items(), checked, strict=True):
            if verdict.kept and verdict.measurements.get("cost"):
                batch[i], verdicts[i] = rescaled, verdict
                Metrics.counter(COUNTER_NAMESPACE, "sized").inc()
        for i, verdict in enumerate(verdicts):
            if verdict.kept and verdict.measurements.get("cost"):
                predicted = {"predicted_ms": round(self.sizing.speed.predicted_ms(verdict.measurements["cost"]), 4)}
                verdicts[i] = Verdict(verdict.reason, verdict.detail, {**verdict.measurements, **predicted})
        return batch, verdicts

    def teardown(self) -> None:
        self.pool = None  # shared: closed when its last holder lets go


class CheckShapes(beam.PTransform):
    """Build and run every candidate on the meta device before any real execution, in contained worker processes
    of `config` (one pool per process, shared by the pipelines given the same `pool` handle)."""

    def __init__(
        self,
        config: ExecutionConfig,
        pool: Shared | None = None,
        batch_size: int = SHAPE_BATCH,
        sizing: Sizing | None = None,
    ):
        super().__init__()
        self.config = config
        self.pool = pool or Shared()
        self.batch_size = batch_size
        self.sizing = sizing

    def expand(self, candidates):
        return (
            candidates
            | "BatchForShapeCheck" >> beam.BatchElements(min_batch_size=self.batch_size, max_batch_size=self.batch_size)
            | "RunOnMeta"
            >> beam.ParDo(_ShapeCheckFn(self.config, self.pool, self.sizing)).with_outputs(REJECTED, main=KEPT)
        )


_REFERENCES: dict[str, object] = {}  # this process's KernelBench indexes, by their spec


def reference_index(spec: str):
    """The KernelBench index of `spec`: the one the driver handed its helpers, else loaded once here."""
    index = parallel.inherited(f"kernelbench:{spec}") or _REFERENCES.get(spec)
    if index is None:
        index = _REFERENCES[spec] = load_reference(spec)
    return index


def decontaminated(item: tuple[str, dict | None, int], reference: str, ast_threshold: float,
                   jaccard_threshold: float) -> Verdict:  # fmt: skip
    """The decontamination verdict of (code, the operator graph its shape check recorded, its operators)."""
    code, graph, nodes = item
    return decontaminate(code, reference_index(reference), ast_threshold, jaccard_threshold, graph, nodes)


class _DecontaminateFn(beam.DoFn):
    def __init__(self, reference: str, ast_threshold: float, jaccard_threshold: float):
        self.judge = partial(decontaminated, reference=reference, ast_threshold=ast_threshold,
                             jaccard_threshold=jaccard_threshold)  # fmt: skip
        self.reference = reference

    def setup(self) -> None:
        reference_index(self.reference)  # a reference that fails to load stops the stage here, once

    def process(self, batch: list[Candidate]) -> Iterator:
        with stage_clock("decontaminate"):
            items = [(c.code, c.measurements.get("graph"), c.measurements.get("graph_nodes", 0)) for c in batch]
            verdicts = parallel.mapped(self.judge, items)
        for candidate, verdict in zip(batch, verdicts, strict=True):
            yield from route(candidate, verdict, "decontaminate")


class DecontaminateAgainstKernelBench(beam.PTransform):
    """Drop candidates whose Model class is a near-duplicate of a KernelBench level 1-3 task; in batches,
    spread over the run's helper processes where it has some (pipeline.parallel)."""

    def __init__(self, reference: str, ast_threshold: float, jaccard_threshold: float):
        super().__init__()
        self.fn = _DecontaminateFn(reference, ast_threshold, jaccard_threshold)

    def expand(self, candidates):
        return (
            candidates
            | "BatchCandidates" >> beam.BatchElements(min_batch_size=CPU_BATCH, max_batch_size=CPU_BATCH)
            | "Decontaminate" >> beam.ParDo(self.fn).with_outputs(REJECTED, main=KEPT)
        )


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
            yield from route(c, Verdict(DUPLICATE, "same normalized code as an earlier candidate"), "dedup")


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
    """Keep one candidate per normalized program, also across the run's earlier rounds (the keys in
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
            {MEMBERS: candidates | "KeyByNormalizedCode" >> beam.Map(lambda c: (c.dedup_key, c)), EARLIER: seen}
            | "GroupByNormalizedCode" >> beam.CoGroupByKey()
            | "KeepFirstOfGroup" >> beam.ParDo(_DedupGroupFn()).with_outputs(REJECTED, main=KEPT)
        )
        limited = (
            {MEMBERS: unique[KEPT] | "KeyByOperatorGraph" >> beam.Map(_graph_key), EARLIER: taken}
            | "GroupByOperatorGraph" >> beam.CoGroupByKey()
            | "KeepWhatSelectionCanTake" >> beam.ParDo(_GraphRoomFn(self.caps)).with_outputs(REJECTED, main=KEPT)
        )
        rejected = (unique[REJECTED], limited[REJECTED]) | "DedupRejections" >> beam.Flatten()
        return {KEPT: limited[KEPT], REJECTED: rejected}


def _warn(message: str) -> None:
    print(f"opsynth: {message}", file=sys.stderr)


def execution_job(candidate: Candidate) -> Job:
    return Job(f"{candidate.data_source}/{candidate.index}", candidate.code, candidate.seed)


def execution_order(candidates: list[Candidate]) -> list[Candidate]:
    """Each data source's candidates in index order, the sources interleaved, each over its EXECUTION_SPREAD
    of the list: the order in which a fill point (see `FillPoint`) is reached soon, past which the last ones
    need not run, and in which the heaviest are not the last. Which candidates a round keeps does not depend
    on it (FillPoint), only how many run."""
    per_source: dict[str, list[Candidate]] = {}
    for c in sorted(candidates, key=lambda c: c.order):
        per_source.setdefault(c.data_source, []).append(c)
    turns = [
        (EXECUTION_SPREAD.get(source, 1.0) * (k + 0.5) / len(cs), c.order, c)
        for source, cs in per_source.items()
        for k, c in enumerate(cs)
    ]
    return [c for *_, c in sorted(turns, key=lambda t: t[:2])]


class _ExecuteBatchFn(beam.DoFn):
    def __init__(
        self,
        config: ExecutionConfig,
        workload: Workload,
        progress_dir: str,
        op_weights: str,
        pool: Shared,
        wanted: dict[str, int] | None = None,
        report: bool = True,
    ):
        self.config = config
        self.wanted = wanted
        self.workload = workload
        self.op_weights = op_weights
        self.progress_dir = progress_dir
        self.shared_pool = pool
        self.pool: WorkerPool | None = None
        self.progress: ExecutionProgress | None = None
        self.tally = Tally(report)

    def setup(self) -> None:
        # One pool per process for every pipeline given the same handle: a run's rounds start workers once.
        self.pool = self.shared_pool.acquire(lambda: WorkerPool(self.config), tag=self.config)
        self.progress = ExecutionProgress(self.progress_dir).load(log=_warn)

    def process(self, batch: list[Candidate]) -> Iterator:
        results, todo = [], []
        fill = FillPoint(self.wanted) if self.wanted is not None else None
        for candidate in execution_order(batch):
            checkpointed = self.progress.lookup(candidate)
            if checkpointed is None:
                todo.append(candidate)
            else:
                results.append(checkpointed)
                if fill is not None:
                    fill.add(candidate, checkpointed[1].kept)
        Metrics.counter(COUNTER_NAMESPACE, "execute_reused").inc(len(results))
        if todo:
            # the kept candidates the fill point asks of this batch, beyond those its checkpoints hold
            self.tally.start(len(todo), None if fill is None else fill.missing())
            checkpoint = Checkpointer(self.progress, todo, self.tally)
            next_round = lookahead.registered(self.progress_dir)
            ahead = None
            if next_round is not None and fill is not None:
                ahead = lookahead.StartAhead(next_round, fill, todo, execution_job)

            def on_result(i: int, result: tuple) -> None:
                if ahead is not None:
                    ahead.decided(todo[i])
                if result[1].reason == NOT_NEEDED:
                    # nothing ran: nothing to keep
                    return
                if fill is not None:
                    fill.add(todo[i], result[1].kept)
                checkpoint.add(i, result)

            with stage_clock("execute"):
                fresh = run_calibrated(
                    self.pool,
                    todo,
                    job_of=execution_job,
                    rescale=lambda c, factor: rescale_candidate(c, factor, self.workload, self.op_weights),
                    window=self.config.runtime_window_ms,
                    tries=CALIBRATION_TRIES,
                    max_factor=CALIBRATION_MAX_FACTOR,
                    target=CALIBRATION_TARGET,
                    on_result=on_result,
                    size=input_elements,
                    skip=None if fill is None else lambda i: fill.skipped(todo[i]),
                    ahead=ahead,
                )
            checkpoint.flush()
            for _, verdict, _ in fresh:  # where this run's workers' time went (not a checkpointed run's)
                for phase, seconds in verdict.measurements.get("phase_s", {}).items():
                    Metrics.counter(COUNTER_NAMESPACE, f"{WORKER_PREFIX}{phase}{TIME_SUFFIX}").inc(round(seconds * 1e6))
            results += fresh
        for candidate, verdict, steps in results:
            if steps:
                Metrics.counter(COUNTER_NAMESPACE, "calibrated").inc()
            # Timing noise stays out of the records.
            measured = {k: v for k, v in verdict.measurements.items() if k != "phase_s"}
            verdict = Verdict(verdict.reason, verdict.detail, measured)
            yield from route(candidate.measured({"calibration_steps": steps}), verdict, "execute")

    def teardown(self) -> None:
        self.pool = None  # shared: closed when its last holder lets go


class ExecuteCandidates(beam.PTransform):
    """Run every candidate in isolated worker processes on the device, calibrating the sizes of those outside
    the runtime window; batches keep all workers busy, and each finished batch is checkpointed under
    `progress_dir`, so a rerun of an interrupted round redoes only the batches that were in flight. Transforms
    given the same `pool` handle (the rounds of one run) share one worker pool in each process. Given `wanted`
    (accepted candidates asked of each data source, see `FillPoint`), a batch runs its candidates in turn and
    skips those its own verdicts already show are not needed (`not_needed`)."""

    def __init__(
        self,
        config: ExecutionConfig,
        batch_size: int,
        workload: Workload,
        progress_dir: str,
        op_weights: str = "uniform",
        pool: Shared | None = None,
        wanted: dict[str, int] | None = None,
        report: bool = True,
    ):
        super().__init__()
        self.wanted = wanted
        self.report = report
        self.config = config
        self.batch_size = batch_size
        self.workload = workload
        self.progress_dir = progress_dir
        self.op_weights = op_weights
        self.pool = pool or Shared()

    def expand(self, candidates):
        return (
            candidates
            | "Batch" >> beam.BatchElements(min_batch_size=self.batch_size, max_batch_size=self.batch_size)
            | "RunChecks"
            >> beam.ParDo(
                _ExecuteBatchFn(
                    self.config,
                    self.workload,
                    self.progress_dir,
                    self.op_weights,
                    self.pool,
                    self.wanted,
                    self.report,
                )
            ).with_outputs(REJECTED, main=KEPT)
        )
