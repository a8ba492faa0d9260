"""`opsynth validate`: every filter, in the pipeline's order, on existing tasks; a verdict per task."""

from __future__ import annotations

from opsynth.commands.arguments import (
    add_command,
    add_execution_args,
    add_task_input_args,
    execution_settings,
    load_kernelbench,
)

VALIDATE_EXAMPLES = """examples:
  opsynth validate task.py --device cpu --runtime-window-ms 0,100
  opsynth validate tasks/ --device cuda --report verdicts.jsonl
  opsynth validate CUDA-Agent-Ops-6K/data/train.parquet --no-compile-check
  opsynth validate out --sample 100 --device cuda --workers 1   (a generated set: re-measure 100 of its rows)"""


def register(sub) -> None:
    val = add_command(
        sub,
        "validate",
        "run every filter on existing tasks and print a verdict per task",
        VALIDATE_EXAMPLES,
        run,
    )
    add_task_input_args(val)
    val.add_argument("--sample", type=int, help="validate this many of the tasks, drawn at random")
    val.add_argument("--sample-seed", type=int, default=0, help="seeds the --sample draw (default 0)")
    val.add_argument(
        "--exit-zero", action="store_true", help="exit 0 even where tasks fail (by default a failing task exits 1)"
    )
    add_execution_args(val)


def run(args) -> int:
    s = execution_settings(args)  # before the imports below (torch): a mistyped value is told at once
    from opsynth.commands.validation import (
        compare_recorded,
        read_tasks,
        recorded_eager_ms,
        sample_tasks,
        summarize,
        validate_tasks,
        write_report,
    )
    from opsynth.filters.execution import execution_config

    tasks = read_tasks(args.input)
    if args.sample is not None:
        tasks = sample_tasks(tasks, args.sample, args.sample_seed)
    execution = execution_config(
        s["device"], s["runtime_window_ms"], s["timeout_s"], s["compile_check"], s["workers"], s["shared_checks"]
    )
    index = load_kernelbench(s["kernelbench"])
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
