"""A Triton kernel's configurations compiled as jobs of their own in a worker's compile pool, joined into the kernel
inductor asked for (why, and what it saves: docs/execution.md, "Compiling")."""

from __future__ import annotations

import functools
import threading
from concurrent.futures import Future
from typing import Any


class ConfigurationsDiffer(RuntimeError):
    """A compile process counted other configurations for a kernel than the worker did (its job then compiles
    none, and the first job compiles them all)."""


def split_configurations(pool) -> bool:
    """Make `pool` (inductor's compile pool, whose `submit` it wraps) compile each configuration of a Triton kernel
    as a job of its own; False where this torch compiles Triton kernels some other way (`pool` is left as it is)."""
    try:
        from torch._inductor.runtime.compile_tasks import _worker_compile_triton
    except ImportError:
        return False
    submit = pool.submit
    if getattr(submit, "splits_configurations", False):
        return True

    @functools.wraps(submit)
    def submitting(fn, *args, **kwargs):
        if fn is not _worker_compile_triton or not args or not callable(args[0]):
            return submit(fn, *args, **kwargs)
        load_kernel, rest = args[0], args[1:]
        count = configurations(load_kernel, rest)
        if count <= 1:
            return submit(fn, *args, **kwargs)
        jobs = [submit(fn, functools.partial(one_configuration, load_kernel, i, count), *rest, **kwargs)
                for i in range(count)]  # fmt: skip
        return joined(jobs)

    submitting.splits_configurations = True
    pool.submit = submitting
    return True


def configurations(load_kernel, rest: tuple) -> int:
    """How many configurations the kernel `load_kernel` loads has, loaded here under the settings inductor gives
    its compile job (`rest`: the job's environment and settings); 1 where it cannot be told. Loading runs the
    kernel's module (inductor's generated code) and compiles nothing; inductor loads it in the worker the same way
    where it tunes a kernel further after its first run."""
    from torch._inductor import config

    settings = next((a for a in rest[1:2] if isinstance(a, dict)), {})
    try:
        with config.patch(settings):
            return len(getattr(load_kernel(), "configs", None) or ())
    except Exception:  # the job itself will say what fails
        return 1


def one_configuration(load_kernel, index: int, count: int):
    """The kernel `load_kernel` loads, left with its configuration `index` of `count` (run in a compile process, as
    the loader of inductor's compile job); where it has other than `count`, job 0 keeps them all and the others
    raise ConfigurationsDiffer."""
    kernel = load_kernel()
    configs = list(kernel.configs or ())
    if len(configs) != count:
        if index:
            raise ConfigurationsDiffer(f"{len(configs)} configurations, not {count}")
        return kernel
    kernel.configs = [configs[index]]
    return kernel


def joined(jobs: list[Future]) -> Future:
    """One future for the jobs of a kernel's configurations, as inductor's one job for the kernel would give it:
    (kernel, microseconds compiling), the kernel holding every configuration that compiled, in order (see
    `joined_kernel`)."""
    whole: Future = Future()
    whole.set_running_or_notify_cancel()
    left = len(jobs)
    lock = threading.Lock()

    def one_done(_job: Future) -> None:
        nonlocal left
        with lock:
            left -= 1
            if left:
                return
        try:
            whole.set_result(joined_kernel(jobs))
        except BaseException as e:  # the compile's own error, raised where inductor waits for the kernel
            whole.set_exception(e)

    for job in jobs:
        job.add_done_callback(one_done)
    return whole


def joined_kernel(jobs: list[Future]) -> tuple[Any, int]:
    """The first compiled job's kernel holding the compile results of every job that compiled, in order. A job
    whose one configuration could not compile (inductor's NoTritonConfigsError: out of resources, say) is left out,
    as inductor leaves such a configuration out of a kernel; where none compiled, the last such error is raised,
    and any other error as it is."""
    try:
        from torch._inductor.runtime.triton_heuristics import NoTritonConfigsError

        one_failed: tuple = (NoTritonConfigsError,)
    except ImportError:
        one_failed = ()  # no configuration's failure is then told from another error

    compiled, failed = [], None
    for job in jobs:
        error = job.exception()
        if error is None:
            compiled.append(job.result())
        elif isinstance(error, ConfigurationsDiffer):
            continue
        elif isinstance(error, one_failed):
            failed = error
        else:
            raise error
    if not compiled:
        raise failed if failed is not None else RuntimeError("no configuration compiled")
    kernel = compiled[0][0]
    kernel.compile_results = [result for k, _ in compiled for result in k.compile_results]
    return kernel, sum(us for _, us in compiled)
