import ast
import inspect
import threading
import time
import types

import pytest

from opsynth import syntax


def _counting(fn, inside, most, guard):
    """`fn`, counting how many threads are inside it (or another so counted) at once."""

    def counted(*args):
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.01)  # long enough for the other threads to try meanwhile
        with guard:
            inside[0] -= 1
        return fn(*args)

    return counted


def test_trees_are_built_by_one_thread_at_a_time(monkeypatch):
    inside, most, guard = [0], [0], threading.Lock()
    monkeypatch.setattr(syntax, "ast", types.SimpleNamespace(parse=_counting(ast.parse, inside, most, guard)))
    # inspect.getsource parses the module of a class to find it: reading source takes the same turn
    counted_source = _counting(inspect.getsource, inside, most, guard)
    monkeypatch.setattr(syntax, "inspect", types.SimpleNamespace(getsource=counted_source))
    calls = [(syntax.parse, "x = 1"), (syntax.source_of, _Shape)] * 3
    threads = [threading.Thread(target=fn, args=(arg,)) for fn, arg in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1


class _Shape:
    side = 2


def test_source_of_is_inspect_getsource():
    assert syntax.source_of(_Shape) == inspect.getsource(_Shape)
    assert "side = 2" in syntax.source_of(_Shape)


def test_a_parse_is_ast_parse():
    assert ast.dump(syntax.parse("y = x + 1")) == ast.dump(ast.parse("y = x + 1"))
    with pytest.raises(SyntaxError):
        syntax.parse("def (")
