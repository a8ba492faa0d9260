"""The run driver of `opsynth generate`: rounds until every data source has its quota, then the dataset.
How many candidates a round makes is `planning`'s; how a round's pipelines run or resume, `round_pipelines`'.

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

import json
import time
from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from apache_beam.utils.shared import Shared

from opsynth.atomic import write_text_atomic
from opsynth.config import (
    EXHAUSTION_YIELD,
    MAX_IDLE_ROUNDS,
    MAX_ROWS_PER_SHARD,
    ROW_GROUP_ROWS,
    VERSION,
)
from opsynth.data_sources import kind
from opsynth.errors import OpsynthError, UsageError
from opsynth.filters.execution import device_name, execution_config
from opsynth.filters.gpu_busy import GpuBusyMonitor
from opsynth.filters.workers import AHEAD_NICE, WorkerPool
from opsynth.operator_catalog import catalog_version
from opsynth.operator_catalog.registry import sampleable
from opsynth.options import GenerateOptions, quotas
from opsynth.outputs.card import split_info, write_card
from opsynth.outputs.figures import FigureData, write_figures
from opsynth.outputs.schema import REJECTED_SCHEMA, TASK_SCHEMA, rejected_row, task_row
from opsynth.outputs.shards import write_shards
from opsynth.outputs.stats import build_stats
from opsynth.pipeline import display, lookahead, parallel, workfiles
from opsynth.pipeline.lookahead import NextRound
from opsynth.pipeline.parallel import helpers_for
from opsynth.pipeline.planning import exhausted_sources, plan_round, speculative_plan
from opsynth.pipeline.round_pipelines import (
    Beside,
    Pools,
    prepare_round,
    round_inputs,
    round_results,
    runs_in_this_process,
    shape_check_config,
    shape_workers,
)
from opsynth.pipeline.rounds import (
    REJECTED_SPOOL,
    SELECTED_SPOOL,
    WORK_FILE,
    checkpointed,
    executions,
    leave_for_later_rounds,
    merged,
    prepared_candidates,
    progress_dir,
)
from opsynth.pipeline.run_folder import FolderLock, check_config, state_dir
from opsynth.pipeline.selection import Selector, trim, wanted
from opsynth.pipeline.sessions import SessionClock, read_sessions
from opsynth.pipeline.sizing import round_sizing, timed_predictions, with_gpu_budget
from opsynth.pipeline.stages import reference_state, warm_composition
from opsynth.records import Candidate, Rejection


@dataclass
class RunResult:
    out: Path
    rows: int
    stats: dict
    already_complete: bool = False


def generator_version() -> str:
    return f"opsynth {VERSION}; catalog {catalog_version()}"


def generate(options: GenerateOptions, beam_args: list[str] | None = None, log=print) -> RunResult:
    beam_args = beam_args or []
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
        # Helpers for the CPU stages' own work (pipeline.parallel), forked before any thread of this process starts.
        helpers = helpers_for() if runs_in_this_process(beam_args) else 0
        if helpers:
            warm_composition([s for s, n in quota.items() if n], options.sizes, options.op_weights)
        with (
            parallel.helping(helpers, **reference_state(options.kernelbench)),
            SessionClock(work_root) as session,
        ):
            return _generate(options, beam_args, log, quota, work_root, session)


def _gpu_record(monitor: GpuBusyMonitor | None, pool: WorkerPool | None, t0: float, shapes=None) -> dict:
    """This process's GPU busy fraction per GPU (NVML) from its first execution to its last, for its session
    record, with when (seconds after the session's start `t0`) its execution workers were all up, its shape
    check's workers (`shapes`, the pool round 0's CPU stages wait for) too, and when the first execution began;
    empty where the GPUs are not watched here (CPU runs, workers on a distributed runner's machines)."""
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
        "first_execution_s": round(pool.first_handed - t0, 1),
    }
    if pool.ready_at is not None:
        record["workers_ready_s"] = round(pool.ready_at - t0, 1)
    if shapes is not None and shapes.ready_at is not None:
        record["shape_workers_ready_s"] = round(shapes.ready_at - t0, 1)
    return {"gpu": record}


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
        # Start the workers now: they import torch and set up the device while round 0 composes its candidates,
        # at a lower priority while they start, since those CPU stages are what the first execution waits for.
        # Held here for the whole run: Beam's Shared keeps only the last object acquired in a process alive.
        shape_pool = pools.shapes.acquire(lambda: WorkerPool(shapes), tag=shapes)
        execution_pool = pools.execution.acquire(lambda: WorkerPool(execution, start_nice=AHEAD_NICE), tag=execution)
        held = [execution_pool, shape_pool]
    monitor = GpuBusyMonitor().__enter__() if execution.device == "cuda" else None
    session.extra = lambda: _gpu_record(monitor, held[0] if held else None, session.t0, held[1] if held else None)
    last_round: dict[str, tuple[int, int]] = {}
    timed: list[float] = []  # measured / predicted time of the executions so far that ran at their first sizes
    exhausted: dict[str, dict] = {}  # data source -> when it was retired and where its missing rows went
    idle = 0
    beside: Beside | None = None  # the next round, its CPU stages run beside this one's execution
    shown = display.active()
    try:
        while selector.missing() and idle < MAX_IDLE_ROUNDS:
            shown.rows(selector.rows.total(), selector.quota_total())
            r = len(rounds)
            t0 = time.monotonic()
            sizing = round_sizing(options, timed, log)  # from the rounds finished so far
            if beside is not None and beside.inputs.number == r:
                beside.wait(log)  # its CPU stages, if they failed there, run again here
                inputs = beside.inputs
            else:
                inputs = round_inputs(
                    r, plan_round(selector.missing(), tried, last_round), tried, options.seed, work_root, round_dirs,
                    selector.graph_caps(), sizing,
                )  # fmt: skip
            plan, round_dir = inputs.plan, inputs.round_dir
            # The next round is planned now, from what is known before this one's execution, so that its CPU
            # stages run beside it (and a resumed run plans it the same).
            ahead = speculative_plan(selector.missing(), plan, last_round)
            beside = None
            if ahead:
                beside = Beside(
                    round_inputs(
                        r + 1, ahead, tried + Counter(plan), options.seed, work_root, round_dirs,
                        selector.graph_caps(), sizing, beside=round_dir,
                    )
                )  # fmt: skip
            prepare = partial(prepare_round, options=options, execution=execution, beam_args=beam_args,
                              pools=pools, log=log, spread=False)  # fmt: skip
            asked = wanted(selector.missing())
            if beside is not None:  # its first candidates may start as this round's execution ends
                next_round = NextRound(beside.candidates, selector.missing(), asked)
                lookahead.register(progress_dir(work_root, round_dir), next_round)
            try:
                new_accepted, new_rejected, resumed = round_results(
                    inputs, options, execution, work_root, beam_args, pools, log, asked,
                    before_execution=None if beside is None else partial(beside.start, prepare, log),
                )  # fmt: skip
            finally:
                lookahead.register(progress_dir(work_root, round_dir), None)
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
            for source in exhausted_sources(plan, gained, selector.missing()):
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
        shown.rows(selector.rows.total(), selector.quota_total())
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
    return RunResult(out, stats["counts"]["rows"], stats)
