"""Decontamination against KernelBench levels 1-3, on the `Model` class, with three signals:

- `kb_ast_similarity`: the paper's structural AST similarity (continuous-eval's `PythonASTSimilarity`);
- `kb_ast_similarity_normalized`: the same after removing no-ops (docstrings, annotations, ...), which an
  edited copy cannot dodge by adding a docstring;
- `kb_minhash_jaccard`: MinHash Jaccard of token 3-grams of the canonicalized class (identifiers renamed).

The reference is an index of fingerprints (type-only AST skeletons and MinHash signatures, no source), built
from a Parquet file, a folder of `.py` tasks or the Hub copy, or the one shipped in the package.
"""

from __future__ import annotations

import ast
import gzip
import importlib.resources
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from opsynth import syntax
from opsynth.config import (
    AST_SIMILARITY_THRESHOLD,
    KERNELBENCH_JACCARD_THRESHOLD,
    MINHASH_PERMUTATIONS,
    MINHASH_SEED,
    MINHASH_SHINGLE,
)
from opsynth.filters.ast_similarity import Profile, SkeletonTable, best_match, profile
from opsynth.filters.minhash import token_minhash
from opsynth.filters.normalize import canonical_tree, code_tokens
from opsynth.filters.task_loading import model_class_node
from opsynth.reasons import KEEP, KERNELBENCH_NEAR_DUPLICATE, LOAD_ERROR, Verdict

EMBEDDED_INDEX = "kernelbench_index.json.gz"
INDEX_FORMAT = 2
HUB_DATASET = "ScalingIntelligence/KernelBench"
LEVELS = (1, 2, 3)
TOO_DEEP = "nested too deeply to be compared with KernelBench"


class ReferenceError_(ValueError):
    """The KernelBench reference cannot be read or has the wrong shape."""


def minhash_signature(canonical: ast.AST | None) -> np.ndarray:
    """MinHash of token 3-grams of a canonicalized tree."""
    tokens = code_tokens(ast.unparse(canonical)) if canonical is not None else []
    return token_minhash(tokens, MINHASH_SEED).hashvalues.astype(np.uint64)


@dataclass(frozen=True)
class Fingerprint:
    """What decontamination compares, for one program: two skeleton roots and a MinHash signature."""

    raw_root: int | None  # the Model class as written (None: it does not parse, or names no class)
    normalized_root: int | None  # the canonicalized Model class (no no-ops), nodes labeled by identifier
    signature: np.ndarray


def fingerprint(table: SkeletonTable, source: str) -> Fingerprint:
    tree = model_class_node(source)  # the class the loader runs, aliases followed; never the whole file
    if tree is None:
        return Fingerprint(None, None, minhash_signature(None))
    canonical = canonical_tree(tree)
    return Fingerprint(table.from_ast(tree), table.from_ast(canonical, labeled=True), minhash_signature(canonical))


@dataclass
class KernelBenchIndex:
    """Fingerprints of the reference tasks, named `level2/12_Gemm_Multiply_LeakyReLU`."""

    names: tuple[str, ...]
    signatures: np.ndarray  # (tasks, MINHASH_PERMUTATIONS) uint64
    table: SkeletonTable
    raw_roots: tuple[int, ...]
    normalized_roots: tuple[int, ...]
    raw_profiles: list[Profile] = field(init=False)
    normalized_profiles: list[Profile] = field(init=False)

    def __post_init__(self) -> None:
        self.raw_profiles = [profile(self.table, r) for r in self.raw_roots]
        self.normalized_profiles = [profile(self.table, r) for r in self.normalized_roots]

    @classmethod
    def from_tasks(cls, tasks: list[tuple[str, str]]) -> KernelBenchIndex:
        if not tasks:
            raise ReferenceError_("the KernelBench reference holds no tasks")
        table = SkeletonTable()
        prints = []
        for name, code in tasks:
            if not isinstance(code, str) or not code.strip():
                raise ReferenceError_(f"KernelBench task {name} has no code")
            try:
                syntax.parse(code)
            except SyntaxError:
                raise ReferenceError_(f"KernelBench task {name} does not parse") from None
            if model_class_node(code) is None:
                raise ReferenceError_(f"KernelBench task {name} defines no `class Model`")
            prints.append(fingerprint(table, code))
        return cls(
            names=tuple(n for n, _ in tasks),
            signatures=np.stack([fp.signature for fp in prints]),
            table=table,
            raw_roots=tuple(fp.raw_root for fp in prints),
            normalized_roots=tuple(fp.normalized_root for fp in prints),
        )

    def to_json(self) -> dict:
        return {
            "format": INDEX_FORMAT,
            "minhash": {"permutations": MINHASH_PERMUTATIONS, "seed": MINHASH_SEED, "shingle": MINHASH_SHINGLE},
            "names": list(self.names),
            "signatures": [[int(v) for v in row] for row in self.signatures],
            "raw_skeletons": [self.table.to_preorder(r) for r in self.raw_roots],
            "normalized_skeletons": [self.table.to_preorder(r) for r in self.normalized_roots],
        }

    @classmethod
    def from_json(cls, data: dict) -> KernelBenchIndex:
        wanted = {"permutations": MINHASH_PERMUTATIONS, "seed": MINHASH_SEED, "shingle": MINHASH_SHINGLE}
        if data.get("format") != INDEX_FORMAT or data.get("minhash") != wanted:
            raise ReferenceError_("the KernelBench index was built by another opsynth version; rebuild it")
        table = SkeletonTable()
        return cls(
            names=tuple(data["names"]),
            signatures=np.array(data["signatures"], dtype=np.uint64),
            table=table,
            raw_roots=tuple(table.from_preorder([tuple(x) for x in s]) for s in data["raw_skeletons"]),
            normalized_roots=tuple(table.from_preorder([tuple(x) for x in s]) for s in data["normalized_skeletons"]),
        )

    def save(self, path: Path) -> None:
        payload = json.dumps(self.to_json(), separators=(",", ":")).encode()
        with open(path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as gz:
            gz.write(payload)

    @classmethod
    def load(cls, path) -> KernelBenchIndex:
        with path.open("rb") as f, gzip.GzipFile(fileobj=f) as gz:
            return cls.from_json(json.loads(gz.read()))


@dataclass(frozen=True)
class Similarity:
    """The three signals of one program against the reference, and the task nearest by the paper's score."""

    ast: float
    ast_normalized: float
    jaccard: float
    nearest: str
    nearest_normalized: str
    nearest_jaccard: str

    def measurements(self) -> dict:
        return {
            "kb_ast_similarity": self.ast,
            "kb_ast_similarity_normalized": self.ast_normalized,
            "kb_minhash_jaccard": self.jaccard,
            "kb_nearest": self.nearest,
        }


def similarity(source: str, index: KernelBenchIndex) -> Similarity:
    fp = fingerprint(index.table, source)
    if fp.raw_root is None:
        ast_score, ast_at, norm_score, norm_at = 0.0, 0, 0.0, 0
    else:
        ast_score, ast_at = best_match(index.table, profile(index.table, fp.raw_root), index.raw_profiles)
        norm_score, norm_at = best_match(
            index.table, profile(index.table, fp.normalized_root), index.normalized_profiles
        )
    agreement = (index.signatures == fp.signature[None, :]).mean(axis=1)
    jaccard_at = int(agreement.argmax())
    return Similarity(
        ast=ast_score,
        ast_normalized=norm_score,
        jaccard=round(float(agreement[jaccard_at]), 4),
        nearest=index.names[ast_at],
        nearest_normalized=index.names[norm_at],
        nearest_jaccard=index.names[jaccard_at],
    )


def near_duplicate_reason(s: Similarity, ast_threshold: float, jaccard_threshold: float) -> str | None:
    """Why a task is a KernelBench near-duplicate, or None."""
    if s.ast > ast_threshold:
        return f"AST similarity {s.ast:.4f} > {ast_threshold} with {s.nearest}"
    if s.ast_normalized > ast_threshold:
        return f"normalized AST similarity {s.ast_normalized:.4f} > {ast_threshold} with {s.nearest_normalized}"
    if s.jaccard > jaccard_threshold:
        return f"MinHash Jaccard {s.jaccard:.4f} > {jaccard_threshold} with {s.nearest_jaccard}"
    return None


def decontaminate(
    source: str,
    index: KernelBenchIndex,
    ast_threshold: float = AST_SIMILARITY_THRESHOLD,
    jaccard_threshold: float = KERNELBENCH_JACCARD_THRESHOLD,
) -> Verdict:
    try:
        s = similarity(source, index)
    except RecursionError:  # compared as a tree: a program nested past Python's recursion limit cannot be
        return Verdict(LOAD_ERROR, TOO_DEEP)
    why = near_duplicate_reason(s, ast_threshold, jaccard_threshold)
    if why:
        return Verdict(KERNELBENCH_NEAR_DUPLICATE, why, s.measurements())
    return Verdict(KEEP, "", s.measurements())


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


def embedded_index_path() -> Path:
    """Where the shipped index lies, inside the installed package."""
    return Path(str(importlib.resources.files("opsynth.filters") / "data" / EMBEDDED_INDEX))


def load_reference(spec: str) -> KernelBenchIndex:
    """`embedded` (the shipped index), `hub`, or a path to a Parquet file or a folder of `.py` tasks."""
    if spec == "embedded":
        return KernelBenchIndex.load(embedded_index_path())
    if spec == "hub":
        return KernelBenchIndex.from_tasks(tasks_from_hub())
    path = Path(spec)
    if path.is_dir():
        return KernelBenchIndex.from_tasks(tasks_from_folder(path))
    if path.is_file():
        return KernelBenchIndex.from_tasks(tasks_from_parquet(path))
    raise ReferenceError_(f"{spec}: no such file or folder (use embedded, hub, or a path)")
