"""How one transformers module becomes a standalone task with its computation visible in the code: the class
and the helpers of its own modeling module it needs are inlined (decorators dropped), the class is renamed
`Model`, and everything else it names is imported from the module that defines it; its configs are built in
`get_init_inputs()` with the installed transformers.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opsynth import syntax
from opsynth.operator_catalog.entry import RenderedTask, TensorSpec, tensor_factory

if TYPE_CHECKING:
    from opsynth.operator_catalog.entry import OpEntry

HEADER = ["from __future__ import annotations", "", "import torch", "import torch.nn as nn", "import transformers"]


@dataclass(frozen=True)
class ModuleUse:
    """One sampled instantiation: constructor argument expressions and input shapes."""

    init_args: tuple[str, ...]  # Python expressions, evaluated in get_init_inputs()
    input_shapes: tuple[tuple[int, ...], ...]
    as_list: bool = False  # forward takes the tensors as one list (feature pyramids)
    extra_args: tuple[str, ...] = ()  # non-tensor forward arguments after the tensors (an output size)


def _names_used(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


@functools.cache
def inline_source(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(import lines, definitions in dependency order) for `cls` and the helpers of its module it needs. Made once
    per class in a process: inspect parses the whole modeling module for each class it finds (25 ms a task at
    the median, up to 0.3 s), and the driver renders a module again each time calibration rescales its task."""
    module = importlib.import_module(cls.__module__)
    imports: set[str] = set()
    ordered: list[str] = []
    done: set[str] = set()

    def visit(obj) -> None:
        if obj.__name__ in done:
            return
        done.add(obj.__name__)
        tree = syntax.parse(textwrap.dedent(syntax.source_of(obj)))
        for node in tree.body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef):
                node.decorator_list = []
        for name in sorted(_names_used(tree)):
            value = module.__dict__.get(name)
            if value is None or name in {"torch", "nn", "transformers", obj.__name__}:
                continue
            if (inspect.isclass(value) or inspect.isfunction(value)) and value.__module__ == module.__name__:
                visit(value)
            elif inspect.ismodule(value):
                imports.add(f"import {value.__name__} as {name}" if value.__name__ != name else f"import {name}")
            else:
                imports.add(f"from {module.__name__} import {name}")
        ordered.append(ast.unparse(tree))

    visit(cls)
    return tuple(sorted(imports)), tuple(ordered)


def _cast_in_init(cls: ast.ClassDef, dtype: str) -> None:
    """End the class's `__init__` (every sampled class has its own) with `self.to(torch.<dtype>)`: its parameters
    and buffers then in the task's dtype."""
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    init.body.append(syntax.parse(f"self.to(torch.{dtype})").body[0])


def render_transformers(entry: OpEntry, use: ModuleUse, dtype: str = "float32") -> RenderedTask:
    """The task around `use` of `entry`, computing in `dtype`: its inputs made in it, its parameters cast to it."""
    cls = entry.module_class()
    imports, definitions = inline_source(cls)
    target = syntax.parse(definitions[-1])
    for node in ast.walk(target):
        if isinstance(node, ast.ClassDef) and node.name == entry.name:
            node.name = "Model"
            if dtype != "float32":
                _cast_in_init(node, dtype)
        elif isinstance(node, ast.Name) and node.id == entry.name:
            node.id = "Model"
    definitions = [*definitions[:-1], f"# {entry.name}, from {entry.module}\n" + ast.unparse(target)]
    tensors = ", ".join(tensor_factory("randn", shape, dtype) for shape in use.input_shapes)
    inputs = ", ".join([f"[{tensors}]" if use.as_list else tensors, *use.extra_args])
    lines = [*HEADER, *imports, "", ""]
    lines.append("\n\n\n".join(definitions))
    lines += ["", "", "def get_inputs():", f"    return [{inputs}]", "", ""]
    lines += ["def get_init_inputs():", f"    return [{', '.join(use.init_args)}]", ""]
    shapes = tuple(TensorSpec(s, dtype) for s in use.input_shapes)
    return RenderedTask("\n".join(lines), (entry.name,), use.init_args, shapes)
