"""How a worker sets up inductor's compiling: its own pool of compile processes, or its own process where that
pool cannot start."""

import types
from concurrent.futures import ThreadPoolExecutor

import pytest

from opsynth.filters.worker_setup import compile_in, start_compile_pool


@pytest.fixture
def inductor():
    """Inductor's settings, those the test sets given back after it (monkeypatch would delete them: inductor's
    settings module then hides them)."""
    import torch._inductor.config as inductor

    with inductor.patch(compile_threads=inductor.compile_threads, worker_start_method=inductor.worker_start_method):
        yield inductor


def test_a_worker_whose_compile_pool_never_answers_compiles_in_its_own_process(monkeypatch, inductor):
    from torch._inductor.async_compile import AsyncCompile

    def never_ready(timeout=None):
        raise TimeoutError("the pool did not answer")

    monkeypatch.setattr(AsyncCompile, "wait_pool_ready", never_ready)
    compile_in(4)
    assert (inductor.compile_threads, inductor.worker_start_method) == (4, "fork")
    assert start_compile_pool() == 0, "no compile processes"
    assert inductor.compile_threads == 1
    assert start_compile_pool() is None, "none asked for any more"


@pytest.mark.parametrize("split", [True, False])
def test_a_started_pool_compiles_a_kernels_configurations_apart_unless_asked_not_to(monkeypatch, inductor, split):
    from torch._inductor.async_compile import AsyncCompile

    processes = types.SimpleNamespace(submit=lambda fn, *args: None)  # stands for inductor's compile processes
    with ThreadPoolExecutor(2) as threads:
        monkeypatch.setattr(AsyncCompile, "wait_pool_ready", lambda timeout=None: None)
        monkeypatch.setattr(AsyncCompile, "pool", lambda: threads)
        monkeypatch.setattr(AsyncCompile, "process_pool", lambda: processes)
        compile_in(2)
        assert start_compile_pool(split=split) == 2
    assert getattr(processes.submit, "splits_configurations", False) is split
