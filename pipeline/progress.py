"""Checkpoints of the execution stage: each finished batch's verdicts, so a run killed at any moment redoes
only the batches that were in flight. Files go through Beam's FileSystems, written under a temporary name
and renamed, so a checkpoint is read whole or not at all; each record carries a hash of itself, so one damaged
or edited afterwards is run again rather than trusted.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

from apache_beam.io.filesystems import FileSystems

from opsynth.filters.execution import verdict_from_wire, verdict_to_wire
from opsynth.pipeline import workfiles
from opsynth.reasons import Verdict
from opsynth.records import Candidate, sealed, unsealed

Result = tuple[Candidate, Verdict, int]  # the final (possibly calibrated) candidate, its verdict, calibration steps


def progress_key(candidate: Candidate) -> str:
    """A candidate as it entered the stage: its place in its stream and its normalized program."""
    return f"{candidate.data_source}/{candidate.index}/{candidate.dedup_key}"


def _parse(line: str) -> tuple[str, Result] | None:
    """A checkpoint line's key and result; None where it is cut short, garbled or edited (its hash disagrees)."""
    try:
        record = unsealed(json.loads(line))
        final = Candidate.from_json(record["candidate"])
        if not record["key"].startswith(f"{final.data_source}/{final.index}/"):
            return None
        return record["key"], (final, verdict_from_wire(record["verdict"]), int(record["steps"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


class ExecutionProgress:
    def __init__(self, folder: str):
        self.folder = folder
        self.done: dict[str, Result] = {}

    def load(self, log: Callable[[str], None] | None = None) -> ExecutionProgress:
        """Read every checkpoint. A damaged record (cut short, garbled, edited) is never trusted: its candidate
        runs again, and `log` is told once per file that holds such records."""
        workfiles.mkdirs(self.folder)  # several processes may load it at once
        for path in workfiles.match(FileSystems.join(self.folder, "batch-*.jsonl")):
            try:
                lines = workfiles.read_text(path).splitlines()
            except (OSError, UnicodeDecodeError):
                lines = ["unreadable"]
            damaged = 0
            for line in lines:
                parsed = _parse(line)
                if parsed is None:
                    damaged += 1
                else:
                    self.done[parsed[0]] = parsed[1]
            if damaged and log is not None:
                log(f"checkpoint {path}: {damaged} damaged record(s) ignored; their candidates run again")
        return self

    def phase_totals(self) -> dict[str, float]:
        """Seconds per phase summed over every checkpointed verdict (all calibration steps included): the
        execution workers' time in every process of the run, those of the attempts a resume continued included."""
        totals: dict[str, float] = {}
        for _, verdict, _ in self.done.values():
            for phase, seconds in verdict.measurements.get("phase_s", {}).items():
                totals[phase] = totals.get(phase, 0.0) + seconds
        return totals

    def lookup(self, candidate: Candidate) -> Result | None:
        return self.done.get(progress_key(candidate))

    def record(self, entered: list[Candidate], results: list[Result]) -> None:
        records = [
            {"key": progress_key(c), "candidate": final.to_json(), "verdict": verdict_to_wire(v), "steps": steps}
            for c, (final, v, steps) in zip(entered, results, strict=True)
        ]
        lines = [json.dumps(sealed(r)) for r in records]
        workfiles.write_text(FileSystems.join(self.folder, f"batch-{uuid.uuid4().hex}.jsonl"), "\n".join(lines) + "\n")
        for c, result in zip(entered, results, strict=True):
            self.done[progress_key(c)] = result
