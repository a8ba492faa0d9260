"""Decontamination of a task's `Model` class against KernelBench levels 1-3, by four signals: the paper's AST
similarity, the same on the normalized class, MinHash Jaccard, and the graph of what it computes; a single operator is
not judged by its graph (docs/recipe.md, "Decontamination"). The reference is filters.kernelbench_index."""

from __future__ import annotations

from dataclasses import dataclass

from opsynth.config import AST_SIMILARITY_THRESHOLD, GRAPH_SIMILARITY_THRESHOLD, KERNELBENCH_JACCARD_THRESHOLD
from opsynth.filters.ast_search import best_match
from opsynth.filters.ast_similarity import profile
from opsynth.filters.compute_graph import graph_similarity, shared_operators
from opsynth.filters.kernelbench_index import KernelBenchIndex, fingerprint
from opsynth.reasons import KEEP, KERNELBENCH_NEAR_DUPLICATE, LOAD_ERROR, Verdict

TOO_DEEP = "nested too deeply to be compared with KernelBench"


@dataclass(frozen=True)
class Similarity:
    """The three signals of one program against the reference, and the task nearest by the paper's score."""

    ast: float
    ast_normalized: float
    jaccard: float
    nearest: str
    nearest_normalized: str
    nearest_jaccard: str
    graph: float | None = None  # None: the task's graph is not known (not recorded, or a single operator)
    nearest_graph: str = ""
    shared: tuple[str, ...] = ()  # the operators it shares with `nearest_graph`

    def measurements(self) -> dict:
        measured = {
            "kb_ast_similarity": self.ast,
            "kb_ast_similarity_normalized": self.ast_normalized,
            "kb_minhash_jaccard": self.jaccard,
            "kb_nearest": self.nearest,
        }
        if self.graph is not None:
            measured |= {"kb_graph_similarity": self.graph, "kb_nearest_graph": self.nearest_graph}
        return measured


def similarity(source: str, index: KernelBenchIndex, graph: dict[str, int] | None = None, nodes: int = 0) -> Similarity:
    """The signals of a program against the reference; the graph's where `graph` (its features, of `nodes`
    operators, as the shape check records them) is given and holds more than one operator."""
    index.table.forget_transient()  # the programs compared before this one, once they are many
    fp = fingerprint(index.table, source)
    if fp.raw_root is None:
        ast_score, ast_at, norm_score, norm_at = 0.0, 0, 0.0, 0
    else:
        ast_score, ast_at = best_match(index.table, profile(index.table, fp.raw_root), index.raw_references)
        norm_score, norm_at = best_match(
            index.table, profile(index.table, fp.normalized_root), index.normalized_references
        )
    agreement = (index.signatures == fp.signature[None, :]).mean(axis=1)
    jaccard_at = int(agreement.argmax())
    graph_score, graph_at = nearest_graph(graph, index) if graph and nodes > 1 else (None, 0)
    return Similarity(
        ast=ast_score,
        ast_normalized=norm_score,
        jaccard=round(float(agreement[jaccard_at]), 4),
        nearest=index.names[ast_at],
        nearest_normalized=index.names[norm_at],
        nearest_jaccard=index.names[jaccard_at],
        graph=graph_score,
        nearest_graph=index.names[graph_at] if graph_score is not None else "",
        shared=tuple(shared_operators(graph, index.graphs[graph_at])) if graph_score else (),
    )


def nearest_graph(graph: dict[str, int], index: KernelBenchIndex) -> tuple[float, int]:
    """The highest graph similarity to a reference task, and that task's place in the index (the first, of
    equals)."""
    total = sum(graph.values())
    best, at = -1.0, 0
    for i, (ref, ref_total) in enumerate(zip(index.graphs, index.graph_totals, strict=True)):
        score = -1.0 if ref is None else graph_similarity(graph, ref, total, ref_total)
        if score > best:
            best, at = score, i
    return round(max(best, 0.0), 4), at


def near_duplicate_reason(
    s: Similarity, ast_threshold: float, jaccard_threshold: float, graph_threshold: float = GRAPH_SIMILARITY_THRESHOLD
) -> str | None:
    """Why a task is a KernelBench near-duplicate, or None."""
    if s.ast > ast_threshold:
        return f"AST similarity {s.ast:.4f} > {ast_threshold} with {s.nearest}"
    if s.ast_normalized > ast_threshold:
        return f"normalized AST similarity {s.ast_normalized:.4f} > {ast_threshold} with {s.nearest_normalized}"
    if s.jaccard > jaccard_threshold:
        return f"MinHash Jaccard {s.jaccard:.4f} > {jaccard_threshold} with {s.nearest_jaccard}"
    if s.graph is not None and s.graph >= graph_threshold:
        return (f"computes what {s.nearest_graph} does: operator-graph similarity {s.graph:.4f} >= "
                f"{graph_threshold} (shared operators: {', '.join(s.shared)})")  # fmt: skip
    return None


def decontaminate(
    source: str,
    index: KernelBenchIndex,
    ast_threshold: float = AST_SIMILARITY_THRESHOLD,
    jaccard_threshold: float = KERNELBENCH_JACCARD_THRESHOLD,
    graph: dict[str, int] | None = None,
    nodes: int = 0,
) -> Verdict:
    """The verdict of one program against the reference; `graph` and `nodes`: what its shape check recorded."""
    try:
        s = similarity(source, index, graph, nodes)
    except RecursionError:  # compared as a tree: a program nested past Python's recursion limit cannot be
        return Verdict(LOAD_ERROR, TOO_DEEP)
    why = near_duplicate_reason(s, ast_threshold, jaccard_threshold)
    if why:
        return Verdict(KERNELBENCH_NEAR_DUPLICATE, why, s.measurements())
    return Verdict(KEEP, "", s.measurements())
