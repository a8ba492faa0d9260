"""A run's first forwards timed again alone: the run's tasks one after another in this one process, each built and
drawn as the execution does, then its first forward and a second one. Where a run's first forwards were long
(its verdicts' `phase_s.first_forward`), this tells a task's own first use of a library or kernel in a process
(long alone too, once per process: the run's workers each pay it) from what the run did around it (short alone).

    python -m opsynth.bench.first_forwards RUN [--longest 60] [--others 60] [--device cuda] [--rehearse]
                                               [--report FILE]

RUN is a run's folder (its work folder `RUN/.opsynth` holds the checkpointed verdicts) or a work folder. It
prints, for the tasks with the longest first forwards in the run and for others drawn at random, their first
forwards' seconds in the run and here, and the tasks whose first forward here took over FIRST_USE_S more than
their second. `--rehearse` (CUDA) rehearses each first forward as the execution does (filters.rehearsal) and
times the rehearsal too: what of a first use it moves out of the first forward. The tasks run in this process: a
development tool over a run's own tasks, not a sandbox.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import time

FIRST_USE_S = 0.1  # a first forward this much longer than the second reads as a first use


def run_tasks(work: str, phase: str = "first_forward") -> list[dict]:
    """The distinct tasks the run's execution checkpointed with a `phase` (see filters.execution.PHASES): code,
    seed, operators, and the most seconds any of their verdicts recorded in it (`in_run_s`)."""
    from opsynth.pipeline import workfiles
    from opsynth.pipeline.progress import ExecutionProgress
    from opsynth.pipeline.rounds import PROGRESS_DIR

    tasks: dict[str, dict] = {}
    checkpoints = workfiles.match(workfiles.join(work, PROGRESS_DIR, "round-*", "batch-*.jsonl"))
    for folder in sorted({path.rsplit("/", 1)[0] for path in checkpoints}):
        for candidate, verdict, _ in ExecutionProgress(folder).load().done.values():
            seconds = verdict.measurements.get("phase_s", {}).get(phase)
            if seconds is None:
                continue
            task = tasks.setdefault(candidate.code, {"code": candidate.code, "seed": candidate.seed,
                                                     "ops": list(candidate.ops), "in_run_s": 0.0})  # fmt: skip
            task["in_run_s"] = max(task["in_run_s"], seconds)
    return list(tasks.values())


def checkpointed_tasks(run: str, phase: str) -> list[dict]:
    """`run_tasks` of a run's folder or work folder, exiting with a line that says what to give where it holds
    none with `phase`."""
    work = os.path.join(run, ".opsynth") if os.path.isdir(os.path.join(run, ".opsynth")) else run
    tasks = run_tasks(work, phase)
    if not tasks:
        what = phase.replace("_", " ")
        sys.exit(f"{run}: no checkpointed verdict with a {what}; give a run's folder or its work folder")
    return tasks


def write_report(path: str | None, records: list[dict]) -> None:
    if path:
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)


def failures(records: list[dict], left: str) -> list[str]:
    """The line that says how many tasks were `left` (untimed, uncompiled) for an error, and the first error."""
    failed = [r for r in records if "error" in r]
    return [f"{left}: {len(failed)} (the first: {failed[0]['error']})"] if failed else []


def chosen(tasks: list[dict], longest: int, others: int, seed: int) -> list[dict]:
    """The `longest` tasks by first forward in the run and `others` of the rest at random, marked as such, in a
    random order (a process's first uses fall on whichever task comes first)."""
    rng = random.Random(seed)
    ranked = sorted(tasks, key=lambda t: (-t["in_run_s"], t["code"]))
    rest = ranked[longest:]
    picked = [{**t, "longest": True} for t in ranked[:longest]]
    picked += [{**t, "longest": False} for t in rng.sample(rest, min(others, len(rest)))]
    rng.shuffle(picked)
    return picked


def built(task: dict, device) -> tuple:
    """A task's model built and its first input drawn as the execution does: (model, inputs)."""
    import torch

    from opsynth.filters.execution import draw_inputs
    from opsynth.filters.task_loading import load_task

    loaded = load_task(task["code"])
    torch.manual_seed(task["seed"])
    with torch.device(device):
        model = loaded.model_class(*loaded.get_init_inputs()).to(device).eval()
    return model, draw_inputs(loaded, task["seed"], 0, device)


@contextlib.contextmanager
def attempted(record: dict, device):
    """Around one task's work here: an error that stops it goes into `record` (the run's verdict says why a task
    fails; here it is only left undone), and the GPU's cached memory is given back after it."""
    import torch

    try:
        yield
    except Exception as e:
        record["error"] = f"{type(e).__name__}: {e}"[:200]
    if device.type == "cuda":
        torch.cuda.empty_cache()


def time_alone(task: dict, device, rehearsing: bool = False) -> dict:
    """One task's model built and its first input drawn as the execution does, then (`rehearsing`) its first
    forward's rehearsal, and its first and second forwards, each finished (synchronized on CUDA), by the host
    clock: seconds, or the error that stopped it."""
    import torch

    def finished() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    record = {"ops": task["ops"], "longest": task["longest"], "in_run_s": task["in_run_s"]}
    with attempted(record, device):
        model, inputs = built(task, device)
        with torch.no_grad():
            if rehearsing:
                from opsynth.filters.rehearsal import rehearse

                start = finished()
                record["untouched"] = rehearse(model, inputs)
                record["rehearsal_s"] = finished() - start
            start = finished()
            model(*inputs)
            first = finished()
            model(*inputs)
            second = finished()
        record.update(first_s=first - start, second_s=second - first)
    return record


def summary(records: list[dict]) -> list[str]:
    lines = []
    for name, longest in (("longest in the run", True), ("others", False)):
        timed = [r for r in records if r["longest"] is longest and "first_s" in r]
        in_run, here, second = (sum(r[k] for r in timed) for k in ("in_run_s", "first_s", "second_s"))
        lines.append(f"{name}: {len(timed)} tasks; first forwards {in_run:.2f} s in the run, {here:.2f} s here "
                     f"(second forwards {second:.2f} s)")  # fmt: skip
        if any("rehearsal_s" in r for r in timed):
            rehearsed = sum(r.get("rehearsal_s", 0.0) for r in timed)
            touched = sum(not r.get("untouched", True) for r in timed)
            lines[-1] += f"; rehearsals {rehearsed:.2f} s before them, {touched} models changed by theirs"
    firsts = sorted((r for r in records if r.get("first_s", 0) - r.get("second_s", 0) > FIRST_USE_S),
                    key=lambda r: -r["first_s"])  # fmt: skip
    lines.append(f"first uses here (first forward over {FIRST_USE_S:g} s longer than the second): {len(firsts)}")
    lines += [f"  {r['first_s']:.3f} s (second {r['second_s']:.4f} s, in the run {r['in_run_s']:.3f} s) {r['ops']}"
              for r in firsts]  # fmt: skip
    return lines + failures(records, "not timed")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m opsynth.bench.first_forwards")
    parser.add_argument("run", help="a run's folder, or its work folder")
    parser.add_argument("--longest", type=int, default=60, help="tasks with the longest first forwards in the run")
    parser.add_argument("--others", type=int, default=60, help="other tasks of the run, drawn at random")
    parser.add_argument("--seed", type=int, default=1, help="for the draw of the others and the order")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--rehearse", action="store_true", help="CUDA: rehearse each first forward before it")
    parser.add_argument("--report", help="a JSON-lines file of each task's times")
    args = parser.parse_args(argv)
    if args.rehearse and args.device != "cuda":
        parser.error("--rehearse captures CUDA graphs: give --device cuda")
    tasks = checkpointed_tasks(args.run, "first_forward")
    import torch

    from opsynth.filters.worker_process import WARM_UP_SOURCE

    device = torch.device(args.device)
    warm_up = {"code": WARM_UP_SOURCE, "seed": 0, "ops": [], "longest": False, "in_run_s": 0.0}
    time_alone(warm_up, device)  # as each worker does before its first task: the context's start is no task's
    picked = chosen(tasks, args.longest, args.others, args.seed)
    records = [time_alone(task, device, args.rehearse) for task in picked]
    write_report(args.report, records)
    print("\n".join(summary(records)))


if __name__ == "__main__":
    main()
