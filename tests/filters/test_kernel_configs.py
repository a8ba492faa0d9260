"""A kernel's Triton configurations compiled as jobs of their own in a compile pool, joined into the kernel inductor
asked for. Inductor's own compile job (`_worker_compile_triton`) runs in forked processes, as in a worker; the
kernels are stand-ins (no Triton here) that compile their configurations into named results."""

import functools
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import pytest
from torch._inductor.runtime.compile_tasks import _worker_compile_triton
from torch._inductor.runtime.triton_heuristics import NoTritonConfigsError

from opsynth.filters.kernel_configs import split_configurations


class Kernel:
    """What inductor's compile job uses of a kernel: its configurations, compiled into `compile_results` (a
    configuration named bad... does not compile, as one out of resources; one named boom... breaks the compiler)."""

    def __init__(self, configs):
        self.configs = list(configs)
        self.compile_results = []

    def precompile(self, warm_cache_only=False):
        if any(c.startswith("boom") for c in self.configs):
            raise RuntimeError("the compiler broke")
        results = [f"{c} of {len(self.configs)}" for c in self.configs if not c.startswith("bad")]
        if not results:
            raise NoTritonConfigsError("No valid triton configs. OutOfResources: out of resource: shared memory")
        self.compile_results, self.configs = results, None

    def prepare_for_pickle(self):
        return ()


def other_in_a_child(parent_pid: int) -> Kernel:
    """Two configurations where the pool's caller loads it, three in a compile process."""
    return Kernel(("a", "b") if os.getpid() == parent_pid else ("a", "b", "c"))


def broken_kernel() -> Kernel:
    raise ValueError("the kernel's module does not load")


@pytest.fixture
def pool():
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        yield pool


def compiled(pool, load_kernel) -> list[str]:
    kernel, microseconds = pool.submit(_worker_compile_triton, load_kernel, {}, {}).result(timeout=60)
    assert microseconds >= 0
    return kernel.compile_results


def test_each_configuration_compiles_in_a_job_of_its_own_joined_in_order(pool):
    assert compiled(pool, functools.partial(Kernel, ("x", "y", "z"))) == ["x of 3", "y of 3", "z of 3"], "as asked"
    assert split_configurations(pool) and split_configurations(pool), "wrapped once, however often asked"
    assert compiled(pool, functools.partial(Kernel, ("x", "y", "z"))) == ["x of 1", "y of 1", "z of 1"]
    assert compiled(pool, functools.partial(Kernel, ("x",))) == ["x of 1"], "one configuration: inductor's own job"
    assert pool.submit(pow, 2, 10).result(timeout=60) == 1024, "other jobs pass as they are"


def test_configurations_that_do_not_compile_are_left_out_as_inductor_leaves_them(pool):
    split_configurations(pool)
    assert compiled(pool, functools.partial(Kernel, ("bad1", "y", "bad2"))) == ["y of 1"]
    with pytest.raises(NoTritonConfigsError, match="OutOfResources"):
        compiled(pool, functools.partial(Kernel, ("bad1", "bad2")))
    with pytest.raises(RuntimeError, match="the compiler broke"):
        compiled(pool, functools.partial(Kernel, ("x", "boom", "z")))
    with pytest.raises(ValueError, match="does not load"):
        compiled(pool, broken_kernel)


def test_a_compile_process_counting_other_configurations_compiles_them_all_in_one_job(pool):
    split_configurations(pool)
    assert compiled(pool, functools.partial(other_in_a_child, os.getpid())) == ["a of 3", "b of 3", "c of 3"]


@pytest.mark.gpu
def test_on_a_gpu_a_kernels_configurations_compile_apart_and_all_come_back(monkeypatch):
    """Inductor's real kernels and pool: a pointwise kernel over a long vector has several configurations, each
    compiled as a job of its own and joined with all of them; the compiled model agrees with eager."""
    import torch
    import torch._dynamo
    import torch._inductor.config as inductor

    from opsynth.filters import kernel_configs
    from opsynth.filters.worker_setup import compile_in, start_compile_pool

    joins, join = [], kernel_configs.joined_kernel

    def joined_kernel(jobs):
        joins.append((len(jobs), join(jobs)))
        return joins[-1][1]

    monkeypatch.setattr(kernel_configs, "joined_kernel", joined_kernel)
    x = torch.randn(1 << 20, device="cuda")

    def fn(t):
        return torch.sin(t) * 2.718281 + torch.cos(t) * 0.577215  # constants of its own: no kernel cached from before

    with inductor.patch(compile_threads=inductor.compile_threads, worker_start_method=inductor.worker_start_method,
                        fx_graph_cache=False):  # fmt: skip
        compile_in(2)
        assert start_compile_pool() == 2
        torch._dynamo.reset()
        out = torch.compile(fn)(x)
    torch.testing.assert_close(out, fn(x))
    assert joins, "a kernel of several configurations was compiled apart"
    assert all(jobs == len(kernel.compile_results) > 1 for jobs, (kernel, _) in joins), "each came back"
