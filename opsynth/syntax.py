"""Python source parsed into a syntax tree, one thread of the process at a time.

CPython 3.11 keeps the AST constructor's recursion depth in state shared by the interpreter's threads, so two
threads building trees at once can fail with `SystemError: AST constructor recursion depth mismatch`: a 6,000-row
run on 2 cores died so, the next round's CPU stages parsing beside this round's calibration; a 600,000-row run
died so again in `inspect.getsource`, which parses a class's module to find the class: reading source goes through
`source_of`.
"""

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
