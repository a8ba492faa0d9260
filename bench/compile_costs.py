"""A run's compiles done again alone: the run's tasks one after another in this one process, each built and drawn as
the execution does, then compiled as the compile check does (inductor, with a worker's compile processes) and
called once. Where the workers' compiling bounds a run (its verdicts' `phase_s.compile`), this tells what a compile
costs by itself from what the run added (cold caches, the other workers on the cores), and where it goes:
inductor's own timers.

    python -m opsynth.bench.compile_costs RUN [--tasks 40] [--seed 1] [--device cuda] [--report FILE]
        [--compile-processes N] [--whole-kernels] [--inductor-config NAME=VALUE ...]

RUN is a run's folder (its work folder `RUN/.opsynth` holds the checkpointed verdicts) or a work folder. It
compiles `--tasks` of the run's compiled tasks drawn at random, in a random order, after the worker's warm-up
task, and prints their compile seconds in the run and here, for the first third and for the rest (a process's
first uses of inductor's lowerings fall on the first ones), the Triton kernels each compiled, and the timers
inductor keeps per step, summed over the tasks (they nest: an outer step's time includes its inner steps'). Each
`--inductor-config` sets one of inductor's settings for the compiles (`triton.autotune_pointwise=False`: one
configuration per pointwise kernel, not several compiled to choose from), to see what it costs; `--whole-kernels`
compiles each kernel's configurations in one job of the compile pool, as inductor does, not one job each (the
workers' way: filters.kernel_configs). Run it with the run's caches (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR) to
see a warm compile, with empty ones to see a cold one. The tasks run in this process: a development tool over a
run's own tasks, not a sandbox.
"""

from __future__ import annotations

import argparse
import ast
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


def triton_kernels() -> int:
    """Triton kernels inductor has compiled so far in this process (found in none of its caches)."""
    from torch._dynamo.utils import counters

    asked = counters["inductor"]
    return asked["async_compile_cache_miss"] - asked["async_compile_cache_hit"]  # it counts a hit as a miss too


def inductor_settings(entries: list[str]) -> dict:
    """`--inductor-config` entries (NAME=VALUE, the value a Python literal or else a string) as inductor's settings;
    exits in one line naming an entry that is malformed or names no setting."""
    import torch._inductor.config

    settings = {}
    for entry in entries:
        name, sep, value = entry.partition("=")
        if not sep or name.strip() not in torch._inductor.config.get_config_copy():
            raise SystemExit(f"--inductor-config {entry}: give NAME=VALUE with NAME one of inductor's settings, "
                             "e.g. triton.autotune_pointwise=False")  # fmt: skip
        try:
            settings[name.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            settings[name.strip()] = value.strip()
    return settings


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
        before, kernels = timers(), triton_kernels()
        with torch.no_grad():
            start = time.perf_counter()
            torch.compile(model, backend="inductor")(*inputs)
            if device.type == "cuda":
                torch.cuda.synchronize()
        record["here_s"] = time.perf_counter() - start
        record["kernels"] = triton_kernels() - kernels
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
        kernels = [r["kernels"] for r in compiled]
        lines.append(f"Triton kernels compiled: {sum(kernels)}, median {statistics.median(kernels):g} a task")
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
    parser.add_argument("--whole-kernels", action="store_true",
                        help="a kernel's configurations compiled in one job of the pool, not one job each")  # fmt: skip
    parser.add_argument("--inductor-config", action="append", default=[], metavar="NAME=VALUE",
                        help="one of inductor's settings for the compiles; repeat for several")  # fmt: skip
    args = parser.parse_args(argv)
    settings = inductor_settings(args.inductor_config)
    tasks = sorted(checkpointed_tasks(args.run, "compile"), key=lambda t: t["code"])
    import torch
    import torch._inductor.config

    from opsynth.filters.worker_process import WARM_UP_SOURCE
    from opsynth.filters.worker_setup import compile_in, start_compile_pool

    compile_in(args.compile_processes)
    device = torch.device(args.device)
    compile_alone({"code": WARM_UP_SOURCE, "seed": 0, "ops": [], "in_run_s": 0.0}, device)  # as each worker does
    start_compile_pool(split=not args.whole_kernels)
    picked = random.Random(args.seed).sample(tasks, min(args.tasks, len(tasks)))
    with torch._inductor.config.patch(settings):
        records = [compile_alone(task, device) for task in picked]
    write_report(args.report, records)
    print("\n".join(summary(records)))


if __name__ == "__main__":
    main()
