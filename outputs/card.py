"""The dataset card (`README.md`): YAML front matter the Hub reads, then what the data is and how it was made.

Everything in it is computed from `stats.json`'s content, so the card and the stats never disagree.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from opsynth.atomic import write_text_atomic
from opsynth.config import GRAPH_SIMILARITY_THRESHOLD
from opsynth.outputs.figures import FIGURES
from opsynth.outputs.schema import REJECTED_SCHEMA, TASK_SCHEMA
from opsynth.reasons import NOT_NEEDED

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


HF_DTYPES = {pa.string(): "string", pa.int32(): "int32", pa.int64(): "int64", pa.float64(): "float64"}


def split_info(paths: list[Path]) -> dict:
    """Rows and sizes of one split, read from its written shards."""
    metas = [pq.ParquetFile(p).metadata for p in paths]
    return {
        "num_examples": sum(m.num_rows for m in metas),
        "num_bytes": sum(m.row_group(i).total_byte_size for m in metas for i in range(m.num_row_groups)),
        "download_size": sum(p.stat().st_size for p in paths),
    }


def dataset_info(config_name: str, schema: pa.Schema, info: dict) -> dict:
    # Besides describing the data, this block is what `datasets` hashes for a local folder with `configs`:
    # without it, a regenerated folder (or another folder of the same name) would load from a stale cache.
    return {
        "config_name": config_name,
        "features": [{"name": f.name, "dtype": HF_DTYPES[f.type]} for f in schema],
        "splits": [{"name": "train", "num_bytes": info["num_bytes"], "num_examples": info["num_examples"]}],
        "download_size": info["download_size"],
        "dataset_size": info["num_bytes"],
    }


def front_matter(stats: dict, splits: dict[str, dict]) -> str:
    """The YAML block the Hub reads: configs, licence, tags, sizes, and `dataset_info` per config."""
    meta = {
        "license": LICENSE,
        "pretty_name": _title(stats),
        "task_categories": ["text-generation"],
        "language": ["en"],
        "tags": ["cuda", "kernelbench", "code", "pytorch", "synthetic"],
        "size_categories": [size_category(stats["counts"]["rows"])],
        "configs": [{"config_name": "default", "data_files": [{"split": "train", "path": "data/train-*"}]}],
        "dataset_info": [dataset_info("default", TASK_SCHEMA, splits["default"])],
    }
    if splits["rejected"]["num_examples"]:  # a config of no rows would not load
        meta["configs"].append(
            {"config_name": "rejected", "data_files": [{"split": "train", "path": "rejected/rejected-*"}]}
        )
        meta["dataset_info"].append(dataset_info("rejected", REJECTED_SCHEMA, splits["rejected"]))
    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True) + "---"


def _table(header: tuple[str, ...], rows: list[tuple]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


NOT_RUN = "past the round's need (not judged)"


def _funnel_rows(stats: dict) -> list[tuple]:
    """The funnel per stage. The selection keeps the rows: what it skipped as duplicates is dropped, and the
    accepted candidates past the quota are said as such (they are in neither the set nor the rejected split),
    as are those the execution stage did not need (see `pipeline.selection.FillPoint`)."""
    rows = []
    for stage, f in stats["funnel"].items():
        dropped = [f"{NOT_RUN if k == NOT_NEEDED else k}: {v}" for k, v in f["dropped"].items()]
        kept = f["kept"]
        beyond = stats["counts"].get("accepted_not_selected", 0)
        if stage == "select" and beyond:
            kept = stats["counts"]["rows"]
            dropped.append(f"beyond the quota (accepted, not needed): {beyond}")
        rows.append((stage, f["in"], kept, ", ".join(dropped) or "-"))
    return rows


def _title(stats: dict) -> str:
    """What was made: rows, and the data sources that have some."""
    sources = [s for s, n in stats["rows_per_data_source"].items() if n]
    made = f"{stats['counts']['rows']} rows from {', '.join(sources)}" if sources else f"{stats['counts']['rows']} rows"
    return f"opsynth tasks: {made} (recipe {stats['config']['preset']}, seed {stats['config']['seed']})"


def _effort(stats: dict) -> list[str]:
    """What executing the candidates took: executions per row, and how busy the GPUs were meanwhile."""
    counts = stats["counts"]
    if not counts.get("executions"):
        return []
    line = f"{counts['executions']} executions on the device ({counts['executions_per_row']} per row"
    busy = stats.get("gpu_busy") or {}
    if busy.get("per_gpu"):
        gpus = ", ".join(f"{100 * b:.0f} %" for b in busy["per_gpu"])
        line += f"); GPU busy {gpus} from the first execution to the last (NVML, over {busy['executing_s']:g} s)."
    else:
        line += ")."
    return [line, ""]


def render_card(stats: dict, splits: dict[str, dict]) -> str:
    cfg = stats["config"]
    counts = stats["counts"]
    rows = counts["rows"]
    lines = [front_matter(stats, splits), "", f"# {_title(stats)}", ""]
    lines += [
        f"{rows} KernelBench-style PyTorch tasks for training agents that write CUDA kernels. Each row is a",
        "program with `class Model(nn.Module)`, `get_inputs()` and `get_init_inputs()` that fuses up to five",
        "PyTorch operators; an agent must write a faster `ModelNew`. The recipe is that of CUDA-Agent-Ops-6K",
        "(the CUDA Agent paper): operators sampled from a typed catalog and composed programmatically, then",
        "filtered for determinism, distinguishable outputs, a runtime window, `torch.compile` agreement and",
        "similarity to KernelBench (by its code's AST and tokens, and by the graph of operators it computes; a task",
        "of a single operator, as KernelBench's level 1 and the released set have many, is not judged by its graph).",
        "",
        "## Load it",
        "",
        "```python",
        "from datasets import load_dataset",
        'tasks = load_dataset("PATH_OR_REPO_ID", split="train")',
        *(
            ['rejected = load_dataset("PATH_OR_REPO_ID", "rejected", split="train")  # every dropped candidate']
            if splits["rejected"]["num_examples"]
            else []
        ),
        "```",
        "",
        *(
            []
            if splits["rejected"]["num_examples"]
            else ["No candidate was rejected: the set has no `rejected` config.", ""]
        ),
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
            ("KernelBench AST similarity threshold", cfg["similarity_threshold"]),
            ("MinHash Jaccard threshold", cfg["jaccard_threshold"]),
            ("operator-graph similarity threshold", GRAPH_SIMILARITY_THRESHOLD),
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
    for source, e in stats.get("exhausted_data_sources", {}).items():
        asked = stats["requested_quota_per_data_source"][source]
        lines += [
            "",
            f"{source} was asked for {asked} rows but stopped at {e['rows']}: in round {e['after_round']} only "
            f"{e['round_rows']} of its {e['round_candidates']} candidates became rows, so its {e['moved_rows']} "
            f"missing rows were made as {e['moved_to']}.",
        ]
    lines += [
        "",
        "## Funnel",
        "",
        f"{counts['candidates']} candidates, {counts['accepted']} accepted, {rows} selected.",
        "",
        *_effort(stats),
    ]
    lines += _table(("stage", "in", "kept", "dropped (reason: count)"), _funnel_rows(stats))
    lines += ["", "## Figures", ""]
    lines += [f"![{title}](figures/{name}.png)" for name, title in FIGURES.items()]
    lines += [
        "",
        "## Columns",
        "",
        "`ops`, `data_source` and `code` are the columns of CUDA-Agent-Ops-6K, unchanged. `id` is a hash of",
        "`code`; `num_ops` the operator count; `input_shapes` the shapes and dtypes of `get_inputs()`;",
        "`eager_ms` / `compile_ms` the median forward times on `device_name`; `kb_ast_similarity` (the",
        "paper's score), `kb_ast_similarity_normalized`, `kb_minhash_jaccard` and `kb_nearest` compare the",
        "Model class with KernelBench levels 1-3; `seed` is the candidate seed; `generator_version`.",
        "",
        "## Citation",
        "",
        "The recipe: *CUDA Agent: Large-Scale Agentic RL for High-Performance CUDA Kernel Generation*, ByteDance",
        "Seed and Tsinghua AIR, arXiv:2602.24286. The decontamination reference: *KernelBench: Can LLMs Write",
        "Efficient GPU Kernels?*, Ouyang et al., arXiv:2502.10517.",
        "",
    ]
    return "\n".join(lines)


def write_card(path: Path, stats: dict, splits: dict[str, dict]) -> None:
    write_text_atomic(path, render_card(stats, splits))
