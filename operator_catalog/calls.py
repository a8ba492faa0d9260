"""Running an `OpCall` directly, as the composer's shape check on the meta device does: the names its target
resolves in, its module built, its arguments bound to tensors, its operands found.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from opsynth.operator_catalog.entry import Expr, Hoisted, OpCall, Operand, Submodule, X

# The names generated code may use, and the objects they stand for when a call is applied directly.
NAMESPACE: dict[str, Any] = {"torch": torch, "nn": nn, "F": F}
BINARY_OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
}


def resolve(target: str) -> Any:
    """`nn.Conv2d` -> the class, `torch.cumsum` -> the function."""
    head, _, rest = target.partition(".")
    obj = NAMESPACE[head]
    for part in rest.split(".") if rest else ():
        obj = getattr(obj, part)
    return obj


def literal(value: Any) -> Any:
    if isinstance(value, Hoisted):
        return value.value
    if isinstance(value, Submodule):
        return resolve(value.target)(*(literal(a) for a in value.args))
    return value


def build_module(call: OpCall) -> nn.Module:
    """Instantiate a `module`-style call (on whatever default device is active)."""
    cls = resolve(call.target)
    return cls(*(literal(a) for a in call.init_args), **dict(call.init_kwargs))


def apply_call(
    call: OpCall, x: torch.Tensor, operands: dict[Operand, torch.Tensor], module: nn.Module | None = None
) -> torch.Tensor:
    """Run one call on `x`; operand tensors are looked up by their `Operand` record. A `module`-style call runs
    `module` when given (already built from the call), else builds it."""

    def bind(value: Any) -> Any:
        if isinstance(value, X):
            return x
        if isinstance(value, Operand):
            return operands[value]
        if isinstance(value, Expr):
            return eval(value.render("x"), {**NAMESPACE, "x": x})
        if isinstance(value, list):
            return [bind(v) for v in value]
        if isinstance(value, tuple):
            return tuple(bind(v) for v in value)
        return value

    args = [bind(a) for a in call.args]
    kwargs = {k: bind(v) for k, v in call.kwargs}
    if call.style == "module":
        out = (module if module is not None else build_module(call))(*args, **kwargs)
    elif call.style == "function":
        out = resolve(call.target)(*args, **kwargs)
    else:
        out = BINARY_OPERATORS[call.target](*args)
    if call.output_index is not None:
        out = out[call.output_index]
    if call.wrap is not None:
        out = eval(call.wrap.format(x="x", call="out"), {**NAMESPACE, "x": x, "out": out})
    return out


def operands_of(call: OpCall) -> list[Operand]:
    """Every `Operand` in a call's arguments, in order of appearance."""
    found: list[Operand] = []

    def walk(value: Any) -> None:
        if isinstance(value, Operand):
            found.append(value)
        elif isinstance(value, list | tuple):
            for v in value:
                walk(v)

    walk(call.args)
    walk(tuple(v for _, v in call.kwargs))
    return found
