"""Python source parsed into a syntax tree, one thread of the process at a time, since CPython 3.11's AST
constructor keeps state shared by threads (docs/development.md, "Workarounds"); a class's source is read through
`source_of`."""

from __future__ import annotations

import ast
import inspect
import threading

_BUILDING = threading.Lock()


def parse(source: str) -> ast.Module:
    """`ast.parse(source)`, holding the process's lock on tree building; raises SyntaxError as it does."""
    with _BUILDING:
        return ast.parse(source)


def source_of(obj) -> str:
    """`inspect.getsource(obj)`, holding the same lock: for a class, inspect builds its module's syntax tree."""
    with _BUILDING:
        return inspect.getsource(obj)
