"""Checkpoints of the execution stage: each finished batch's verdicts, written whole or not at all and hashed, so
a killed run redoes only the batches in flight (docs/output.md); and the progress they show, from the stage where it
runs in the driver's process, else read from the checkpoints."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable

from apache_beam.io.filesystems import FileSystems

from opsynth.filters.verdicts import verdict_from_wire, verdict_to_wire
from opsynth.pipeline import display, workfiles
from opsynth.pipeline.display import Bar
from opsynth.reasons import Verdict
from opsynth.records import Candidate, sealed, unsealed

CHECKPOINT_EVERY_S = 30.0  # the execution stage writes its finished results at least this often
Result = tuple[Candidate, Verdict, int]  # the final (possibly calibrated) candidate, its verdict, calibration steps


def progress_key(candidate: Candidate) -> str:
    """A candidate as it entered the stage: its place in its stream and its key."""
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
        self.files: set[str] = set()  # the checkpoint files read

    def load(self, log: Callable[[str], None] | None = None) -> ExecutionProgress:
        """Read every checkpoint. A damaged record (cut short, garbled, edited) is never trusted: its candidate
        runs again, and `log` is told once per file that holds such records."""
        workfiles.mkdirs(self.folder)  # several processes may load it at once
        self.read_new(log)
        return self

    def read_new(self, log: Callable[[str], None] | None = None) -> list[Result]:
        """Read the checkpoints written since this one last read (each file once, whole: it is written under a
        temporary name and renamed); the results they hold. Damaged records as in `load`."""
        fresh = []
        for path in workfiles.match(FileSystems.join(self.folder, "batch-*.jsonl")):
            if path in self.files:
                continue
            self.files.add(path)
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
                    fresh.append(parsed[1])
            if damaged and log is not None:
                log(f"checkpoint {path}: {damaged} damaged record(s) ignored; their candidates run again")
        return fresh

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


class Tally:
    """Fresh verdicts of one execution stage, shown as they come in on the bar of the stage (display), and as a
    line of detail each time they are checkpointed: how many of the candidates it was handed have run, how many
    of the kept ones the fill point still asks for are in, and the time that leaves at the rate they come in."""

    def __init__(self, report: bool = True):
        self.checked = self.kept = self.handed = self.needed = 0
        self.started: float | None = None
        self.shown = report
        self.bar: Bar | None = None  # the stage's bar: its thread's, found as a batch begins (never pickled)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "bar": None}

    def start(self, handed: int, needed: int | None) -> None:
        """A batch begins: `handed` candidates to run, of which `needed` are wanted kept (None: all of them run)."""
        if self.started is None:
            self.started = time.monotonic()
        self.bar = self.bar or display.active().current()
        added = handed if needed is None else min(handed, needed)
        self.handed += handed
        self.needed += added
        if self.bar is not None:
            self.bar.grow(added)

    def add(self, verdict: Verdict) -> None:
        self.checked += 1
        self.kept += verdict.kept
        if self.bar is not None:
            self.bar.show(self.kept, f"{self.checked:,} executed")

    def line(self, elapsed: float) -> str:
        done = f"executed {self.checked:,} of at most {self.handed:,} candidates, kept {self.kept:,}"
        if self.needed:
            done += f" of the {self.needed:,} needed ({min(1.0, self.kept / self.needed):.0%})"
        if elapsed <= 0:
            return done
        done += f" ({elapsed:.0f} s, {self.checked / elapsed:.1f}/s"
        if 0 < self.kept < self.needed:
            done += f", about {_duration((self.needed - self.kept) * elapsed / self.kept)} left"
        return done + ")"

    def report(self) -> None:
        if self.shown:
            display.active().detail(f"  {self.line(time.monotonic() - (self.started or time.monotonic()))}")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


class Checkpointer:
    """Writes a batch's results to the run's checkpoints as they come in, at most every CHECKPOINT_EVERY_S, so
    a run stopped mid-batch loses only the last seconds of work, however large the batch."""

    def __init__(self, progress: ExecutionProgress, entered: list[Candidate], tally: Tally):
        self.progress = progress
        self.entered = entered
        self.tally = tally
        self.pending: list[tuple[Candidate, tuple]] = []
        self.last = time.monotonic()

    def add(self, i: int, result: tuple) -> None:
        self.pending.append((self.entered[i], result))
        self.tally.add(result[1])
        if time.monotonic() - self.last >= CHECKPOINT_EVERY_S:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.progress.record([c for c, _ in self.pending], [r for _, r in self.pending])
            self.pending = []
            self.tally.report()
        self.last = time.monotonic()


class CheckpointWatch:
    """The driver's view of an execution stage that runs in other processes (Beam's multi-processing mode, a
    portable or distributed runner), whose own reports go to those processes' logs: every `every_s` it reads the
    checkpoints of `progress` (loaded: a resumed round's are not new) written since (the runner's metrics reach
    the driver only when the job ends) and reports them as a Tally of `handed` candidates, `needed` of them
    wanted kept."""

    def __init__(self, progress: ExecutionProgress, handed: int, needed: int | None, every_s: float, bar=None):
        self.progress = progress
        self.tally = Tally()
        self.tally.bar = bar
        self.tally.start(handed, needed)
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="checkpoint-watch", daemon=True)

    def __enter__(self) -> CheckpointWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if exc[0] is None:
            self.poll()  # what the stage's last flush wrote

    def _watch(self) -> None:
        while not self._stop.wait(self.every_s):
            self.poll()

    def poll(self) -> None:
        """Report the verdicts of the checkpoints written since the last look, if there are any."""
        fresh = self.progress.read_new()
        if not fresh:
            return
        for _, verdict, _ in fresh:
            self.tally.add(verdict)
        self.tally.report()
