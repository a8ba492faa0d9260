"""The execution stage: a round's candidates run in the contained workers of the run's pool, calibrated into the
runtime window, checkpointed as their verdicts come in, skipped past the round's fill point, and, at the round's
end, the next round's first candidates started on the workers left idle (pipeline.lookahead)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.utils.shared import Shared

from opsynth.config import (
    CALIBRATION_MAX_FACTOR,
    CALIBRATION_TARGET,
    CALIBRATION_TRIES,
    EXECUTION_SPREAD,
    FIRST_TRY_CEILING,
    WORKER_PREFIX,
)
from opsynth.filters.calibration import aim_ms, first_try, run_calibrated
from opsynth.filters.execution import ExecutionConfig
from opsynth.filters.workers import Job, WorkerPool
from opsynth.pipeline import host_costs, lookahead
from opsynth.pipeline.candidates import input_elements, rescale_candidate
from opsynth.pipeline.host_costs import HostCosts
from opsynth.pipeline.progress import Checkpointer, ExecutionProgress, Tally
from opsynth.pipeline.selection import FillPoint
from opsynth.pipeline.stages import COUNTER_NAMESPACE, KEPT, REJECTED, TIME_SUFFIX, route, stage_clock
from opsynth.reasons import NOT_NEEDED, Verdict
from opsynth.records import Candidate
from opsynth.workload import Workload


def _warn(message: str) -> None:
    print(f"opsynth: {message}", file=sys.stderr)


def execution_job(candidate: Candidate) -> Job:
    return Job(f"{candidate.data_source}/{candidate.index}", candidate.code, candidate.seed)


def first_try_ceiling(cfg: ExecutionConfig) -> float | None:
    """The ceiling of a candidate's first try (filters.calibration) on CUDA, where a task far over the aim costs
    device time in every check; none on the CPU, whose timings vary with the machine's load more than a verdict
    may."""
    if cfg.device != "cuda":
        return None
    return FIRST_TRY_CEILING * aim_ms(cfg.runtime_window_ms, CALIBRATION_TARGET)


def first_job(candidate: Candidate, cfg: ExecutionConfig) -> Job:
    """A candidate's first execution, as its round runs it or an earlier round starts it ahead."""
    return first_try(execution_job(candidate), first_try_ceiling(cfg))


def run_candidates(pool: WorkerPool, candidates: list[Candidate], workload: Workload, op_weights: str,
                   window: tuple[float, float], on_result=None, skip=None, ahead=None) -> list[tuple]:  # fmt: skip
    """(final candidate, its verdict, calibration steps) of each candidate run on `pool`, in order: one outside
    `window` (less the pool's keep margin) is rescaled toward it and run again, as `generate` does
    (filters.calibration.run_calibrated, whose `on_result`, `skip` and `ahead` these are); one whose rescale
    cannot reach it is decided unrun."""
    return run_calibrated(
        pool,
        candidates,
        job_of=execution_job,
        rescale=lambda c, factor: rescale_candidate(c, factor, workload, op_weights),
        window=window,
        tries=CALIBRATION_TRIES,
        max_factor=CALIBRATION_MAX_FACTOR,
        target=CALIBRATION_TARGET,
        on_result=on_result,
        size=input_elements,
        skip=skip,
        ahead=ahead,
        margin=pool.cfg.keep_margin,
        first_job_of=lambda c: first_job(c, pool.cfg),
    )


def execution_order(candidates: list[Candidate], costs: HostCosts | None = None, workers: int = 1) -> list[Candidate]:
    """Each data source's candidates in index order, the sources interleaved, each over its EXECUTION_SPREAD
    of the list: the order in which a fill point (see `FillPoint`) is reached soon, past which the last ones
    need not run, and in which the heaviest are not the last. Given the run's `costs` so far, a candidate
    expected to keep a worker longer than most moves that much earlier, as many places as the pool's `workers`
    hand out meanwhile (pipeline.host_costs). Which candidates a round keeps does not depend on the order
    (FillPoint), only how many run."""
    per_source: dict[str, list[Candidate]] = {}
    for c in sorted(candidates, key=lambda c: c.order):
        per_source.setdefault(c.data_source, []).append(c)
    turns = [
        (EXECUTION_SPREAD.get(source, 1.0) * (k + 0.5) / len(cs), c.order, c)
        for source, cs in per_source.items()
        for k, c in enumerate(cs)
    ]
    order = [c for *_, c in sorted(turns, key=lambda t: t[:2])]
    if costs is None or not costs.executions():
        return order
    per_s = workers / max(costs.occupied_s(), 1e-3)  # candidates handed out a second
    places = sorted(range(len(order)), key=lambda i: (i - costs.lead_s(order[i].ops) * per_s, i))
    return [order[i] for i in places]


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
        costs = host_costs.for_run(self.progress_dir)
        found = {id(c): self.progress.lookup(c) for c in batch}  # this round's checkpoints (a resumed run)
        if not costs.executions():  # a resumed run: its costs so far are what this round's checkpoints hold
            for candidate in batch:
                if (checkpointed := found[id(candidate)]) is not None:
                    costs.add(candidate.ops, checkpointed[1].measurements.get("phase_s"))
        for candidate in execution_order(batch, costs, self.pool.cfg.workers):
            checkpointed = found[id(candidate)]
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
                cfg = self.pool.cfg  # asked for after this stage's teardown too (WorkerPool.run, between runs)
                ahead = lookahead.StartAhead(next_round, fill, todo, lambda c: first_job(c, cfg))

            def on_result(i: int, result: tuple) -> None:
                if ahead is not None:
                    ahead.decided(todo[i])
                if result[1].reason == NOT_NEEDED:
                    # nothing ran: nothing to keep
                    return
                if fill is not None:
                    fill.add(todo[i], result[1].kept)
                costs.add(todo[i].ops, result[1].measurements.get("phase_s"))
                checkpoint.add(i, result)

            with stage_clock("execute"):
                fresh = run_candidates(self.pool, todo, self.workload, self.op_weights, self.config.runtime_window_ms,
                                       on_result, None if fill is None else lambda i: fill.skipped(todo[i]),
                                       ahead)  # fmt: skip
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
        self.batch_size = batch_size
        self.fn = _ExecuteBatchFn(config, workload, progress_dir, op_weights, pool or Shared(), wanted, report)

    def expand(self, candidates):
        return (
            candidates
            | "Batch" >> beam.BatchElements(min_batch_size=self.batch_size, max_batch_size=self.batch_size)
            | "RunChecks" >> beam.ParDo(self.fn).with_outputs(REJECTED, main=KEPT)
        )
