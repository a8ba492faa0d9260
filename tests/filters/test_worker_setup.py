"""How a worker sets up inductor's compiling: its own pool of compile processes, or its own process where that
pool cannot start."""

from opsynth.filters.worker_setup import compile_in, start_compile_pool


def test_a_worker_whose_compile_pool_never_answers_compiles_in_its_own_process(monkeypatch):
    import torch._inductor.config as inductor
    from torch._inductor.async_compile import AsyncCompile

    monkeypatch.setattr(inductor, "compile_threads", inductor.compile_threads)  # given back after the test
    monkeypatch.setattr(inductor, "worker_start_method", inductor.worker_start_method)

    def never_ready(timeout=None):
        raise TimeoutError("the pool did not answer")

    monkeypatch.setattr(AsyncCompile, "wait_pool_ready", never_ready)
    compile_in(4)
    assert (inductor.compile_threads, inductor.worker_start_method) == (4, "fork")
    assert start_compile_pool() == 0, "no compile processes"
    assert inductor.compile_threads == 1
    assert start_compile_pool() is None, "none asked for any more"
