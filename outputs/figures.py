"""The card's figures: ops per task, top operators, eager time with the window, KernelBench similarity with
the threshold (the paper's Fig. 7 shows the same distribution). PNGs written atomically under `figures/`."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from opsynth.atomic import replacing

FIGURES = {
    "ops_per_task": "Rows per data source",
    "top_operators": "The 25 most frequent operators",
    "eager_time": "Eager time per forward, with the runtime window",
    "kb_similarity": "AST similarity to the nearest KernelBench task, with the threshold",
}


def axes(width: float, height: float):
    # Figure without pyplot: no backend selection and no global state, so it is safe in any worker. Imported
    # here: a run draws at its end, and its driver need not import matplotlib as it starts.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    return fig, fig.subplots()


def counts_on(axis) -> None:
    """Whole numbers only on an axis that counts rows or occurrences."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def log_bins(values: list[float], count: int) -> list[float] | int:
    """`count` histogram bins evenly spaced in log scale over the (positive) values' range."""
    lo, hi = max(min(values), 1e-4), max(values)
    return [lo * (hi / lo) ** (i / count) for i in range(count + 1)] if hi > lo else 10


def save(fig, path: Path) -> None:
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight", format="png")


@dataclass
class FigureData:
    """What the figures need of the rows, gathered as the rows stream past: a few numbers per row, no code."""

    operators: Counter = field(default_factory=Counter)
    eager_ms: list[float] = field(default_factory=list)
    kb_ast_similarity: list[float] = field(default_factory=list)

    def add(self, row: dict) -> dict:
        if row["data_source"] != "transformers":
            self.operators.update(json.loads(row["ops"]))
        if row["eager_ms"]:
            self.eager_ms.append(row["eager_ms"])
        if row["kb_ast_similarity"] is not None:
            self.kb_ast_similarity.append(row["kb_ast_similarity"])
        return row


def write_figures(folder: Path, data: FigureData, stats: dict) -> list[str]:
    """Draw every figure from what was gathered of the rows written; returns their paths relative to the
    dataset folder."""
    figures = folder / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    cfg = stats["config"]

    fig, ax = axes(6, 3.2)
    sources = list(stats["rows_per_data_source"])
    ax.bar(sources, [stats["rows_per_data_source"][s] for s in sources], color="#4C72B0")
    ax.tick_params(axis="x", labelrotation=30)  # "torch#5" and "transformers" side by side would overlap
    ax.set_ylabel("rows")
    counts_on(ax.yaxis)
    ax.set_title(FIGURES["ops_per_task"])
    save(fig, figures / "ops_per_task.png")

    top = data.operators.most_common(25)[::-1]
    fig, ax = axes(6, 6)
    ax.barh([name for name, _ in top], [n for _, n in top], color="#55A868")
    ax.set_xlabel("occurrences in ops")
    counts_on(ax.xaxis)
    ax.set_title(FIGURES["top_operators"])
    save(fig, figures / "top_operators.png")

    eager = data.eager_ms
    low, high = cfg["runtime_window_ms"]
    fig, ax = axes(6, 3.2)
    if eager:
        ax.hist(eager, bins=log_bins(eager, 40), color="#8172B2")
        ax.set_xscale("log")
    for edge in (low, high):
        if edge > 0:
            ax.axvline(edge, color="k", linestyle="--", linewidth=1)
    ax.set_xlabel(f"eager ms on {stats['device']}")
    ax.set_ylabel("rows")
    counts_on(ax.yaxis)
    ax.set_title(FIGURES["eager_time"])
    save(fig, figures / "eager_time.png")

    scores = data.kb_ast_similarity
    fig, ax = axes(6, 3.2)
    ax.axvspan(0.25, 0.35, color="#DDDDDD", label="most of the paper's kept tasks")
    ax.hist(scores, bins=[i / 50 for i in range(51)], color="#C44E52", label="this set")
    ax.axvline(cfg["similarity_threshold"], color="k", linestyle="--", linewidth=1, label="threshold")
    ax.set_xlim(0, 1)
    ax.set_xlabel("kb_ast_similarity (max over KernelBench levels 1-3)")
    ax.set_ylabel("rows")
    counts_on(ax.yaxis)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3, frameon=False)  # off the data
    ax.set_title(FIGURES["kb_similarity"])
    save(fig, figures / "kb_similarity.png")
    return [f"figures/{name}.png" for name in FIGURES]
