"""`opsynth similarity`: the three KernelBench similarity signals of existing tasks, one JSON line each."""

from __future__ import annotations

import statistics

from opsynth.commands.validate import read_tasks
from opsynth.filters.decontamination import TOO_DEEP, KernelBenchIndex, near_duplicate_reason, similarity


def similarity_report(
    input_path: str, index: KernelBenchIndex, similarity_threshold: float, jaccard_threshold: float
) -> tuple[list[dict], str]:
    """(one record per task, a one-line summary)."""
    tasks = read_tasks(input_path)
    key = "row" if input_path.endswith(".parquet") else "task"
    lines = []
    for name, source in tasks:
        label = {key: int(name) if key == "row" and name.isdigit() else name}
        try:
            s = similarity(source, index)
        except RecursionError:
            lines.append({**label, "error": TOO_DEEP})
            continue
        flagged = near_duplicate_reason(s, similarity_threshold, jaccard_threshold) is not None
        lines.append({**label, **s.measurements(), "kernelbench_near_duplicate": flagged})
    scores = [line["kb_ast_similarity"] for line in lines if "error" not in line] or [0.0]
    flagged = sum(line.get("kernelbench_near_duplicate", False) for line in lines)
    summary = (
        f"{len(lines)} tasks: kb_ast_similarity median {statistics.median(scores):.4f}, max {max(scores):.4f}; "
        f"{flagged} KernelBench near-duplicates"
    )
    return lines, summary
