"""`opsynth similarity`: the three KernelBench similarity signals of existing tasks, one JSON line each."""

from __future__ import annotations

import statistics

from filters.decontamination import KernelBenchIndex, near_duplicate_reason, similarity
from pipeline.validate import read_tasks


def similarity_report(
    input_path: str, index: KernelBenchIndex, similarity_threshold: float, jaccard_threshold: float
) -> tuple[list[dict], str]:
    """(one record per task, a one-line summary)."""
    tasks = read_tasks(input_path)
    key = "row" if input_path.endswith(".parquet") else "task"
    lines = []
    for name, source in tasks:
        s = similarity(source, index)
        flagged = near_duplicate_reason(s, similarity_threshold, jaccard_threshold) is not None
        lines.append(
            {key: int(name) if key == "row" else name, **s.measurements(), "kernelbench_near_duplicate": flagged}
        )
    scores = [line["kb_ast_similarity"] for line in lines]
    flagged = sum(line["kernelbench_near_duplicate"] for line in lines)
    summary = (
        f"{len(lines)} tasks: kb_ast_similarity median {statistics.median(scores):.4f}, max {max(scores):.4f}; "
        f"{flagged} KernelBench near-duplicates"
    )
    return lines, summary
