"""The highest structural AST similarity (filters.ast_similarity) of a program to any of a set of references, found
exactly: every reference's score bounded from above at once by sparse products, and references scored in the order
of their bounds until none left can beat the best (docs/decontamination.md, "Its exact search")."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
from scipy.sparse import csc_matrix

from opsynth.filters.ast_similarity import ROOT_WEIGHT, Profile, SkeletonTable, score

# Added to a bound so that it stays above the score, which is rounded (filters.ast_similarity.DECIMALS) and may
# round up past the exact ratio the bound was computed beside.
ROUNDING_MARGIN = 1e-4


@dataclass(frozen=True)
class _Rows:
    """The references' significant subtrees of one root type: each one's path counts (a row), and its
    reference."""

    counts: csc_matrix  # (subtrees, paths)
    reference: np.ndarray  # the reference of each row; rows are in reference order
    starts: np.ndarray  # the first row of each reference that has some
    references: np.ndarray  # those references


class ReferenceSet:
    """Profiles of reference programs (filters.ast_similarity.profile, of one `SkeletonTable`), ready for
    `best_match`."""

    def __init__(self, table: SkeletonTable, profiles: list[Profile]):
        self.table, self.profiles = table, profiles
        self._paths: dict[tuple[int, str, int], int] = {}
        self.totals = np.array([q.total_weight for q in profiles], dtype=float)
        self.scored = np.array([len(q.subtrees) > 1 for q in profiles], dtype=bool)
        by_kind: dict[str, list[tuple[int, Counter]]] = {}
        counted: dict[int, Counter] = {}
        for i, q in enumerate(profiles):
            for kind, subtrees in q.by_kind.items():
                for s in subtrees:
                    if s not in counted:
                        counted[s] = self._path_counts(s, grow=True)
                    by_kind.setdefault(kind, []).append((i, counted[s]))
        self._rows = {kind: self._matrix(rows) for kind, rows in by_kind.items()}

    def __len__(self) -> int:
        return len(self.profiles)

    def _path_counts(self, root: int, grow: bool = False) -> Counter:
        """The nodes of a subtree per path of labels from its root, by path id. `grow`: a path no reference has
        gets an id; else it is left out, and the nodes below it with it (their paths pass through it)."""
        kind, children = self.table.kind, self.table.children
        counts: Counter = Counter()
        stack = [(root, -1)]
        while stack:
            node, parent = stack.pop()
            key = (parent, kind[node], len(children[node]))
            path = self._paths.get(key)
            if path is None:
                if not grow:
                    continue
                path = self._paths[key] = len(self._paths)
            counts[path] += 1
            stack.extend((child, path) for child in children[node])
        return counts

    def _matrix(self, rows: list[tuple[int, Counter]]) -> _Rows:
        cells = [(r, path, n) for r, (_, counts) in enumerate(rows) for path, n in counts.items()]
        r, c, n = (np.array(x, dtype=np.int64) for x in zip(*cells, strict=True))
        counts = csc_matrix((n.astype(float), (r, c)), shape=(len(rows), len(self._paths)))
        reference = np.array([i for i, _ in rows], dtype=np.int64)
        first = np.flatnonzero(np.r_[True, reference[1:] != reference[:-1]])
        return _Rows(counts, reference, first, reference[first])

    def bounds(self, p: Profile) -> np.ndarray:
        """For each reference, a number above its score with `p` (exactly 0 where the score is 0 by the
        metric's rule of one significant subtree). Per root type, each subtree of `p` is paired with its best
        bounded subtree of the reference, and each of the reference's with its best of `p`; the smaller sum
        bounds the one-to-one assignment."""
        weighted = np.zeros(len(self.profiles))
        if len(p.subtrees) <= 1:
            return weighted
        for kind, mine in p.by_kind.items():
            rows = self._rows.get(kind)
            if rows is None:
                continue
            pair = np.stack([self._pair_bounds(a, rows.counts) for a in mine])  # (mine, rows)
            mine_side = np.maximum.reduceat(pair, rows.starts, axis=1).sum(axis=0)
            theirs_side = np.add.reduceat(pair.max(axis=0), rows.starts)
            weighted[rows.references] += ROOT_WEIGHT.get(kind.split(":", 1)[0], 1.0) * np.minimum(
                mine_side, theirs_side
            )
        bound = 2 * weighted / (p.total_weight + self.totals) + ROUNDING_MARGIN
        return np.where(self.scored, bound, 0.0)

    def _pair_bounds(self, subtree: int, counts: csc_matrix) -> np.ndarray:
        """Matching nodes of `subtree` with each row's subtree at most: the sum over paths of the smaller count."""
        mine = self._path_counts(subtree)
        if not mine:
            return np.zeros(counts.shape[0])
        paths = np.fromiter(mine.keys(), dtype=np.int64, count=len(mine))
        have = np.fromiter(mine.values(), dtype=float, count=len(mine))
        theirs = counts[:, paths].tocoo()
        return np.bincount(theirs.row, weights=np.minimum(theirs.data, have[theirs.col]), minlength=counts.shape[0])


def best_match(table: SkeletonTable, p: Profile, references: ReferenceSet) -> tuple[float, int]:
    """(maximum score, index of the first reference reaching it), exactly as scoring every reference gives."""
    bounds = references.bounds(p)
    best_score, best_index = -1.0, -1
    for i in np.lexsort((np.arange(len(bounds)), -bounds)).tolist():
        if bounds[i] < best_score or (bounds[i] == best_score and i > best_index):
            break  # no reference left can beat it, or equal it at a lower index
        s = score(table, p, references.profiles[i])
        if s > best_score or (s == best_score and i < best_index):
            best_score, best_index = s, i
    return best_score, best_index
