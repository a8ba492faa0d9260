"""Code normalization shared by decontamination and within-set dedup.

`normalize_code` removes what does not change a program's meaning (docstrings, comments, layout, no-op
statements, annotations, `super(Model, self)` arguments); `canonical_code` also renames identifiers and
literals to placeholders, keeping the names of the torch API, so that a renamed copy reads the same.
"""

from __future__ import annotations

import ast
import builtins
import copy
import hashlib
import io
import tokenize

from opsynth import syntax

API_ROOTS = frozenset({"torch", "nn", "F", "math", "self", "super"}) | frozenset(dir(builtins))


def _has_call(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) for n in ast.walk(node))


def _dead_assignment(stmt: ast.stmt, loaded: set[str]) -> bool:
    """`name = <expression without calls>` whose name is never read, or `x = x`: removing it changes nothing."""
    if not isinstance(stmt, ast.Assign) or _has_call(stmt.value):
        return False
    names = [t.id for t in stmt.targets if isinstance(t, ast.Name)]
    if len(names) != len(stmt.targets):
        return False
    if isinstance(stmt.value, ast.Name) and names == [stmt.value.id]:
        return True
    return not any(n in loaded for n in names)


class _StripNoOps(ast.NodeTransformer):
    """Docstrings and other constant expression statements, `pass` beside other statements, annotations,
    assertions, dead assignments."""

    def __init__(self) -> None:
        self.loaded: set[str] = set()

    def _body(self, body: list[ast.stmt]) -> list[ast.stmt]:
        kept = [
            s
            for s in body
            if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
            and not isinstance(s, ast.Pass | ast.Assert)
            and not _dead_assignment(s, self.loaded)
        ]
        return kept or [ast.Pass()]

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        for field in ("body", "orelse", "finalbody"):
            value = getattr(node, field, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                setattr(node, field, self._body(value))
        return node

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = None
        return node

    def visit_Module(self, node: ast.Module) -> ast.AST:
        # A module's constants (a task's input extents) are read inside its functions: dead only if read nowhere.
        self.loaded = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        return self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.returns = None
        outer = self.loaded
        self.loaded = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        self.generic_visit(node)
        self.loaded = outer
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST | None:
        if node.value is None:
            return None
        return ast.copy_location(ast.Assign(targets=[node.target], value=node.value), node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "super":
            node.args, node.keywords = [], []
        return node


class _Canonicalize(ast.NodeTransformer):
    """Local names, arguments and `self.` attributes -> v0, v1, ... by first use; numbers -> 0, strings -> ''."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def _rename(self, name: str) -> str:
        if name in API_ROOTS:
            return name
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self._rename(node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg = self._rename(node.arg)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            node.attr = self._rename(f"self.{node.attr}")
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if isinstance(node.value, bool) or node.value is None:
            return node
        if isinstance(node.value, int | float | complex):
            return ast.copy_location(ast.Constant(0), node)
        if isinstance(node.value, str):
            return ast.copy_location(ast.Constant(""), node)
        return node


def _parse(node_or_source: ast.AST | str) -> ast.AST | None:
    if isinstance(node_or_source, str):
        try:
            return syntax.parse(node_or_source)
        except SyntaxError:
            return None
    return copy.deepcopy(node_or_source)


def normalized_tree(node_or_source: ast.AST | str) -> ast.AST | None:
    """The tree with no-ops removed (a copy; None if the source does not parse)."""
    tree = _parse(node_or_source)
    return None if tree is None else ast.fix_missing_locations(_StripNoOps().visit(tree))


def normalize_code(node_or_source: ast.AST | str) -> str:
    """Canonical source without no-ops; unparseable text is returned as is."""
    tree = normalized_tree(node_or_source)
    return node_or_source if tree is None else ast.unparse(tree)


def canonical_tree(node_or_source: ast.AST | str) -> ast.AST | None:
    """`normalized_tree`, with identifiers and literals replaced by placeholders (API names kept)."""
    tree = normalized_tree(node_or_source)
    return None if tree is None else ast.fix_missing_locations(_Canonicalize().visit(tree))


def canonical_code(node_or_source: ast.AST | str) -> str:
    tree = canonical_tree(node_or_source)
    if tree is None:
        return node_or_source if isinstance(node_or_source, str) else ""
    return ast.unparse(tree)


def code_tokens(source: str) -> list[str]:
    """Python tokens of a source, without layout tokens."""
    skip = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT, tokenize.ENDMARKER}
    try:
        return [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type not in skip]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return source.split()


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
