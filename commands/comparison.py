"""`opsynth compare`: a generated folder side by side with CUDA-Agent-Ops-6K, as a Markdown report with figures, from
the released set's mixture and operator frequencies shipped with the package, and where given its example rows and
their validation report (docs/commands.md)."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from opsynth.atomic import write_text_atomic
from opsynth.config import AST_SIMILARITY_THRESHOLD, OPS6K_MIXTURE
from opsynth.operator_catalog.faithfulness import ops_faithful, ops_mentioned
from opsynth.operator_catalog.registry import all_entries
from opsynth.operator_catalog.weights import OPS6K_COUNTS
from opsynth.outputs.figures import axes, log_bins, save
from opsynth.outputs.stats import STAGES, spread

# Measured on the released set's 6,000 rows: distinct ordered `ops` lists over rows.
RELEASED_DISTINCT_OP_LISTS = 0.869
RELEASED_ROWS = 6000
ABSENT_SHOWN = 15  # released operators missing here, listed by name
PAPER_SIMILARITY_BAND = (0.25, 0.35)  # where the paper's Fig. 7 puts most kept tasks


@dataclass
class Side:
    """What the report reads of one set of rows."""

    name: str
    rows: list[dict]

    def ops_lists(self) -> list[tuple[str, ...]]:
        return [tuple(json.loads(r["ops"])) for r in self.rows if r["data_source"] != "transformers"]


def _read_rows(path: Path, columns: list[str]) -> list[dict]:
    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    rows: list[dict] = []
    for f in files:
        table = pq.read_table(f)
        rows.extend(table.select([c for c in columns if c in table.column_names]).to_pylist())
    return rows


def _inputs(code: str) -> tuple[int, list[str]] | None:
    """Total elements and dtypes of a task's input tensors, read by running its get_inputs() on the meta
    device; None for a task that cannot be loaded or sized, or has no input tensor."""
    import torch

    from opsynth.filters.task_loading import load_task

    try:
        task = load_task(code)
        with torch.device("meta"):
            tensors = [t for t in task.get_inputs() if isinstance(t, torch.Tensor)]
    except Exception:
        return None
    elements = sum(t.numel() for t in tensors)
    return (elements, [str(t.dtype).removeprefix("torch.") for t in tensors]) if elements else None


def _bar_compare(path: Path, labels: list[str], ours: list[float], theirs: list[float], title: str, ylabel: str):
    fig, ax = axes(7, 3.4)
    x = range(len(labels))
    ax.bar([i - 0.2 for i in x], ours, width=0.4, label="this set", color="#4C72B0")
    ax.bar([i + 0.2 for i in x], theirs, width=0.4, label="CUDA-Agent-Ops-6K", color="#DD8452")
    ax.set_xticks(list(x), labels, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    save(fig, path)


def _hist_compare(
    path: Path, ours: list[float], theirs: list[float], bins, title: str, xlabel: str, marks=(), log_x=False
):
    """Both sides' histograms over the same bins, each bar the share of that side's rows in the bin (not a
    density, which unequal log-spaced bins would distort)."""
    fig, ax = axes(7, 3.4)
    if len(theirs):
        ax.hist(theirs, bins=bins, alpha=0.6, weights=[1 / len(theirs)] * len(theirs),
                label=f"CUDA-Agent-Ops-6K examples ({len(theirs)})", color="#DD8452")  # fmt: skip
    ax.hist(ours, bins=bins, alpha=0.6, weights=[1 / len(ours)] * len(ours), label=f"this set ({len(ours)})",
            color="#4C72B0")  # fmt: skip
    if log_x:
        ax.set_xscale("log")
    for x, style in marks:
        ax.axvline(x, color="k", linestyle=style, linewidth=1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("share of rows")
    ax.set_title(title)
    ax.legend(fontsize=8)
    save(fig, path)


def compare(folder: Path, out: Path, released: Path | None = None, released_report: Path | None = None) -> Path:
    """Write `out/comparison.md` and its figures; returns the report's path."""
    ours = Side("this set", _read_rows(folder / "data", ["ops", "data_source", "code", "input_shapes", "eager_ms",
                                                            "kb_ast_similarity", "device_name"]))  # fmt: skip
    if not ours.rows:
        raise ValueError(f"{folder} holds no rows under data/")
    stats = json.loads((folder / "stats.json").read_text()) if (folder / "stats.json").exists() else {}
    theirs = Side("released examples", _read_rows(released, ["ops", "data_source", "code"]) if released else [])
    report = [json.loads(line) for line in released_report.read_text().splitlines() if line.strip()] if (
        released_report) else []  # fmt: skip
    figures = out / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    n = len(ours.rows)
    device = next((r["device_name"] for r in ours.rows if r.get("device_name")), "unknown device")
    md = [f"# {folder.name} beside CUDA-Agent-Ops-6K", ""]
    md += [f"{n:,} rows generated by opsynth (timed on {device}), compared with the released set's 6,000 rows"
           + (f" and {len(theirs.rows)} of its rows" if theirs.rows else "") + ".", ""]  # fmt: skip

    # Mixture.
    sources = Counter(r["data_source"] for r in ours.rows)
    md += [
        "## Mixture",
        "",
        "| data_source | rows | share | released rows | released share |",
        "| --- | --- | --- | --- | --- |",
    ]
    for source, share in OPS6K_MIXTURE.items():
        md.append(f"| {source} | {sources.get(source, 0):,} | {100 * sources.get(source, 0) / n:.2f} % "
                  f"| {round(RELEASED_ROWS * share / 100):,} | {share:.2f} % |")  # fmt: skip
    md.append("")

    # Operators.
    ops = Counter(op for lst in ours.ops_lists() for op in lst)
    released_total = sum(OPS6K_COUNTS.values())
    ours_total = sum(ops.values()) or 1
    common = sorted(set(ops) & set(OPS6K_COUNTS))
    md += ["## Operators", ""]
    md += [f"{len(ops)} distinct torch operators used (the released set: {len(OPS6K_COUNTS)}); "
           f"{len(set(OPS6K_COUNTS) - set(ops))} released operators do not occur.", ""]  # fmt: skip
    absent = sorted(set(OPS6K_COUNTS) - set(ops), key=lambda o: (-OPS6K_COUNTS[o], o))
    excluded = {e.name: e.excluded for e in all_entries() if e.excluded}
    for label, names in (
        ("Excluded from the catalog (the reason is in `opsynth catalog`)", [o for o in absent if o in excluded]),
        ("In the catalog, but in no row kept", [o for o in absent if o not in excluded]),
    ):
        if names:
            shown = ", ".join(f"{o} ({OPS6K_COUNTS[o]})" for o in names[:ABSENT_SHOWN])
            more = f", and {len(names) - ABSENT_SHOWN} more" if len(names) > ABSENT_SHOWN else ""
            md += [f"{label}, {len(names)}, the most used first (uses in the released set): {shown}{more}.", ""]
    if len(common) >= 3:
        from scipy.stats import spearmanr

        rho = spearmanr([ops[o] for o in common], [OPS6K_COUNTS[o] for o in common]).statistic
        md += [f"Rank correlation of operator frequencies over the {len(common)} shared operators: "
               f"Spearman {rho:.3f}.", ""]  # fmt: skip
    top = [o for o, _ in Counter(OPS6K_COUNTS).most_common(20)]
    md += ["| operator | share of ops here | share in the released set |", "| --- | --- | --- |"]
    md += [f"| {o} | {100 * ops.get(o, 0) / ours_total:.2f} % | {100 * OPS6K_COUNTS[o] / released_total:.2f} % |"
           for o in top]  # fmt: skip
    md.append("")
    _bar_compare(figures / "top_operators.png", top, [100 * ops.get(o, 0) / ours_total for o in top],
                 [100 * OPS6K_COUNTS[o] / released_total for o in top], "The released set's 20 most used operators",
                 "% of operator uses")  # fmt: skip
    md += ["![top operators](figures/top_operators.png)", ""]

    # Diversity.
    lists = ours.ops_lists()
    distinct = len(set(lists)) / max(1, len(lists))
    md += ["## Distinct operator lists", ""]
    md += [f"Distinct ordered `ops` lists per torch row: {100 * distinct:.1f} % "
           f"(the released set: {100 * RELEASED_DISTINCT_OP_LISTS:.1f} %).", ""]  # fmt: skip

    # Input sizes and dtypes.
    sizes = []
    dtypes: Counter = Counter()
    for r in ours.rows:
        shapes = r["input_shapes"]
        sizes.append(sum(math.prod(s["shape"]) for s in shapes))
        dtypes.update(s.get("dtype", "float32") for s in shapes)
    released = [x for x in (_inputs(r["code"]) for r in theirs.rows) if x]
    md += ["## Inputs", ""]
    md += [f"Input elements per task, this set: {spread(sizes)}; input tensors by dtype {dict(dtypes)}."]
    if released:
        released_dtypes = Counter(d for _, ds in released for d in ds)
        md += [f"The released examples: {spread([e for e, _ in released])}; input tensors by dtype "
               f"{dict(released_dtypes)}."]  # fmt: skip
    md.append("")

    # Eager time.
    eager = [r["eager_ms"] for r in ours.rows if r.get("eager_ms")]
    released_eager = [r["eager_ms"] for r in report if r.get("eager_ms")]
    md += ["## Eager time", "", f"This set on {device}: {spread(eager)} ms."]
    if released_eager:
        kept = sum(1 for r in report if r.get("verdict") == "keep")
        md += [f"The released examples re-measured with `opsynth validate`: {spread(released_eager)} ms; "
               f"{kept} of {len(report)} pass every check there."]  # fmt: skip
    md.append("")
    if eager:
        bins = log_bins([*eager, *released_eager], 30)
        window = stats.get("config", {}).get("runtime_window_ms", [])
        _hist_compare(figures / "eager_time.png", eager, released_eager, bins, "Eager time per forward",
                      f"ms on {device} (log scale; dashed: the runtime window)",
                      marks=[(x, "--") for x in window if x > 0], log_x=True)  # fmt: skip
        md += ["![eager time](figures/eager_time.png)", ""]

    # KernelBench similarity.
    sims = [r["kb_ast_similarity"] for r in ours.rows if r.get("kb_ast_similarity") is not None]
    released_sims = [r["kb_ast_similarity"] for r in report if r.get("kb_ast_similarity") is not None]
    low, high = PAPER_SIMILARITY_BAND
    in_band = sum(low <= s <= high for s in sims) / max(1, len(sims))
    md += ["## Similarity to KernelBench", ""]
    md += [f"`kb_ast_similarity` (the paper's score, max over KernelBench levels 1-3): {spread(sims)}; "
           f"{100 * in_band:.1f} % in [{low}, {high}], where the paper puts most kept tasks; "
           f"{sum(s > AST_SIMILARITY_THRESHOLD for s in sims)} above the {AST_SIMILARITY_THRESHOLD} threshold "
           "(the paper: none)."]  # fmt: skip
    if released_sims:
        md += [f"The released examples: {spread(released_sims)}."]
    md.append("")
    _hist_compare(figures / "kb_similarity.png", sims, released_sims, [i / 50 for i in range(51)],
                  "AST similarity to the nearest KernelBench task", "kb_ast_similarity",
                  marks=((low, ":"), (high, ":"), (AST_SIMILARITY_THRESHOLD, "--")))  # fmt: skip
    md += ["![kb similarity](figures/kb_similarity.png)", ""]

    # Faithfulness of ops: the strict reading (exactly these operators, in order) and the loose one (each occurs).
    def share(rows, check):
        torch_rows = [r for r in rows if r["data_source"] != "transformers"]
        return sum(check(r["code"], json.loads(r["ops"])) for r in torch_rows), len(torch_rows)

    md += ["## `ops` against the code", ""]
    md += ["| check | this set | the released examples |", "| --- | --- | --- |"]
    for label, check in (
        ("every listed operator occurs in the code", ops_mentioned),
        ("`ops` lists exactly the operators `forward` applies, in order", ops_faithful),
    ):
        ok, total = share(ours.rows, check)
        cells = [f"{ok:,} of {total:,} ({100 * ok / max(1, total):.1f} %)"]
        if theirs.rows:
            ok_r, total_r = share(theirs.rows, check)
            cells.append(f"{ok_r} of {total_r} ({100 * ok_r / max(1, total_r):.1f} %)")
        else:
            cells.append("n/a")
        md.append(f"| {label} | {' | '.join(cells)} |")
    md.append("")

    # Funnel.
    if stats.get("funnel"):
        md += ["## Funnel", "", "| stage | in | kept | dropped |", "| --- | --- | --- | --- |"]
        for stage in (s for s in STAGES if s in stats["funnel"]):
            f = stats["funnel"][stage]
            dropped = ", ".join(f"{k} {v:,}" for k, v in f["dropped"].items()) or "-"
            md.append(f"| {stage} | {f['in']:,} | {f['kept']:,} | {dropped} |")
        timings, rounds = stats["timings_s"], len(stats.get("rounds", []))
        sessions = timings.get("sessions", [])
        if len(sessions) > 1:
            walls = " + ".join(f"{s['wall_s']:.0f}" for s in sessions)
            md += ["", f"Wall time {timings['sessions_total']:.0f} s over {rounds} rounds, in {len(sessions)} "
                   f"processes (stopped and resumed): {walls} s.", ""]  # fmt: skip
        else:
            md += ["", f"Wall time {timings['total']:.0f} s over {rounds} rounds.", ""]

    path = out / "comparison.md"
    write_text_atomic(path, "\n".join(md))
    return path
