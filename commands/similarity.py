"""`opsynth similarity`: the four KernelBench similarity signals of existing tasks, one JSON line each; a flagged
task's line says why (the KernelBench task, the signal, and for the operator graph the operators shared)."""

from __future__ import annotations

import json
import statistics
import sys

from opsynth.commands.arguments import (
    add_command,
    add_decontamination_args,
    add_task_input_args,
    decontamination_settings,
    load_kernelbench,
)


def register(sub) -> None:
    sim = add_command(
        sub,
        "similarity",
        "KernelBench similarity of tasks: the paper's AST score, the normalized one, MinHash, the operator graph",
        "examples:\n  opsynth similarity task.py\n  opsynth similarity train.parquet --report sims.jsonl",
        run,
    )
    add_task_input_args(sim)
    add_decontamination_args(sim)


def run(args) -> int:
    settings = decontamination_settings(args)
    index = load_kernelbench(settings["kernelbench"])
    lines, summary = similarity_report(
        args.input, index, settings["similarity_threshold"], settings["jaccard_threshold"]
    )
    if args.report:
        from pathlib import Path

        from opsynth.atomic import write_text_atomic

        write_text_atomic(Path(args.report), "".join(json.dumps(line) + "\n" for line in lines))
    for line in lines:
        print(json.dumps(line))
    print(summary, file=sys.stderr)
    return 0


def similarity_report(
    input_path: str, index, similarity_threshold: float, jaccard_threshold: float
) -> tuple[list[dict], str]:
    """(one record per task, a one-line summary)."""
    from opsynth.commands.validation import read_tasks
    from opsynth.filters.decontamination import TOO_DEEP, near_duplicate_reason, similarity
    from opsynth.filters.kernelbench_index import recorded_graphs

    tasks = read_tasks(input_path)
    graphs = recorded_graphs([source for _, source in tasks])  # task code runs in contained workers only
    key = "row" if input_path.endswith(".parquet") else "task"
    lines = []
    for (name, source), (graph, nodes) in zip(tasks, graphs, strict=True):
        label = {key: int(name) if key == "row" and name.isdigit() else name}
        try:
            s = similarity(source, index, graph, nodes)
        except RecursionError:
            lines.append({**label, "error": TOO_DEEP})
            continue
        why = near_duplicate_reason(s, similarity_threshold, jaccard_threshold)
        shared = {"kb_graph_shared_operators": list(s.shared)} if s.graph is not None else {}
        lines.append({**label, **s.measurements(), **shared, "kernelbench_near_duplicate": why is not None,
                      **({"reason": why} if why else {})})  # fmt: skip
    scores = [line["kb_ast_similarity"] for line in lines if "error" not in line] or [0.0]
    flagged = sum(line.get("kernelbench_near_duplicate", False) for line in lines)
    summary = (
        f"{len(lines)} tasks: kb_ast_similarity median {statistics.median(scores):.4f}, max {max(scores):.4f}; "
        f"{flagged} KernelBench near-duplicates"
    )
    return lines, summary
