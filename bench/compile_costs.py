"""A run's compiles done again alone: the run's tasks one after another in this one process, each built and drawn as
the execution does, then compiled as the compile check does (inductor, with a worker's compile processes) and
called once. Where the workers' compiling bounds a run (its verdicts' `phase_s.compile`), this tells what a compile
costs by itself from what the run added (cold caches, the other workers on the cores), and where it goes:
inductor's own timers.

    python -m opsynth.bench.compile_costs RUN [--tasks 40] [--seed 1] [--device cuda] [--report FILE]
        [--compile-processes N]

RUN is a run's folder (its work folder `RUN/.opsynth` holds the checkpointed verdicts) or a work folder. It
compiles `--tasks` of the run's compiled tasks drawn at random, in a random order, after the worker's warm-up
task, and prints their compile seconds in the run and here, for the first third and for the rest (a process's
first uses of inductor's lowerings fall on the first ones), and the timers inductor keeps per step, summed over
the tasks (they nest: an outer step's time includes its inner steps'). Run it with the run's caches
(TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR) to see a warm compile, with empty ones to see a cold one. The tasks
run in this process: a development tool over a run's own tasks, not a sandbox.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from opsynth.bench.first_forwards import attempted, built, checkpointed_tasks, failures, write_report
from opsynth.config import COMPILE_PROCESSES

TOP_TIMERS = 12  # inductor's timers shown, the longest first


def timers() -> dict[str, float]:
    """Seconds inductor and dynamo have timed so far in this process, per step (empty where torch keeps none)."""
    import torch._dynamo.utils

    kept = getattr(torch._dynamo.utils, "compilation_time_metrics", {})
    return {name: sum(times) for name, times in kept.items()}


def compile_alone(task: dict, device) -> dict:
    """One task built and drawn as the execution does, then compiled and called once (finished: synchronized on
    CUDA), by the host clock, with the seconds of each of inductor's steps it took; or the error that stopped
    it."""
    import torch
    import torch._dynamo

    record = {"ops": task["ops"], "in_run_s": task["in_run_s"]}
    with attempted(record, device):
        model, inputs = built(task, device)
        torch._dynamo.reset()
        before = timers()
        with torch.no_grad():
            start = time.perf_counter()
            torch.compile(model, backend="inductor")(*inputs)
            if device.type == "cuda":
                torch.cuda.synchronize()
        record["here_s"] = time.perf_counter() - start
        record["steps"] = {name: round(s - before.get(name, 0.0), 4) for name, s in timers().items()
                           if s - before.get(name, 0.0) >= 1e-4}  # fmt: skip
    return record


def summary(records: list[dict]) -> list[str]:
    compiled = [r for r in records if "here_s" in r]
    lines = []
    first = max(1, len(compiled) // 3)
    for name, part in (("the first third", compiled[:first]), ("the rest", compiled[first:])):
        if part:
            in_run, here = (statistics.median(r[k] for r in part) for k in ("in_run_s", "here_s"))
            lines.append(f"{name}: {len(part)} tasks; compile median {in_run:.3f} s in the run, {here:.3f} s here")
    steps: dict[str, float] = {}
    for r in compiled:
        for name, s in r["steps"].items():
            steps[name] = steps.get(name, 0.0) + s
    if compiled:
        lines.append(f"inductor's steps, seconds a task (nested), over {len(compiled)} tasks:")
        longest = sorted(steps.items(), key=lambda kv: -kv[1])[:TOP_TIMERS]
        lines += [f"  {s / len(compiled):.3f} {name}" for name, s in longest]
    return lines + failures(records, "not compiled")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m opsynth.bench.compile_costs")
    parser.add_argument("run", help="a run's folder, or its work folder")
    parser.add_argument("--tasks", type=int, default=40, help="compiled tasks of the run, drawn at random")
    parser.add_argument("--seed", type=int, default=1, help="for the draw and the order")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--report", help="a JSON-lines file of each task's times")
    parser.add_argument(
        "--compile-processes", type=int, default=COMPILE_PROCESSES, help="compiling the kernels (1: the process itself)"
    )
    args = parser.parse_args(argv)
    tasks = sorted(checkpointed_tasks(args.run, "compile"), key=lambda t: t["code"])
    import torch

    from opsynth.filters.worker_process import WARM_UP_SOURCE
    from opsynth.filters.worker_setup import compile_in, start_compile_pool

    compile_in(args.compile_processes)
    device = torch.device(args.device)
    compile_alone({"code": WARM_UP_SOURCE, "seed": 0, "ops": [], "in_run_s": 0.0}, device)  # as each worker does
    start_compile_pool()
    picked = random.Random(args.seed).sample(tasks, min(args.tasks, len(tasks)))
    records = [compile_alone(task, device) for task in picked]
    write_report(args.report, records)
    print("\n".join(summary(records)))


if __name__ == "__main__":
    main()
