"""Loading a task program exactly the way KernelBench's loader does: compile, exec, look up three names.

Also finds the `Model` class's source, which decontamination compares.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

from opsynth import syntax


class TaskLoadError(Exception):
    """The program does not compile, raises at import, or lacks Model / get_inputs / get_init_inputs."""


@dataclass(frozen=True)
class LoadedTask:
    model_class: type
    get_inputs: Any
    get_init_inputs: Any


def load_task(source: str, filename: str = "<task>") -> LoadedTask:
    if not isinstance(source, str) or not source.strip():
        raise TaskLoadError("is empty: there is no code")
    try:
        code = compile(source, filename, "exec")
    except (SyntaxError, ValueError) as e:
        raise TaskLoadError(f"does not compile: {e}") from e
    namespace: dict[str, Any] = {}
    try:
        exec(code, namespace)
    except Exception as e:
        raise TaskLoadError(f"raises on load: {type(e).__name__}: {e}") from e
    missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if not callable(namespace.get(n))]
    if missing:
        raise TaskLoadError(f"defines no {', '.join(missing)}")
    return LoadedTask(namespace["Model"], namespace["get_inputs"], namespace["get_init_inputs"])


def model_class_node(source: str) -> ast.ClassDef | None:
    """The class that `Model` names once the program has run, as KernelBench's loader takes it: a top-level
    `class Model`, or the class that top-level assignments (`Model = Net`, `Net = Impl`) bind it to last; None
    where `Model` is bound to no class of the program (or it does not parse). Read from the tree, never run."""
    try:
        tree = syntax.parse(source)
    except SyntaxError:
        return None
    bound: dict[str, ast.ClassDef | None] = {}  # top-level names -> the class each stands for, in program order
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            bound[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            value = bound.get(node.value.id) if isinstance(node.value, ast.Name) else None
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    bound[target.id] = value
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            bound[node.name] = None
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                bound[(alias.asname or alias.name).split(".")[0]] = None
    return bound.get("Model")
