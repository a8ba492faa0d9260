"""`opsynth compare`: a generated folder beside CUDA-Agent-Ops-6K, as Markdown and figures."""

from __future__ import annotations

from opsynth.commands.arguments import add_command
from opsynth.errors import UsageError


def register(sub) -> None:
    cmp_ = add_command(
        sub,
        "compare",
        "report a generated folder beside CUDA-Agent-Ops-6K (Markdown and figures)",
        (
            "examples:\n  opsynth compare ops6k --out report\n"
            "  opsynth compare ops6k --released ops6k_examples.parquet --released-report validate.jsonl --out report"
        ),
        run,
    )
    cmp_.add_argument("folder", help="the --out folder of a finished opsynth generate run")
    cmp_.add_argument("--released", help="released rows (Parquet with ops, data_source, code) to compare inputs with")
    cmp_.add_argument("--released-report", help="`opsynth validate --report` of those rows, for their eager times")
    cmp_.add_argument("--out", required=True, help="folder for comparison.md and its figures")


def run(args) -> int:
    from pathlib import Path

    from opsynth.commands.comparison import compare

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
