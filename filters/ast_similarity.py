"""Structural AST similarity with the scores of continuous-eval's `PythonASTSimilarity`, made fast by running on
interned type-only skeletons (docs/decontamination.md, "The AST score"); the maximum over a reference set is
filters.ast_search's."""

from __future__ import annotations

import ast
import itertools
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

# The field that names a node, for labeled skeletons: Name.id, Attribute.attr, arg.arg, keyword.arg, ...
LABEL_FIELDS = ("id", "attr", "arg", "name")
SIGNIFICANT = frozenset({"Import", "FunctionDef", "If", "ClassDef", "While", "For", "comprehension", "Return"})
ROOT_WEIGHT = {"Import": 0.3, "FunctionDef": 1.2, "If": 0.5}  # every other significant type weighs 1
DECIMALS = 4  # the metric rounds its score
# Pairwise matches kept before the memo is cleared (about 110 bytes each: 21 MiB). A tiny candidate adds about 30,
# and what a match of another program's left there saves is too little to measure (4.1 ms a candidate either way).
MEMO_LIMIT = 200_000
# Structures interned after the reference set's (the programs compared with it, one after another; about 290
# bytes each, a candidate adding about 5) kept before they are dropped, with the memo: a 600,000-row run compares
# over a million programs.
TRANSIENT_LIMIT = 20_000


def _best_assignment(matrix: list[list[int]]) -> int:
    """Maximum total of a one-to-one assignment of rows to columns (rectangular allowed)."""
    rows, cols = len(matrix), len(matrix[0])
    if rows == 1:
        return max(matrix[0])
    if cols == 1:
        return max(r[0] for r in matrix)
    if rows == cols == 2:
        return max(matrix[0][0] + matrix[1][1], matrix[0][1] + matrix[1][0])
    if rows == cols == 3:
        return max(sum(matrix[i][p[i]] for i in range(3)) for p in itertools.permutations(range(3)))
    m = np.asarray(matrix)
    r, c = linear_sum_assignment(m, maximize=True)
    return int(m[r, c].sum())


class SkeletonTable:
    """Interned type-only trees: an id per distinct structure, with its type, children and size."""

    def __init__(self) -> None:
        self._ids: dict[tuple[str, tuple[int, ...]], int] = {}
        self.kind: list[str] = []
        self.children: list[tuple[int, ...]] = []
        self.size: list[int] = []
        self._memo: dict[tuple[int, int], int] = {}
        self._kept = 0  # ids below this are kept for good (see `keep`)

    def intern(self, kind: str, children: tuple[int, ...]) -> int:
        key = (kind, children)
        found = self._ids.get(key)
        if found is not None:
            return found
        new = len(self.kind)
        self._ids[key] = new
        self.kind.append(kind)
        self.children.append(children)
        self.size.append(1 + sum(self.size[c] for c in children))
        return new

    def keep(self) -> None:
        """Keep every structure interned so far (a reference set's) for good: `forget_transient` drops only
        those interned after."""
        self._kept = len(self.kind)

    def forget_transient(self) -> None:
        """Where more than TRANSIENT_LIMIT structures were interned since `keep`, drop them, and every memoised
        match: otherwise the table grows with every program compared. Called between programs, never while the
        ids of one are in use (they may be handed out again)."""
        if len(self.kind) - self._kept <= TRANSIENT_LIMIT:
            return
        for key in zip(self.kind[self._kept :], self.children[self._kept :], strict=True):
            del self._ids[key]
        for column in (self.kind, self.children, self.size):
            del column[self._kept :]
        self._memo.clear()

    def from_ast(self, node: ast.AST, labeled: bool = False) -> int:
        """The node's skeleton; `labeled` refines each type by its identifier (`Attribute:BatchNorm2d`)."""
        children = tuple(self.from_ast(child, labeled) for child in ast.iter_child_nodes(node))
        kind = type(node).__name__
        if labeled:
            label = next((getattr(node, f) for f in LABEL_FIELDS if isinstance(getattr(node, f, None), str)), None)
            kind = f"{kind}:{label}" if label is not None else kind
        return self.intern(kind, children)

    def to_preorder(self, root: int) -> list[tuple[str, int]]:
        """(type, child count) in preorder: enough to rebuild the structure, and nothing else."""
        out = []
        stack = [root]
        while stack:
            node = stack.pop()
            out.append((self.kind[node], len(self.children[node])))
            stack.extend(reversed(self.children[node]))
        return out

    def from_preorder(self, items: list[tuple[str, int]]) -> int:
        position = 0

        def build() -> int:
            nonlocal position
            kind, count = items[position]
            position += 1
            return self.intern(kind, tuple(build() for _ in range(count)))

        return build()

    def root_type(self, node: int) -> str:
        return self.kind[node].split(":", 1)[0]

    def significant(self, root: int) -> list[int]:
        """Significant subtrees in `ast.walk` order (breadth first)."""
        found, queue, head = [], [root], 0
        while head < len(queue):
            node = queue[head]
            head += 1
            if self.root_type(node) in SIGNIFICANT:
                found.append(node)
            queue.extend(self.children[node])
        return found

    def match(self, a: int, b: int) -> int:
        """Matching nodes of two trees (continuous-eval's `_compare_ASTs` with unlimited reordering)."""
        if a == b:
            return self.size[a]
        key = (a, b) if a < b else (b, a)
        found = self._memo.get(key)
        if found is not None:
            return found
        ca, cb = self.children[a], self.children[b]
        if self.kind[a] != self.kind[b] or len(ca) != len(cb):
            value = 0
        elif not ca:
            value = 1
        elif len(ca) == 1:
            value = self.match(ca[0], cb[0]) + 1
        else:
            value = _best_assignment([[self.match(x, y) for y in cb] for x in ca]) + 1
        if len(self._memo) >= MEMO_LIMIT:
            self._memo.clear()
        self._memo[key] = value
        return value


@dataclass(frozen=True)
class Profile:
    """One program's significant subtrees, grouped by root type for scoring."""

    subtrees: tuple[int, ...]
    total_weight: float  # sum of size x root weight over the subtrees
    by_kind: dict[str, tuple[int, ...]]  # type -> subtree ids


def profile(table: SkeletonTable, root: int) -> Profile:
    subtrees = tuple(table.significant(root))
    by_kind: dict[str, list[int]] = defaultdict(list)
    for s in subtrees:
        by_kind[table.kind[s]].append(s)
    total = sum(table.size[s] * ROOT_WEIGHT.get(table.root_type(s), 1.0) for s in subtrees)
    return Profile(subtrees, total, {k: tuple(v) for k, v in by_kind.items()})


def score(table: SkeletonTable, p: Profile, q: Profile) -> float:
    """The metric's score of two programs (0 when either has at most one significant subtree, as there)."""
    if len(p.subtrees) <= 1 or len(q.subtrees) <= 1:
        return 0.0
    # Subtrees of different types never match, so the optimal assignment decomposes by root type.
    weighted = 0.0
    for kind, mine in p.by_kind.items():
        theirs = q.by_kind.get(kind)
        if theirs:
            best = _best_assignment([[table.match(a, b) for b in theirs] for a in mine])
            weighted += ROOT_WEIGHT.get(kind.split(":", 1)[0], 1.0) * best
    return round(2 * weighted / (p.total_weight + q.total_weight), DECIMALS)


def brute_force(table: SkeletonTable, p: Profile, references: list[Profile]) -> tuple[float, int]:
    scores = [score(table, p, r) for r in references]
    best = max(scores)
    return best, scores.index(best)
