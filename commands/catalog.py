"""`opsynth catalog`: list the operator catalog, or check every entry (`catalog check`)."""

from __future__ import annotations

import json

from opsynth.commands.arguments import add_command, resolve_device
from opsynth.config import WORKLOADS


def register(sub) -> None:
    cat = add_command(
        sub,
        "catalog",
        "list the operator catalog, or `catalog check` it on the meta device",
        (
            "examples:\n  opsynth catalog\n  opsynth catalog --json\n  opsynth catalog check\n"
            "  opsynth catalog check --execute --no-compile-check"
        ),
        run,
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


def run(args) -> int:
    from opsynth.operator_catalog import all_entries

    entries = all_entries()
    if args.action == "check":
        from opsynth.commands.catalog_check import check_entry
        from opsynth.filters.worker_setup import quiet_library_notices

        quiet_library_notices()  # the meta checks here build transformers modules standalone, as tasks do
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
            failures += _execute_catalog(entries, resolve_device(args.device), not args.no_compile_check)
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
    """Run every entry's task through the execution filters (tiny on the CPU, gpu on CUDA) in contained workers,
    as `generate` runs its candidates (a task that crashes costs its own try); the number that fail."""
    from opsynth.commands.arguments import default_workers
    from opsynth.commands.catalog_check import execute_entries
    from opsynth.filters.execution import execution_config
    from opsynth.filters.workers import WorkerPool

    workload = WORKLOADS["gpu" if device == "cuda" else "tiny"]
    workers = default_workers(device, compile_check)
    config = execution_config(device, workload.runtime_window_ms, workload.timeout_s, compile_check, workers)
    checked = [e for e in entries if not e.excluded]
    with WorkerPool(config) as pool:
        errors = execute_entries(checked, workload, pool)
    failures = 0
    for entry in checked:
        if errors[entry.name]:
            failures += 1
            print(f"FAIL {entry.name} [executed]: {errors[entry.name]}")
    compiled = "on" if compile_check else "off"
    print(
        f"{len(checked)} entries executed on {device} ({workload.name}, compile check {compiled}): {failures} failures"
    )
    return failures
