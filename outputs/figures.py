"""The card's figures: ops per task, top operators, eager time with the window, KernelBench similarity with
the threshold (the paper's Fig. 7 shows the same distribution). PNGs written atomically under `figures/`."""

from __future__ import annotations

import bisect
import json
import math
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
    return log_spaced(max(min(values), 1e-4), max(values), count)


def log_spaced(lo: float, hi: float, count: int) -> list[float] | int:
    """The edges of `count` bins evenly spaced in log scale from `lo` to `hi` (10 bins where they are equal)."""
    return [lo * (hi / lo) ** (i / count) for i in range(count + 1)] if hi > lo else 10


def save(fig, path: Path) -> None:
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight", format="png")


# The figures' histograms are gathered as the rows stream past, in bins fixed beforehand, so that what a run holds
# for them does not grow with its rows (a list of every row's value, handed to matplotlib, took 190 MiB more at its
# end in a 600,000-row run). Eager times go into fine bins, evenly spaced in log scale, that the figure sums into
# its own 40 over the range the rows span; similarity scores go into the figure's own bins.
EAGER_MS_RANGE = (1e-4, 1e6)  # eager ms outside it count in its end bins
EAGER_FINE_BINS_PER_DECADE = 100  # bins 2.3 % wide: the figure's 40 bins are drawn to within one of them
EAGER_BINS = 40
SIMILARITY_BINS = 50  # over [0, 1]
SIMILARITY_EDGES = [i / SIMILARITY_BINS for i in range(SIMILARITY_BINS + 1)]


_FINE_BINS = round(math.log10(EAGER_MS_RANGE[1] / EAGER_MS_RANGE[0]) * EAGER_FINE_BINS_PER_DECADE)


def _fine_bin(ms: float) -> int:
    lo, hi = EAGER_MS_RANGE
    decades = math.log10(min(max(ms, lo), hi) / lo)
    return min(int(decades * EAGER_FINE_BINS_PER_DECADE), _FINE_BINS - 1)


def _fine_edge(i: int) -> float:
    return EAGER_MS_RANGE[0] * 10 ** (i / EAGER_FINE_BINS_PER_DECADE)


@dataclass
class FigureData:
    """What the figures need of the rows, gathered as the rows stream past: counts of operators and of rows per
    histogram bin, no code and nothing per row."""

    operators: Counter = field(default_factory=Counter)
    eager_fine: Counter = field(default_factory=Counter)  # fine bin (see _fine_bin) -> rows
    similarity: list[int] = field(default_factory=lambda: [0] * SIMILARITY_BINS)

    def add(self, row: dict) -> dict:
        if row["data_source"] != "transformers":
            self.operators.update(json.loads(row["ops"]))
        if row["eager_ms"]:
            self.eager_fine[_fine_bin(row["eager_ms"])] += 1
        if (score := row["kb_ast_similarity"]) is not None:
            i = bisect.bisect_right(SIMILARITY_EDGES, score) - 1  # as numpy bins: the last one closed
            self.similarity[min(max(i, 0), SIMILARITY_BINS - 1)] += 1
        return row

    def eager_histogram(self) -> tuple[list[float], list[int]] | None:
        """(edges, counts) of EAGER_BINS bins evenly spaced in log scale over the fine bins the rows fill, each
        fine bin counted in the bin its middle falls in; None without rows."""
        if not self.eager_fine:
            return None
        first, last = min(self.eager_fine), max(self.eager_fine)
        edges = log_spaced(_fine_edge(first), _fine_edge(last + 1), EAGER_BINS)
        counts = [0] * (len(edges) - 1)
        for i, n in self.eager_fine.items():
            middle = math.sqrt(_fine_edge(i) * _fine_edge(i + 1))
            counts[min(bisect.bisect_right(edges, middle) - 1, len(counts) - 1)] += n
        return edges, counts


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

    eager = data.eager_histogram()
    low, high = cfg["runtime_window_ms"]
    fig, ax = axes(6, 3.2)
    if eager is not None:
        edges, counts = eager
        ax.hist(edges[:-1], bins=edges, weights=counts, color="#8172B2")
        ax.set_xscale("log")
    for edge in (low, high):
        if edge > 0:
            ax.axvline(edge, color="k", linestyle="--", linewidth=1)
    ax.set_xlabel(f"eager ms on {stats['device']}")
    ax.set_ylabel("rows")
    counts_on(ax.yaxis)
    ax.set_title(FIGURES["eager_time"])
    save(fig, figures / "eager_time.png")

    fig, ax = axes(6, 3.2)
    ax.axvspan(0.25, 0.35, color="#DDDDDD", label="most of the paper's kept tasks")
    edges = SIMILARITY_EDGES
    ax.hist(edges[:-1], bins=edges, weights=data.similarity, color="#C44E52", label="this set")
    ax.axvline(cfg["similarity_threshold"], color="k", linestyle="--", linewidth=1, label="threshold")
    ax.set_xlim(0, 1)
    ax.set_xlabel("kb_ast_similarity (max over KernelBench levels 1-3)")
    ax.set_ylabel("rows")
    counts_on(ax.yaxis)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3, frameon=False)  # off the data
    ax.set_title(FIGURES["kb_similarity"])
    save(fig, figures / "kb_similarity.png")
    return [f"figures/{name}.png" for name in FIGURES]
