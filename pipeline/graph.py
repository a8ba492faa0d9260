"""The Beam graph of one round: candidate specs in, accepted candidates and rejections out as JSON lines.

specs -> ComposeCandidates -> CheckShapes -> DecontaminateAgainstKernelBench -> DedupWithinSet
      -> ExecuteCandidates -> accepted;  every stage's rejections -> rejected
"""

from __future__ import annotations

import json

import apache_beam as beam
from apache_beam.utils.shared import Shared

from filters.execution import ExecutionConfig
from pipeline.config import WORKLOADS
from pipeline.options import GenerateOptions
from pipeline.records import CandidateSpec
from pipeline.stages import (
    KEPT,
    REJECTED,
    CheckShapes,
    ComposeCandidates,
    DecontaminateAgainstKernelBench,
    DedupWithinSet,
    ExecuteCandidates,
)


class WriteRecords(beam.PTransform):
    """Records (anything with `to_json`) -> JSON-lines files `PREFIX-SSSSS-of-NNNNN.jsonl` via Beam's sinks."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def expand(self, records):
        return (
            records
            | "ToJson" >> beam.Map(lambda r: json.dumps(r.to_json(), sort_keys=True))
            | "Write" >> beam.io.WriteToText(self.prefix, file_name_suffix=".jsonl")
        )


def build_round(
    p: beam.Pipeline,
    specs: list[CandidateSpec],
    options: GenerateOptions,
    execution: ExecutionConfig,
    seen_keys: frozenset[str],
    round_dir: str,
    progress_dir: str,
    graph_caps: dict[str, int] | None = None,
    graph_rows: dict[tuple[str, str], int] | None = None,
    pool: Shared | None = None,
) -> None:
    workload = WORKLOADS[options.workload]
    composed = (
        p
        | "CandidateSpecs" >> beam.Create(specs)
        | "ComposeCandidates" >> ComposeCandidates(workload, options.op_weights)
    )
    shaped = composed[KEPT] | "CheckShapes" >> CheckShapes()
    clean = shaped[KEPT] | "DecontaminateAgainstKernelBench" >> DecontaminateAgainstKernelBench(
        options.kernelbench, options.similarity_threshold, options.jaccard_threshold
    )
    unique = clean[KEPT] | "DedupWithinSet" >> DedupWithinSet(seen_keys, graph_caps, graph_rows)
    executed = unique[KEPT] | "ExecuteCandidates" >> ExecuteCandidates(
        execution, options.batch_size, workload, progress_dir, options.op_weights, pool
    )

    stages = (composed, shaped, clean, unique, executed)
    rejected = tuple(s[REJECTED] for s in stages) | "AllRejections" >> beam.Flatten()
    _ = executed[KEPT] | "WriteAccepted" >> WriteRecords(f"{round_dir}/accepted")
    _ = rejected | "WriteRejected" >> WriteRecords(f"{round_dir}/rejected")
