"""The libraries' bytecode, compiled once by one `compileall` process over the cores where their installation lacks
it, before a command's worker pools start (docs/execution.md, "Workers and the GPU")."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

# The libraries a run's processes import, in the order their absence costs it most.
PACKAGES = (
    "torch", "sympy", "triton", "transformers", "mpmath", "networkx", "numpy", "scipy", "pandas", "pyarrow",
    "apache_beam", "datasketch", "jinja2", "matplotlib", "huggingface_hub", "safetensors", "tokenizers",
)  # fmt: skip
# Never imported by a run, and the bulk of some packages: their test suites, torch's test helpers, and the model
# families of transformers (a task imports the few it wraps).
EXCLUDED = r"[/\\]tests[/\\]|[/\\]torch[/\\]testing[/\\]_internal[/\\]|[/\\]transformers[/\\]models[/\\]"
COMPILE_WAIT_S = 300.0  # the longest a command waits for the compile before its pools start anyway

_compiling: subprocess.Popen | None = None


def _bytecode_of(source: str) -> str | None:
    try:
        return importlib.util.cache_from_source(source)
    except (NotImplementedError, ValueError):
        return None


def uncompiled(packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """The folders (or single-module files) of the installed `packages` whose top module has no bytecode where
    Python looks for it: an installation that compiled one module of a package compiled all of them."""
    missing = []
    for name in packages:
        try:
            spec = importlib.util.find_spec(name)  # finds a top-level package without importing it
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.has_location or not spec.origin or not spec.origin.endswith(".py"):
            continue
        bytecode = _bytecode_of(spec.origin)
        if bytecode is None or os.path.exists(bytecode):
            continue
        missing.append(str(Path(spec.origin).parent) if spec.submodule_search_locations else spec.origin)
    return missing


def compile_ahead(packages: tuple[str, ...] = PACKAGES, cores: int | None = None) -> list[str]:
    """Start compiling the missing bytecode of `packages` in the background (see the module's docstring); the
    folders it compiles, none where nothing is missing or a compile runs already."""
    global _compiling
    if _compiling is not None and _compiling.poll() is None:
        return []
    folders = uncompiled(packages)
    if not folders:
        return []
    jobs = max(1, (cores or os.cpu_count() or 1) - 1)  # one core stays with this process's own imports
    try:
        _compiling = subprocess.Popen(
            [sys.executable, "-m", "compileall", "-qq", "-j", str(jobs), "-x", EXCLUDED, *folders],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except OSError:
        return []
    return folders


def wait_compiled(timeout_s: float = COMPILE_WAIT_S) -> float:
    """Return once the compile `compile_ahead` started has ended, or after `timeout_s`, leaving it to finish: the
    seconds waited (0 where no compile runs)."""
    global _compiling
    if _compiling is None:
        return 0.0
    started = time.monotonic()
    try:
        _compiling.wait(timeout=timeout_s)
        _compiling = None
    except subprocess.TimeoutExpired:
        pass  # left to finish
    return time.monotonic() - started
