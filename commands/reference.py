"""`opsynth reference build`: the KernelBench fingerprint index shipped in the package, made again."""

from __future__ import annotations

from opsynth.atomic import replacing
from opsynth.commands.arguments import add_command, load_kernelbench
from opsynth.errors import UsageError


def register(sub) -> None:
    ref = add_command(
        sub,
        "reference",
        "build the embedded KernelBench fingerprint index",
        "example:\n  opsynth reference build --kernelbench KernelBench/kernelbench.parquet",
        run,
    )
    ref.add_argument("action", choices=("build",))
    ref.add_argument("--kernelbench", required=True, metavar="PATH|hub", help="KernelBench tasks to fingerprint")
    ref.add_argument("--output", help="where to write the index (default: the one shipped in the package)")


def run(args) -> int:
    from pathlib import Path

    from opsynth.filters.kernelbench_index import embedded_index_path

    if args.kernelbench == "embedded":
        raise UsageError("--kernelbench: give the KernelBench Parquet file or folder (or hub) to fingerprint")
    index = load_kernelbench(args.kernelbench)
    output = Path(args.output) if args.output else embedded_index_path()
    with replacing(output) as tmp:
        index.save(tmp)
    print(f"wrote fingerprints of {len(index.names)} KernelBench tasks to {output}")
    return 0
