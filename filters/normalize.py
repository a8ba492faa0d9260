"""Code normalization shared by decontamination and within-set dedup.

Docstrings, comments and formatting are removed by a parse / unparse round trip, so that two programs that
differ only in those compare equal.
"""

from __future__ import annotations

import ast
import hashlib
import io
import tokenize


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return tree


def normalize_code(node_or_source: ast.AST | str) -> str:
    """Canonical source: no docstrings, no comments, `ast.unparse` formatting. Unparseable text is returned as is."""
    if isinstance(node_or_source, str):
        try:
            tree = ast.parse(node_or_source)
        except SyntaxError:
            return node_or_source
    else:
        tree = ast.parse(ast.unparse(node_or_source))
    return ast.unparse(_strip_docstrings(tree))


def code_tokens(source: str) -> list[str]:
    """Python tokens of a source, without layout tokens."""
    skip = {
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.COMMENT,
        tokenize.ENDMARKER,
    }
    try:
        return [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type not in skip]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return source.split()


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
