"""The dataset card (`README.md`): YAML front matter the Hub reads, then what the data is and how it was made.

Everything in it is computed from `stats.json`'s content, so the card and the stats never disagree.
"""

from __future__ import annotations

from pathlib import Path

from outputs.shards import write_text_atomic

LICENSE = "apache-2.0"


def size_category(n: int) -> str:
    for limit, label in (
        (1_000, "n<1K"),
        (10_000, "1K<n<10K"),
        (100_000, "10K<n<100K"),
        (1_000_000, "100K<n<1M"),
    ):
        if n < limit:
            return label
    return "1M<n<10M"


def front_matter(stats: dict) -> str:
    cfg = stats["config"]
    return "\n".join(
        [
            "---",
            f"license: {LICENSE}",
            f"pretty_name: opsynth {cfg['preset']} tasks (seed {cfg['seed']}, {stats['counts']['rows']} rows)",
            "task_categories:",
            "- text-generation",
            "language:",
            "- en",
            "tags:",
            "- cuda",
            "- kernelbench",
            "- code",
            "- pytorch",
            "- synthetic",
            "size_categories:",
            f"- {size_category(stats['counts']['rows'])}",
            "configs:",
            "- config_name: default",
            "  data_files:",
            "  - split: train",
            "    path: data/train-*",
            "- config_name: rejected",
            "  data_files:",
            "  - split: train",
            "    path: rejected/rejected-*",
            "---",
        ]
    )


def _table(header: tuple[str, ...], rows: list[tuple]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def render_card(stats: dict) -> str:
    cfg = stats["config"]
    counts = stats["counts"]
    rows = counts["rows"]
    lines = [front_matter(stats), "", f"# {cfg['preset']} tasks made by opsynth", ""]
    lines += [
        f"{rows} KernelBench-style PyTorch tasks for training agents that write CUDA kernels. Each row is a",
        "program with `class Model(nn.Module)`, `get_inputs()` and `get_init_inputs()` that fuses up to five",
        "PyTorch operators; an agent must write a faster `ModelNew`. The recipe is that of CUDA-Agent-Ops-6K",
        "(the CUDA Agent paper): operators sampled from a typed catalog and composed programmatically, then",
        "filtered for determinism, distinguishable outputs, a runtime window, `torch.compile` agreement and",
        "similarity to KernelBench.",
        "",
        "## Load it",
        "",
        "```python",
        "from datasets import load_dataset",
        'tasks = load_dataset("PATH_OR_REPO_ID", split="train")',
        'rejected = load_dataset("PATH_OR_REPO_ID", "rejected", split="train")  # every dropped candidate',
        "```",
        "",
        "## How this set was made",
        "",
    ]
    window = cfg["runtime_window_ms"]
    lines += _table(
        ("setting", "value"),
        [
            ("seed", cfg["seed"]),
            ("workload", cfg["workload"]),
            ("device", stats["device"]),
            ("eager runtime window", f"[{window[0]}, {window[1]}] ms"),
            ("torch.compile check", "on" if cfg["compile_check"] else "off"),
            ("KernelBench reference", cfg["kernelbench"]),
            ("MinHash Jaccard threshold", cfg["jaccard_threshold"]),
            ("generator", stats["versions"]["opsynth"]),
            ("torch", stats["versions"]["torch"]),
        ],
    )
    lines += ["", "## Composition", ""]
    lines += _table(
        ("data_source", "rows", "share", "released set"),
        [
            (
                s,
                n,
                f"{100 * n / rows:.2f} %" if rows else "-",
                f"{stats['released_mixture_percent'][s]:.2f} %",
            )
            for s, n in stats["rows_per_data_source"].items()
        ],
    )
    lines += [
        "",
        "## Funnel",
        "",
        f"{counts['candidates']} candidates, {counts['accepted']} accepted, {rows} selected.",
        "",
    ]
    lines += _table(
        ("stage", "in", "kept", "dropped (reason: count)"),
        [
            (stage, f["in"], f["kept"], ", ".join(f"{k}: {v}" for k, v in f["dropped"].items()) or "-")
            for stage, f in stats["funnel"].items()
        ],
    )
    lines += [
        "",
        "## Columns",
        "",
        "`ops`, `data_source` and `code` are the columns of CUDA-Agent-Ops-6K, unchanged. `id` is a hash of",
        "`code`; `num_ops` the operator count; `input_shapes` the shapes and dtypes of `get_inputs()`;",
        "`eager_ms` / `compile_ms` the median forward times on `device_name`; `kb_minhash_jaccard` and",
        "`kb_nearest` the nearest KernelBench level 1-3 task; `seed` the candidate seed; `generator_version`.",
        "",
        "## Citation",
        "",
        "The recipe: *CUDA Agent: Large-Scale Agentic RL for High-Performance CUDA Kernel Generation*, ByteDance",
        "Seed and Tsinghua AIR, arXiv:2602.24286. The decontamination reference: *KernelBench: Can LLMs Write",
        "Efficient GPU Kernels?*, Ouyang et al., arXiv:2502.10517.",
        "",
    ]
    return "\n".join(lines)


def write_card(path: Path, stats: dict) -> None:
    write_text_atomic(path, render_card(stats))
