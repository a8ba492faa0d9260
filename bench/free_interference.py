"""Whether another process's GPU allocations and frees slow this process's kernels, and for how long after them:
the measure behind `filters.device_lock.FREED_CLEARING_BYTES_PER_S`. On a CUDA machine:

    python -m opsynth.bench.free_interference [--gib 2 8]

This process times one memory-bound forward (cos, then sigmoid, of 1 GiB of float32) over and over with CUDA
events, while a second process allocates and frees a buffer of each size in turn, a pause between, noting when each
call began and returned (synchronized). Each forward is classed by where it fell: during a call, within 20, 50 or
100 ms after one, or clear of them; it prints each class's forward time over the median one.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time

AFTER_S = (0.02, 0.05, 0.1)  # the spans after a call that a forward's start is classed by


def _allocate_and_free(calls, stop, gib: int, pause_s: float) -> None:
    import torch

    torch.empty(1, device="cuda")
    noted = []
    while not stop.is_set():
        start = time.time()
        buffer = torch.empty(gib << 30, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        noted.append(("alloc", start, time.time()))
        time.sleep(pause_s)
        start = time.time()
        del buffer
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        noted.append(("free", start, time.time()))
        time.sleep(pause_s)
    calls.put(noted)


def _afters() -> list[str]:
    return [f"within {after * 1e3:g} ms after" for after in AFTER_S]


def where_it_fell(start: float, end: float, calls: list[tuple]) -> str:
    """The class of a forward from `start` to `end` among the other process's (kind, began, returned) calls."""
    for kind, began, returned in calls:
        if start < returned and end > began:
            return f"{kind}, during"
    for after, label in zip(AFTER_S, _afters(), strict=True):
        for kind, _, returned in calls:
            if returned <= start < returned + after:
                return f"{kind}, {label}"
    return "clear"


def measure(gib: int, seconds: float = 5.0) -> dict[str, list[float]]:
    """Forward times over their median, by class, while another process allocates and frees `gib` GiB."""
    import torch

    x = torch.randn(256 << 20, device="cuda")
    for _ in range(5):
        torch.sigmoid(torch.cos(x))
    torch.cuda.synchronize()
    context = multiprocessing.get_context("spawn")
    calls, stop = context.Queue(), context.Event()
    other = context.Process(target=_allocate_and_free, args=(calls, stop, gib, 0.05 + 0.02 * gib))
    other.start()
    time.sleep(5)  # its start (torch, a CUDA context) done
    forwards = []
    end = time.time() + seconds
    while time.time() < end:
        before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start = time.time()
        before.record()
        torch.sigmoid(torch.cos(x))
        after.record()
        after.synchronize()
        forwards.append((start, time.time(), before.elapsed_time(after)))
    stop.set()
    noted = calls.get()
    other.join()
    median = statistics.median(ms for *_, ms in forwards)
    classes: dict[str, list[float]] = {}
    for start, finish, ms in forwards:
        classes.setdefault(where_it_fell(start, finish, noted), []).append(ms / median)
    return classes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m opsynth.bench.free_interference")
    parser.add_argument("--gib", type=int, nargs="+", default=[2, 8], help="sizes allocated and freed, in GiB")
    args = parser.parse_args(argv)
    for gib in args.gib:
        print(f"another process allocating and freeing {gib} GiB: forward time / median forward time")
        classes = measure(gib)
        order = [f"{kind}, {when}" for kind in ("alloc", "free") for when in ["during", *_afters()]] + ["clear"]
        for where, ratios in sorted(classes.items(), key=lambda item: order.index(item[0])):
            ratios.sort()
            print(f"  {where:28s} {len(ratios):5d} forwards: median {statistics.median(ratios):.3f},"
                  f" 90th percentile {ratios[len(ratios) * 9 // 10]:.3f}, highest {ratios[-1]:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
