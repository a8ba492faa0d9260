"""The run driver of `opsynth generate`: rounds until every data source has its quota, then the dataset; a round
marked complete only once its pipeline finished, so a run resumes at the first incomplete one, and memory bounded by
a round (docs/output.md; docs/distributed.md, "What to expect")."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from apache_beam.utils.shared import Shared

from opsynth.config import KEEP_CHECKS, MAX_IDLE_ROUNDS
from opsynth.data_sources import TRANSFORMERS, kind
from opsynth.errors import OpsynthError, UsageError
from opsynth.filters.execution import ExecutionConfig, execution_config
from opsynth.filters.gpu_busy import GpuBusyMonitor
from opsynth.filters.workers import AHEAD_NICE, WorkerPool
from opsynth.operator_catalog.registry import sampleable
from opsynth.operator_catalog.transformers_modules import SHARED_MODULE
from opsynth.options import GenerateOptions, quotas
from opsynth.pipeline import display, lookahead, parallel, workfiles
from opsynth.pipeline.dataset_writer import write_dataset
from opsynth.pipeline.engines import runs_in_this_process
from opsynth.pipeline.heap import hold_malloc_arenas
from opsynth.pipeline.lookahead import NextRound
from opsynth.pipeline.parallel import helpers_for
from opsynth.pipeline.planning import plan_round, speculative_plan
from opsynth.pipeline.round_pipelines import (
    Beside,
    Pools,
    prepare_round,
    round_inputs,
    round_results,
    shape_check_config,
    shape_workers,
)
from opsynth.pipeline.rounds import progress_dir
from opsynth.pipeline.run_folder import FolderLock, check_config, state_dir
from opsynth.pipeline.run_state import RunState
from opsynth.pipeline.selection import Selector, wanted
from opsynth.pipeline.sessions import GPU_SERIES_SUFFIX, SessionClock
from opsynth.pipeline.sizing import round_sizing, with_gpu_budget
from opsynth.pipeline.stages import reference_state, warm_composition


@dataclass
class RunResult:
    out: Path
    rows: int
    stats: dict
    already_complete: bool = False


def generate(
    options: GenerateOptions, beam_args: list[str] | None = None, log=print, started: float | None = None
) -> RunResult:
    """Make (or resume, or find finished) the dataset `options` ask for. `started`: when the user's wait began on
    the monotonic clock (the command line's process start), where this process's session counts from."""
    beam_args = beam_args or []
    # Before this process starts a thread: once its threads have arenas of their own, a limit only stops more.
    hold_malloc_arenas()
    options = with_gpu_budget(options)
    out = Path(options.out)
    quota = quotas(options.num_samples, options.mixture)
    for source, n in quota.items():
        if n and not sampleable(kind(source)):
            raise UsageError(f"the catalog has no {kind(source)} entries to make {source} rows; drop it from --mixture")
    state = state_dir(options)
    with FolderLock(state, out):
        check_config(options, state)
        work_root = options.work_dir or str(state)
        stats = workfiles.read_json(str(out / "stats.json"))
        if isinstance(stats, dict) and "counts" in stats:
            return RunResult(out, stats["counts"]["rows"], stats, already_complete=True)
        execution = execution_config(
            options.device,
            options.runtime_window_ms,
            options.timeout_s,
            options.compile_check,
            options.workers,
            options.shared_checks,
            **KEEP_CHECKS,
        )
        here = runs_in_this_process(beam_args)
        # The workers start first: they import torch and set up their device while this process warms up and
        # round 0 makes its candidates. Helpers for the CPU stages' own work (pipeline.parallel) are forked
        # after them, but before any thread of this process starts.
        # Round 0's shape check would otherwise wait for its workers' first transformers tasks to import it, and
        # its execution begin with most workers importing it at once, the GPU idle meanwhile.
        preload = (SHARED_MODULE,) if quota.get(TRANSFORMERS) else ()
        with run_pools(execution, here, preload) as workers:
            helpers = helpers_for() if here else 0
            if helpers:
                warm_composition([s for s, n in quota.items() if n], options.sizes, options.op_weights)
            with (
                parallel.helping(helpers, **reference_state(options.kernelbench)),
                SessionClock(work_root, t0=started) as session,
            ):
                try:
                    return _generate(options, beam_args, log, quota, work_root, session, workers)
                finally:
                    workers.close()  # within the session: its user waits for this too


def _interrupted(error: BaseException | None) -> bool:
    """Whether `error` is Ctrl-C: a KeyboardInterrupt, or raised from one (Beam re-raises one from a stage as a
    RuntimeError)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def gpu_record(monitor: GpuBusyMonitor | None, pool: WorkerPool | None, t0: float, shapes=None) -> dict:
    """This process's GPU busy fraction per GPU (NVML) from its first execution to its last, and its host's cores'
    busy share meanwhile, for its session record, with when (seconds after the session's start `t0`) its
    execution workers began to start (and how long their pool had waited for the libraries' bytecode before) and
    were all up, its shape check's workers (`shapes`, the pool round 0's CPU stages wait for) too, when the first
    execution began, and how many workers were replaced meanwhile; empty where the GPUs are not watched here (CPU
    runs, workers on a distributed runner's machines)."""
    if monitor is None or pool is None:
        return {}
    if monitor.unavailable:
        return {"gpu": {"unavailable": monitor.unavailable}}
    if pool.first_handed is None or pool.last_done is None:
        return {}
    span = pool.last_done - pool.first_handed
    record = {
        "executing_s": round(span, 1),
        "busy_fraction": monitor.busy(pool.first_handed, pool.last_done),
        "host_busy_fraction": monitor.host_busy(pool.first_handed, pool.last_done),  # the host's cores, meanwhile
        "first_execution_s": round(pool.first_handed - t0, 1),
        "workers_started_s": round(pool.started_at - t0, 1),
        "bytecode_wait_s": round(pool.bytecode_wait_s, 1),  # before that start, waiting for the libraries' bytecode
        "workers_replaced": pool.replaced,  # retired (grown or tampered with), crashed or timed out, and restarted
    }
    if pool.compiling_in_process:  # their compile pool not started (filters.worker_setup.start_compile_pool)
        record["workers_compiling_in_process"] = pool.compiling_in_process
    if pool.ready_at is not None:
        record["workers_ready_s"] = round(pool.ready_at - t0, 1)
    for busy, key in ((False, "while_idle"), (True, "while_busy")):  # where the workers were meanwhile
        if (states := monitor.workers_while(pool.first_handed, pool.last_done, busy)) is not None:
            record[key] = states
    if shapes is not None and shapes.ready_at is not None:
        record["shape_workers_ready_s"] = round(shapes.ready_at - t0, 1)
    return {"gpu": record}


def write_gpu_series(monitor: GpuBusyMonitor, session: SessionClock) -> None:
    """The monitor's samples (`GpuBusyMonitor.series`), one JSON object a line, beside the session's record: when
    the GPUs idled and where their workers were then. A diagnostic: a folder it cannot be written to costs the
    run nothing."""
    with contextlib.suppress(OSError):
        workfiles.write_json_lines(session.companion(GPU_SERIES_SUFFIX), monitor.series(session.t0))


@dataclass
class RunWorkers:
    """The run's execution settings and its worker pools: the handles its rounds' stages share in each process
    that runs them, and the pools held in this one (none where the stages run elsewhere: not `here`)."""

    execution: ExecutionConfig
    pools: Pools
    here: bool  # the stages run in this process (runs_in_this_process)
    execution_pool: WorkerPool | None = None
    shape_pool: WorkerPool | None = None

    def held(self) -> list[WorkerPool]:
        return [p for p in (self.execution_pool, self.shape_pool) if p is not None]

    def close(self) -> None:
        for pool in self.held():
            pool.close()


@contextlib.contextmanager
def run_pools(execution: ExecutionConfig, here: bool, preload: tuple[str, ...] = ()) -> Iterator[RunWorkers]:
    """The run's worker pools; where its stages run in this process (`here`), the execution's and the shape
    check's workers start now, both importing `preload` as they do, the execution's at a lower priority while
    they start (the CPU stages before round 0 are what its first execution waits for), and are held until the
    run ends (Beam's Shared keeps only the last object acquired in a process alive).
    Closed on the way out, if not before."""
    workers = RunWorkers(
        execution, Pools(Shared(), Shared(), shape_check_config(execution, shape_workers() if here else 1)), here
    )
    pools = workers.pools
    try:
        if here:
            workers.execution_pool = pools.execution.acquire(
                lambda: WorkerPool(execution, start_nice=AHEAD_NICE, preload=preload), tag=execution
            )
            workers.shape_pool = pools.shapes.acquire(
                lambda: WorkerPool(pools.shape_config, preload=preload), tag=pools.shape_config
            )
        yield workers
    finally:
        workers.close()


def _generate(
    options: GenerateOptions,
    beam_args: list[str],
    log,
    quota: dict[str, int],
    work_root: str,
    session: SessionClock,
    workers: RunWorkers,
) -> RunResult:
    execution, pools, here = workers.execution, workers.pools, workers.here
    state = RunState(Selector(quota))
    selector = state.selector
    started = time.monotonic()
    pool = workers.execution_pool
    states = None if pool is None else pool.worker_states
    monitor = GpuBusyMonitor(states=states).__enter__() if execution.device == "cuda" else None
    session.extra = lambda: gpu_record(monitor, workers.execution_pool, session.t0, workers.shape_pool)
    beside: Beside | None = None  # the next round, its CPU stages run beside this one's execution
    shown = display.active()
    try:
        while selector.missing() and state.idle < MAX_IDLE_ROUNDS:
            shown.rows(selector.rows.total(), selector.quota_total())
            r = len(state.rounds)
            t0 = time.monotonic()
            sizing = round_sizing(options, state.timed, log)  # from the rounds finished so far
            prepared_here = False
            if beside is not None and beside.inputs.number == r:
                beside.wait(log)  # its CPU stages, if they failed there, run again here
                inputs = beside.inputs
                # its CPU stages ran beside the round before in this session, unless that one had finished before
                prepared_here = not state.rounds[-1]["resumed"]
            else:
                planned = plan_round(selector.missing(), state.tried, state.history, selector.rows)
                inputs = round_inputs(
                    r, planned, state.tried, options.seed, work_root, state.round_dirs, selector.graph_caps(), sizing,
                )  # fmt: skip
            plan, round_dir = inputs.plan, inputs.round_dir
            # The next round is planned now, from what is known before this one's execution, so that its CPU
            # stages run beside it (and a resumed run plans it the same).
            ahead = speculative_plan(selector.missing(), plan, state.history, selector.rows)
            beside = None
            if ahead:
                beside = Beside(
                    round_inputs(
                        r + 1, ahead, state.tried + Counter(plan), options.seed, work_root, state.round_dirs,
                        selector.graph_caps(), sizing, beside=round_dir,
                    )
                )  # fmt: skip
            prepare = partial(prepare_round, options=options, execution=execution, beam_args=beam_args,
                              pools=pools, log=log, spread=False)  # fmt: skip
            asked = wanted(selector.missing())
            if beside is not None:  # its first candidates may start as this round's execution ends
                next_round = NextRound(beside.candidates, selector.missing(), asked)
                lookahead.register(progress_dir(work_root, round_dir), next_round)
            # In this process the next round's CPU stages are a pipeline of their own, on a thread beside this
            # round's execution; elsewhere (a distributed runner) they join its pipeline: one job per round.
            start_beside = None if beside is None or not here else partial(beside.start, prepare, log)
            try:
                new_accepted, new_rejected, resumed = round_results(
                    inputs, options, execution, work_root, beam_args, pools, log, asked, before_execution=start_beside,
                    also_prepare=None if beside is None or here else beside.inputs, prepared_here=prepared_here,
                )  # fmt: skip
            finally:
                lookahead.register(progress_dir(work_root, round_dir), None)
            state.close_round(inputs, new_accepted, new_rejected, resumed, asked, t0, log)
            del new_accepted, new_rejected
        shown.rows(selector.rows.total(), selector.quota_total())
        if workers.execution_pool is not None:
            workers.execution_pool.retire()  # the execution's workers end while the dataset is written
        if beside is not None:
            if beside.thread is not None and not selector.missing():  # its start was shown: so is its end
                log(f"round {beside.inputs.number}: not run, every data source has its rows")
            beside.wait(lambda *_: None)  # a round prepared ahead but not needed: done before its pools close
        if workers.shape_pool is not None:
            workers.shape_pool.retire()
    except Exception as e:
        # A round prepared beside the one that failed is done before the pools it uses close (and before the
        # process ends with its thread inside torch, which aborts it); not so after Ctrl-C, which stops at once.
        if beside is not None and not _interrupted(e):
            beside.wait(lambda *_: None)
        raise
    finally:
        if monitor is not None:
            monitor.__exit__(None, None, None)
            write_gpu_series(monitor, session)
    short = selector.missing()
    if short:
        reasons = ", ".join(f"{reason} {n}" for (_, reason), n in state.dropped.most_common(3))
        missing = ", ".join(f"{n} {source}" for source, n in short.items())
        raise OpsynthError(
            f"after {len(state.rounds)} rounds ({MAX_IDLE_ROUNDS} in a row adding no row) still missing {missing} "
            f"rows (most rejections: {reasons}); widen --runtime-window-ms or change --mixture"
        )
    stats = write_dataset(options, state, quota, started, work_root, session)
    return RunResult(Path(options.out), stats["counts"]["rows"], stats)
