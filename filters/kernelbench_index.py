"""The KernelBench reference of decontamination: an index of fingerprints of its tasks (no source), built from a
Parquet file, a folder of `.py` tasks or the Hub copy, or the one shipped in the package (docs/decontamination.md,
"The reference")."""

from __future__ import annotations

import ast
import gzip
import importlib.resources
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from opsynth import syntax
from opsynth.config import MINHASH_PERMUTATIONS, MINHASH_SEED, MINHASH_SHINGLE
from opsynth.filters.ast_search import ReferenceSet
from opsynth.filters.ast_similarity import Profile, SkeletonTable, profile
from opsynth.filters.minhash import token_minhash
from opsynth.filters.normalize import canonical_tree, code_tokens
from opsynth.filters.task_loading import model_class_node

EMBEDDED_INDEX = "kernelbench_index.json.gz"
INDEX_FORMAT = 3
HUB_DATASET = "ScalingIntelligence/KernelBench"
LEVELS = (1, 2, 3)
REFERENCE_WORKERS = 4  # processes that record the reference's graphs


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
    graphs: tuple[dict[str, int] | None, ...]  # None: the task's forward could not be recorded on meta
    raw_profiles: list[Profile] = field(init=False)
    normalized_profiles: list[Profile] = field(init=False)
    raw_references: ReferenceSet = field(init=False)  # the profiles, ready for filters.ast_search.best_match
    normalized_references: ReferenceSet = field(init=False)
    graph_totals: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.table.keep()  # the references' structures; a compared program's are dropped in time (decontamination)
        self.graph_totals = [sum(g.values()) if g else 0 for g in self.graphs]
        self.raw_profiles = [profile(self.table, r) for r in self.raw_roots]
        self.normalized_profiles = [profile(self.table, r) for r in self.normalized_roots]
        self.raw_references = ReferenceSet(self.table, self.raw_profiles)
        self.normalized_references = ReferenceSet(self.table, self.normalized_profiles)

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
            graphs=tuple(graph for graph, _ in recorded_graphs([code for _, code in tasks])),
        )

    def to_json(self) -> dict:
        return {
            "format": INDEX_FORMAT,
            "minhash": {"permutations": MINHASH_PERMUTATIONS, "seed": MINHASH_SEED, "shingle": MINHASH_SHINGLE},
            "names": list(self.names),
            "signatures": [[int(v) for v in row] for row in self.signatures],
            "raw_skeletons": [self.table.to_preorder(r) for r in self.raw_roots],
            "normalized_skeletons": [self.table.to_preorder(r) for r in self.normalized_roots],
            "graphs": [None if g is None else dict(sorted(g.items())) for g in self.graphs],
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
            graphs=tuple(data["graphs"]),
        )

    def save(self, path: Path) -> None:
        payload = json.dumps(self.to_json(), separators=(",", ":")).encode()
        with open(path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as gz:
            gz.write(payload)

    @classmethod
    def load(cls, path) -> KernelBenchIndex:
        with path.open("rb") as f, gzip.GzipFile(fileobj=f) as gz:
            return cls.from_json(json.loads(gz.read()))


def recorded_graphs(codes: list[str]) -> list[tuple[dict[str, int] | None, int]]:
    """The operator graphs of programs (their features and operator counts), recorded by the shape check in
    contained workers (reference code is someone else's code too); (None, 0) for one whose forward cannot run on
    meta."""
    import os

    from opsynth.filters.execution import ExecutionConfig
    from opsynth.filters.worker_process import SHAPES
    from opsynth.filters.workers import Job, WorkerPool

    workers = max(1, min(REFERENCE_WORKERS, os.cpu_count() or 1))
    cfg = ExecutionConfig(device="cpu", runtime_window_ms=(0.0, 1.0), timeout_s=120.0, compile_check=False,
                          workers=workers)  # fmt: skip
    with WorkerPool(cfg) as pool:
        verdicts = pool.run([Job(str(i), code, 0, SHAPES) for i, code in enumerate(codes)])
    return [(v.measurements.get("graph"), v.measurements.get("graph_nodes", 0)) if v.kept else (None, 0)
            for v in verdicts]  # fmt: skip


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


_INDEXED: dict[str, KernelBenchIndex] = {}  # this process's indexes: `embedded`, and by key (see `indexed`)


def load_reference(spec: str) -> KernelBenchIndex:
    """`embedded` (the shipped index), `hub`, or a path to a Parquet file or a folder of `.py` tasks; each loaded
    once per process (a run's plan and its stages read the same one)."""
    if spec == "embedded":
        if spec not in _INDEXED:
            _INDEXED[spec] = KernelBenchIndex.load(embedded_index_path())
        return _INDEXED[spec]
    if spec == "hub":
        return indexed(tasks_from_hub())
    path = Path(spec)
    if path.is_dir():
        return indexed(tasks_from_folder(path))
    if path.is_file():
        return indexed(tasks_from_parquet(path))
    raise ReferenceError_(f"{spec}: no such file or folder (use embedded, hub, or a path)")


def indexed(tasks: list[tuple[str, str]]) -> KernelBenchIndex:
    """The index of reference tasks given as code, built once per machine: recording their graphs starts a pool
    of workers (seconds), and every stage of every round that reads the reference loads it. Kept in this process
    and in the user's temporary folder, under a key of the tasks and of the filters' code, which fingerprints them."""
    import hashlib
    import os
    import tempfile

    from opsynth.atomic import replacing

    digest = hashlib.sha256(json.dumps([INDEX_FORMAT, tasks]).encode())
    for module in sorted(Path(__file__).parent.glob("*.py")):  # the filters' code, which makes the fingerprints
        digest.update(module.read_bytes())
    key = digest.hexdigest()[:24]
    if key in _INDEXED:
        return _INDEXED[key]
    cache = Path(tempfile.gettempdir()) / f"opsynth-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
    path = cache / f"kernelbench-{key}.json.gz"
    try:
        index = KernelBenchIndex.load(path)
    except (OSError, ValueError, KeyError, TypeError, EOFError):  # absent, or not whole: made again
        index = KernelBenchIndex.from_tasks(tasks)
        try:
            cache.mkdir(mode=0o700, exist_ok=True)
            with replacing(path) as tmp:
                index.save(tmp)
        except OSError:
            pass  # an unwritable temporary folder costs the next process the build, nothing else
    _INDEXED[key] = index
    return index
