"""`stats.json`: the run's config, versions, device, the funnel per stage and reason, and timings.

Names are fixed so that tools can read them across runs: `counts.candidates`, `counts.rows`,
`funnel[stage].{in,kept,dropped}`, `dropped_by_reason`. `accepted` counts candidates that passed every filter;
the selection then skips tasks already in the set and repeated operator graphs and stops at the quota.
"""

from __future__ import annotations

import platform
import statistics
from collections import Counter

from opsynth.config import KEEP_CHECKS, OPS6K_MIXTURE, WORKER_PREFIX
from opsynth.filters.execution import PHASES
from opsynth.filters.gpu_busy import SAMPLE_PERIOD_S
from opsynth.options import GenerateOptions
from opsynth.reasons import NOT_NEEDED, REASONS

STAGES = ("compose", "earlier_rounds", "shape_check", "decontaminate", "dedup", "execute", "select")


def _versions(generator_version: str) -> dict:
    import apache_beam
    import torch

    return {
        "opsynth": generator_version,
        "torch": torch.__version__,
        "apache_beam": apache_beam.__version__,
        "python": platform.python_version(),
    }


def spread(values: list[float]) -> str:
    """A sample in a few words: its median, quartiles, 5th and 95th percentiles (from 20 values) and range
    (3 significant digits)."""
    if not values:
        return "n/a"
    if len(values) < 4:
        return f"median {statistics.median(values):.3g}"
    q1, q2, q3 = statistics.quantiles(values, n=4)
    tails = ""
    if len(values) >= 20:
        twentieths = statistics.quantiles(values, n=20)
        tails = f"; 5th-95th percentile {twentieths[0]:.3g} - {twentieths[-1]:.3g}"
    return f"median {q2:.3g} (quartiles {q1:.3g} - {q3:.3g}{tails}; {min(values):.3g} - {max(values):.3g})"


def gpu_busy(sessions: list[dict]) -> dict | None:
    """The GPU busy fraction per GPU (NVML, sampled during execution) from the first execution to the last, and
    the host's cores' busy share meanwhile (`host_cores`), over every session of the run, weighted by each one's
    span; None where no session watched a GPU."""
    watched = [s["gpu"] for s in sessions if isinstance(s.get("gpu"), dict)]
    spans = [g for g in watched if g.get("busy_fraction") and g.get("executing_s")]
    if not spans:
        reasons = {g["unavailable"] for g in watched if g.get("unavailable")}
        return {"unavailable": sorted(reasons)[0]} if reasons else None
    gpus = len(spans[0]["busy_fraction"])
    spans = [g for g in spans if len(g["busy_fraction"]) == gpus]
    total = sum(g["executing_s"] for g in spans)
    per_gpu = [round(sum(g["busy_fraction"][d] * g["executing_s"] for g in spans) / total, 3) for d in range(gpus)]
    busy = {
        "per_gpu": per_gpu,
        "mean": round(sum(per_gpu) / gpus, 3),
        "executing_s": round(total, 1),
        # each session's seconds from its start to its first execution (the GPU idle while the CPU stages and
        # the workers' start-up come first), summed
        "before_first_execution_s": round(sum(g.get("first_execution_s", 0.0) for g in spans), 1),
        "sampled_by": f"NVML utilization every {SAMPLE_PERIOD_S:g} s, from each session's first execution to its last",
    }
    hosts = [g for g in spans if g.get("host_busy_fraction") is not None]  # none from older code, or off Linux
    if hosts:  # the host's cores meanwhile: near 1, the host's work (compiles) bounds the GPU's
        seconds = sum(g["executing_s"] for g in hosts)
        busy["host_cores"] = round(sum(g["host_busy_fraction"] * g["executing_s"] for g in hosts) / seconds, 3)
    for key, share in (("while_idle", "idle"), ("while_busy", "busy")):
        if states := workers_meanwhile([g[key] for g in spans if g.get(key)], share):
            busy[key] = states
    return busy


def workers_meanwhile(records: list[dict], share: str) -> dict | None:
    """Where a GPU's workers were while it idled, or while it was busy (filters.gpu_busy), over sessions: the mean
    number in each state, weighted by each session's seconds of it."""
    seconds = sum(r["seconds"] for r in records)
    if not seconds:
        return None
    workers: Counter = Counter()
    for r in records:
        for state, n in r["workers"].items():
            workers[state] += n * r["seconds"]
    return {
        "seconds": round(seconds, 1),
        "workers": {state: round(w / seconds, 2) for state, w in workers.most_common()},
        "sampled_by": f"each worker's state beside each NVML sample, weighted by the GPU's {share} share",
    }


def build_stats(
    *,
    options: GenerateOptions,
    quota: dict[str, int],
    rows_per_source: Counter,
    requested_quota: dict[str, int] | None = None,
    exhausted: dict[str, dict] | None = None,
    accepted_total: int,
    dropped: Counter,
    not_needed: int = 0,
    rounds: list[dict],
    wall_s: float,
    device: str,
    generator_version: str,
    checkpointed: tuple[int, dict[str, float]] = (0, {}),
    sessions: list[dict] | None = None,
) -> dict:
    """`dropped` counts rejections by (stage, reason); `not_needed` the candidates past their round's fill point,
    never judged (the funnel shows them at the execution stage; they are no rejections); `rows_per_source` the
    rows written per data source;
    `checkpointed` the run's checkpointed verdicts and their phases' seconds summed (see ExecutionProgress);
    `sessions` the wall time of every process that worked on the run (see pipeline.sessions); `quota` the rows
    asked of each data source at the end, which differs from `requested_quota` where a source was `exhausted`
    (see pipeline.run) and its missing rows went to another."""
    sessions = sessions or []
    verdicts, phase_totals = checkpointed
    candidates = sum(r["candidates"] for r in rounds)
    by_stage: dict[str, Counter] = {s: Counter() for s in STAGES}
    for (stage, reason), n in dropped.items():
        by_stage[stage][reason] += n
    if not_needed:
        by_stage["execute"][NOT_NEEDED] += not_needed
    funnel = {}
    remaining = candidates
    for stage in STAGES:
        dropped_here = sum(by_stage[stage].values())
        funnel[stage] = {
            "in": remaining,
            "kept": remaining - dropped_here,
            "dropped": dict(sorted(by_stage[stage].items())),
        }
        remaining -= dropped_here
    all_reasons: Counter = Counter()
    for (_, reason), n in dropped.items():
        all_reasons[reason] += n
    rows = sum(rows_per_source.values())
    executions = sum(r.get("executions", 0) for r in rounds)
    return {
        "config": {"out": options.out, **options.fingerprint(), **KEEP_CHECKS},
        "versions": _versions(generator_version),
        "device": device,
        "counts": {
            "candidates": candidates,
            "accepted": accepted_total,
            "rows": rows,
            "accepted_not_selected": accepted_total - rows - sum(by_stage["select"].values()),
            "rejected": sum(dropped.values()),
            "not_needed": not_needed,
            # Executions of candidates on the device, calibration's re-measures included, and per row written.
            "executions": executions,
            "executions_per_row": round(executions / rows, 3) if rows else None,
            # Of them, first tries stopped at their first timed forward, over their ceiling (CUDA); and tasks run
            # again alone, out of memory beside the other workers of their GPU.
            "ceiling_stops": sum(r.get("ceiling_stops", 0) for r in rounds),
            "memory_retries": sum(r.get("memory_retries", 0) for r in rounds),
        },
        "gpu_busy": gpu_busy(sessions),
        "funnel": funnel,
        "dropped_by_reason": {reason: all_reasons.get(reason, 0) for reason in REASONS if reason != NOT_NEEDED},
        "rows_per_data_source": {s: rows_per_source.get(s, 0) for s in quota},
        "quota_per_data_source": quota,
        "requested_quota_per_data_source": requested_quota or quota,
        "exhausted_data_sources": exhausted or {},
        "released_mixture_percent": OPS6K_MIXTURE,
        "rounds": rounds,
        "timings_s": {
            "total": round(wall_s, 3),  # this process's; a resumed run's earlier processes are in `sessions`
            # Every process that worked on the run (stopped and resumed ones), and their sum: the run's wall time.
            "sessions": sessions,
            "sessions_total": round(sum(s["wall_s"] for s in sessions), 1),
            "rounds": round(sum(r["wall_s"] for r in rounds), 3),
            # Work inside each stage, summed over its workers (so it can exceed the wall time).
            "stage_work": {
                stage: round(sum(r["stage_work_s"].get(stage, 0.0) for r in rounds), 3)
                for stage in STAGES
                if any(stage in r["stage_work_s"] for r in rounds)
            },
            # The execution workers' time per phase of a task (opsynth.filters.execution.PHASES), summed over the
            # workers, for the verdicts this process made.
            "execution_worker_phases": {
                phase: round(sum(r["stage_work_s"].get(WORKER_PREFIX + phase, 0.0) for r in rounds), 3)
                for phase in PHASES
                if any(WORKER_PREFIX + phase in r["stage_work_s"] for r in rounds)
            },
            # The same over every checkpointed verdict of the run: interrupted and resumed runs included.
            "checkpointed_worker_phases": {
                "verdicts": verdicts,
                # PHASES first, then any an earlier version of the checks named otherwise
                **{
                    phase: round(phase_totals[phase], 3)
                    for phase in [p for p in PHASES if p in phase_totals] + sorted(set(phase_totals) - set(PHASES))
                },
            },
        },
    }
