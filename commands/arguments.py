"""Options and settings several commands share: where tasks execute, the KernelBench reference and its
thresholds, the task input, and the checks on their values."""

from __future__ import annotations

import argparse
import os

from opsynth.config import AST_SIMILARITY_THRESHOLD, KERNELBENCH_JACCARD_THRESHOLD, WORKLOADS
from opsynth.errors import UsageError

EXCLUSIVE_CHECKS_HELP = (
    "CUDA: hold the GPU alone for all of a task's device work, not only for its timings (by default the checks "
    "of up to 3 tasks share it); slower, for telling a sharing problem apart"
)


def add_command(sub, name: str, help: str, examples: str, run) -> argparse.ArgumentParser:
    """A subcommand run by `run(args)`, its examples shown under its --help as written."""
    parser = sub.add_parser(name, help=help, epilog=examples, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(run=run)
    return parser


def add_execution_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        default="auto",
        choices=("auto", "cuda", "cpu"),
        help="where tasks execute (default: auto)",
    )
    p.add_argument("--workload", choices=tuple(WORKLOADS), help="task sizes and window: gpu (default on CUDA) or tiny")
    p.add_argument("--runtime-window-ms", metavar="LO,HI", help="eager time window (default: the workload's)")
    p.add_argument("--timeout-s", type=float,
                   help="per-task time limit in CPU seconds per worker thread (default: the workload's)")  # fmt: skip
    p.add_argument("--no-compile-check", action="store_true", help="skip the torch.compile run and comparison")
    add_sharing(p)
    p.add_argument(
        "--workers",
        type=int,
        help="execution worker processes (default: cores on CPU; on CUDA all cores but 2 with the compile check, "
        "else 2 per GPU)",
    )
    add_decontamination_args(p)


def add_decontamination_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--kernelbench",
        default="embedded",
        metavar="embedded|hub|PATH",
        help="decontamination reference: the shipped index, the Hub copy, or a Parquet file / folder",
    )
    p.add_argument(
        "--jaccard-threshold",
        type=float,
        default=KERNELBENCH_JACCARD_THRESHOLD,
        help="MinHash Jaccard above which a task is a KernelBench near-duplicate (default %(default)s)",
    )
    p.add_argument(
        "--similarity-threshold",
        type=float,
        default=AST_SIMILARITY_THRESHOLD,
        help="AST similarity (the paper's, or on normalized code) above which a task is a KernelBench "
        "near-duplicate (default %(default)s)",
    )


def add_task_input_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "input", help="a .py task, a folder of them, a Parquet file with a `code` column, or a dataset folder"
    )
    p.add_argument("--report", help="write one JSON line per task to this file")


def add_sharing(p: argparse.ArgumentParser) -> None:
    p.add_argument("--exclusive-checks", dest="shared_checks", action="store_false", help=EXCLUSIVE_CHECKS_HELP)
    # The checks' sharing was opt-in before it became the default; commands that ask for it still run.
    p.add_argument("--shared-checks", dest="shared_checks", action="store_true", help=argparse.SUPPRESS)


def resolve_device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is visible here; use --device cpu (with --workload tiny)")
    return requested


def positive(name: str, value, kind=int):
    if value is not None and value <= 0:
        raise UsageError(f"{name} must be a positive {'integer' if kind is int else 'number'}, got {value}")
    return value


def execution_settings(args, remote: bool = False, plan: bool = False) -> dict:
    """The execution options; `remote` when a distributed runner's workers, not this machine, run the tasks;
    `plan` when nothing runs, so a device named need not be here."""
    from opsynth.bytecode import compile_ahead
    from opsynth.options import check_workload, parse_window

    # The values first, which need no torch: a mistyped one is told before the device is looked at.
    positive("--workers", args.workers)
    timeout_s = positive("--timeout-s", args.timeout_s, float)
    given_window = parse_window(args.runtime_window_ms) if args.runtime_window_ms else None
    given_workload = check_workload(args.workload) if args.workload else None
    decontamination = decontamination_settings(args)
    if plan and args.device in ("cuda", "cpu"):
        device = args.device
    elif remote:
        if args.device not in ("cuda", "cpu"):
            raise UsageError("--device: with a distributed --runner say where the workers run: cuda or cpu")
        if args.workers is None:
            raise UsageError("--workers: with a distributed --runner give the execution processes per Beam worker "
                             "(with the compile check, all cores of a worker machine but 2)")  # fmt: skip
        device = args.device
    else:
        compile_ahead()  # the libraries this process and the workers it starts import: see opsynth.bytecode
        device = resolve_device(args.device)
    workload = given_workload or ("gpu" if device == "cuda" else "tiny")
    wl = WORKLOADS[workload]
    return {
        "device": device,
        "workload": workload,
        "runtime_window_ms": given_window or wl.runtime_window_ms,
        "timeout_s": timeout_s or wl.timeout_s,
        "compile_check": not args.no_compile_check,
        "workers": args.workers or default_workers(device, not args.no_compile_check),
        "shared_checks": args.shared_checks,
        **decontamination,
    }


def decontamination_settings(args) -> dict:
    for name in ("similarity_threshold", "jaccard_threshold"):
        value = getattr(args, name)
        if not 0.0 <= value <= 1.0:
            raise UsageError(f"--{name.replace('_', '-')} must lie in [0, 1], got {value}")
    return {
        "kernelbench": args.kernelbench,
        "similarity_threshold": args.similarity_threshold,
        "jaccard_threshold": args.jaccard_threshold,
    }


def default_workers(device: str, compile_check: bool) -> int:
    """CPU: one per core. CUDA: the device lock lets one task per GPU run its forwards, so 2 per GPU keep each
    busy; with the compile check, which is CPU work, all cores but two (the driver's), at least 2 per GPU."""
    cores = os.cpu_count() or 1
    if device == "cuda":
        import torch

        per_gpu_floor = 2 * max(1, torch.cuda.device_count())
        return max(per_gpu_floor, cores - 2) if compile_check else per_gpu_floor
    return max(1, cores)


def load_kernelbench(spec: str):
    """The KernelBench reference, loaded before any work; one that cannot be read is a usage error."""
    from opsynth.filters.kernelbench_index import ReferenceError_, load_reference

    try:
        return load_reference(spec)
    except ReferenceError_ as e:
        raise UsageError(f"--kernelbench: {e}") from None
