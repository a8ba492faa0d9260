"""`opsynth generate`: run the pipeline into a dataset folder, or `--plan` whether a mixture can be met."""

from __future__ import annotations

import contextlib
import json
import logging

from opsynth.bytecode import compile_ahead
from opsynth.commands.arguments import add_command, add_execution_args, execution_settings, load_kernelbench, positive
from opsynth.config import DEFAULT_PRESET
from opsynth.errors import UsageError
from opsynth.pipeline.engines import DIRECT_RUNNER_NAMES, runner_name, runs_in_this_process

GENERATE_EXAMPLES = """examples:
  opsynth generate --out out --num-samples 20 --device cpu --workload tiny
  opsynth generate --out ops6k --preset ops6k --device cuda
  opsynth generate --out mix --num-samples 1000 --mixture torch1=10,torch2=60,torch3=30 --seed 7
  opsynth generate --out out --num-samples 200 --direct_num_workers 2 --direct_running_mode multi_processing
Options not listed here are passed to Apache Beam (e.g. --runner, --direct_num_workers)."""


def register(sub) -> None:
    gen = add_command(
        sub,
        "generate",
        "run the pipeline and write a dataset folder",
        GENERATE_EXAMPLES,
        run,
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
        "--dtypes",
        metavar="DTYPE=WEIGHT,...",
        help="the dtypes tasks compute in, drawn per task with these weights: float32, bfloat16, float16 "
        "(e.g. float32=80,bfloat16=10,float16=10; default float32 alone)",
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
    shown = gen.add_mutually_exclusive_group()
    shown.add_argument(
        "--quiet", action="store_true", help="no progress bars or lines: only warnings, errors and the last line"
    )
    shown.add_argument(
        "--verbose",
        action="store_true",
        help="the lines of detail beside the progress bars (the execution's every 30 s), and the messages of "
        "Beam, its workers and transformers",
    )
    shown.add_argument(
        "--json",
        action="store_true",
        help="no progress lines; on success, one JSON line on stdout: folder, rows, rows per data source, what each "
        "stage kept, executions, seconds of generate",
    )
    add_execution_args(gen)


def run(args) -> int:
    from opsynth.options import GenerateOptions, check_preset, parse_dtypes, parse_mixture

    if args.out is None and not args.plan:
        raise UsageError("generate needs --out DIR, the folder the dataset goes to (see `opsynth generate --help`)")
    preset = check_preset(args.preset)
    num_samples = positive("--num-samples", args.num_samples) or preset["num_samples"]
    mixture = parse_mixture(args.mixture) if args.mixture is not None else dict(preset["mixture"])
    dtypes = parse_dtypes(args.dtypes) if args.dtypes is not None else None
    # The checks above need neither Beam nor torch, so a mistyped value is told at once; the rest import them.
    extra = args.beam_args  # the options generate does not define: Beam's
    remote = distributed_runner(extra) is not None
    if not (args.plan or remote):
        compile_ahead()  # before Beam's import: the libraries' missing bytecode (see opsynth.bytecode)
    unknown = _unknown_beam_args(extra)
    if unknown:
        raise UsageError(f"unknown option {unknown[0]} (see `opsynth generate --help`; Beam options pass through)")
    settings = execution_settings(args, remote=remote, plan=args.plan)
    load_kernelbench(settings["kernelbench"])  # fail fast: the workers load it from the spec
    batch_size = positive("--batch-size", args.batch_size) or default_batch_size(settings["workers"], extra)
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
        dtypes=dtypes,
        batch_size=batch_size,
        accelerator=args.accelerator or None,
        quiet=args.quiet or args.json,
        **settings,
    )
    if args.plan:
        from opsynth.pipeline.plan import plan, refuse_short, report

        plans = plan(options)
        print(report(plans, options))
        refuse_short(plans, options)
        return 0
    from opsynth.pipeline.display import Display, showing
    from opsynth.pipeline.run import generate
    from opsynth.pipeline.sessions import process_started

    with quiet_libraries(args.verbose), showing(Display.for_terminal(options.quiet, args.verbose)) as display:
        result = generate(
            options, extra if args.verbose else quiet_workers(extra), log=display.line, started=process_started()
        )
    print(json.dumps(summary(result), sort_keys=True) if args.json else last_line(result))
    return 0 if result.rows == num_samples else 1


LIBRARY_LOGGERS = ("apache_beam", "transformers", "datasets", "torch")


@contextlib.contextmanager
def quiet_libraries(verbose: bool):
    """While the run lasts, the libraries' own loggers say only errors unless `--verbose`: their notices (Beam's
    runner set-up, transformers' deprecations) are not the run's. Their levels are given back afterwards."""
    loggers = [logging.getLogger(name) for name in LIBRARY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logger.level if verbose else logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def last_line(result) -> str:
    """What a finished `generate` says last, on stdout."""
    if result.already_complete:
        return f"{result.out} already holds the finished dataset ({result.rows} rows); nothing to do"
    return f"wrote {result.rows} rows to {result.out / 'data'}; funnel and settings in {result.out / 'stats.json'}"


def summary(result) -> dict:
    """`generate --json`: the run in one line, from its stats.json."""
    stats = result.stats
    counts = stats.get("counts", {})
    return {
        "folder": str(result.out),
        "rows": result.rows,
        "rows_per_data_source": stats.get("rows_per_data_source"),
        # what each stage kept; the selection keeps the rows (accepted candidates beyond the quota are not kept)
        "funnel": {stage: row["kept"] for stage, row in stats.get("funnel", {}).items()} | {"select": result.rows},
        "executions": counts.get("executions"),
        "executions_per_row": counts.get("executions_per_row"),
        "sessions_s": stats.get("timings_s", {}).get("sessions_total"),
        "already_complete": result.already_complete,
    }


WORKER_LOG_LEVEL = "--default_sdk_harness_log_level"


def quiet_workers(beam_args: list[str]) -> list[str]:
    """Beam's options, with its SDK workers (the local runner's multi-processing mode, a portable runner's
    pool) logging errors only, where no level is given: their INFO and WARNING lines (channels established,
    harness starting) would fill the terminal between the progress lines, some 25 a worker."""
    if any(a == WORKER_LOG_LEVEL or a.startswith(f"{WORKER_LOG_LEVEL}=") for a in beam_args):
        return beam_args
    return [*beam_args, f"{WORKER_LOG_LEVEL}=ERROR"]


def _unknown_beam_args(extra: list[str]) -> list[str]:
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in PipelineOptions.__subclasses__():
        cls._add_argparse_args(parser)
    _, unknown = parser.parse_known_args(extra)
    return unknown


LOCAL_RUNNERS = {*DIRECT_RUNNER_NAMES, "prismrunner", "prism", "interactiverunner"}  # runners on this machine


def distributed_runner(extra: list[str]) -> str | None:
    """The --runner among the Beam options when it runs the work on other machines (Dataflow, Flink, Spark). Read
    as Beam's parser reads it (the last one given; no abbreviations; a class by its short or its full name),
    without importing Beam."""
    runner = None
    for k, arg in enumerate(extra):
        if arg == "--runner" and k + 1 < len(extra):
            runner = extra[k + 1]
        elif arg.startswith("--runner="):
            runner = arg.split("=", 1)[1]
    return runner if runner and runner_name(runner) not in LOCAL_RUNNERS else None


def default_batch_size(workers: int, beam_args: list[str]) -> int:
    """A whole round where the pipelines run in this process (one worker pool: a batch's end would leave its
    workers idle until the batch's last task is done); else BATCH_PER_WORKER per execution worker, so a round
    spreads over the runner's workers."""
    from opsynth.config import BATCH_PER_WORKER, IN_PROCESS_BATCH

    return IN_PROCESS_BATCH if runs_in_this_process(beam_args) else BATCH_PER_WORKER * workers
