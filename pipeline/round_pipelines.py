"""A round's two parts, its CPU stages and then its execution, each run unless its outputs are there and intact;
the next round's CPU stages beside this one's execution: in this process, a pipeline of their own on a thread; on any
other runner, in the execution's pipeline (one job per round)."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import shutil
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.utils.shared import Shared

from opsynth.errors import OpsynthError
from opsynth.filters.execution import ExecutionConfig
from opsynth.pipeline import display, workfiles
from opsynth.pipeline.engines import local_engine, runs_in_this_process
from opsynth.pipeline.execution_stage import execution_order
from opsynth.pipeline.graph import (
    ACCEPTED,
    EXECUTE_REJECTED,
    PREPARE_STAGES,
    PREPARED,
    build_execute,
    build_prepare,
)
from opsynth.pipeline.progress import CheckpointWatch, ExecutionProgress
from opsynth.pipeline.rounds import (
    CHECKPOINTED_FILE,
    DONE_MARKER,
    PLAN_FILE,
    PREPARE_WORK_FILE,
    PREPARED_MARKER,
    WORK_FILE,
    dedup_files,
    intact,
    leave_pending,
    prepared_candidates,
    progress_dir,
    recorded_plan,
    round_records,
)
from opsynth.pipeline.stages import Sizing, stage_work_seconds
from opsynth.reasons import one_line
from opsynth.records import Candidate, CandidateSpec, Rejection, candidate_seed

# A round's CPU stages run on several processes (at most PREPARE_PROCESSES, given 4 cores or more) from this many
# candidates. Each process loads torch, the catalog and the KernelBench reference and starts a shape-check
# worker of its own: on one H200's host (16 cores) a 644-candidate round took 54 s so, against 46 s in this
# process, its stages' work tripled; on 2 cores it is slower at any size.
MULTIPROCESS_PREPARE_MIN = 1000
PREPARE_PROCESSES = 8  # each loads torch and the KernelBench reference
QUIET_HARNESS = ["--default_sdk_harness_log_level", "WARNING"]  # the processes' start-up chatter
SHAPE_CORES = 2  # cores per shape-check worker, where the CPU stages run in this process
MAX_SHAPE_WORKERS = 8
WATCH_EVERY_S = 30.0  # how often the driver reads the checkpoints of an execution that runs in other processes


class Pools(NamedTuple):
    """Handles on the run's worker pools, shared by its rounds' pipelines in each process that runs them."""

    execution: Shared
    shapes: Shared
    shape_config: ExecutionConfig  # the shape check's, where the pipelines run in this process


def shape_check_config(execution: ExecutionConfig, workers: int = 1) -> ExecutionConfig:
    """The shape check's workers in each process that runs the stage, on the CPU (the meta device needs no GPU):
    apart from the execution's workers, whose start-up (a CUDA context, a first compile) it need not wait for."""
    return dataclasses.replace(execution, device="cpu", compile_check=False, shared_checks=False, workers=workers)


def shape_workers() -> int:
    """The shape check's workers where the CPU stages run in this process: one per SHAPE_CORES cores, at most
    MAX_SHAPE_WORKERS (the stage is a round's longest CPU step, and delays its first execution)."""
    return max(1, min(MAX_SHAPE_WORKERS, (os.cpu_count() or 1) // SHAPE_CORES))


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


def round_inputs(number, plan, tried, seed, work_root, finished, graph_caps, sizing, beside=None) -> RoundInputs:
    round_dir = workfiles.join(work_root, f"round-{number:05d}")
    plan = recorded_plan(round_dir) or plan
    specs = [
        CandidateSpec(s, i, candidate_seed(seed, s, i)) for s, n in plan.items() for i in range(tried[s], tried[s] + n)
    ]
    return RoundInputs(number, round_dir, plan, specs, dedup_files(finished, beside), graph_caps, sizing, beside)


def round_results(
    inputs: RoundInputs, options, execution, work_root, beam_args, pools, log, wanted=None, before_execution=None,
    also_prepare: RoundInputs | None = None, prepared_here: bool = False,
) -> tuple[list[Candidate], list[Rejection], bool]:  # fmt: skip
    """A round's accepted candidates and rejections, and whether it had finished before: run (or finished)
    where it had not. A finished round whose records are damaged, or do not account for its candidates (a run
    that failed wrote them), runs again from its CPU stages; the execution's checkpoints spare its GPU work.
    `before_execution()` is called once its CPU stages are done and its execution is to start; `also_prepare`
    (the next round) is prepared in its execution's pipeline (see `execute_round`). `prepared_here`: its CPU
    stages ran beside the round before in this session (a run that finds them done otherwise says it resumes)."""
    r, round_dir, specs = inputs.number, inputs.round_dir, inputs.specs

    def run() -> None:
        prepare_round(inputs, options, execution, beam_args, pools, log)
        if before_execution is not None:
            before_execution()
        execute_round(inputs, options, execution, work_root, beam_args, pools, wanted, log, also_prepare)

    resumed = workfiles.exists(workfiles.join(round_dir, DONE_MARKER))
    if not resumed:
        log(f"round {r}: {len(specs)} candidates ({', '.join(f'{s}: {n}' for s, n in inputs.plan.items())})")
        if not prepared_here and workfiles.exists(workfiles.join(round_dir, PREPARED_MARKER)):
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


# The local folders (`Pipeline.local_tempdir`) of the pipelines running now. Beam makes one per pipeline and
# removes it when `run` returns, not when building fails or the process exits with a pipeline still running on a
# thread (the next round's CPU stages, beside an execution stopped by a signal); those go at exit.
_live_tempdirs: set[str] = set()
atexit.register(lambda: [shutil.rmtree(d, ignore_errors=True) for d in list(_live_tempdirs)])


def run_pipeline(beam_args: list[str], build: Callable[[beam.Pipeline], None]) -> dict[str, float]:
    """Build and run one Beam pipeline; the seconds of work per stage, from its counters."""
    options = PipelineOptions(beam_args)
    p = beam.Pipeline(runner=local_engine(options), options=options)
    _live_tempdirs.add(p.local_tempdir)
    try:
        build(p)
        result = p.run()
        result.wait_until_finish()
    finally:
        shutil.rmtree(p.local_tempdir, ignore_errors=True)
        _live_tempdirs.discard(p.local_tempdir)
    return stage_work_seconds(result)


def _prepare_build(inputs: RoundInputs, options, execution, pools: Pools, here_config: bool) -> Callable:
    """A round's folder made ready for its CPU stages (emptied, its plan written), and what adds the stages to a
    pipeline. `here_config`: the shape check's workers are the run's (the stages run with its own Beam options);
    else one of their own per process."""
    round_dir, specs = inputs.round_dir, inputs.specs
    workfiles.delete(round_dir)
    workfiles.mkdirs(round_dir)
    plan = Counter(spec.data_source for spec in specs)
    workfiles.write_text(workfiles.join(round_dir, PLAN_FILE), json.dumps(dict(plan)))
    if inputs.beside is not None:
        leave_pending(inputs.beside)  # again: a resumed run may have lost it
    shape_config = pools.shape_config if here_config else shape_check_config(execution)
    return partial(build_prepare, specs=specs, options=options, dedup_files=inputs.dedup_files, round_dir=round_dir,
                   shape_config=shape_config, graph_caps=inputs.graph_caps, shape_pool=pools.shapes,
                   sizing=inputs.sizing)  # fmt: skip


def _mark_prepared(round_dir: str, work: dict[str, float]) -> None:
    workfiles.write_text(workfiles.join(round_dir, PREPARE_WORK_FILE), json.dumps(work, sort_keys=True))
    workfiles.write_text(workfiles.join(round_dir, PREPARED_MARKER), "")


def is_prepared(round_dir: str, log=print) -> bool:
    """Whether a round's CPU stages are done and their output intact (a damaged one loses its mark)."""
    marker = workfiles.join(round_dir, PREPARED_MARKER)
    if workfiles.exists(marker) and not intact(workfiles.join(round_dir, f"{PREPARED}-*.jsonl")):
        log(f"{round_dir}: the output of its CPU stages is damaged; running them again")
        workfiles.delete(marker)
    return workfiles.exists(marker)


def prepare_round(
    inputs: RoundInputs, options, execution, beam_args: list[str], pools: Pools, log=print, spread: bool = True
) -> None:
    """A round's CPU stages, unless they are done (`PREPARED_MARKER`) and their output intact. Interrupted, they
    are done again whole. `spread`: on several processes where the round is large (see `prepare_args`); a
    round prepared beside an execution runs in this process instead, leaving the cores to the compiles."""

    def prepare(args: list[str]) -> dict[str, float]:
        return run_pipeline(args, _prepare_build(inputs, options, execution, pools, args is beam_args))

    if is_prepared(inputs.round_dir, log):
        return
    several = prepare_args(beam_args, len(inputs.specs)) if spread else beam_args
    with display.active().stage(f"round {inputs.number}: CPU stages", total=len(inputs.specs)) as bar:
        try:
            work = prepare(several)
        except Exception as e:
            if several == beam_args:
                raise
            # Only an optimization of ours failed (Beam's multi-process mode, on a machine that lacks what it
            # needs): the same stages in this process.
            log(f"the CPU stages on several processes failed ({one_line(e)}); running them in this process")
            if bar is not None:
                bar.show(0)
            work = prepare(beam_args)
    _mark_prepared(inputs.round_dir, work)


def execute_round(
    inputs: RoundInputs, options, execution, work_root, beam_args, pools: Pools, wanted=None, log=print,
    also_prepare: RoundInputs | None = None,
) -> None:  # fmt: skip
    """A prepared round's execution; interrupted, it starts again, its checkpointed results reused. Its progress
    is shown (display) as its verdicts come in, or where it runs in other processes, as they are checkpointed.
    `also_prepare`: the next round, whose CPU stages (unless done) run in the same pipeline, beside the
    execution: one job per round on a distributed runner, where each job has its start-up."""
    round_dir = inputs.round_dir
    for leftover in (f"{ACCEPTED}-*", f"{EXECUTE_REJECTED}-*", "beam-temp-*"):
        workfiles.delete_matching(workfiles.join(round_dir, leftover))
    prepared_files = workfiles.match(workfiles.join(round_dir, f"{PREPARED}-*.jsonl"))
    progress = progress_dir(work_root, round_dir)
    workfiles.mkdirs(progress)
    work = workfiles.read_json(workfiles.join(round_dir, PREPARE_WORK_FILE), {})
    here = runs_in_this_process(beam_args)
    builds = [
        partial(build_execute, prepared_files=prepared_files, options=options, execution=execution,
                round_dir=round_dir, progress_dir=progress, pool=pools.execution, wanted=wanted, report=here)
    ]  # fmt: skip
    if also_prepare is not None and not is_prepared(also_prepare.round_dir, log):
        log(f"round {also_prepare.number}: {len(also_prepare.specs)} candidates, prepared in the round before's job")
        builds.append(_prepare_build(also_prepare, options, execution, pools, True))
    else:
        also_prepare = None
    with (
        display.active().stage(f"round {inputs.number}: execution", unit="kept") as bar,
        contextlib.nullcontext() if here else _watch(round_dir, progress, wanted, bar),
    ):
        executed = run_pipeline(beam_args, lambda p: [build(p) for build in builds])
    if also_prepare is not None:
        _mark_prepared(also_prepare.round_dir, {s: executed.pop(s) for s in PREPARE_STAGES if s in executed})
    for stage, seconds in executed.items():
        work[stage] = work.get(stage, 0.0) + seconds
    workfiles.write_text(workfiles.join(round_dir, WORK_FILE), json.dumps(work, sort_keys=True))
    checkpointed = ExecutionProgress(progress).load()
    summary = {"verdicts": len(checkpointed.done), "phase_s": checkpointed.phase_totals()}
    workfiles.write_text(workfiles.join(round_dir, CHECKPOINTED_FILE), json.dumps(summary, sort_keys=True))
    workfiles.write_text(workfiles.join(round_dir, DONE_MARKER), "")


def _watch(round_dir: str, progress: str, wanted: dict[str, int] | None, bar) -> CheckpointWatch:
    """The driver's watch on a round's execution elsewhere, shown on `bar`: its prepared candidates less those
    checkpointed already (a resumed round's), and of the kept ones `wanted` asks of each source, those missing."""
    done = ExecutionProgress(progress).load()
    prepared = Counter(c.data_source for c in prepared_candidates(round_dir).values())
    kept = Counter(final.data_source for final, verdict, _ in done.done.values() if verdict.kept)
    needed = None if wanted is None else sum(max(0, min(n, wanted.get(s, 0)) - kept[s]) for s, n in prepared.items())
    return CheckpointWatch(done, max(0, prepared.total() - len(done.done)), needed, WATCH_EVERY_S, bar)


class Beside:
    """A round's CPU stages on a thread of their own, beside the execution of the round before."""

    def __init__(self, inputs: RoundInputs):
        self.inputs = inputs
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.done = False  # its CPU stages done on its thread
        self._prepared: list[Candidate] | None = None

    def start(self, prepare: Callable[[RoundInputs], None], log) -> None:
        if self.thread is not None:
            return  # started already (its round's execution ran again)
        log(f"round {self.inputs.number}: {len(self.inputs.specs)} candidates, prepared beside the round before")

        def run() -> None:
            try:
                prepare(self.inputs)
                self.done = True
            except BaseException as e:  # told when the round is due (`wait`), and its CPU stages done again
                self.error = e

        self.thread = threading.Thread(target=run, name=f"round-{self.inputs.number}-cpu-stages", daemon=True)
        self.thread.start()

    def candidates(self) -> list[Candidate] | None:
        """Its prepared candidates in execution order, once its CPU stages are done (read once; asked from
        another thread too, also once `wait` has returned); else None."""
        if self._prepared is None:
            if not self.done:
                return None
            if not workfiles.exists(workfiles.join(self.inputs.round_dir, PREPARED_MARKER)):
                return None
            self._prepared = execution_order(list(prepared_candidates(self.inputs.round_dir).values()))
        return self._prepared

    def wait(self, log) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            log(f"round {self.inputs.number}: its CPU stages beside the round before failed ({one_line(self.error)})")
            self.error = None


def prepare_args(beam_args: list[str], candidates: int) -> list[str]:
    """Beam options of a round's CPU stages: where the run is in this process and the user chose no local mode,
    a large round's CPU stages run on several processes (up to PREPARE_PROCESSES), while its execution stays in
    this process with its workers."""
    chosen = any(a.startswith(("--direct_num_workers", "--direct_running_mode")) for a in beam_args)
    processes = min(os.cpu_count() or 1, PREPARE_PROCESSES)
    if chosen or processes < 4 or candidates < MULTIPROCESS_PREPARE_MIN or not runs_in_this_process(beam_args):
        return beam_args
    quiet = [] if any(a.startswith("--default_sdk_harness_log_level") for a in beam_args) else QUIET_HARNESS
    return [*beam_args, "--direct_num_workers", str(processes), "--direct_running_mode", "multi_processing", *quiet]
