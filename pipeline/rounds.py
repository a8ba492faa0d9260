"""A round's files: the markers and records a round leaves in its folder and the run's work folder, and how the
driver reads them back (whole or damaged, accounted for or not), merges the rounds' spools, and sums their
checkpoints. Every record is sealed (records.sealed); plain files are rewritten each time a run passes them.
"""

from __future__ import annotations

import heapq
import json
from collections import Counter
from collections.abc import Callable, Iterator

from opsynth.config import DATA_SOURCES
from opsynth.filters.dedup import op_graph_hash
from opsynth.pipeline import workfiles
from opsynth.pipeline.graph import (
    ACCEPTED,
    EXECUTE_REJECTED,
    GRAPH_ROWS,
    PENDING_GRAPH_ROWS,
    PENDING_KEYS,
    PREPARE_REJECTED,
    PREPARED,
    SEEN_KEYS,
)
from opsynth.pipeline.progress import ExecutionProgress
from opsynth.records import Candidate, Rejection, executed_candidates, unsealed

DONE_MARKER = "_SUCCESS"
PREPARED_MARKER = "_PREPARED"  # the round's CPU stages are done; a resume starts at its execution
WORK_FILE = "stage_work_s.json"
PREPARE_WORK_FILE = "prepare_work_s.json"
PLAN_FILE = "plan.json"  # candidates per data source: written before the round's work, followed when it resumes
SELECTED_SPOOL = "selected.jsonl"  # the round's rows, by id
REJECTED_SPOOL = "rejections.jsonl"  # the round's rejections (its stages' and the selection's), by order
# The execution stage's checkpoints, a folder per round outside the round's own (which a redo of its CPU stages
# empties), so that a stage looks up its own round's and nothing grows with the run.
PROGRESS_DIR = "progress"
CHECKPOINTED_FILE = "checkpointed.json"  # a finished round's checkpointed verdicts and their phases' seconds


def recorded_plan(round_dir: str) -> dict[str, int] | None:
    """The plan a round wrote before its work; for a finished round of an earlier version, which wrote none,
    its candidates per data source, counted from its records. None for a round not started."""
    plan = workfiles.read_json(workfiles.join(round_dir, PLAN_FILE))
    if isinstance(plan, dict) and all(s in DATA_SOURCES and isinstance(n, int) and n > 0 for s, n in plan.items()):
        return plan
    if not workfiles.exists(workfiles.join(round_dir, DONE_MARKER)):
        return None
    counts = Counter(
        d.get("candidate", d)["data_source"]
        for pattern in (f"{ACCEPTED}-*.jsonl", f"{PREPARE_REJECTED}-*.jsonl", f"{EXECUTE_REJECTED}-*.jsonl")
        for d in workfiles.read_jsonl_glob(workfiles.join(round_dir, pattern))
    )
    return {s: counts[s] for s in sorted(counts, key=DATA_SOURCES.index)}


def intact(pattern: str) -> bool:
    """Whether every record of the files matching `pattern` reads back as it was written."""
    try:
        for d in workfiles.read_jsonl_glob(pattern):
            unsealed(d)
    except (OSError, ValueError):  # DamagedRecord, JSON and UTF-8 errors are ValueErrors
        return False
    return True


def round_records(round_dir: str, candidates: int) -> tuple[list[Candidate], list[Rejection]] | None:
    """A finished round's accepted candidates and rejections; None unless they are readable and account for its
    `candidates` exactly once each."""
    try:
        records = workfiles.read_jsonl_glob
        accepted = [Candidate.from_json(unsealed(d)) for d in records(workfiles.join(round_dir, f"{ACCEPTED}-*.jsonl"))]
        rejected = [
            Rejection.from_json(unsealed(d))
            for prefix in (PREPARE_REJECTED, EXECUTE_REJECTED)
            for d in records(workfiles.join(round_dir, f"{prefix}-*.jsonl"))
        ]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    orders = {c.order for c in accepted} | {x.candidate.order for x in rejected}
    return (accepted, rejected) if len(accepted) + len(rejected) == len(orders) == candidates else None


def prepared_candidates(round_dir: str) -> dict[tuple[str, int], Candidate]:
    """The candidates a round's CPU stages passed to its execution, by order."""
    records = workfiles.read_jsonl_glob(workfiles.join(round_dir, f"{PREPARED}-*.jsonl"))
    return {c.order: c for c in (Candidate.from_json(unsealed(d)) for d in records)}


def merged(round_dirs: list[str], spool: str, key: Callable, make: Callable) -> Iterator:
    """The records of every round's sorted spool, in one sorted stream (a k-way merge: one record per round
    in memory)."""
    streams = [map(make, workfiles.iter_jsonl(workfiles.join(d, spool))) for d in round_dirs]
    return heapq.merge(*streams, key=key)


def progress_dir(work_root: str, round_dir: str) -> str:
    return workfiles.join(work_root, PROGRESS_DIR, round_dir.rstrip("/").rsplit("/", 1)[-1])


def checkpointed(work_root: str, round_dirs: list[str]) -> tuple[int, dict[str, float]]:
    """The run's checkpointed verdicts and their phases' seconds, summed from each round's summary (from its
    checkpoints where a round has none), so the end of a run reads one small file per round."""
    verdicts, totals = 0, Counter()
    for round_dir in round_dirs:
        summary = workfiles.read_json(workfiles.join(round_dir, CHECKPOINTED_FILE))
        try:
            count, phases = int(summary["verdicts"]), {phase: float(s) for phase, s in summary["phase_s"].items()}
        except (TypeError, KeyError, ValueError, AttributeError):  # missing or damaged: from the checkpoints
            done = ExecutionProgress(progress_dir(work_root, round_dir)).load()
            count, phases = len(done.done), done.phase_totals()
        verdicts += count
        totals.update(phases)
    return verdicts, dict(totals)


def dedup_files(finished: list[str], pending: str | None = None) -> tuple[list[str], list[str]]:
    """The files a round's dedup reads: the seen keys and selected graph rows of the `finished` rounds (their
    folders), and the pending ones of a round still executing (see `leave_pending`)."""
    seen = [workfiles.join(d, SEEN_KEYS) for d in finished]
    graphs = [workfiles.join(d, GRAPH_ROWS) for d in finished]
    if pending is not None:
        seen.append(workfiles.join(pending, PENDING_KEYS))
        graphs.append(workfiles.join(pending, PENDING_GRAPH_ROWS))
    return seen, graphs


def leave_pending(round_dir: str) -> None:
    """What the dedup of the round prepared beside this one's execution reads of it: the keys of all its
    prepared candidates, and their count per operator graph of the torch data sources, as if all were rows."""
    prepared = list(prepared_candidates(round_dir).values())
    workfiles.write_text(workfiles.join(round_dir, PENDING_KEYS), "".join(f"{c.dedup_key}\n" for c in prepared))
    _write_graph_rows(workfiles.join(round_dir, PENDING_GRAPH_ROWS), prepared)


def _write_graph_rows(path: str, candidates: list[Candidate]) -> None:
    graphs = Counter((c.data_source, op_graph_hash(c.ops)) for c in candidates if c.data_source != "transformers")
    workfiles.write_text(path, "".join(json.dumps([s, g, n]) + "\n" for (s, g), n in sorted(graphs.items())))


def leave_for_later_rounds(
    round_dir: str, accepted: list[Candidate], rejected: list[Rejection], chosen: list[Candidate]
) -> None:
    """What the dedup of later rounds reads of this one (see graph.SEEN_KEYS, GRAPH_ROWS): the keys of the
    programs it executed, and its selected rows per operator graph of the torch data sources. Written again
    whenever the round is passed, resumed or not, so a damaged file mends with the next run."""
    executed = executed_candidates(accepted, rejected)
    workfiles.write_text(workfiles.join(round_dir, SEEN_KEYS), "".join(f"{c.dedup_key}\n" for c in executed))
    _write_graph_rows(workfiles.join(round_dir, GRAPH_ROWS), chosen)


def executions(accepted: list[Candidate], rejected: list[Rejection]) -> int:
    """Executions a round's candidates took: one each that reached the execution stage, and one per re-measure
    of its calibration."""
    executed = executed_candidates(accepted, rejected)
    return sum(1 + c.measurements.get("calibration_steps", 0) for c in executed)


def marked(key: str, accepted: list[Candidate], rejected: list[Rejection]) -> int:
    """Of a round's executed candidates, those whose measurements carry `key`: CEILING_STOP, a first try stopped
    at its ceiling (filters.calibration), which ended at its first timed forward, before any compiling, and ran
    again; MEMORY_RETRY, a try that ran out of memory beside the other workers and ran again alone."""
    return sum(key in c.measurements for c in executed_candidates(accepted, rejected))
