import importlib.util
import os
import sys

import pytest

from opsynth import bytecode


@pytest.fixture
def library(tmp_path, monkeypatch):
    """An installed package without bytecode, as `uv pip install` leaves one: a module, a subpackage, tests."""
    root = tmp_path / "site"
    package = root / "bytecode_probe_pkg"
    (package / "sub").mkdir(parents=True)
    (package / "tests").mkdir()
    (package / "__init__.py").write_text("VALUE = 1\n")
    (package / "core.py").write_text("def f():\n    return 2\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "tests" / "test_core.py").write_text("def test_f():\n    pass\n")
    (root / "bytecode_probe_mod.py").write_text("X = 3\n")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr(bytecode, "_compiling", None)
    return package


def compiled(path) -> bool:
    return os.path.exists(importlib.util.cache_from_source(str(path)))


def test_what_lacks_bytecode_is_compiled_in_the_background_where_python_looks(library):
    names = ("bytecode_probe_pkg", "bytecode_probe_mod", "no_such_package_here")
    assert bytecode.uncompiled(names) == [str(library), str(library.parent / "bytecode_probe_mod.py")]

    assert bytecode.compile_ahead(names, cores=2) == [str(library), str(library.parent / "bytecode_probe_mod.py")]
    assert bytecode.wait_compiled() >= 0.0  # the seconds it waited

    for module in ("__init__.py", "core.py", "sub/__init__.py"):
        assert compiled(library / module)
    assert compiled(library.parent / "bytecode_probe_mod.py")
    assert not compiled(library / "tests" / "test_core.py")  # a test suite is never imported by a run
    assert bytecode.uncompiled(names) == []
    assert bytecode.compile_ahead(names) == []  # nothing left: no process started
    assert bytecode.wait_compiled() == 0.0  # nothing to wait for


def test_an_installation_with_its_bytecode_is_left_alone():
    assert bytecode.uncompiled(("pytest",)) == []  # pip compiled it as it installed it


def test_a_folder_where_bytecode_cannot_be_written_costs_nothing(library):
    for folder in (library, library / "sub", library / "tests"):
        (folder / "__pycache__").write_text("a file where the folder would go")  # unwritable, for root too
    assert bytecode.compile_ahead(("bytecode_probe_pkg",), cores=2) == [str(library)]
    bytecode.wait_compiled()  # compileall failed quietly; nothing waits further
    assert bytecode.uncompiled(("bytecode_probe_pkg",)) == [str(library)]


def test_a_wait_gives_up_after_its_limit(library, monkeypatch):
    class Slow:
        def poll(self):
            return None

        def wait(self, timeout):
            import subprocess

            raise subprocess.TimeoutExpired("compileall", timeout)

    monkeypatch.setattr(bytecode, "_compiling", Slow())
    bytecode.wait_compiled(timeout_s=0.01)  # returns, leaving the compile to finish
    assert bytecode.compile_ahead(("bytecode_probe_pkg",)) == []  # one compile at a time
    assert sys.modules.get("bytecode_probe_pkg") is None
