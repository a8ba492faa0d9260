"""The stages of the Beam graph, one named composite each: what every stage shares (its outputs `KEPT` and
`REJECTED`, its counters per reason, its clock) and a candidate's own CPU stages (composition, the shape check with
sizing, decontamination); the dedup stage is in dedup_stage, the execution stage in execution_stage."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput
from apache_beam.utils.shared import Shared

from opsynth.config import (
    CALIBRATION_TARGET,
    PREDICTED_ABOVE_FACTOR,
    SIZE_MAX_FACTOR,
    SIZE_SLACK,
)
from opsynth.data_sources import TRANSFORMERS
from opsynth.device_speed import DeviceSpeed
from opsynth.filters.calibration import rescale_factor
from opsynth.filters.decontamination import decontaminate
from opsynth.filters.execution import ExecutionConfig
from opsynth.filters.kernelbench_index import load_reference
from opsynth.filters.worker_process import SHAPES
from opsynth.filters.workers import Job, WorkerPool
from opsynth.operator_catalog.compose import CompositionError
from opsynth.pipeline import display, parallel
from opsynth.pipeline.candidates import make_candidate, rescale_candidate
from opsynth.reasons import RUNTIME_ABOVE_WINDOW, RUNTIME_BELOW_WINDOW, SHAPE_ERROR, Verdict
from opsynth.records import Candidate, CandidateSpec, Rejection
from opsynth.workload import Workload

KEPT = "kept"
REJECTED = "rejected"
COUNTER_NAMESPACE = "opsynth"
TIME_SUFFIX = "_work_us"
# Candidates handed to the shape check's workers at once: a fixed size, the last batch of a bundle smaller. Beam's
# adaptive batching, left to itself, kept the batches at one or two candidates (timed per batch, they looked cheap),
# so the shape check of a round ran on one worker at a time. A first round of a few hundred is one batch.
SHAPE_BATCH = 512
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


# What drops a candidate before its shape check when earlier rounds rule it out (see dedup_stage.RuledOutEarlier).
EARLIER_ROUNDS = "earlier_rounds"
# The CPU stages a candidate passes one by one before the dedup's join of the round's candidates, in their order.
CPU_STAGES = ("compose", EARLIER_ROUNDS, "shape_check", "decontaminate")


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


def warm_composition(sources: list[str], workload: Workload, op_weights: str) -> None:
    """Compose one throwaway candidate of each of `sources` here: what composition imports on first use (torch's
    decompositions for the meta device, transformers) is then loaded once, before the helpers are forked, not
    in each of them at once (on one H200's host that made a round's first batch take 7.5 s, not 1 s)."""
    for source in sources:
        composed(CandidateSpec(source, 0, 0), workload, op_weights)


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
    (filters.cost), at `speed`, predicts its time; one predicted further below or above the calibration aim than
    SIZE_SLACK allows is made again from its seed with its batch scaled toward it (within the element budget)."""

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


def shape_verdicts(pool: WorkerPool, batch: list[Candidate]) -> list[Verdict]:
    """The shape check's verdicts of `batch`, in its order, its transformers candidates handed out first: a
    worker's first one imports transformers (seconds on one H200's host), which so overlaps the other workers'
    checks instead of ending the batch. A verdict does not depend on the order."""
    order = sorted(range(len(batch)), key=lambda i: batch[i].data_source != TRANSFORMERS)
    verdicts: list[Verdict | None] = [None] * len(batch)
    for i, verdict in zip(order, pool.run(_shape_jobs([batch[i] for i in order])), strict=True):
        verdicts[i] = verdict
    return verdicts


def _rescaled(item: tuple[Candidate, float], workload: Workload, op_weights: str) -> Candidate | None:
    candidate, factor = item
    return rescale_candidate(candidate, factor, workload, op_weights)


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
            verdicts = shape_verdicts(self.pool, batch)
            if self.sizing is not None:
                batch, verdicts = self._sized(batch, verdicts)
        for candidate, verdict in zip(batch, verdicts, strict=True):
            yield from route(candidate, verdict, "shape_check")

    def _sized(self, batch: list[Candidate], verdicts: list[Verdict]) -> tuple[list[Candidate], list[Verdict]]:
        """The batch with each candidate predicted far from the aim replaced by its rescaled self, where that
        passes the shape check too; every kept candidate's prediction in its measurements, one still predicted
        PREDICTED_ABOVE_FACTOR times the window's top rejected as above it, and one launching no kernel as below."""
        batch, verdicts = list(batch), list(verdicts)
        far: dict[int, float] = {}
        for i, verdict in enumerate(verdicts):
            cost = verdict.measurements.get("cost")
            if not (verdict.kept and cost and cost["kernels"]):
                continue  # nothing to size: one launching no kernel is rejected below, as no size helps it
            if not 1 / SIZE_SLACK[1] <= (factor := self.sizing.factor(cost)) <= SIZE_SLACK[0]:
                far[i] = factor
        # Composed again at their scale, on the helpers where there are: the sizing moves most of a first round's
        # candidates (185 of a 600-row run's 318, 1.2 s of composition on one core of the development machine).
        rescaled = parallel.mapped(
            partial(_rescaled, workload=self.sizing.workload, op_weights=self.sizing.op_weights),
            [(batch[i], factor) for i, factor in far.items()],
        )
        moved = {i: candidate for i, candidate in zip(far, rescaled, strict=True) if candidate is not None}
        checked = shape_verdicts(self.pool, list(moved.values()))
        for (i, rescaled), verdict in zip(moved.items(), checked, strict=True):
            if verdict.kept and verdict.measurements.get("cost"):
                batch[i], verdicts[i] = rescaled, verdict
                Metrics.counter(COUNTER_NAMESPACE, "sized").inc()
        too_slow = PREDICTED_ABOVE_FACTOR * self.sizing.window[1]
        for i, verdict in enumerate(verdicts):
            if verdict.kept and verdict.measurements.get("cost"):
                predicted_ms = round(self.sizing.speed.predicted_ms(verdict.measurements["cost"]), 4)
                measurements = {**verdict.measurements, "predicted_ms": predicted_ms}
                if predicted_ms > too_slow:
                    detail = f"predicted {predicted_ms:.0f} ms at the smallest sizes it could be made, not run"
                    verdicts[i] = Verdict(RUNTIME_ABOVE_WINDOW, detail, measurements)
                elif not verdict.measurements["cost"]["kernels"]:
                    detail = "its forward launches no kernel (views of its input only): it cannot reach the window"
                    verdicts[i] = Verdict(RUNTIME_BELOW_WINDOW, f"{detail}, not run", measurements)
                else:
                    verdicts[i] = Verdict(verdict.reason, verdict.detail, measurements)
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


def _reference_key(spec: str) -> str:
    return f"kernelbench:{spec}"


def reference_state(spec: str) -> dict:
    """The KernelBench index of `spec`, as the driver hands it to its helpers (parallel.helping)."""
    return {_reference_key(spec): reference_index(spec)}


def reference_index(spec: str):
    """The KernelBench index of `spec`: the one the driver handed its helpers, else loaded once here."""
    index = parallel.inherited(_reference_key(spec)) or _REFERENCES.get(spec)
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
