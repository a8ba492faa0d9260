"""Decontamination against KernelBench levels 1-3: MinHash Jaccard of the `Model` class.

The reference is the shipped fingerprint index (signatures only, no KernelBench source), a Parquet file or a
folder of `.py` tasks, or the Hub copy; every form reduces to the same (names, signatures) index.
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from datasketch import MinHash

from filters.normalize import code_tokens, normalize_code
from filters.reasons import KEEP, KERNELBENCH_NEAR_DUPLICATE, Verdict
from filters.task_loading import model_class_node
from pipeline.config import KERNELBENCH_JACCARD_THRESHOLD, MINHASH_PERMUTATIONS, MINHASH_SEED, MINHASH_SHINGLE

EMBEDDED_INDEX = "kernelbench_index.npz"
HUB_DATASET = "ScalingIntelligence/KernelBench"
LEVELS = (1, 2, 3)


class ReferenceError_(ValueError):
    """The KernelBench reference cannot be read or has the wrong shape."""


def model_class_code(source: str) -> str:
    """The normalized `Model` class of a program (the whole program when it has no such class)."""
    node = model_class_node(source)
    return normalize_code(node if node is not None else source)


def signature(source: str) -> np.ndarray:
    """MinHash signature of token shingles of the normalized `Model` class."""
    tokens = code_tokens(model_class_code(source))
    k = MINHASH_SHINGLE
    shingles = {" ".join(tokens[i : i + k]).encode() for i in range(max(1, len(tokens) - k + 1))}
    mh = MinHash(num_perm=MINHASH_PERMUTATIONS, seed=MINHASH_SEED)
    mh.update_batch(sorted(shingles))
    return mh.hashvalues.astype(np.uint64)


@dataclass(frozen=True)
class KernelBenchIndex:
    """Names (`level2/12_Gemm_Multiply_LeakyReLU`) and MinHash signatures of the reference tasks."""

    names: tuple[str, ...]
    signatures: np.ndarray  # (len(names), MINHASH_PERMUTATIONS) uint64

    @classmethod
    def from_tasks(cls, tasks: list[tuple[str, str]]) -> KernelBenchIndex:
        if not tasks:
            raise ReferenceError_("the KernelBench reference holds no tasks")
        return cls(tuple(n for n, _ in tasks), np.stack([signature(code) for _, code in tasks]))

    def nearest(self, sig: np.ndarray) -> tuple[float, str]:
        agreement = (self.signatures == sig[None, :]).mean(axis=1)
        best = int(agreement.argmax())
        return float(agreement[best]), self.names[best]

    def save(self, path: Path) -> None:
        with open(path, "wb") as f:
            np.savez_compressed(f, names=np.array(self.names), signatures=self.signatures)

    @classmethod
    def load(cls, path) -> KernelBenchIndex:
        with np.load(path) as data:
            return cls(tuple(str(n) for n in data["names"]), data["signatures"].astype(np.uint64))


def tasks_from_parquet(path: Path) -> list[tuple[str, str]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:
        raise ReferenceError_(f"cannot read KernelBench Parquet {path}: {e}") from e
    columns = set(table.column_names)
    if "code" not in columns or "name" not in columns:
        raise ReferenceError_(
            f"{path} has columns {sorted(columns)}; a KernelBench file needs `code` and `name` (and `level`)"
        )
    rows = table.to_pylist()
    if "level" in columns:
        rows = [r for r in rows if r["level"] in LEVELS]
    return [(f"level{r['level']}/{r['name']}" if "level" in r else r["name"], r["code"]) for r in rows]


def tasks_from_folder(path: Path) -> list[tuple[str, str]]:
    files = sorted(p for p in path.rglob("*.py") if p.is_file())
    if not files:
        raise ReferenceError_(f"{path} holds no .py KernelBench tasks")
    return [(str(p.relative_to(path).with_suffix("")), p.read_text(encoding="utf-8", errors="replace")) for p in files]


def tasks_from_hub() -> list[tuple[str, str]]:
    import datasets

    try:
        splits = [datasets.load_dataset(HUB_DATASET, split=f"level_{level}") for level in LEVELS]
    except Exception as e:
        raise ReferenceError_(f"cannot load {HUB_DATASET} from the Hub ({type(e).__name__}); pass a local path") from e
    return [(f"level{lv}/{r['name']}", r["code"]) for lv, split in zip(LEVELS, splits, strict=True) for r in split]


def load_reference(spec: str) -> KernelBenchIndex:
    """`embedded` (the shipped index), `hub`, or a path to a Parquet file or a folder of `.py` tasks."""
    if spec == "embedded":
        return KernelBenchIndex.load(importlib.resources.files("filters") / "data" / EMBEDDED_INDEX)
    if spec == "hub":
        return KernelBenchIndex.from_tasks(tasks_from_hub())
    path = Path(spec)
    if path.is_dir():
        return KernelBenchIndex.from_tasks(tasks_from_folder(path))
    if path.is_file():
        return KernelBenchIndex.from_tasks(tasks_from_parquet(path))
    raise ReferenceError_(f"--kernelbench {spec}: no such file or folder (use embedded, hub, or a path)")


def decontaminate(source: str, index: KernelBenchIndex, threshold: float = KERNELBENCH_JACCARD_THRESHOLD) -> Verdict:
    jaccard, nearest = index.nearest(signature(source))
    measurements = {"kb_minhash_jaccard": jaccard, "kb_nearest": nearest}
    if jaccard > threshold:
        return Verdict(KERNELBENCH_NEAR_DUPLICATE, f"MinHash Jaccard {jaccard:.3f} with {nearest}", measurements)
    return Verdict(KEEP, "", measurements)
