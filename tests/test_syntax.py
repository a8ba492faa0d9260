import ast
import threading
import time
import types

import pytest

from opsynth import syntax


def test_trees_are_built_by_one_thread_at_a_time(monkeypatch):
    inside, most = [0], [0]
    guard = threading.Lock()

    def slow_parse(source):
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.01)  # long enough for the other threads to try meanwhile
        with guard:
            inside[0] -= 1
        return ast.parse(source)

    monkeypatch.setattr(syntax, "ast", types.SimpleNamespace(parse=slow_parse))
    threads = [threading.Thread(target=syntax.parse, args=("x = 1",)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1


def test_a_parse_is_ast_parse():
    assert ast.dump(syntax.parse("y = x + 1")) == ast.dump(ast.parse("y = x + 1"))
    with pytest.raises(SyntaxError):
        syntax.parse("def (")
