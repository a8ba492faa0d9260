"""Checkpoints of the execution stage: each finished batch's verdicts, so a run killed at any moment redoes
only the batches that were in flight. Files go through Beam's FileSystems, written under a temporary name
and renamed, so a checkpoint is read whole or not at all.
"""

from __future__ import annotations

import json
import uuid

from apache_beam.io.filesystems import FileSystems

from filters.execution import verdict_from_wire, verdict_to_wire
from filters.reasons import Verdict
from pipeline import workfiles
from pipeline.records import Candidate

Result = tuple[Candidate, Verdict, int]  # the final (possibly calibrated) candidate, its verdict, calibration steps


def progress_key(candidate: Candidate) -> str:
    """A candidate as it entered the stage: its place in its stream and its normalized program."""
    return f"{candidate.data_source}/{candidate.index}/{candidate.dedup_key}"


class ExecutionProgress:
    def __init__(self, folder: str):
        self.folder = folder
        self.done: dict[str, Result] = {}

    def load(self) -> ExecutionProgress:
        workfiles.mkdirs(self.folder)  # several processes may load it at once
        for match in FileSystems.match([FileSystems.join(self.folder, "batch-*.jsonl")])[0].metadata_list:
            with FileSystems.open(match.path) as f:
                for line in f.read().decode("utf-8").splitlines():
                    d = json.loads(line)
                    self.done[d["key"]] = (
                        Candidate.from_json(d["candidate"]),
                        verdict_from_wire(d["verdict"]),
                        d["steps"],
                    )
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
        lines = [
            json.dumps(
                {"key": progress_key(c), "candidate": final.to_json(), "verdict": verdict_to_wire(v), "steps": steps}
            )
            for c, (final, v, steps) in zip(entered, results, strict=True)
        ]
        name = f"batch-{uuid.uuid4().hex}.jsonl"
        tmp, final_path = FileSystems.join(self.folder, f".tmp-{name}"), FileSystems.join(self.folder, name)
        with FileSystems.create(tmp) as f:
            f.write(("\n".join(lines) + "\n").encode("utf-8"))
        FileSystems.rename([tmp], [final_path])
        for c, result in zip(entered, results, strict=True):
            self.done[progress_key(c)] = result
