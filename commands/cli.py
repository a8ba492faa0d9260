"""The `opsynth` command line: typed subcommands, examples in `--help`, and one place that turns exceptions
into one-line, actionable messages (exit 2 for usage errors, 1 for failures, no traceback without --debug).
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import signal
import sys

from opsynth.config import AST_SIMILARITY_THRESHOLD, DEFAULT_PRESET, KERNELBENCH_JACCARD_THRESHOLD, WORKLOADS
from opsynth.errors import OpsynthError, UsageError

NUMERIC_VALUE_OPTIONS = frozenset({"--runtime-window-ms", "--seed", "--num-samples", "--timeout-s", "--workers",
                                   "--similarity-threshold", "--jaccard-threshold", "--sample", "--n"})  # fmt: skip
BENCH_CANDIDATES = 200  # opsynth bench's default --n
FAULT_TRIALS = 20  # opsynth bench faults' default --n: trials of each kind
EXCLUSIVE_CHECKS_HELP = (
    "CUDA: hold the GPU alone for all of a task's device work, not only for its timings (by default the checks "
    "of up to 3 tasks share it); slower, for telling a sharing problem apart"
)
GENERATE_EXAMPLES = """examples:
  opsynth generate --out out --num-samples 20 --device cpu --workload tiny
  opsynth generate --out ops6k --preset ops6k --device cuda
  opsynth generate --out mix --num-samples 1000 --mixture torch1=10,torch2=60,torch3=30 --seed 7
  opsynth generate --out out --num-samples 200 --direct_num_workers 2 --direct_running_mode multi_processing
Options not listed here are passed to Apache Beam (e.g. --runner, --direct_num_workers)."""

VALIDATE_EXAMPLES = """examples:
  opsynth validate task.py --device cpu --runtime-window-ms 0,100
  opsynth validate tasks/ --device cuda --report verdicts.jsonl
  opsynth validate CUDA-Agent-Ops-6K/data/train.parquet --no-compile-check
  opsynth validate out --sample 100 --device cuda --workers 1   (a generated set: re-measure 100 of its rows)"""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line that points at --help (exit 2), and no abbreviated flags:
    with Beam's options passing through, `--num-sample` must be an error, not a guess."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise UsageError(f"{message} (see `{self.prog} --help`)")


class _Version(argparse.Action):
    """`--version`: opsynth's, its operator catalog's (a hash of its entries), torch's, Beam's and Python's."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        import platform

        import apache_beam
        import torch

        from opsynth.config import VERSION
        from opsynth.operator_catalog import catalog_version

        print(f"opsynth {VERSION} (catalog {catalog_version()}; torch {torch.__version__}; apache-beam "
              f"{apache_beam.__version__}; Python {platform.python_version()})")  # fmt: skip
        parser.exit()


def _add_execution_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        default="auto",
        choices=("auto", "cuda", "cpu"),
        help="where tasks execute (default: auto)",
    )
    p.add_argument("--workload", choices=tuple(WORKLOADS), help="task sizes and window: gpu (default on CUDA) or tiny")
    p.add_argument("--runtime-window-ms", metavar="LO,HI", help="eager time window (default: the workload's)")
    p.add_argument("--timeout-s", type=float, help="per-task execution time limit (default: the workload's)")
    p.add_argument("--no-compile-check", action="store_true", help="skip the torch.compile run and comparison")
    _add_sharing(p)
    p.add_argument(
        "--workers",
        type=int,
        help="execution worker processes (default: cores on CPU; on CUDA all cores but 2 with the compile check, "
        "else 2 per GPU)",
    )
    _add_decontamination_args(p)


def _add_decontamination_args(p: argparse.ArgumentParser) -> None:
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


def _add_task_input_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "input", help="a .py task, a folder of them, a Parquet file with a `code` column, or a dataset folder"
    )
    p.add_argument("--report", help="write one JSON line per task to this file")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="opsynth", description="Synthesize KernelBench-style tasks for CUDA-kernel agents.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--version", action=_Version, help="print the versions of opsynth, its catalog, torch and Beam")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    gen = sub.add_parser(
        "generate",
        help="run the pipeline and write a dataset folder",
        epilog=GENERATE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gen.add_argument("--out", help="output folder (new, empty, or an unfinished run to resume); not with --plan")
    gen.add_argument(
        "--plan",
        action="store_true",
        help="make no dataset: estimate on the CPU whether each data source holds enough distinct tasks for its "
        "rows, print the estimate, and exit (2 naming a source that falls short)",
    )
    gen.add_argument(
        "--work-dir",
        help="where rounds and checkpoints go, reachable by every Beam worker (gs://... on Dataflow; "
        "default DIR/.opsynth)",
    )
    gen.add_argument("--num-samples", type=int, help="rows in the dataset (default: the preset's)")
    gen.add_argument("--seed", type=int, default=0, help="run seed (default 0)")
    gen.add_argument(
        "--preset", default=DEFAULT_PRESET, help=f"recipe: ops6k, ops60k, ops600k (default {DEFAULT_PRESET})"
    )
    gen.add_argument(
        "--mixture",
        help="rows per data source in percent, e.g. torch1=3.40,torch2=83.77,...,transformers=1.18",
    )
    gen.add_argument(
        "--op-weights",
        choices=("ops6k", "uniform"),
        help="how operators are drawn: as often as CUDA-Agent-Ops-6K uses them, or uniformly (default: the preset's)",
    )
    gen.add_argument(
        "--batch-size",
        type=int,
        help="candidates handed to the workers at once (default: a whole round with Beam's local runner in this "
        "process, else 64 per worker; results are checkpointed every 30 s either way)",
    )
    gen.add_argument(
        "--accelerator",
        help="a distributed runner: the accelerator resource hint of the execution stage alone, in the runner's "
        "format (Dataflow: 'type:nvidia-l4;count:1;install-nvidia-driver'), so the CPU stages can run on CPU workers",
    )
    _add_execution_args(gen)

    val = sub.add_parser(
        "validate",
        help="run every filter on existing tasks and print a verdict per task",
        epilog=VALIDATE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_task_input_args(val)
    val.add_argument("--sample", type=int, help="validate this many of the tasks, drawn at random")
    val.add_argument("--sample-seed", type=int, default=0, help="seeds the --sample draw (default 0)")
    val.add_argument(
        "--exit-zero", action="store_true", help="exit 0 even where tasks fail (by default a failing task exits 1)"
    )
    _add_execution_args(val)

    sim = sub.add_parser(
        "similarity",
        help="KernelBench similarity of tasks: the paper's AST score, the normalized one, MinHash Jaccard",
        epilog="examples:\n  opsynth similarity task.py\n  opsynth similarity train.parquet --report sims.jsonl",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_task_input_args(sim)
    _add_decontamination_args(sim)

    pub = sub.add_parser(
        "publish",
        help="upload a finished dataset folder to the Hugging Face Hub in one commit",
        epilog="examples:\n  opsynth publish out --repo-id my-org/cuda-tasks-6k --dry-run\n"
        "  opsynth publish out --repo-id my-org/cuda-tasks-6k --private\n"
        "The token comes from HF_TOKEN or `hf auth login`; it is never printed or written.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    pub.add_argument("folder", help="the --out folder of a finished opsynth generate run")
    pub.add_argument("--repo-id", required=True, help="ORG/NAME of the dataset repository (created if missing)")
    pub.add_argument("--private", action="store_true", help="create the repository private")
    pub.add_argument("--revision", help="branch to commit to (created if missing; default main)")
    pub.add_argument("--dry-run", action="store_true", help="check the folder and list what would be uploaded")

    bench = sub.add_parser(
        "bench",
        help="measure the throughput of a stage and write it as JSON",
        epilog="examples:\n  opsynth bench cpu --n 500\n  opsynth bench decontam --n 300\n"
        "  opsynth bench execute --device cuda --n 400 --out gpu.json\n  opsynth bench faults --n 20 --out faults.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument(
        "stage",
        choices=("cpu", "decontam", "execute", "gpu", "faults"),
        help="gpu: execute on CUDA; faults: kill, starve and damage tiny runs, and validate hostile tasks",
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
    _add_sharing(bench)
    bench.add_argument("--out", help="also write the result to this JSON file")

    cat = sub.add_parser(
        "catalog",
        help="list the operator catalog, or `catalog check` it on the meta device",
        epilog=(
            "examples:\n  opsynth catalog\n  opsynth catalog --json\n  opsynth catalog check\n"
            "  opsynth catalog check --execute --no-compile-check"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cat.add_argument("action", nargs="?", choices=("list", "check"), default="list")
    cat.add_argument("--json", action="store_true", help='print {"entries": [...]} as JSON')
    cat.add_argument(
        "--execute",
        action="store_true",
        help="check: also run each entry's one-operator tiny task through the execution filters on the CPU",
    )
    cat.add_argument("--no-compile-check", action="store_true", help="--execute: skip the torch.compile check")
    cat.add_argument(
        "--device",
        default="cpu",
        choices=("auto", "cuda", "cpu"),
        help="--execute: where to run (cpu: tiny tasks; cuda: gpu-workload tasks in its window)",
    )

    cmp_ = sub.add_parser(
        "compare",
        help="report a generated folder beside CUDA-Agent-Ops-6K (Markdown and figures)",
        epilog=(
            "examples:\n  opsynth compare ops6k --out report\n"
            "  opsynth compare ops6k --released ops6k_examples.parquet --released-report validate.jsonl --out report"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmp_.add_argument("folder", help="the --out folder of a finished opsynth generate run")
    cmp_.add_argument("--released", help="released rows (Parquet with ops, data_source, code) to compare inputs with")
    cmp_.add_argument("--released-report", help="`opsynth validate --report` of those rows, for their eager times")
    cmp_.add_argument("--out", required=True, help="folder for comparison.md and its figures")

    ref = sub.add_parser(
        "reference",
        help="build the embedded KernelBench fingerprint index",
        epilog="example:\n  opsynth reference build --kernelbench KernelBench/kernelbench.parquet",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ref.add_argument("action", choices=("build",))
    ref.add_argument("--kernelbench", required=True, metavar="PATH|hub", help="KernelBench tasks to fingerprint")
    ref.add_argument("--output", help="where to write the index (default: the one shipped in the package)")
    return parser


def _resolve_device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is visible here; use --device cpu (with --workload tiny)")
    return requested


def _positive(name: str, value, kind=int):
    if value is not None and value <= 0:
        raise UsageError(f"{name} must be a positive {'integer' if kind is int else 'number'}, got {value}")
    return value


def _execution_settings(args, remote: bool = False, plan: bool = False) -> dict:
    """The execution options; `remote` when a distributed runner's workers, not this machine, run the tasks;
    `plan` when nothing runs, so a device named need not be here."""
    from opsynth.options import check_workload, parse_window

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
        device = _resolve_device(args.device)
    workload = check_workload(args.workload or ("gpu" if device == "cuda" else "tiny"))
    wl = WORKLOADS[workload]
    window = parse_window(args.runtime_window_ms) if args.runtime_window_ms else wl.runtime_window_ms
    workers = _positive("--workers", args.workers) or _default_workers(device, not args.no_compile_check)
    return {
        "device": device,
        "workload": workload,
        "runtime_window_ms": window,
        "timeout_s": _positive("--timeout-s", args.timeout_s, float) or wl.timeout_s,
        "compile_check": not args.no_compile_check,
        "workers": workers,
        "shared_checks": args.shared_checks,
        **_decontamination_settings(args),
    }


def _decontamination_settings(args) -> dict:
    for name in ("similarity_threshold", "jaccard_threshold"):
        value = getattr(args, name)
        if not 0.0 <= value <= 1.0:
            raise UsageError(f"--{name.replace('_', '-')} must lie in [0, 1], got {value}")
    return {
        "kernelbench": args.kernelbench,
        "similarity_threshold": args.similarity_threshold,
        "jaccard_threshold": args.jaccard_threshold,
    }


def _add_sharing(p: argparse.ArgumentParser) -> None:
    p.add_argument("--exclusive-checks", dest="shared_checks", action="store_false", help=EXCLUSIVE_CHECKS_HELP)
    # The checks' sharing was opt-in before it became the default; commands that ask for it still run.
    p.add_argument("--shared-checks", dest="shared_checks", action="store_true", help=argparse.SUPPRESS)


def _default_workers(device: str, compile_check: bool) -> int:
    """CPU: one per core. CUDA: the device lock lets one task per GPU run its forwards, so 2 per GPU keep each
    busy; with the compile check, which is CPU work, all cores but two (the driver's), at least 2 per GPU."""
    cores = os.cpu_count() or 1
    if device == "cuda":
        import torch

        per_gpu_floor = 2 * max(1, torch.cuda.device_count())
        return max(per_gpu_floor, cores - 2) if compile_check else per_gpu_floor
    return max(1, cores)


def _load_kernelbench(spec: str):
    """The KernelBench reference, loaded before any work; one that cannot be read is a usage error."""
    from opsynth.filters.decontamination import ReferenceError_, load_reference

    try:
        return load_reference(spec)
    except ReferenceError_ as e:
        raise UsageError(f"--kernelbench: {e}") from None


def _unknown_beam_args(extra: list[str]) -> list[str]:
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in PipelineOptions.__subclasses__():
        cls._add_argparse_args(parser)
    _, unknown = parser.parse_known_args(extra)
    return unknown


LOCAL_RUNNERS = {"directrunner", "direct", "prismrunner", "prism", "interactiverunner"}


def _distributed_runner(extra: list[str]) -> str | None:
    """The --runner among the Beam options when it runs the work on other machines (Dataflow, Flink, Spark)."""
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    runner = PipelineOptions(extra).view_as(StandardOptions).runner
    return runner if runner and runner.lower() not in LOCAL_RUNNERS else None


def _default_batch_size(workers: int, beam_args: list[str]) -> int:
    """A whole round where the pipelines run in this process (one worker pool: a batch's end would leave its
    workers idle until the batch's last task is done); else BATCH_PER_WORKER per execution worker, so a round
    spreads over the runner's workers."""
    from opsynth.config import BATCH_PER_WORKER, IN_PROCESS_BATCH
    from opsynth.pipeline.run import runs_in_this_process

    return IN_PROCESS_BATCH if runs_in_this_process(beam_args) else BATCH_PER_WORKER * workers


def cmd_generate(args, extra: list[str]) -> int:
    from opsynth.options import GenerateOptions, check_preset, parse_mixture
    from opsynth.pipeline.run import generate

    unknown = _unknown_beam_args(extra)
    if unknown:
        raise UsageError(f"unknown option {unknown[0]} (see `opsynth generate --help`; Beam options pass through)")
    if args.out is None and not args.plan:
        raise UsageError("generate needs --out DIR, the folder the dataset goes to (see `opsynth generate --help`)")
    preset = check_preset(args.preset)
    num_samples = _positive("--num-samples", args.num_samples) or preset["num_samples"]
    mixture = parse_mixture(args.mixture) if args.mixture is not None else dict(preset["mixture"])
    settings = _execution_settings(args, remote=_distributed_runner(extra) is not None, plan=args.plan)
    _load_kernelbench(settings["kernelbench"])  # fail fast: the workers load it from the spec
    batch_size = _positive("--batch-size", args.batch_size) or _default_batch_size(settings["workers"], extra)
    if args.out is not None and "://" in args.out:
        raise UsageError(
            f"--out {args.out}: the dataset is written to a local or mounted folder; "
            "put the workers' files on the object store with --work-dir instead"
        )
    options = GenerateOptions(
        out=args.out or "",
        work_dir=args.work_dir,
        num_samples=num_samples,
        seed=args.seed,
        preset=args.preset,
        mixture=mixture,
        op_weights=args.op_weights or preset["op_weights"],
        batch_size=batch_size,
        accelerator=args.accelerator or None,
        **settings,
    )
    if args.plan:
        from opsynth.pipeline.plan import plan, refuse_short, report

        plans = plan(options)
        print(report(plans, options))
        refuse_short(plans)
        return 0
    result = generate(options, extra)
    return 0 if result.rows == num_samples else 1


def cmd_validate(args) -> int:
    from opsynth.commands.validate import (
        compare_recorded,
        read_tasks,
        recorded_eager_ms,
        sample_tasks,
        summarize,
        validate_tasks,
        write_report,
    )
    from opsynth.pipeline.run import execution_config

    tasks = read_tasks(args.input)
    if args.sample is not None:
        tasks = sample_tasks(tasks, args.sample, args.sample_seed)
    s = _execution_settings(args)
    execution = execution_config(
        s["device"], s["runtime_window_ms"], s["timeout_s"], s["compile_check"], s["workers"], s["shared_checks"]
    )
    index = _load_kernelbench(s["kernelbench"])
    results = validate_tasks(tasks, execution, index, s["similarity_threshold"], s["jaccard_threshold"])
    if args.report:
        write_report(args.report, results)
    for r in results:
        detail = f"  ({r.verdict.detail})" if r.verdict.detail else ""
        print(f"{r.task}: {r.verdict.reason}{detail}")
    print(summarize(results))
    recorded = compare_recorded(results, recorded_eager_ms(args.input))
    if recorded:
        print(recorded)
    return 0 if args.exit_zero or all(r.verdict.kept for r in results) else 1


def cmd_similarity(args) -> int:
    from opsynth.commands.similarity import similarity_report

    settings = _decontamination_settings(args)
    index = _load_kernelbench(settings["kernelbench"])
    lines, summary = similarity_report(
        args.input, index, settings["similarity_threshold"], settings["jaccard_threshold"]
    )
    if args.report:
        from pathlib import Path

        from opsynth.outputs.shards import write_text_atomic

        write_text_atomic(Path(args.report), "".join(json.dumps(line) + "\n" for line in lines))
    for line in lines:
        print(json.dumps(line))
    print(summary, file=sys.stderr)
    return 0


def cmd_bench(args) -> int:
    if args.stage == "faults":
        from opsynth.bench.faults import run_faults

        return _write_bench(run_faults(_positive("--n", args.n) or FAULT_TRIALS), args.out)
    from opsynth.bench.harness import run_bench

    if args.stage == "gpu":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("opsynth bench gpu needs a CUDA device; here use opsynth bench execute --device cpu")
    device = _resolve_device("cuda" if args.stage == "gpu" else args.device)
    workload = args.workload or ("gpu" if device == "cuda" else "tiny")
    n = _positive("--n", args.n) or BENCH_CANDIDATES
    workers = _positive("--workers", args.workers) or _default_workers(device, not args.no_compile_check)
    stage = "execute" if args.stage == "gpu" else args.stage
    result = run_bench(stage, n, workload, device, workers, not args.no_compile_check, args.shared_checks)
    return _write_bench(result, args.out)


def _write_bench(result: dict, out: str | None) -> int:
    text = json.dumps(result, indent=2)
    if out:
        from pathlib import Path

        from opsynth.outputs.shards import write_text_atomic

        write_text_atomic(Path(out), text + "\n")
    print(text)
    return 0


def cmd_catalog(args) -> int:
    from opsynth.operator_catalog import all_entries

    entries = all_entries()
    if args.action == "check":
        from opsynth.commands.catalog_check import check_entry

        failures = 0
        for entry in entries:
            if entry.excluded:
                continue
            for workload in WORKLOADS.values():
                error = check_entry(entry, workload)
                if error:
                    failures += 1
                    print(f"FAIL {entry.name} [{workload.name}]: {error}")
        checked = sum(1 for e in entries if not e.excluded)
        print(f"{checked} entries checked on meta in {len(WORKLOADS)} workloads: {failures} failures")
        if args.execute:
            failures += _execute_catalog(entries, _resolve_device(args.device), not args.no_compile_check)
        return 1 if failures else 0
    if args.json:
        rows = [
            {
                "name": e.name,
                "kind": e.kind,
                "family": e.family,
                "ranks": list(e.ranks),
                "domain": e.domain,
                "terminal": e.terminal,
                "excluded": e.excluded,
            }
            for e in entries
        ]
        print(json.dumps({"entries": rows}, indent=1))
        return 0
    for e in entries:
        print(
            f"{e.name:32s} {e.kind:12s} {e.family:14s} ranks {','.join(map(str, e.ranks))}"
            + (f"  excluded: {e.excluded}" if e.excluded else "")
        )
    print(f"{len(entries)} entries")
    return 0


def _execute_catalog(entries, device: str, compile_check: bool) -> int:
    """Run every entry's task through the execution filters (tiny on the CPU, gpu on CUDA); the number that
    fail. In this process, one task at a time: a task that crashes the process stops the check."""
    from opsynth.commands.catalog_check import execute_entry
    from opsynth.config import CALIBRATION_MAX_FACTOR, CALIBRATION_TARGET, CALIBRATION_TRIES
    from opsynth.pipeline.run import execution_config

    workload = WORKLOADS["gpu" if device == "cuda" else "tiny"]
    config = execution_config(device, workload.runtime_window_ms, workload.timeout_s, compile_check, 1)
    failures = 0
    for entry in entries:
        if not entry.excluded:
            error = execute_entry(
                entry, workload, config, CALIBRATION_TRIES, CALIBRATION_MAX_FACTOR, target=CALIBRATION_TARGET
            )
            if error:
                failures += 1
                print(f"FAIL {entry.name} [executed]: {error}")
    checked = sum(1 for e in entries if not e.excluded)
    print(
        f"{checked} entries executed on {device} ({workload.name}, compile check {'on' if compile_check else 'off'}): "
        f"{failures} failures"
    )
    return failures


def cmd_compare(args) -> int:
    from pathlib import Path

    from opsynth.commands.compare import compare

    folder = Path(args.folder)
    if not (folder / "data").is_dir() or not list((folder / "data").glob("*.parquet")):
        raise UsageError(f"{folder} is not a generated dataset folder (no data/*.parquet); give an --out of generate")
    for flag, value in (("--released", args.released), ("--released-report", args.released_report)):
        if value and not Path(value).exists():
            raise UsageError(f"{flag} {value}: no such file")
    path = compare(
        folder,
        Path(args.out),
        Path(args.released) if args.released else None,
        Path(args.released_report) if args.released_report else None,
    )
    print(f"wrote {path}")
    return 0


def cmd_reference(args) -> int:
    from pathlib import Path

    from opsynth.filters.decontamination import embedded_index_path

    if args.kernelbench == "embedded":
        raise UsageError("--kernelbench: give the KernelBench Parquet file or folder (or hub) to fingerprint")
    index = _load_kernelbench(args.kernelbench)
    output = Path(args.output) if args.output else embedded_index_path()
    tmp = output.with_name(f".tmp-{output.name}")
    index.save(tmp)
    os.replace(tmp, output)
    print(f"wrote fingerprints of {len(index.names)} KernelBench tasks to {output}")
    return 0


def _negative_values_attached(argv: list[str]) -> list[str]:
    """`--opt -1,5` as `--opt=-1,5` for the options whose values may start with a minus: argparse would read
    the value as an option and say the option lacks its argument, where the value itself is what is wrong."""
    out: list[str] = []
    for token in argv:
        if out and out[-1] in NUMERIC_VALUE_OPTIONS and token[:1] == "-" and token[1:2] in "0123456789.":
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def run(argv: list[str]) -> int:
    """Parse and run one command; raises the errors `main` reports."""
    args, extra = build_parser().parse_known_args(_negative_values_attached(argv))
    if args.command != "generate" and extra:
        raise UsageError(f"unknown option {extra[0]} (see `opsynth {args.command} --help`)")
    if args.command == "generate":
        return cmd_generate(args, extra)
    if args.command == "validate":
        return cmd_validate(args)
    if args.command == "catalog":
        return cmd_catalog(args)
    if args.command == "compare":
        return cmd_compare(args)
    if args.command == "similarity":
        return cmd_similarity(args)
    if args.command == "bench":
        return cmd_bench(args)
    if args.command == "publish":
        from opsynth.outputs.publish import publish

        publish(args.folder, args.repo_id, private=args.private, revision=args.revision, dry_run=args.dry_run)
        return 0
    return cmd_reference(args)


def _quiet_optional_beam_clients(record: logging.LogRecord) -> bool:
    # `import apache_beam` warns that its Google Cloud clients are absent; opsynth does not use them.
    return "apitools not found" not in record.getMessage()


def _traceback_if(debug: bool) -> None:
    """With --debug, the traceback of the error being handled; the exit code stays what it is without."""
    if debug:
        import traceback

        traceback.print_exc()


INTERRUPTED_EXIT = 130  # the shell's code for a command stopped by SIGINT
INTERRUPTED = "opsynth: interrupted; run the same command again to resume"


class _Interrupt:
    """Ctrl-C, noted as it comes: Beam turns a KeyboardInterrupt raised inside a stage into a RuntimeError and
    logs its traceback, so `main` tells an interrupt by this, not by the exception that reaches it."""

    seen = False

    @classmethod
    def handle(cls, signum, frame) -> None:
        cls.seen = True
        logging.disable(logging.CRITICAL)  # the stages' tracebacks of the interrupt are not news
        raise KeyboardInterrupt


def _interrupted() -> int:
    print(INTERRUPTED, file=sys.stderr)
    return INTERRUPTED_EXIT


def main(argv: list[str] | None = None) -> int:
    logging.getLogger().addFilter(_quiet_optional_beam_clients)
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]  # accepted before or after the subcommand
    watching = signal.getsignal(signal.SIGINT) is signal.default_int_handler  # not where SIGINT is ignored
    if watching:
        _Interrupt.seen = False
        signal.signal(signal.SIGINT, _Interrupt.handle)
    try:
        return _main(argv, debug)
    finally:
        if watching:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            logging.disable(logging.NOTSET)


def _main(argv: list[str], debug: bool) -> int:
    try:
        return run(argv)
    except UsageError as e:
        _traceback_if(debug)
        print(f"opsynth: error: {e}", file=sys.stderr)
        return 2
    except OpsynthError as e:
        if _Interrupt.seen:
            return _interrupted()
        _traceback_if(debug)
        print(f"opsynth: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`| head`): not an error. Point stdout at devnull so the exit flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return _interrupted()
    except Exception as e:
        if _Interrupt.seen:
            return _interrupted()
        _traceback_if(debug)
        if (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left on device" in str(e):
            print("opsynth: error: no space left on device; free some, then run the same command again (generate "
                  "resumes where it stopped)", file=sys.stderr)  # fmt: skip
            return 1
        print(f"opsynth: error: {type(e).__name__}: {e} (rerun with --debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
