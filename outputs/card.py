"""The dataset card (`README.md`): YAML front matter the Hub reads, then what the data is and how it was made.

Everything in it is computed from `stats.json`'s content, so the card and the stats never disagree.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from opsynth.atomic import write_text_atomic
from opsynth.config import GRAPH_SIMILARITY_THRESHOLD
from opsynth.outputs.figures import FIGURES
from opsynth.outputs.schema import REJECTED_SCHEMA, TASK_SCHEMA
from opsynth.outputs.stats import STAGES
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


# The configs of the folder: name, where its shards are, and their schema.
CONFIGS = {"default": ("data/train-*", TASK_SCHEMA), "rejected": ("rejected/rejected-*", REJECTED_SCHEMA)}
PLACEHOLDER = "PATH_OR_REPO_ID"  # where the folder's path or the Hub repository goes in the load example


def split_info(paths: list[Path]) -> dict:
    """Rows and sizes of one split, read from its written shards."""
    metas = [pq.ParquetFile(p).metadata for p in paths]
    return {
        "num_examples": sum(m.num_rows for m in metas),
        "num_bytes": sum(m.row_group(i).total_byte_size for m in metas for i in range(m.num_row_groups)),
        "download_size": sum(p.stat().st_size for p in paths),
    }


def card_data(stats: dict, splits: dict[str, dict]):
    """The metadata the Hub reads (`huggingface_hub.DatasetCardData`): licence, tags, sizes, the configs and,
    per config, `dataset_info` with its features (`datasets`' own, from the Arrow schema). Besides describing
    the data, `dataset_info` is what `datasets` hashes for a local folder with `configs`: without it, a
    regenerated folder (or another of the same name) would load from a stale cache. A config of no rows would
    not load, so the rejected one is listed only where some candidate was rejected."""
    from datasets import DatasetInfo, Features, SplitDict, SplitInfo
    from datasets.info import DatasetInfosDict
    from huggingface_hub import DatasetCardData

    listed = [name for name in CONFIGS if name == "default" or splits[name]["num_examples"]]
    data = DatasetCardData(
        license=LICENSE,
        pretty_name=_title(stats),
        task_categories=["text-generation"],
        language=["en"],
        tags=["cuda", "kernelbench", "code", "pytorch", "synthetic"],
        size_categories=[size_category(stats["counts"]["rows"])],
        configs=[
            {"config_name": name, "data_files": [{"split": "train", "path": CONFIGS[name][0]}]} for name in listed
        ],
    )
    infos = {}
    for name in listed:
        info = splits[name]
        split_dict = SplitDict()
        split_dict.add(SplitInfo(name="train", num_bytes=info["num_bytes"], num_examples=info["num_examples"]))
        infos[name] = DatasetInfo(
            features=Features.from_arrow_schema(CONFIGS[name][1]),
            splits=split_dict,
            download_size=info["download_size"],
            dataset_size=info["num_bytes"],
        )
    DatasetInfosDict(infos).to_dataset_card_data(data)
    if isinstance(data.get("dataset_info"), dict):  # one config: a list all the same, as the Hub shows several
        data["dataset_info"] = [{"config_name": "default", **data["dataset_info"]}]
    return data


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
    funnel = stats["funnel"]  # in the pipeline's order, also once read back from stats.json (keys sorted)
    for stage, f in sorted(funnel.items(), key=lambda item: STAGES.index(item[0]) if item[0] in STAGES else 99):
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
    if counts.get("ceiling_stops"):
        line += f"; {counts['ceiling_stops']} of them first tries stopped at a first timed forward over their ceiling"
    if counts.get("memory_retries"):
        line += f"; {counts['memory_retries']} tasks run again alone, out of memory beside the others"
    busy = stats.get("gpu_busy") or {}
    if busy.get("per_gpu"):
        gpus = ", ".join(f"{100 * b:.0f} %" for b in busy["per_gpu"])
        host = f"; the host's cores {100 * busy['host_cores']:.0f} % busy meanwhile" if "host_cores" in busy else ""
        line += f"); GPU busy {gpus} from the first execution to the last (NVML, over {busy['executing_s']:g} s{host})."
    else:
        line += ")."
    return [line, ""]


def render_card(stats: dict, splits: dict[str, dict], dataset: str | None = None) -> str:
    """The card's text; its load example names `dataset` (the Hub repository, once published), else the folder
    as the run was given it."""
    from huggingface_hub import DatasetCard

    cfg = stats["config"]
    counts = stats["counts"]
    rows = counts["rows"]
    dataset = json.dumps(dataset or cfg.get("out") or PLACEHOLDER)
    lines = [f"# {_title(stats)}", ""]
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
        f'tasks = load_dataset({dataset}, split="train")',
        *(
            [f'rejected = load_dataset({dataset}, "rejected", split="train")  # every dropped candidate']
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
            ("dtypes", _dtypes(cfg.get("dtypes"))),
            ("device", stats["device"]),
            ("eager runtime window", f"[{window[0]}, {window[1]}] ms{_kept_inside(cfg.get('keep_margin'))}"),
            ("input draws told apart", _told_apart(cfg)),
            ("torch.compile check", _compile_check(cfg)),
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
        "`code`; `num_ops` the operator count; `input_shapes` the dtype and shape of each input of `get_inputs()`;",
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
    return str(DatasetCard(f"---\n{card_data(stats, splits).to_yaml()}\n---\n\n" + "\n".join(lines)))


def write_card(path: Path, stats: dict, splits: dict[str, dict]) -> None:
    write_text_atomic(path, render_card(stats, splits))


def folder_splits(folder: Path) -> dict[str, dict]:
    """Rows and sizes of each config of a written folder, read from its shards."""
    return {name: split_info(sorted(folder.glob(f"{shards}.parquet"))) for name, (shards, _) in CONFIGS.items()}


def card_for(folder: Path, dataset: str) -> str:
    """The card of a finished folder, its load example naming `dataset` (the Hub repository it goes to)."""
    stats = json.loads((folder / "stats.json").read_text())
    return render_card(stats, folder_splits(folder), dataset)


def _dtypes(weights: dict[str, float] | None) -> str:
    """The dtypes tasks were drawn in, as shares (float32 alone where none were asked)."""
    if not weights:
        return "float32"
    total = sum(weights.values())
    shares = ", ".join(f"{name} {100 * w / total:.0f} %" for name, w in weights.items())
    return f"{shares} of tasks, drawn per task"


def _kept_inside(margin: float | None) -> str:
    return f", rows kept {margin:.0%} inside it" if margin else ""


def _told_apart(cfg: dict) -> str:
    """How a row's input draws differ: in what share of their output elements, beyond what tolerance, which pairs
    (a run's config from before these were recorded says only that they differ)."""
    fraction, margin = cfg.get("distinguishing_fraction"), cfg.get("tolerance_margin") or 1
    if not fraction:
        return "differing"
    beyond = "the tolerance" if margin == 1 else f"{margin:g} times the tolerance"
    pairs = "; every two draws where the outputs are small" if cfg.get("every_pair") else ""
    return f"differing in at least {fraction:.0%} of output elements, beyond {beyond}{pairs}"


def _compile_check(cfg: dict) -> str:
    if not cfg["compile_check"]:
        return "off"
    margin, draws = cfg.get("tolerance_margin"), cfg.get("compile_draws") or 1
    within = f", agreeing with eager within the tolerance / {margin:g}" if margin else ""
    discrete = f"; on {draws} input draws where an output is discrete" if draws > 1 else ""
    return f"on{within}{discrete}"
