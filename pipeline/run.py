"""The run driver of `opsynth generate`: rounds of the Beam graph until every data source has its quota.

Each round's outputs land under `WORK/round-NNNNN/` (WORK is `--work-dir`, by default `DIR/.opsynth`) and are
marked complete only after the round's pipeline finished, so a run started again with the same options resumes
at the first incomplete round. The round plan depends only on earlier rounds' results, so a resumed run makes
the same dataset; each round writes its plan first (`plan.json`), and a resumed round follows the plan it wrote.

Memory is bounded by a round, not by the run: the driver reads one round's records at a time, selects from
them, and spools the round's rows and rejections, sorted, beside its outputs; the final shards are a merge of
those spools. What it keeps across rounds is small per candidate (dedup keys, MinHash signatures of the rows,
counts, and three numbers per row for the figures).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import NamedTuple

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.utils.shared import Shared

from opsynth.config import (
    EXHAUSTION_MIN_CANDIDATES,
    EXHAUSTION_YIELD,
    INITIAL_OVERSAMPLING,
    MAX_IDLE_ROUNDS,
    MAX_ROUND_CANDIDATES,
    MAX_ROWS_PER_SHARD,
    PILOT_CANDIDATES,
    ROUND_PADDING,
    ROW_GROUP_ROWS,
    TIMING,
    VERSION,
)
from opsynth.errors import OpsynthError, UsageError
from opsynth.filters.execution import ExecutionConfig, device_name
from opsynth.filters.gpu_busy import GpuBusyMonitor
from opsynth.filters.workers import WorkerPool
from opsynth.operator_catalog import catalog_version
from opsynth.operator_catalog.registry import sampleable
from opsynth.options import GenerateOptions, quotas
from opsynth.outputs.card import split_info, write_card
from opsynth.outputs.figures import FigureData, write_figures
from opsynth.outputs.schema import REJECTED_SCHEMA, TASK_SCHEMA, rejected_row, task_row
from opsynth.outputs.shards import write_shards, write_text_atomic
from opsynth.outputs.stats import build_stats
from opsynth.pipeline import workfiles
from opsynth.pipeline.graph import (
    ACCEPTED,
    EXECUTE_REJECTED,
    PREPARED,
    build_execute,
    build_prepare,
)
from opsynth.pipeline.progress import ExecutionProgress
from opsynth.pipeline.rounds import (
    CHECKPOINTED_FILE,
    DONE_MARKER,
    PLAN_FILE,
    PREPARE_WORK_FILE,
    PREPARED_MARKER,
    REJECTED_SPOOL,
    SELECTED_SPOOL,
    WORK_FILE,
    checkpointed,
    dedup_files,
    executions,
    intact,
    leave_for_later_rounds,
    leave_pending,
    merged,
    prepared_candidates,
    progress_dir,
    recorded_plan,
    round_records,
)
from opsynth.pipeline.run_folder import FolderLock, check_config, state_dir
from opsynth.pipeline.selection import Selector, trim, wanted
from opsynth.pipeline.sessions import SessionClock, read_sessions
from opsynth.pipeline.sizing import round_sizing, timed_predictions, with_gpu_budget
from opsynth.pipeline.stages import Sizing, stage_work_seconds
from opsynth.reasons import one_line
from opsynth.records import Candidate, CandidateSpec, Rejection, candidate_seed

MIN_CANDIDATES_PER_ROUND = 4
# A round's CPU stages run on several processes (at most PREPARE_PROCESSES, given 4 cores or more) from this many
# candidates. Each process loads torch, the catalog and the KernelBench reference and starts a shape-check
# worker of its own: on one H200's host (16 cores) a 644-candidate round took 54 s so, against 46 s in this
# process, its stages' work tripled; on 2 cores it is slower at any size.
MULTIPROCESS_PREPARE_MIN = 1000
PREPARE_PROCESSES = 8  # each loads torch and the KernelBench reference
QUIET_HARNESS = ["--default_sdk_harness_log_level", "WARNING"]  # the processes' start-up chatter
SHAPE_CORES = 4  # cores per shape-check worker, where the CPU stages run in this process
MAX_SHAPE_WORKERS = 4


class Pools(NamedTuple):
    """Handles on the run's worker pools, shared by its rounds' pipelines in each process that runs them."""

    execution: Shared
    shapes: Shared
    shape_config: ExecutionConfig  # the shape check's, where the pipelines run in this process


@dataclass
class RunResult:
    out: Path
    rows: int
    stats: dict
    already_complete: bool = False


def generator_version() -> str:
    return f"opsynth {VERSION}; catalog {catalog_version()}"


def execution_config(
    device: str,
    runtime_window_ms: tuple[float, float],
    timeout_s: float,
    compile_check: bool,
    workers: int,
    shared_checks: bool = True,
) -> ExecutionConfig:
    """The execution settings, with the device's warm-up and timed iterations (`generate`, `validate`, `bench`)."""
    warmup, iters = TIMING[device]
    return ExecutionConfig(
        device=device,
        runtime_window_ms=runtime_window_ms,
        timeout_s=timeout_s,
        compile_check=compile_check,
        warmup=warmup,
        iters=iters,
        workers=workers,
        shared_checks=shared_checks,
    )


def shape_check_config(execution: ExecutionConfig, workers: int = 1) -> ExecutionConfig:
    """The shape check's workers in each process that runs the stage, on the CPU (the meta device needs no GPU):
    apart from the execution's workers, whose start-up (a CUDA context, a first compile) it need not wait for."""
    return dataclasses.replace(execution, device="cpu", compile_check=False, shared_checks=False, workers=workers)


def shape_workers() -> int:
    """The shape check's workers where the CPU stages run in this process: one per SHAPE_CORES cores, at most
    MAX_SHAPE_WORKERS (the stage is a round's longest CPU step, and delays its first execution)."""
    return max(1, min(MAX_SHAPE_WORKERS, (os.cpu_count() or 1) // SHAPE_CORES))


def _plan_round(missing: dict[str, int], tried: Counter, last_round: dict[str, tuple[int, int]]) -> dict[str, int]:
    """Candidates to make per data source: a bounded pilot first, then the missing rows over the yield of the
    last round (`last_round[source]` = candidates made, rows gained). The last round's yield, not the run's:
    as a source's quota nears what the dedup caps admit, the yield falls and the average would lag behind.
    A plan larger than MAX_ROUND_CANDIDATES is scaled down to it (each source keeps its share)."""
    plan = {}
    for source, want in missing.items():
        made, gained = last_round.get(source, (0, 0))
        if gained:
            n = math.ceil(want * made / gained * ROUND_PADDING)
        elif tried[source]:
            n = 2 * max(made, MIN_CANDIDATES_PER_ROUND)  # the last round gained nothing: double the effort
        else:
            n = min(math.ceil(want * INITIAL_OVERSAMPLING), PILOT_CANDIDATES)
        plan[source] = max(MIN_CANDIDATES_PER_ROUND, n)
    return _capped(plan)


def _capped(plan: dict[str, int]) -> dict[str, int]:
    """A plan of more than MAX_ROUND_CANDIDATES scaled down to it, each source keeping its share."""
    total = sum(plan.values())
    if total > MAX_ROUND_CANDIDATES:
        plan = {s: max(MIN_CANDIDATES_PER_ROUND, n * MAX_ROUND_CANDIDATES // total) for s, n in plan.items()}
    return plan


def _speculative_plan(missing: dict[str, int], plan: dict[str, int], last_round: dict) -> dict[str, int]:
    """The next round's plan, made as a round of `plan` starts its execution, so that the next one's CPU stages
    run beside it: the rows still `missing` less what this round should yield at the last finished round's
    yield of each data source (before any, the pilot's 1 / INITIAL_OVERSAMPLING), over that yield, padded as
    `_plan_round` pads. It skips a source whose last round gained nothing (its yield is unknown), and is empty
    where this round should fill every quota. Too many candidates cost CPU time only: the execution stops at
    each round's fill point (see `pipeline.selection.FillPoint`)."""
    ahead = {}
    for source, want in missing.items():
        made, gained = last_round.get(source, (0, 0))
        if made and not gained:
            continue
        expected = gained / made if made else 1 / INITIAL_OVERSAMPLING
        short = want - plan.get(source, 0) * expected
        if short > 0:
            ahead[source] = max(MIN_CANDIDATES_PER_ROUND, math.ceil(short / expected * ROUND_PADDING))
    return _capped(ahead)


@dataclass(frozen=True)
class RoundInputs:
    """What a round is made from, fixed before its CPU stages run, so that a resumed or repeated round gets the
    same: its plan and specs, what its dedup reads (`dedup_files`), its graph caps and its sizing. A round
    prepared beside the execution of the one before (`beside`) reads that one's prepared candidates as seen."""

    number: int
    round_dir: str
    plan: dict[str, int]
    specs: list[CandidateSpec]
    dedup_files: tuple[list[str], list[str]]
    graph_caps: dict[str, int]
    sizing: Sizing | None = None
    beside: str | None = None


def _round_inputs(number, plan, tried, seed, work_root, finished, graph_caps, sizing, beside=None) -> RoundInputs:
    round_dir = workfiles.join(work_root, f"round-{number:05d}")
    plan = recorded_plan(round_dir) or plan
    specs = [
        CandidateSpec(s, i, candidate_seed(seed, s, i)) for s, n in plan.items() for i in range(tried[s], tried[s] + n)
    ]
    return RoundInputs(number, round_dir, plan, specs, dedup_files(finished, beside), graph_caps, sizing, beside)


def _round_results(
    inputs: RoundInputs, options, execution, work_root, beam_args, pools, log, wanted=None, before_execution=None
) -> tuple[list[Candidate], list[Rejection], bool]:
    """A round's accepted candidates and rejections, and whether it had finished before: run (or finished)
    where it had not. A finished round whose records are damaged, or do not account for its candidates (a run
    that failed wrote them), runs again from its CPU stages; the execution's checkpoints spare its GPU work.
    `before_execution()` is called once its CPU stages are done and its execution is to start."""
    r, round_dir, specs = inputs.number, inputs.round_dir, inputs.specs

    def run() -> None:
        _prepare_round(inputs, options, execution, beam_args, pools, log)
        if before_execution is not None:
            before_execution()
        _execute_round(inputs, options, execution, work_root, beam_args, pools, wanted)

    resumed = workfiles.exists(workfiles.join(round_dir, DONE_MARKER))
    if not resumed:
        log(f"round {r}: {len(specs)} candidates ({', '.join(f'{s}: {n}' for s, n in inputs.plan.items())})")
        if workfiles.exists(workfiles.join(round_dir, PREPARED_MARKER)):
            log(f"round {r}: its CPU stages were done; resuming at its execution")
        run()
    records = round_records(round_dir, len(specs))
    if records is None:
        log(f"round {r}: its records are damaged or miss some of its {len(specs)} candidates; running it again")
        for marker in (DONE_MARKER, PREPARED_MARKER):
            workfiles.delete(workfiles.join(round_dir, marker))
        run()
        resumed, records = False, round_records(round_dir, len(specs))
        if records is None:
            raise OpsynthError(f"round {r}'s records do not account for its {len(specs)} candidates")
    return (*records, resumed)


def _exhausted(plan: dict[str, int], gained: Counter, missing: dict[str, int]) -> list[str]:
    """The data sources still short of rows whose last round made many candidates for very few rows."""
    return [
        s
        for s, made in plan.items()
        if s in missing and made >= EXHAUSTION_MIN_CANDIDATES and gained[s] < EXHAUSTION_YIELD * made
    ]


def _run_pipeline(beam_args: list[str], build: Callable[[beam.Pipeline], None]) -> dict[str, float]:
    """Build and run one Beam pipeline; the seconds of work per stage, from its counters."""
    p = beam.Pipeline(options=PipelineOptions(beam_args))
    build(p)
    result = p.run()
    result.wait_until_finish()
    return stage_work_seconds(result)


def _prepare_round(
    inputs: RoundInputs, options, execution, beam_args: list[str], pools: Pools, log=print, spread: bool = True
) -> None:
    """A round's CPU stages, unless they are done (`PREPARED_MARKER`) and their output intact. Interrupted, they
    are done again whole. `spread`: on several processes where the round is large (see `_prepare_args`); a
    round prepared beside an execution runs in this process instead, leaving the cores to the compiles."""
    round_dir, specs = inputs.round_dir, inputs.specs

    def prepare(args: list[str]) -> dict[str, float]:
        workfiles.delete(round_dir)
        workfiles.mkdirs(round_dir)
        plan = Counter(spec.data_source for spec in specs)
        workfiles.write_text(workfiles.join(round_dir, PLAN_FILE), json.dumps(dict(plan)))
        if inputs.beside is not None:
            leave_pending(inputs.beside)  # again: a resumed run may have lost it
        shape_config = pools.shape_config if args is beam_args else shape_check_config(execution)
        caps, sizing = inputs.graph_caps, inputs.sizing
        build = partial(build_prepare, specs=specs, options=options, dedup_files=inputs.dedup_files,
                        round_dir=round_dir, shape_config=shape_config, graph_caps=caps, shape_pool=pools.shapes,
                        sizing=sizing)  # fmt: skip
        return _run_pipeline(args, build)

    prepared = workfiles.join(round_dir, f"{PREPARED}-*.jsonl")
    if workfiles.exists(workfiles.join(round_dir, PREPARED_MARKER)) and not intact(prepared):
        log(f"{round_dir}: the output of its CPU stages is damaged; running them again")
        workfiles.delete(workfiles.join(round_dir, PREPARED_MARKER))
    if workfiles.exists(workfiles.join(round_dir, PREPARED_MARKER)):
        return
    several = _prepare_args(beam_args, len(specs)) if spread else beam_args
    try:
        work = prepare(several)
    except Exception as e:
        if several == beam_args:
            raise
        # Only an optimization of ours failed (Beam's multi-process mode, on a machine that lacks what it
        # needs): the same stages in this process.
        log(f"the CPU stages on several processes failed ({one_line(e)}); running them in this process")
        work = prepare(beam_args)
    workfiles.write_text(workfiles.join(round_dir, PREPARE_WORK_FILE), json.dumps(work, sort_keys=True))
    workfiles.write_text(workfiles.join(round_dir, PREPARED_MARKER), "")


def _execute_round(inputs: RoundInputs, options, execution, work_root, beam_args, pools: Pools, wanted=None) -> None:
    """A prepared round's execution; interrupted, it starts again, its checkpointed results reused."""
    round_dir = inputs.round_dir
    for leftover in (f"{ACCEPTED}-*", f"{EXECUTE_REJECTED}-*", "beam-temp-*"):
        workfiles.delete_matching(workfiles.join(round_dir, leftover))
    prepared_files = workfiles.match(workfiles.join(round_dir, f"{PREPARED}-*.jsonl"))
    progress = progress_dir(work_root, round_dir)
    workfiles.mkdirs(progress)
    work = workfiles.read_json(workfiles.join(round_dir, PREPARE_WORK_FILE), {})
    executed = _run_pipeline(
        beam_args,
        lambda p: build_execute(p, prepared_files, options, execution, round_dir, progress, pools.execution, wanted),
    )
    for stage, seconds in executed.items():
        work[stage] = work.get(stage, 0.0) + seconds
    workfiles.write_text(workfiles.join(round_dir, WORK_FILE), json.dumps(work, sort_keys=True))
    checkpointed = ExecutionProgress(progress).load()
    summary = {"verdicts": len(checkpointed.done), "phase_s": checkpointed.phase_totals()}
    workfiles.write_text(workfiles.join(round_dir, CHECKPOINTED_FILE), json.dumps(summary, sort_keys=True))
    workfiles.write_text(workfiles.join(round_dir, DONE_MARKER), "")


class _Beside:
    """A round's CPU stages on a thread of their own, beside the execution of the round before."""

    def __init__(self, inputs: RoundInputs):
        self.inputs = inputs
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self, prepare: Callable[[RoundInputs], None], log) -> None:
        if self.thread is not None:
            return  # started already (its round's execution ran again)
        log(f"round {self.inputs.number}: {len(self.inputs.specs)} candidates, prepared beside the round before")

        def run() -> None:
            try:
                prepare(self.inputs)
            except BaseException as e:  # told when the round is due (`wait`), and its CPU stages done again
                self.error = e

        self.thread = threading.Thread(target=run, name=f"round-{self.inputs.number}-cpu-stages", daemon=True)
        self.thread.start()

    def wait(self, log) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            log(f"round {self.inputs.number}: its CPU stages beside the round before failed ({one_line(self.error)})")
            self.error = None


def _prepare_args(beam_args: list[str], candidates: int) -> list[str]:
    """Beam options of a round's CPU stages: where the run is in this process and the user chose no local mode,
    a large round's CPU stages run on several processes (up to PREPARE_PROCESSES), while its execution stays in
    this process with its workers."""
    chosen = any(a.startswith(("--direct_num_workers", "--direct_running_mode")) for a in beam_args)
    processes = min(os.cpu_count() or 1, PREPARE_PROCESSES)
    if chosen or processes < 4 or candidates < MULTIPROCESS_PREPARE_MIN or not runs_in_this_process(beam_args):
        return beam_args
    quiet = [] if any(a.startswith("--default_sdk_harness_log_level") for a in beam_args) else QUIET_HARNESS
    return [*beam_args, "--direct_num_workers", str(processes), "--direct_running_mode", "multi_processing", *quiet]


def runs_in_this_process(beam_args: list[str]) -> bool:
    """Whether the pipelines run inside this process (Beam's local runner, in memory or in threads)."""
    from apache_beam.options.pipeline_options import DirectOptions, StandardOptions

    beam_options = PipelineOptions(beam_args)
    runner = (beam_options.view_as(StandardOptions).runner or "DirectRunner").lower()
    mode = beam_options.view_as(DirectOptions).direct_running_mode
    return runner in ("directrunner", "direct") and mode in ("in_memory", "multi_threading")


def generate(options: GenerateOptions, beam_args: list[str] | None = None, log=print) -> RunResult:
    beam_args = beam_args or []
    options = with_gpu_budget(options)
    out = Path(options.out)
    quota = quotas(options.num_samples, options.mixture)
    for source, n in quota.items():
        kind = "transformers" if source == "transformers" else "torch"
        if n and not sampleable(kind):
            raise UsageError(f"the catalog has no {kind} entries to make {source} rows; drop it from --mixture")
    state = state_dir(options)
    with FolderLock(state, out):
        check_config(options, state)
        work_root = options.work_dir or str(state)
        stats = workfiles.read_json(str(out / "stats.json"))
        if isinstance(stats, dict) and "counts" in stats:
            log(f"{out} already holds the finished dataset ({stats['counts']['rows']} rows); nothing to do")
            return RunResult(out, stats["counts"]["rows"], stats, already_complete=True)
        with SessionClock(work_root) as session:
            return _generate(options, beam_args, log, quota, work_root, session)


def _gpu_record(monitor: GpuBusyMonitor | None, pool: WorkerPool | None) -> dict:
    """This process's GPU busy fraction per GPU (NVML) from its first execution to its last, for its session
    record; empty where the GPUs are not watched here (CPU runs, workers on a distributed runner's machines)."""
    if monitor is None or pool is None:
        return {}
    if monitor.unavailable:
        return {"gpu": {"unavailable": monitor.unavailable}}
    if pool.first_handed is None or pool.last_done is None:
        return {}
    span = pool.last_done - pool.first_handed
    return {"gpu": {"executing_s": round(span, 1), "busy_fraction": monitor.busy(pool.first_handed, pool.last_done)}}


def _generate(
    options: GenerateOptions, beam_args: list[str], log, quota: dict[str, int], work_root: str, session: SessionClock
) -> RunResult:
    out = Path(options.out)
    execution = execution_config(
        options.device,
        options.runtime_window_ms,
        options.timeout_s,
        options.compile_check,
        options.workers,
        options.shared_checks,
    )
    selector = Selector(quota)
    dropped: Counter = Counter()  # (stage, reason) -> rejections
    accepted_total = 0
    not_needed = 0  # candidates past their round's fill point (see selection.FillPoint)
    tried: Counter = Counter()
    rounds: list[dict] = []
    round_dirs: list[str] = []
    started = time.monotonic()
    # The rounds' stages share their workers (in each process that runs them).
    shapes = shape_check_config(execution, shape_workers() if runs_in_this_process(beam_args) else 1)
    pools = Pools(Shared(), Shared(), shapes)
    held: list[WorkerPool] = []
    if runs_in_this_process(beam_args):
        # Start the workers now: they import torch and set up the device while round 0 composes its candidates.
        # Held here for the whole run: Beam's Shared keeps only the last object acquired in a process alive.
        held = [
            pools.execution.acquire(lambda: WorkerPool(execution), tag=execution),
            pools.shapes.acquire(lambda: WorkerPool(shapes), tag=shapes),
        ]
    monitor = GpuBusyMonitor().__enter__() if execution.device == "cuda" else None
    session.extra = lambda: _gpu_record(monitor, held[0] if held else None)
    last_round: dict[str, tuple[int, int]] = {}
    timed: list[float] = []  # measured / predicted time of the executions so far that ran at their first sizes
    exhausted: dict[str, dict] = {}  # data source -> when it was retired and where its missing rows went
    idle = 0
    beside: _Beside | None = None  # the next round, its CPU stages run beside this one's execution
    try:
        while selector.missing() and idle < MAX_IDLE_ROUNDS:
            r = len(rounds)
            t0 = time.monotonic()
            sizing = round_sizing(options, timed, log)  # from the rounds finished so far
            if beside is not None and beside.inputs.number == r:
                beside.wait(log)  # its CPU stages, if they failed there, run again here
                inputs = beside.inputs
            else:
                inputs = _round_inputs(
                    r, _plan_round(selector.missing(), tried, last_round), tried, options.seed, work_root, round_dirs,
                    selector.graph_caps(), sizing,
                )  # fmt: skip
            plan, round_dir = inputs.plan, inputs.round_dir
            # The next round is planned now, from what is known before this one's execution, so that its CPU
            # stages run beside it (and a resumed run plans it the same).
            ahead = _speculative_plan(selector.missing(), plan, last_round)
            beside = None
            if ahead:
                beside = _Beside(
                    _round_inputs(
                        r + 1, ahead, tried + Counter(plan), options.seed, work_root, round_dirs,
                        selector.graph_caps(), sizing, beside=round_dir,
                    )
                )  # fmt: skip
            prepare = partial(_prepare_round, options=options, execution=execution, beam_args=beam_args,
                              pools=pools, log=log, spread=False)  # fmt: skip
            asked = wanted(selector.missing())
            new_accepted, new_rejected, resumed = _round_results(
                inputs, options, execution, work_root, beam_args, pools, log, asked,
                before_execution=None if beside is None else partial(beside.start, prepare, log),
            )  # fmt: skip
            spent = executions(new_accepted, new_rejected)
            new_accepted, new_rejected, aside = trim(new_accepted, new_rejected, asked, prepared_candidates(round_dir))
            not_needed += len(aside)
            timed += timed_predictions(new_accepted, new_rejected)
            tried.update(plan)
            chosen, skipped = selector.admit(new_accepted)
            leave_for_later_rounds(round_dir, new_accepted, new_rejected, chosen)
            rejections = sorted([*new_rejected, *skipped], key=lambda x: x.candidate.order)
            workfiles.write_jsonl(workfiles.join(round_dir, SELECTED_SPOOL), sorted(chosen, key=lambda c: c.id))
            workfiles.write_jsonl(workfiles.join(round_dir, REJECTED_SPOOL), rejections)
            round_dirs.append(round_dir)
            gained = Counter(c.data_source for c in chosen)
            unused = Counter(c.data_source for c in aside)
            last_round = {s: (n - unused[s], gained[s]) for s, n in plan.items()}
            idle = 0 if chosen else idle + 1
            accepted_total += len(new_accepted)
            dropped.update((x.stage, x.reason) for x in rejections)
            rounds.append(
                {
                    "round": r,
                    "candidates": len(inputs.specs),
                    "accepted": len(new_accepted),
                    "not_needed": len(aside),
                    "resumed": resumed,
                    "executions": spent,
                    "stage_work_s": workfiles.read_json(workfiles.join(round_dir, WORK_FILE), {}),
                    "wall_s": round(time.monotonic() - t0, 3),
                }
            )
            log(
                f"round {r}: {len(new_accepted)} accepted, {len(new_rejected)} rejected"
                + (" (resumed)" if resumed else f" in {rounds[-1]['wall_s']:.0f} s")
            )
            for source in _exhausted(plan, gained, selector.missing()):
                retired = selector.retire(source, set(exhausted))
                if retired is None:
                    continue
                heir, moved = retired
                exhausted[source] = {
                    "after_round": r,
                    "round_candidates": plan[source],
                    "round_rows": gained[source],
                    "rows": selector.rows[source],
                    "moved_to": heir,
                    "moved_rows": moved,
                }
                log(
                    f"round {r}: {source} is exhausted ({gained[source]} rows from {plan[source]} candidates, under "
                    f"{EXHAUSTION_YIELD:.0%}); its {moved} missing rows go to {heir}"
                )
            del new_accepted, new_rejected, chosen, skipped, rejections, aside
        if beside is not None:
            beside.wait(lambda *_: None)  # a round prepared ahead but not needed: done before its pools close
    finally:
        if monitor is not None:
            monitor.__exit__(None, None, None)
        for pool in held:
            pool.close()
    short = selector.missing()
    if short:
        reasons = ", ".join(f"{reason} {n}" for (_, reason), n in dropped.most_common(3))
        missing = ", ".join(f"{n} {source}" for source, n in short.items())
        raise OpsynthError(
            f"after {len(rounds)} rounds ({MAX_IDLE_ROUNDS} in a row adding no row) still missing {missing} rows "
            f"(most rejections: {reasons}); widen --runtime-window-ms or change --mixture"
        )

    version = generator_version()
    figure_data = FigureData()
    task_rows = (
        figure_data.add(task_row(c, version))
        for c in merged(round_dirs, SELECTED_SPOOL, lambda c: c.id, Candidate.from_json)
    )
    task_shards = write_shards(task_rows, TASK_SCHEMA, out / "data", "train", MAX_ROWS_PER_SHARD, ROW_GROUP_ROWS)
    rejected_rows = (
        rejected_row(x) for x in merged(round_dirs, REJECTED_SPOOL, lambda x: x.candidate.order, Rejection.from_json)
    )
    rejected_shards = write_shards(
        rejected_rows,
        REJECTED_SCHEMA,
        out / "rejected",
        "rejected",
        MAX_ROWS_PER_SHARD,
        ROW_GROUP_ROWS,
        keep_empty=False,
    )
    verdicts_and_phases = checkpointed(work_root, round_dirs)
    session.write(finished=True)  # its work done but for writing what follows
    stats = build_stats(
        options=options,
        quota=selector.quota,
        requested_quota=quota,
        exhausted=exhausted,
        rows_per_source=selector.rows,
        accepted_total=accepted_total,
        not_needed=not_needed,
        dropped=dropped,
        rounds=rounds,
        checkpointed=verdicts_and_phases,
        wall_s=time.monotonic() - started,
        sessions=read_sessions(work_root),
        device=device_name(options.device),
        generator_version=version,
    )
    write_figures(out, figure_data, stats)
    write_card(out / "README.md", stats, {"default": split_info(task_shards), "rejected": split_info(rejected_shards)})
    write_text_atomic(out / "stats.json", json.dumps(stats, indent=2, sort_keys=True))
    log(f"wrote {stats['counts']['rows']} rows to {out / 'data'}; funnel and settings in {out / 'stats.json'}")
    return RunResult(out, stats["counts"]["rows"], stats)
