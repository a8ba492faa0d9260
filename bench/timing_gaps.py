"""How long the GPU idles inside a timing's exclusive hold, and what of it is the profiler's, the first launch's or
another process's: the wall time of a timing's forwards against the device time the profiler sums. On a CUDA
machine:

    python -m opsynth.bench.timing_gaps [--reps 20]

For a few synthetic models of about 2 ms (a memory-bound chain, a convolution, a launch-bound chain of small
operators) it times `iters` forwards as a timing does (`filters.timing.profile_forwards`, the profiler started
before the forwards) and prints, per model and variant, the median of (wall - device) in ms over `--reps`: as a
run times them (one run; the second of two in one profile, and its device time over the first's, 1.0 where the
split is right); right after a second process's kernels (as after a drain of the tasks sharing the GPU); after one
untimed forward, or one one-element kernel, under the same profiler (the first launch's cost apart); with the
profiler's schedule, a warm-up step (an untimed forward, or a one-element kernel) whose events it drops before the
recorded one, and the recorded forwards' device time over the plain profile's (1.0: none of the warm-up's counted);
with CUDA events and no profiler; and what stopping one profiler and starting the next costs (between a hold's eager
and compiled runs).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import statistics
import time


def _other_process(conn) -> None:
    """Runs about 5 ms of kernels each time it is asked, synchronized, then answers."""
    import torch

    x = torch.randn(64 << 20, device="cuda")
    while conn.recv():
        for _ in range(10):
            x = torch.sin(x)
        torch.cuda.synchronize()
        conn.send(True)


def models(torch):
    """(name, forward, inputs) of the synthetic models."""
    big = torch.randn(128 << 20, device="cuda")
    conv = torch.nn.Conv2d(64, 64, 3, padding=1).cuda().eval()
    image = torch.randn(32, 64, 128, 128, device="cuda")
    small = torch.randn(1 << 16, device="cuda")

    def chain(x):
        return torch.tanh(torch.sigmoid(torch.cos(torch.sin(x)))) * 0.5

    def many_small(x):
        for _ in range(100):
            x = torch.relu(x + 0.01)
        return x

    return [
        ("memory-bound chain", chain, [big]),
        ("conv2d", conv, [image]),
        ("100 small operators", many_small, [small]),
    ]


def measure(reps: int) -> dict[str, dict[str, float]]:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from opsynth.filters.timing import PhaseClock, device_ms, profile_forwards, split_runs, timed_iters

    def after(warm, args, fn, inputs, iters: int, steps: bool = False) -> tuple[float, list]:
        """(the wall ms of `iters` forwards of `fn`, the profile's events) under a profiler that first ran
        `warm(*args)`, finished; with `steps`, a warm-up step of the profiler's schedule (its events dropped)."""
        options = {"schedule": schedule(wait=0, warmup=1, active=1, repeat=1)} if steps else {}
        with profile(activities=[ProfilerActivity.CUDA], **options) as prof:
            warm(*args)
            torch.cuda.synchronize()
            if steps:
                prof.step()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn(*inputs)
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) * 1e3
        return wall, list(prof.events())

    context = multiprocessing.get_context("spawn")
    here, there = context.Pipe()
    other = context.Process(target=_other_process, args=(there,), daemon=True)
    other.start()
    here.send(True)
    here.recv()  # its CUDA context made
    results = {}
    with torch.no_grad():
        for name, fn, inputs in models(torch):
            for _ in range(3):
                fn(*inputs)
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*inputs)
            end.record()
            end.synchronize()
            iters = timed_iters(10, start.elapsed_time(end))
            variants = ("as a run times", "a run times, two runs: the second", "after another process",
                        "after a forward", "after a tiny kernel", "scheduled, warm-up forward",
                        "scheduled, warm-up tiny kernel", "events", "profiler stop and start")  # fmt: skip
            gaps = {variant: [] for variant in variants}
            device, scheduled, split = [], [], []
            tiny = torch.zeros(1, device="cuda")
            for _ in range(reps):
                for variant in ("as a run times", "after another process"):
                    if variant == "after another process":
                        here.send(True)
                        here.recv()
                    clock = PhaseClock()
                    prof = profile_forwards([(fn, "t")], inputs, iters, contextlib.nullcontext(), clock)
                    ms = device_ms(prof.events(), iters) * iters
                    device.append(ms)
                    gaps[variant].append(clock.seconds["t"] * 1e3 - ms)
                wall, events = after(fn, inputs, fn, inputs, iters)
                gaps["after a forward"].append(wall - device_ms(events, iters + 1) * iters)
                clock = PhaseClock()
                prof = profile_forwards([(fn, "a"), (fn, "b")], inputs, iters, contextlib.nullcontext(), clock)
                first, second = split_runs(list(prof.events()), 2)
                gaps["a run times, two runs: the second"].append(clock.seconds["b"] * 1e3 - device_ms(second, 1))
                split.append(device_ms(second, 1) / device_ms(first, 1))
                wall, events = after(tiny.add_, [1], fn, inputs, iters)
                gaps["after a tiny kernel"].append(wall - device_ms(events, iters) * iters)
                for variant, warm, args in (
                    ("scheduled, warm-up forward", fn, inputs),
                    ("scheduled, warm-up tiny kernel", tiny.add_, [1]),
                ):
                    wall, events = after(warm, args, fn, inputs, iters, steps=True)
                    ms = device_ms(events, iters) * iters
                    gaps[variant].append(wall - ms)
                    scheduled.append(ms / device[-1])
                t0 = time.perf_counter()
                start.record()
                for _ in range(iters):
                    fn(*inputs)
                end.record()
                end.synchronize()
                gaps["events"].append((time.perf_counter() - t0) * 1e3 - start.elapsed_time(end))
                first = profile(activities=[ProfilerActivity.CUDA])
                first.__enter__()
                t0 = time.perf_counter()
                first.__exit__(None, None, None)
                second = profile(activities=[ProfilerActivity.CUDA])
                second.__enter__()
                gaps["profiler stop and start"].append((time.perf_counter() - t0) * 1e3)
                second.__exit__(None, None, None)
            row = {"iters": iters, "device_ms": round(statistics.median(device), 3)}
            row["scheduled / plain device time"] = round(statistics.median(scheduled), 3)
            row["two runs split: second / first device time"] = round(statistics.median(split), 3)
            results[name] = row | {variant: round(statistics.median(values), 3) for variant, values in gaps.items()}
    here.send(False)
    other.join(10)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=20, help="timings of each model and variant")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        parser.exit(2, "opsynth: timing_gaps needs a CUDA device\n")
    print(f"{torch.cuda.get_device_name()}: wall - device of a timing's forwards, ms (median of {args.reps})")
    for name, row in measure(args.reps).items():
        print(f"  {name}: {row}")


if __name__ == "__main__":
    main()
