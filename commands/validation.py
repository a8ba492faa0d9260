"""`opsynth validate`: every filter of the pipeline, in the pipeline's order (cheap checks first), on existing tasks;
a task's verdict is the first reason it fails, and a generated folder's recorded eager times are compared with those
measured now (docs/commands.md)."""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from opsynth.atomic import write_text_atomic
from opsynth.errors import UsageError
from opsynth.filters.decontamination import decontaminate
from opsynth.filters.execution import ExecutionConfig
from opsynth.filters.kernelbench_index import KernelBenchIndex
from opsynth.filters.worker_process import SHAPES
from opsynth.filters.workers import Job, WorkerPool
from opsynth.outputs.stats import spread
from opsynth.reasons import KEEP, OUT_OF_MEMORY, Verdict

T = TypeVar("T")
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


INPUT_HELP = "give a .py task, a folder of them, a Parquet file with a `code` column, or a dataset folder"


def _parquet_tasks(files: list[Path]) -> list[tuple[str, str]]:
    """(name, code) of every row: the `id` column names a row where there is one (a generated set), else its
    index (in a single file) or `file:index`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tasks = []
    for path in files:
        try:
            schema = pq.read_schema(path)
        except Exception as e:
            raise UsageError(f"{path} is not a readable Parquet file ({type(e).__name__})") from None
        if "code" not in schema.names:
            raise UsageError(f"{path} has no `code` column (columns: {', '.join(schema.names)}); {INPUT_HELP}")
        code_type = schema.field("code").type
        if not (pa.types.is_string(code_type) or pa.types.is_large_string(code_type)):
            raise UsageError(f"{path}: its `code` column holds {code_type}, not text; {INPUT_HELP}")
        table = pq.read_table(path, columns=[c for c in ("code", "id") if c in schema.names])
        codes = table.column("code").to_pylist()
        if "id" in schema.names:
            names = [str(x) for x in table.column("id").to_pylist()]
        else:
            names = [str(i) if len(files) == 1 else f"{path.name}:{i}" for i in range(len(codes))]
        tasks += [(name, code or "") for name, code in zip(names, codes, strict=True)]  # a null code loads as empty
    return tasks


def dataset_shards(folder: Path) -> list[Path]:
    """The Parquet files of a dataset folder: in it, or in its `data/` folder as `generate` writes them."""
    for place in (folder, folder / "data"):
        shards = sorted(p for p in place.glob("*.parquet") if p.is_file())
        if shards:
            return shards
    return []


def read_tasks(input_path: str) -> list[tuple[str, str]]:
    """(task name, source) pairs from a `.py` file, a folder of `.py` files, a Parquet file with `code`, or a
    dataset folder (Parquet shards in it or in its `data/`, such as `generate` writes)."""
    path = Path(input_path)
    if not path.exists():
        raise UsageError(f"{input_path}: no such file or folder; {INPUT_HELP}")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".py" and p.is_file())
        if files:
            return [(p.name, p.read_text(encoding="utf-8", errors="replace")) for p in files]
        shards = dataset_shards(path)
        if not shards:
            raise UsageError(f"{input_path} holds no .py files and no Parquet shards; {INPUT_HELP}")
        return _parquet_tasks(shards)
    if path.suffix == ".py":
        return [(path.name, path.read_text(encoding="utf-8", errors="replace"))]
    if path.suffix == ".parquet":
        return _parquet_tasks([path])
    raise UsageError(f"{input_path}: expected a .py file, a folder, or a .parquet file; {INPUT_HELP}")


def recorded_columns(input_path: str, columns: tuple[str, ...]) -> dict[str, tuple]:
    """Task id -> the values of `columns` a generated set recorded for it (its rows' columns), where the input
    is Parquet with an `id` column and the first of them; empty otherwise. A column missing is None."""
    import pyarrow.parquet as pq

    path = Path(input_path)
    files = dataset_shards(path) if path.is_dir() else [path] if path.suffix == ".parquet" else []
    recorded: dict[str, tuple] = {}
    for file in files:
        names = set(pq.read_schema(file).names)
        if not {"id", columns[0]} <= names:
            return {}
        table = pq.read_table(file, columns=["id", *(c for c in columns if c in names)])
        values = [table.column(c).to_pylist() if c in names else [None] * table.num_rows for c in columns]
        recorded.update(zip(map(str, table.column("id").to_pylist()), zip(*values, strict=True), strict=True))
    return recorded


def recorded_eager_ms(input_path: str) -> dict[str, float]:
    """Task name -> the eager time a generated set recorded for it (its `eager_ms` column), where the input is
    Parquet with one; empty otherwise."""
    recorded = recorded_columns(input_path, ("eager_ms",))
    return {name: ms for name, (ms,) in recorded.items() if ms is not None}


def sample_tasks(tasks: list[T], n: int, seed: int) -> list[T]:
    """`n` of the tasks drawn at random (the same ones for the same seed), in their input order."""
    if n <= 0:
        raise UsageError(f"--sample {n}: give a positive number of tasks to draw")
    if n >= len(tasks):
        return list(tasks)
    return [tasks[i] for i in sorted(random.Random(seed).sample(range(len(tasks)), n))]


def validate_tasks(
    tasks: list[tuple[str, str]],
    execution: ExecutionConfig,
    index: KernelBenchIndex,
    similarity_threshold: float,
    jaccard_threshold: float,
) -> list[TaskResult]:
    """Every task's verdict: the shape check and the execution checks in contained worker processes (task code
    never runs here), decontamination, which parses the task and compares the operator graph its shape check
    recorded, here in between."""
    verdicts: dict[int, Verdict] = {}
    measured: dict[int, dict] = {}
    to_execute: list[int] = []
    with WorkerPool(execution) as pool:
        shapes = pool.run([Job(name, source, VALIDATE_SEED, SHAPES) for name, source in tasks])
        for i, ((_, source), shape) in enumerate(zip(tasks, shapes, strict=True)):
            if not shape.kept:
                verdicts[i] = shape
                continue
            graph, nodes = shape.measurements.get("graph"), shape.measurements.get("graph_nodes", 0)
            clean = decontaminate(source, index, similarity_threshold, jaccard_threshold, graph, nodes)
            measured[i] = clean.measurements
            if not clean.kept:
                verdicts[i] = clean
                continue
            to_execute.append(i)
        if to_execute:
            ran = pool.run([Job(tasks[i][0], tasks[i][1], VALIDATE_SEED) for i in to_execute])
            verdicts.update(zip(to_execute, ran, strict=True))
            # A task that ran out of memory beside the others runs again once they are done, one at a time: the
            # device's memory is then its own but for the idle workers' small caches. On one H200, whole
            # re-validations of 600 generated rows (14 workers) found 1 or 2 of them out of memory; three such
            # tasks each kept validated with one worker.
            if execution.workers > 1:
                for i in [i for i in to_execute if verdicts[i].reason == OUT_OF_MEMORY]:
                    verdicts[i] = pool.run([Job(tasks[i][0], tasks[i][1], VALIDATE_SEED)])[0]
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


def compare_recorded(results: list[TaskResult], recorded: dict[str, float]) -> str | None:
    """How the eager times measured now compare with those the set recorded, over the tasks timed both ways;
    None where there are none."""
    ratios = [
        r.verdict.measurements["eager_ms"] / recorded[r.task]
        for r in results
        if r.task in recorded and recorded[r.task] > 0 and "eager_ms" in r.verdict.measurements
    ]
    if not ratios:
        return None
    kept = sum(r.verdict.reason == KEEP for r in results if r.task in recorded)
    return (
        f"eager time measured now / recorded, over {len(ratios)} tasks: {spread(ratios)}; {kept} of the "
        f"{sum(r.task in recorded for r in results)} recorded tasks keep"
    )


def write_report(path: str, results: list[TaskResult]) -> None:
    write_text_atomic(Path(path), "".join(json.dumps(r.report_line(), default=str) + "\n" for r in results))
