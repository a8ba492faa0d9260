"""`opsynth score`: a solution (`ModelNew`) against its task, as the CUDA Agent paper's reward in {-1, 1, 2, 3}."""

from __future__ import annotations

import json
from pathlib import Path

from opsynth.commands.arguments import add_command, positive
from opsynth.errors import UsageError
from opsynth.filters.scorer import TIMEOUT_S

SCORE_EXAMPLES = """examples:
  opsynth score out:3f2a9c0d1e2b4a5f solution.py --device cuda      (a row of a generated folder, by its id)
  opsynth score out/data/train-00000-of-00001.parquet:3f2a9c0d1e2b4a5f solution/ --json
  opsynth score task.py solution.py --device cpu                      (a .py task: its baselines measured now)
A solution is a .py file defining ModelNew (it may build the sources beside it itself, from its __file__), or
a folder holding model_new.py (or one .py file) and .cu/.cpp sources, built with torch.utils.cpp_extension
as the module `cuda_extension` where the solution imports that; a build error scores -1."""
TASK_HELP = "DIR:ID (a row of a generated folder), FILE.parquet:ID (a row by its id or index), or a .py task"


def register(sub) -> None:
    p = add_command(sub, "score", "score a solution (ModelNew) against its task: reward -1, 1, 2 or 3",
                    SCORE_EXAMPLES, run)  # fmt: skip
    p.add_argument("task", help=f"{TASK_HELP}; or a generated folder, to score a folder of solutions")
    p.add_argument(
        "solution",
        help="a .py file defining ModelNew, or a folder with model_new.py and .cu/.cpp files; for a generated "
        "folder, a folder of solutions named by task id (ID.py or ID/model_new.py)",
    )
    p.add_argument("--report", help="a folder's scores: one JSON line per task in this file, the summary last")
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"), help="where both run (default: auto)")
    p.add_argument(
        "--baseline",
        choices=("recorded", "measure"),
        help="the eager and torch.compile times to beat: a row's recorded ones, or measured now beside the "
        "solution (default: recorded for a row on CUDA, else measure)",
    )
    p.add_argument("--timeout-s", type=float,
                   help=f"wall-clock limit of each side, a build included (default {TIMEOUT_S:g})")  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON line: reward, reason, the three times, baseline")


def _row(path: Path, key: str) -> dict:
    """The row `key` (its id, else its index) of a Parquet file or of a generated folder's shards."""
    import pyarrow.parquet as pq

    from opsynth.commands.validation import dataset_shards

    files = [path] if path.is_file() else dataset_shards(path)
    if not files:
        raise UsageError(f"{path} holds no Parquet shards; {TASK_HELP}")
    offset = 0
    for file in files:
        names = pq.read_schema(file).names
        if "code" not in names:
            raise UsageError(f"{file} has no `code` column; {TASK_HELP}")
        columns = [c for c in ("id", "code", "eager_ms", "compile_ms") if c in names]
        rows = pq.read_table(file, columns=columns).to_pylist()
        for i, row in enumerate(rows):
            if str(row.get("id")) == key or ("id" not in names and key == str(offset + i)):
                return row
        offset += len(rows)
    raise UsageError(f"{path} has no row {key}; give a row's id (the `id` column) after the colon")


def _task(spec: str) -> tuple[str, tuple[float | None, float | None] | None]:
    """The task's source and, for a row, its recorded (eager_ms, compile_ms)."""
    path = Path(spec)
    if spec.endswith(".py"):
        if not path.is_file():
            raise UsageError(f"{spec}: no such file; {TASK_HELP}")
        return path.read_text(encoding="utf-8", errors="replace"), None
    where, sep, key = spec.rpartition(":")
    if not sep or not where or not key:
        raise UsageError(f"{spec}: {TASK_HELP}")
    if not Path(where).exists():
        raise UsageError(f"{where}: no such file or folder; {TASK_HELP}")
    row = _row(Path(where), key)
    recorded = (row.get("eager_ms"), row.get("compile_ms")) if row.get("eager_ms") is not None else None
    return row["code"] or "", recorded


def _solution(spec: str) -> tuple[str, str, str | None]:
    """(its source, its path, the folder of its .cu/.cpp sources or None)."""
    from opsynth.filters.scoring import SOLUTION_FILENAME

    path = Path(spec)
    if path.is_dir():
        modules = [path / SOLUTION_FILENAME] if (path / SOLUTION_FILENAME).is_file() else sorted(path.glob("*.py"))
        if len(modules) != 1:
            raise UsageError(f"{spec}: a solution folder holds {SOLUTION_FILENAME} (or one .py file) defining "
                             "ModelNew, and its .cu/.cpp sources")  # fmt: skip
        module = modules[0]
        return module.read_text(encoding="utf-8", errors="replace"), str(module.resolve()), str(path)
    if path.suffix != ".py" or not path.is_file():
        raise UsageError(f"{spec}: give a .py file defining ModelNew, or a folder with {SOLUTION_FILENAME}")
    return path.read_text(encoding="utf-8", errors="replace"), str(path.resolve()), None


def _solutions(folder: Path, ids: list[str]) -> dict[str, tuple[str, str, str | None]]:
    """The solutions of a folder of solutions, by task id: ID.py, or ID/ holding model_new.py and its sources."""
    found = {}
    for key in ids:
        for candidate in (folder / f"{key}.py", folder / key):
            if candidate.exists():
                found[key] = _solution(str(candidate))
                break
    return found


def _score_folder(args, timeout_s: float) -> int:
    """Every task of a generated folder that has a solution in the solutions folder, on all GPUs at once (one
    score per GPU); a task without one scores -1. The paper's metrics at the end."""
    from concurrent.futures import ThreadPoolExecutor

    from opsynth.atomic import write_text_atomic
    from opsynth.commands.arguments import resolve_device
    from opsynth.commands.validation import read_tasks, recorded_columns
    from opsynth.filters.scorer import Score, score, summary

    if not Path(args.solution).is_dir():
        raise UsageError(f"{args.solution}: to score a generated folder give a folder of solutions (ID.py or ID/)")
    tasks = dict(read_tasks(args.task))
    times = recorded_columns(args.task, ("eager_ms", "compile_ms"))
    solutions = _solutions(Path(args.solution), list(tasks))
    if not solutions:
        raise UsageError(f"{args.solution} holds no solution named by a task id of {args.task} (ID.py or ID/)")
    device = resolve_device(args.device)
    measure = _baseline(args.baseline, device, recorded=bool(times)) == "measure"
    import torch

    gpus = list(range(torch.cuda.device_count())) if device == "cuda" else [None]

    def one(item: tuple[int, str]) -> Score:
        i, key = item
        if key not in solutions:
            return Score(-1, "no solution", None, *times.get(key, (None, None)), "measured" if measure else "recorded")
        source, path, sources = solutions[key]
        return score(tasks[key], source, path, sources, device, None if measure else times.get(key),
                     timeout_s, gpus[i % len(gpus)])  # fmt: skip

    keys = sorted(tasks)
    with ThreadPoolExecutor(max_workers=len(gpus)) as pool:
        scores = list(pool.map(one, enumerate(keys)))
    totals = summary(scores)
    lines = [json.dumps({"task": key, **s.to_json()}, sort_keys=True) for key, s in zip(keys, scores, strict=True)]
    if args.report:
        write_text_atomic(Path(args.report), "\n".join([*lines, json.dumps({"summary": totals})]) + "\n")
    print(json.dumps(totals, sort_keys=True) if args.json else _summary_line(totals))
    return 0


def _summary_line(totals: dict) -> str:
    geomean = totals["geomean_speedup_over_eager"]
    speedup = "-" if geomean is None else f"{geomean:.3f}x"
    return (f"{totals['tasks']} tasks: {totals['pass_rate']:.1%} correct, {totals['faster_than_eager_rate']:.1%} "
            f"faster than eager, {totals['faster_than_compile_rate']:.1%} faster than torch.compile; geometric "
            f"mean speed-up over eager {speedup} (correct solutions)")  # fmt: skip


def _baseline(asked: str | None, device: str, recorded: bool) -> str:
    """The baselines to use: those asked for, else a row's recorded times on CUDA (the pipeline measured them
    as the scorer does), measured now otherwise (a CPU run records its own, rougher, measure)."""
    if asked == "recorded" and not recorded:
        raise UsageError("--baseline recorded: the task has no recorded eager time; use --baseline measure")
    return asked or ("recorded" if recorded and device == "cuda" else "measure")


def run(args) -> int:
    timeout_s = positive("--timeout-s", args.timeout_s, float) or TIMEOUT_S
    if Path(args.task).is_dir():
        return _score_folder(args, timeout_s)
    if args.report:
        raise UsageError("--report is for a folder of solutions scored against a generated folder")
    task, recorded = _task(args.task)
    source, solution_path, extension_dir = _solution(args.solution)
    from opsynth.commands.arguments import resolve_device
    from opsynth.filters.scorer import score

    device = resolve_device(args.device)
    baseline = _baseline(args.baseline, device, recorded is not None)
    result = score(task, source, solution_path, extension_dir, device,
                   recorded if baseline == "recorded" else None, timeout_s)  # fmt: skip
    if args.json:
        print(json.dumps(result.to_json(), sort_keys=True))
    else:

        def ms(value):
            return "-" if value is None else f"{value:.4f} ms"

        print(f"reward {result.reward}: {result.reason}")
        print(f"solution {ms(result.solution_ms)}; eager {ms(result.eager_ms)}; torch.compile "
              f"{ms(result.compile_ms)} ({result.baseline})")  # fmt: skip
    return 0
