"""Within-set dedup: what counts as the same task (`task_key`: the same program but for its batch extent) and the
per-graph caps, kept as a set of keys and a counter of graphs, no pairwise comparison (docs/recipe.md, "Selection")."""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterable
from typing import TypeVar

from opsynth.filters.normalize import content_hash, normalize_code, normalized_tree
from opsynth.operator_catalog.codegen import BATCH_NAMES

T = TypeVar("T")


def dedup_key(source: str) -> str:
    return content_hash(normalize_code(source))


def split_group(members: Iterable[T], order_key, already_seen: bool) -> tuple[T | None, list[T]]:
    """(the member kept, the members dropped) of one group of equal keys; none is kept if seen before."""
    ordered = sorted(members, key=order_key)
    if already_seen:
        return None, ordered
    return ordered[0], ordered[1:]


def _batch_extent(stmt: ast.stmt) -> bool:
    """`batch_size = 128` at module level, as the renderer writes a task's batch extent."""
    return (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
        and stmt.targets[0].id in BATCH_NAMES
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, int)
    )


def task_key(source: str) -> str:
    """The key of what the selection counts as one task: the normalized program less its batch extent, which
    `get_inputs` spells by its name for the first input and as a number for any other input that shares it (the
    renderer writes those inputs' shapes out): a leading extent equal to the batch's reads as the batch's name."""
    tree = normalized_tree(source)
    if tree is None:
        return dedup_key(source)
    extents = {stmt.value.value: stmt.targets[0].id for stmt in tree.body if _batch_extent(stmt)}
    tree.body = [stmt for stmt in tree.body if not _batch_extent(stmt)]
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "get_inputs":
            for call in (node for node in ast.walk(stmt) if isinstance(node, ast.Call) and node.args):
                first = call.args[0]
                if isinstance(first, ast.Constant) and type(first.value) is int and first.value in extents:
                    call.args[0] = ast.Name(extents[first.value], ast.Load())
    return content_hash(ast.unparse(tree))


def op_graph_hash(ops: Iterable[str]) -> str:
    """The key of an operator graph: equal for tasks that apply the same operators in the same order. A chain's
    graph is its ordered list, so the list itself is the key: a Weisfeiler-Lehman hash of the chain's graph split
    22,000 random lists into the same 17,783 classes, at 56 us a list against 1.2 us."""
    return content_hash("\x1f".join(ops))


_HEX16 = re.compile(r"[0-9a-f]{16}")


def compact(text: str) -> int | str:
    """A hex digest (a key, a row's id) as the number of its first 16 digits, which a run holds for each of its rows
    in 36 bytes where the string takes 65 (an id) or 113 (a key); 64 bits keep 600,000 keys apart but with a
    chance of 1e-8. Any other text as it is."""
    return int(text[:16], 16) if _HEX16.match(text) else text


def spelled(name: int | str) -> str:
    """A name `compact` made, written out again."""
    return f"{name:016x}" if isinstance(name, int) else name


class WithinSetFilter:
    """Admits candidates in order, refusing a task already admitted and graphs past their cap. What it keeps grows
    with the rows (a key and a name each, `compact`: about 130 bytes a row), its graph counts with the catalog's
    operator lists."""

    def __init__(self):
        self.graphs: Counter = Counter()
        self.tasks: dict[int | str, int | str] = {}  # task key -> the row admitted with it (both `compact`)

    def refusal(self, key: str, ops: Iterable[str], max_per_graph: int) -> str | None:
        """Why the task of `task_key` `key` would be refused now, or None; remembers nothing."""
        if self.graphs[op_graph_hash(ops)] >= max_per_graph:
            return f"operator graph already in {max_per_graph} rows"
        admitted = self.tasks.get(compact(key))
        return None if admitted is None else f"the same task as {spelled(admitted)} (its batch extent aside)"

    def admit(self, name: str, key: str, ops: Iterable[str], max_per_graph: int) -> str | None:
        """None if the task of `task_key` `key` is admitted (and remembered); else why not. `name` says which row
        it is in later refusals."""
        why = self.refusal(key, ops, max_per_graph)
        if why is None:
            self.tasks[compact(key)] = compact(name)
            self.graphs[op_graph_hash(ops)] += 1
        return why
