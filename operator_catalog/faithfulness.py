"""Which operators a task's `forward` applies, read from its AST, in execution order.

It is the check that `ops` lists exactly the operators in the code: calls of `torch.*` / `F.*` and of
`self.<module>` (resolved through `__init__` to `nn.X`), and arithmetic at the top of a statement.
Tensor-method glue (`x.flatten(1)`) is not an operator.
"""

from __future__ import annotations

import ast

from opsynth import syntax
from opsynth.operator_catalog.arithmetic import BINARY

# Bare arithmetic names (`add`) are written as their operator symbol (`x + self.bias`), as the catalog renders them.
SYMBOL_OF = {name: symbol for name, (symbol, _, _) in BINARY.items()}
BINOP_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _module_types(cls: ast.ClassDef) -> dict[str, str]:
    """`self.conv = nn.Conv2d(...)` in `__init__` -> {"conv": "nn.Conv2d"}."""
    types = {}
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            name = _dotted(node.value.func)
            for target in node.targets:
                attr = _dotted(target)
                if name and attr and attr.startswith("self."):
                    types[attr.removeprefix("self.")] = name
    return types


def ops_in_forward(source: str) -> list[str]:
    tree = syntax.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model")
    forward = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    modules = _module_types(cls)
    found: list[str] = []

    def calls(node: ast.AST) -> None:
        if isinstance(node, ast.Call):
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                calls(arg)
            name = _dotted(node.func) or ""
            if name.startswith(("torch.", "F.")):
                found.append(name)
            elif name.startswith("self.") and name.removeprefix("self.") in modules:
                found.append(modules[name.removeprefix("self.")])
            elif isinstance(node.func, ast.Attribute):
                calls(node.func.value)
        elif isinstance(node, ast.Subscript):
            calls(node.value)
        elif isinstance(node, list | tuple):
            for item in node:
                calls(item)
        elif isinstance(node, ast.List | ast.Tuple):
            calls(node.elts)

    for stmt in forward.body:
        value = getattr(stmt, "value", None)
        if value is None:
            continue
        if isinstance(value, ast.BinOp) and type(value.op) in BINOP_SYMBOL:
            calls(value.left)
            calls(value.right)
            found.append(BINOP_SYMBOL[type(value.op)])
        else:
            calls(value)
    return found


def ops_faithful(source: str, ops: list[str] | tuple[str, ...]) -> bool:
    """True when `ops` names exactly the operators `forward` applies, in order (`add` is `+`, ...)."""
    try:
        return [SYMBOL_OF.get(o, o) for o in ops] == ops_in_forward(source)
    except (SyntaxError, StopIteration):
        return False


def ops_mentioned(source: str, ops: list[str] | tuple[str, ...]) -> bool:
    """True when every listed operator occurs somewhere in the code: its last name (`MaxPool2d` of
    `nn.MaxPool2d`, `sum` of `torch.sum`) as a name or an attribute, and bare arithmetic (`add`, `+`) as its
    operator too. The loose reading of `ops`, for code that does not apply one operator per statement."""
    try:
        tree = syntax.parse(source)
    except SyntaxError:
        return False
    names, symbols = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in BINOP_SYMBOL:
            symbols.add(BINOP_SYMBOL[type(node.op)])
    return all(op.rsplit(".", 1)[-1] in names or SYMBOL_OF.get(op, op) in symbols for op in ops)
