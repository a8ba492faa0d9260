"""The row schemas of the dataset and of its rejected candidates, as explicit pyarrow schemas.

The first three task columns are the released set's, unchanged, so a generated set is a drop-in replacement.
"""

from __future__ import annotations

import json

import pyarrow as pa

from opsynth.records import Candidate, Rejection

# One input tensor of `get_inputs()`: what people filter on, typed (a list of these per row).
INPUT_SHAPE = pa.struct([pa.field("dtype", pa.string()), pa.field("shape", pa.list_(pa.int64()))])

TASK_SCHEMA = pa.schema(
    [
        pa.field("ops", pa.string(), nullable=False),  # JSON list of operator names, in order
        pa.field("data_source", pa.string(), nullable=False),  # torch#k or transformers
        pa.field("code", pa.string(), nullable=False),  # the task program
        pa.field("id", pa.string(), nullable=False),  # stable content id: hash of `code`
        pa.field("num_ops", pa.int32(), nullable=False),
        pa.field("input_shapes", pa.list_(INPUT_SHAPE), nullable=False),  # each input's dtype and shape
        pa.field("eager_ms", pa.float64()),  # median eager forward time on device_name
        pa.field("compile_ms", pa.float64()),  # the same under torch.compile; null without the compile check
        pa.field("device_name", pa.string()),
        pa.field("kb_ast_similarity", pa.float64()),  # max AST similarity to KernelBench levels 1-3 (the paper's)
        pa.field("kb_ast_similarity_normalized", pa.float64()),  # the same on the normalized Model class
        pa.field("kb_minhash_jaccard", pa.float64()),  # max MinHash Jaccard to KernelBench levels 1-3
        pa.field("kb_nearest", pa.string()),  # the KernelBench task nearest by the paper's score
        pa.field("seed", pa.int64(), nullable=False),  # the candidate seed that produced the row
        pa.field("generator_version", pa.string(), nullable=False),
    ]
)

REJECTED_SCHEMA = pa.schema(
    [
        pa.field("reason", pa.string(), nullable=False),  # one of opsynth.reasons.REASONS
        pa.field("stage", pa.string(), nullable=False),  # one of outputs.stats.STAGES
        pa.field("detail", pa.string(), nullable=False),
        pa.field("data_source", pa.string(), nullable=False),
        pa.field("candidate_index", pa.int64(), nullable=False),
        pa.field("seed", pa.int64(), nullable=False),
        pa.field("ops", pa.string(), nullable=False),
        pa.field("code", pa.string(), nullable=False),
        pa.field("measurements", pa.string(), nullable=False),  # JSON object of what was measured
    ]
)


def task_row(c: Candidate, generator_version: str) -> dict:
    m = c.measurements
    return {
        "ops": json.dumps(list(c.ops)),
        "data_source": c.data_source,
        "code": c.code,
        "id": c.id,
        "num_ops": len(c.ops),
        "input_shapes": [{"dtype": s["dtype"], "shape": list(s["shape"])} for s in c.input_shapes],
        "eager_ms": m.get("eager_ms"),
        "compile_ms": m.get("compile_ms"),
        "device_name": m.get("device_name"),
        "kb_ast_similarity": m.get("kb_ast_similarity"),
        "kb_ast_similarity_normalized": m.get("kb_ast_similarity_normalized"),
        "kb_minhash_jaccard": m.get("kb_minhash_jaccard"),
        "kb_nearest": m.get("kb_nearest"),
        "seed": c.seed,
        "generator_version": generator_version,
    }


def rejected_row(r: Rejection) -> dict:
    c = r.candidate
    return {
        "reason": r.reason,
        "stage": r.stage,
        "detail": r.detail,
        "data_source": c.data_source,
        "candidate_index": c.index,
        "seed": c.seed,
        "ops": json.dumps(list(c.ops)),
        "code": c.code,
        "measurements": json.dumps(c.measurements, sort_keys=True, default=str),
    }
