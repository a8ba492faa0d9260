"""`opsynth validate`: every filter of the pipeline, in the pipeline's order, on existing tasks.

Input is a `.py` task, a folder of them, or a Parquet file with a `code` column (such as CUDA-Agent-Ops-6K);
cheap checks (shape check on meta, decontamination) run before any execution, and a task's verdict is the
first reason it fails.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from filters.decontamination import KernelBenchIndex, decontaminate
from filters.execution import ExecutionConfig
from filters.reasons import KEEP, Verdict
from filters.shape_check import check_shapes
from filters.workers import Job, WorkerPool
from outputs.shards import write_text_atomic
from pipeline.errors import UsageError

VALIDATE_SEED = 20260229  # the same seed for every task, so a verdict is reproducible


@dataclass(frozen=True)
class TaskResult:
    task: str  # file name or row index
    verdict: Verdict

    def report_line(self) -> dict:
        return {
            "task": self.task,
            "verdict": self.verdict.reason,
            "detail": self.verdict.detail,
            **{k: v for k, v in self.verdict.measurements.items() if k != "output_shapes"},
        }


def read_tasks(input_path: str) -> list[tuple[str, str]]:
    """(task name, source) pairs from a `.py` file, a folder of `.py` files, or a Parquet file with `code`."""
    path = Path(input_path)
    if not path.exists():
        raise UsageError(f"{input_path}: no such file or folder; give a .py task, a folder of them, or a Parquet file")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".py" and p.is_file())
        if not files:
            raise UsageError(f"{input_path} holds no .py files; give a folder of KernelBench-style tasks")
        return [(p.name, p.read_text(encoding="utf-8", errors="replace")) for p in files]
    if path.suffix == ".py":
        return [(path.name, path.read_text(encoding="utf-8", errors="replace"))]
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            schema = pq.read_schema(path)
        except Exception as e:
            raise UsageError(f"{input_path} is not a readable Parquet file ({type(e).__name__})") from None
        if "code" not in schema.names:
            raise UsageError(f"{input_path} has no `code` column (columns: {', '.join(schema.names)})")
        codes = pq.read_table(path, columns=["code"]).column("code").to_pylist()
        return [(str(i), code or "") for i, code in enumerate(codes)]
    raise UsageError(f"{input_path}: expected a .py file, a folder of them, or a .parquet file")


def validate_tasks(
    tasks: list[tuple[str, str]],
    execution: ExecutionConfig,
    index: KernelBenchIndex,
    similarity_threshold: float,
    jaccard_threshold: float,
) -> list[TaskResult]:
    verdicts: dict[int, Verdict] = {}
    measured: dict[int, dict] = {}
    to_execute: list[int] = []
    for i, (_, source) in enumerate(tasks):
        shape = check_shapes(source)
        if not shape.kept:
            verdicts[i] = shape
            continue
        clean = decontaminate(source, index, similarity_threshold, jaccard_threshold)
        measured[i] = clean.measurements
        if not clean.kept:
            verdicts[i] = clean
            continue
        to_execute.append(i)
    if to_execute:
        with WorkerPool(execution) as pool:
            ran = pool.run([Job(tasks[i][0], tasks[i][1], VALIDATE_SEED) for i in to_execute])
        verdicts.update(zip(to_execute, ran, strict=True))
    results = []
    for i, (name, _) in enumerate(tasks):
        v = verdicts[i]
        results.append(TaskResult(name, Verdict(v.reason, v.detail, {**measured.get(i, {}), **v.measurements})))
    return results


def summarize(results: list[TaskResult]) -> str:
    counts = Counter(r.verdict.reason for r in results)
    kept = counts.pop(KEEP, 0)
    parts = [f"{kept} keep"] + [f"{n} {reason}" for reason, n in counts.most_common()]
    return f"{len(results)} tasks: " + ", ".join(parts)


def write_report(path: str, results: list[TaskResult]) -> None:
    write_text_atomic(Path(path), "".join(json.dumps(r.report_line(), default=str) + "\n" for r in results))
