"""Within-set dedup: exact duplicates, near-duplicates, and repeats of one operator graph.

Exact duplicates (same normalized program) are dropped before execution. Near-duplicates (MinHash-LSH over
token 3-grams of the normalized program) and rows beyond a cap per operator graph (a networkx graph hash)
are dropped by the selection, in the run's order, so the dataset does not depend on how rounds split the
candidates. All of it is linear in the number of candidates: no pairwise comparison of the whole set.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Iterable
from typing import TypeVar

import networkx as nx
from datasketch import LeanMinHash, MinHash, MinHashLSH

from opsynth.config import DEDUP_MINHASH_SEED, MINHASH_PERMUTATIONS
from opsynth.filters.minhash import token_minhash
from opsynth.filters.normalize import code_tokens, content_hash, normalize_code

T = TypeVar("T")


def dedup_key(source: str) -> str:
    return content_hash(normalize_code(source))


def split_group(members: Iterable[T], order_key, already_seen: bool) -> tuple[T | None, list[T]]:
    """(the member kept, the members dropped) of one group of equal keys; none is kept if seen before."""
    ordered = sorted(members, key=order_key)
    if already_seen:
        return None, ordered
    return ordered[0], ordered[1:]


def program_minhash(source: str) -> MinHash:
    return token_minhash(code_tokens(normalize_code(source)), DEDUP_MINHASH_SEED)


def op_graph_hash(ops: Iterable[str]) -> str:
    """Weisfeiler-Lehman hash of the operator chain: equal for tasks that apply the same operators in order."""
    graph = nx.DiGraph()
    ops = list(ops)
    for i, op in enumerate(ops):
        graph.add_node(i, op=op)
        if i:
            graph.add_edge(i - 1, i)
    with warnings.catch_warnings():
        # networkx >= 3.5 (required) hashes directed graphs one fixed way; it warns that older versions differed.
        warnings.filterwarnings("ignore", message="The hashes produced for directed graphs changed")
        return nx.weisfeiler_lehman_graph_hash(graph, node_attr="op")


class WithinSetFilter:
    """Admits candidates in order, refusing near-duplicates of earlier ones and graphs past their cap."""

    def __init__(self, jaccard_threshold: float):
        self.lsh = MinHashLSH(threshold=jaccard_threshold, num_perm=MINHASH_PERMUTATIONS)
        self.jaccard_threshold = jaccard_threshold
        self.graphs: Counter = Counter()
        self.signatures: dict[str, MinHash] = {}

    def admit(self, key: str, source: str, ops: Iterable[str], max_per_graph: int) -> str | None:
        """None if admitted (and remembered); else why not."""
        graph = op_graph_hash(ops)
        if self.graphs[graph] >= max_per_graph:
            return f"operator graph already in {max_per_graph} rows"
        signature = program_minhash(source)
        for other in sorted(self.lsh.query(signature)):
            similarity = signature.jaccard(self.signatures[other])
            if similarity >= self.jaccard_threshold:
                return f"near-duplicate of {other} (MinHash Jaccard {similarity:.2f})"
        lean = LeanMinHash(signature)  # the hash values alone: a third of a MinHash's memory
        self.lsh.insert(key, lean)
        self.signatures[key] = lean
        self.graphs[graph] += 1
        return None
