"""Code rendering: a `Composition` becomes KernelBench-format source through a small emitter per node kind.

A namespace hands out unique names, the header is derived from the names the body uses, and the result is a
frozen record (source, ops, init inputs, input shapes), after the shape of `torch.fx`'s `PythonCode`.
"""

from __future__ import annotations

import builtins
import keyword
import re
from dataclasses import dataclass, field
from typing import Any

from opsynth.operator_catalog.calls import operands_of
from opsynth.operator_catalog.compose import Composition, GlueNode, OpNode
from opsynth.operator_catalog.entry import (
    Expr,
    Hoisted,
    OpCall,
    Operand,
    RenderedTask,
    Submodule,
    TensorSpec,
    X,
    tensor_factory,
)

# Input dimension names by rank, as KernelBench spells them.
DIM_NAMES = {
    1: ("size",),
    2: ("batch_size", "in_features"),
    3: ("batch_size", "channels", "length"),
    4: ("batch_size", "channels", "height", "width"),
    5: ("batch_size", "channels", "depth", "height", "width"),
}
# The constant that holds the batch extent, the one the shape calibration rescales (dim 0 of every rank).
BATCH_NAMES = frozenset(names[0] for names in DIM_NAMES.values())
IMPORTS = {"torch": "import torch", "nn": "import torch.nn as nn", "F": "import torch.nn.functional as F"}


@dataclass
class Namespace:
    """Hands out unique Python identifiers: `conv`, `conv_1`, ..."""

    taken: set[str] = field(
        default_factory=lambda: set(keyword.kwlist) | set(dir(builtins)) | {"torch", "nn", "F", "self", "x", "Model"}
    )

    def unique(self, base: str) -> str:
        name, i = base, 1
        while name in self.taken:
            name = f"{base}_{i}"
            i += 1
        self.taken.add(name)
        return name


def _snake(target: str) -> str:
    """`nn.ConvTranspose2d` -> `conv_transpose2d`."""
    cls = target.rsplit(".", 1)[-1]
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", cls).lower()


@dataclass
class _Emitter:
    namespace: Namespace = field(default_factory=Namespace)
    constants: list[tuple[str, Any]] = field(default_factory=list)
    init_params: list[str] = field(default_factory=list)
    init_values: list[Any] = field(default_factory=list)
    init_lines: list[str] = field(default_factory=list)
    forward_lines: list[str] = field(default_factory=list)
    forward_params: list[str] = field(default_factory=lambda: ["x"])
    extra_inputs: list[tuple[str, Operand]] = field(default_factory=list)
    operand_names: dict[int, str] = field(default_factory=dict)
    used: set[str] = field(default_factory=lambda: {"torch", "nn"})

    def value(self, v: Any) -> str:
        if isinstance(v, X):
            return "x"
        if isinstance(v, Operand):
            return self.operand_names[id(v)]
        if isinstance(v, Expr):
            return v.render("x")
        if isinstance(v, Hoisted):
            return self.hoist(v)
        if isinstance(v, Submodule):
            self.used.add(v.target.split(".")[0])
            return f"{v.target}({', '.join(self.value(a) for a in v.args)})"
        if isinstance(v, list):
            return "[" + ", ".join(self.value(i) for i in v) + "]"
        if isinstance(v, tuple):
            inner = ", ".join(self.value(i) for i in v)
            return f"({inner},)" if len(v) == 1 else f"({inner})"
        return repr(v)

    def hoist(self, h: Hoisted) -> str:
        name = self.namespace.unique(h.name)
        self.constants.append((name, h.value))
        self.init_params.append(name)
        self.init_values.append(h.value)
        return name

    def declare_operands(self, call: OpCall) -> None:
        for op in operands_of(call):
            if op.role == "parameter":
                name = self.namespace.unique(op.hint)
                self.init_lines.append(f"self.{name} = nn.Parameter(torch.{op.init}({self.value(op.shape)}))")
                self.operand_names[id(op)] = f"self.{name}"
            else:
                name = self.namespace.unique(op.hint)
                self.forward_params.append(name)
                self.extra_inputs.append((name, op))
                self.operand_names[id(op)] = name

    def emit_op(self, call: OpCall) -> None:
        self.declare_operands(call)
        self.used.add(call.target.split(".")[0] if call.style != "binary" else "torch")
        args = [self.value(a) for a in call.args] + [f"{k}={self.value(v)}" for k, v in call.kwargs]
        if call.style == "module":
            attr = self.namespace.unique(_snake(call.target))
            init = [self.value(a) for a in call.init_args] + [f"{k}={self.value(v)}" for k, v in call.init_kwargs]
            self.init_lines.append(f"self.{attr} = {call.target}({', '.join(init)})")
            expr = f"self.{attr}({', '.join(args)})"
        elif call.style == "function":
            expr = f"{call.target}({', '.join(args)})"
        else:
            expr = f" {call.target} ".join(args)
        if call.output_index is not None:
            expr = f"{expr}[{call.output_index}]"
        if call.wrap is not None:
            expr = call.wrap.format(x="x", call=expr)
        self.forward_lines.append(f"x = {expr}")

    def emit_glue(self, glue: GlueNode) -> None:
        chain = "".join(f".{m}({', '.join(self.value(a) for a in args)})" for m, args in glue.steps)
        self.forward_lines.append(f"x = x{chain}  # glue ({glue.why})")


def _docstring(ops: tuple[str, ...]) -> str:
    if len(ops) == 1:
        return f"Applies {ops[0]}."
    return f"Applies {', '.join(ops[:-1])} and {ops[-1]} in sequence."


def render(comp: Composition) -> RenderedTask:
    em = _Emitter()
    input_dims = [em.namespace.unique(n) for n in DIM_NAMES[comp.input.rank]]
    em.constants.extend(zip(input_dims, comp.input.shape, strict=True))
    for node in comp.nodes:
        if isinstance(node, OpNode):
            em.emit_op(node.call)
        else:
            em.emit_glue(node)
    ops = comp.ops

    lines = [IMPORTS[n] for n in ("torch", "nn", "F") if n in em.used]
    lines += ["", "", "class Model(nn.Module):", f'    """{_docstring(ops)}"""', ""]
    lines.append(f"    def __init__(self{''.join(', ' + p for p in em.init_params)}):")
    lines.append("        super().__init__()")
    lines += [f"        {line}" for line in em.init_lines]
    dtype = comp.input.dtype
    typed = "" if dtype == "float32" else f", dtype=torch.{dtype}"
    if typed and em.init_lines:
        lines.append(f"        self.to(torch.{dtype})")
    lines += ["", f"    def forward(self, {', '.join(em.forward_params)}):"]
    lines += [f"        {line}" for line in em.forward_lines]
    lines += ["        return x", "", ""]
    lines += [f"{name} = {value!r}" for name, value in em.constants]
    lines += ["", "", "def get_inputs():", f"    x = torch.randn({', '.join(input_dims)}{typed})"]
    lines += [f"    {name} = {tensor_factory(op.init, op.shape, dtype)}" for name, op in em.extra_inputs]
    lines += [f"    return [{', '.join(em.forward_params)}]", "", ""]
    lines += ["def get_init_inputs():", f"    return [{', '.join(em.init_params)}]", ""]

    shapes = (comp.input, *tuple(TensorSpec(op.shape, dtype) for _, op in em.extra_inputs))
    return RenderedTask("\n".join(lines), ops, tuple(em.init_values), shapes)
