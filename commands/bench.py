"""`opsynth bench`: a stage's throughput, the selection's state per row, or the fault suite, as JSON."""

from __future__ import annotations

import json

from opsynth.commands.arguments import add_command, add_sharing, default_workers, positive, resolve_device
from opsynth.config import WORKLOADS
from opsynth.errors import UsageError

BENCH_CANDIDATES = 200  # opsynth bench's default --n
FAULT_TRIALS = 20  # opsynth bench faults' default --n: trials of each kind


def register(sub) -> None:
    bench = add_command(
        sub,
        "bench",
        "measure the throughput of a stage and write it as JSON",
        "examples:\n  opsynth bench cpu --n 500\n  opsynth bench decontam --n 300\n"
        "  opsynth bench execute --device cuda --n 400 --out gpu.json\n  opsynth bench selection --n 600000\n"
        "  opsynth bench faults --n 20 --out faults.json",
        run,
    )
    bench.add_argument(
        "stage",
        choices=("cpu", "decontam", "execute", "gpu", "selection", "faults"),
        help="gpu: execute on CUDA; selection: the state kept per row; faults: kill, starve and damage tiny runs, "
        "and validate hostile tasks",
    )
    bench.add_argument(
        "--n", type=int, help="candidates to push through (default 200); faults: trials of each kind (default 20)"
    )
    bench.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    bench.add_argument("--workload", choices=tuple(WORKLOADS), help="default: gpu on CUDA, else tiny")
    bench.add_argument(
        "--workers",
        type=int,
        help="execution workers (default as for generate: cores on CPU; on CUDA all cores but 2 with the compile "
        "check, else 2 per GPU)",
    )
    bench.add_argument("--no-compile-check", action="store_true")
    add_sharing(bench)
    bench.add_argument("--out", help="also write the result to this JSON file")


def run(args) -> int:
    if args.stage == "faults":
        from opsynth.bench.faults import run_faults

        return _write_bench(run_faults(positive("--n", args.n) or FAULT_TRIALS), args.out)
    from opsynth.bench.harness import run_bench

    if args.stage == "gpu":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("opsynth bench gpu needs a CUDA device; here use opsynth bench execute --device cpu")
    device = resolve_device("cuda" if args.stage == "gpu" else args.device)
    workload = args.workload or ("gpu" if device == "cuda" else "tiny")
    n = positive("--n", args.n) or BENCH_CANDIDATES
    workers = positive("--workers", args.workers) or default_workers(device, not args.no_compile_check)
    stage = "execute" if args.stage == "gpu" else args.stage
    result = run_bench(stage, n, workload, device, workers, not args.no_compile_check, args.shared_checks)
    return _write_bench(result, args.out)


def _write_bench(result: dict, out: str | None) -> int:
    text = json.dumps(result, indent=2)
    if out:
        from pathlib import Path

        from opsynth.atomic import write_text_atomic

        write_text_atomic(Path(out), text + "\n")
    print(text)
    return 0
