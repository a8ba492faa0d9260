"""The Beam graphs of one round, as JSON lines in and out. A round has two parts, so that a run resumed
mid-round starts again at the execution (the GPU's work) without redoing its CPU stages:

prepare:  specs -> ComposeCandidates -> RuledOutEarlier -> CheckShapes -> DecontaminateAgainstKernelBench
          -> DedupWithinSet -> prepared;  every stage's rejections -> rejected-prepare
execute:  prepared -> ExecuteCandidates -> accepted;  its rejections -> rejected-execute

Each is a composite transform (`PrepareRound`, `ExecuteRound`), so that one pipeline may hold a round's
execution and the next round's CPU stages side by side (see round_pipelines).
"""

from __future__ import annotations

import json

import apache_beam as beam
from apache_beam.utils.shared import Shared

from opsynth.filters.execution import ExecutionConfig
from opsynth.options import GenerateOptions
from opsynth.pipeline.dedup_stage import DedupWithinSet, RuledOutEarlier
from opsynth.pipeline.execution_stage import ExecuteCandidates
from opsynth.pipeline.stages import (
    CPU_STAGES,
    KEPT,
    REJECTED,
    CheckShapes,
    ComposeCandidates,
    DecontaminateAgainstKernelBench,
    Sizing,
)
from opsynth.records import Candidate, CandidateSpec, sealed, unsealed


class WriteRecords(beam.PTransform):
    """Records (anything with `to_json`) -> JSON-lines files `PREFIX-SSSSS-of-NNNNN.jsonl` via Beam's sinks, each
    line sealed with its hash (records.sealed)."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def expand(self, records):
        return (
            records
            | "ToJson" >> beam.Map(lambda r: json.dumps(sealed(r.to_json()), sort_keys=True))
            | "Write" >> beam.io.WriteToText(self.prefix, file_name_suffix=".jsonl")
        )


PREPARED = "prepared"  # the candidates of a round that the CPU stages passed, as JSON lines
PREPARE_REJECTED = "rejected-prepare"
EXECUTE_REJECTED = "rejected-execute"
ACCEPTED = "accepted"
# What a finished round leaves for the dedup of the rounds after it: the keys (`Candidate.dedup_key`) it executed,
# one per line, and the rows it selected per operator graph, as `[source, graph, rows]` lines.
SEEN_KEYS = "seen-keys.txt"
GRAPH_ROWS = "graph-rows.jsonl"
# The same, in those formats, of a round whose execution has not finished, for the round prepared beside it:
# the keys of all its prepared candidates, and their count per operator graph (rows it may yet select).
PENDING_KEYS = "pending-keys.txt"
PENDING_GRAPH_ROWS = "pending-graph-rows.jsonl"


PREPARE_STAGES = (*CPU_STAGES, "dedup")  # the stages of `PrepareRound`, as their work counters name them


def build_prepare(p: beam.Pipeline, *args, **kwargs) -> None:
    """A round's CPU stages (`PrepareRound`, of these arguments) added to `p`."""
    _ = p | "PrepareRound" >> PrepareRound(*args, **kwargs)


class PrepareRound(beam.PTransform):
    """A round's CPU stages: specs in, `PREPARED` candidates and `PREPARE_REJECTED` rejections out. The shape
    check runs its candidates in worker processes of `shape_config` (shared through `shape_pool`), and sizes
    them by `sizing` where given; the dedup reads what earlier rounds left (`dedup_files`: their SEEN_KEYS and
    GRAPH_ROWS files, or PENDING_KEYS and PENDING_GRAPH_ROWS)."""

    def __init__(
        self,
        specs: list[CandidateSpec],
        options: GenerateOptions,
        dedup_files: tuple[list[str], list[str]],
        round_dir: str,
        shape_config: ExecutionConfig,
        graph_caps: dict[str, int] | None = None,
        shape_pool: Shared | None = None,
        sizing: Sizing | None = None,
    ):
        super().__init__()
        self.specs, self.options, self.dedup_files, self.round_dir = specs, options, dedup_files, round_dir
        self.shape_config, self.graph_caps, self.shape_pool, self.sizing = shape_config, graph_caps, shape_pool, sizing

    def expand(self, pbegin):
        options = self.options
        composed = (
            pbegin
            | "CandidateSpecs" >> beam.Create(self.specs)
            | "ComposeCandidates" >> ComposeCandidates(options.sizes, options.op_weights)
        )
        seen, graphs = self.dedup_files or ((), ())
        # Sized candidates are composed again, so their keys are final only where there is no sizing.
        early = RuledOutEarlier(self.graph_caps, seen, graphs, keys_final=self.sizing is None)
        fresh = composed[KEPT] | "RuledOutEarlier" >> early
        shaped = fresh[KEPT] | "CheckShapes" >> CheckShapes(self.shape_config, self.shape_pool, sizing=self.sizing)
        clean = shaped[KEPT] | "DecontaminateAgainstKernelBench" >> DecontaminateAgainstKernelBench(
            options.kernelbench, options.similarity_threshold, options.jaccard_threshold
        )
        # The tasks earlier rounds ran, where dropped before the shape check, are not looked for again.
        unique = clean[KEPT] | "DedupWithinSet" >> DedupWithinSet(
            self.graph_caps, () if early.seen_files else seen, graphs
        )
        stages = (composed, fresh, shaped, clean, unique)
        rejected = tuple(s[REJECTED] for s in stages) | "AllRejections" >> beam.Flatten()
        _ = unique[KEPT] | "WritePrepared" >> WriteRecords(f"{self.round_dir}/{PREPARED}")
        return rejected | "WriteRejected" >> WriteRecords(f"{self.round_dir}/{PREPARE_REJECTED}")


def build_execute(p: beam.Pipeline, *args, **kwargs) -> None:
    """A round's execution stage (`ExecuteRound`, of these arguments) added to `p`."""
    _ = p | "ExecuteRound" >> ExecuteRound(*args, **kwargs)


class ExecuteRound(beam.PTransform):
    """A round's execution stage: the `PREPARED` files in, `ACCEPTED` candidates and `EXECUTE_REJECTED` out. The
    candidates are reshuffled first, so that a distributed runner spreads them over its workers whatever files
    the CPU stages wrote them to; the execution alone carries the run's accelerator hint, if it has one.
    `wanted`: accepted candidates asked of each data source, past which the stage may skip candidates. `report`:
    the stage reports its progress where it runs (in the driver's process; elsewhere the driver reads it from
    the checkpoints, see progress.CheckpointWatch)."""

    def __init__(
        self,
        prepared_files: list[str],
        options: GenerateOptions,
        execution: ExecutionConfig,
        round_dir: str,
        progress_dir: str,
        pool: Shared | None = None,
        wanted: dict[str, int] | None = None,
        report: bool = True,
    ):
        super().__init__()
        self.prepared_files, self.options, self.execution = prepared_files, options, execution
        self.round_dir, self.progress_dir = round_dir, progress_dir
        self.pool, self.wanted, self.report = pool, wanted, report

    def expand(self, pbegin):
        options = self.options
        candidates = (
            pbegin
            | "PreparedFiles" >> beam.Create(self.prepared_files)
            | "ReadPrepared" >> beam.io.ReadAllFromText()
            | "ParsePrepared" >> beam.Map(lambda line: Candidate.from_json(unsealed(json.loads(line))))
            | "SpreadOverWorkers" >> beam.Reshuffle()
        )
        execute = ExecuteCandidates(
            self.execution,
            options.batch_size,
            options.sizes,
            self.progress_dir,
            options.op_weights,
            self.pool,
            self.wanted,
            report=self.report and not options.quiet,
        )
        if options.accelerator:
            execute = execute.with_resource_hints(accelerator=options.accelerator)
        executed = candidates | "ExecuteCandidates" >> execute
        _ = executed[KEPT] | "WriteAccepted" >> WriteRecords(f"{self.round_dir}/{ACCEPTED}")
        return executed[REJECTED] | "WriteRejected" >> WriteRecords(f"{self.round_dir}/{EXECUTE_REJECTED}")
