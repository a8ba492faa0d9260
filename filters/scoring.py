"""The CUDA Agent paper's reward for a solution (`ModelNew`) to a task, and the two halves of its measurement, each
run in a process of its own (filters.scoring_process): the task's side (`reference_case`) and the solution's
(`solution_run`), which never sees the task's outputs or baselines (docs/commands.md, "Scoring")."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from typing import Any

import torch

from opsynth.config import NUM_DRAWS, VERIFY_ATOL, VERIFY_RTOL
from opsynth.filters.comparison import flatten_outputs, to_device
from opsynth.filters.execution import draw_inputs
from opsynth.filters.task_loading import load_task
from opsynth.filters.timing import PhaseClock, device_ms, host_time_ms, profile_forwards

ATOL, RTOL = VERIFY_ATOL, VERIFY_RTOL  # the paper's tolerance
WARMUP, ITERS = 5, 10  # forwards before the timed ones, and the timed ones
FASTER = 1.05  # "more than 5 % faster": a baseline's time over the solution's above this
EXTENSION_NAME = "cuda_extension"  # what a solution imports its compiled sources as
SOLUTION_FILENAME = "model_new.py"  # the solution's module in a solution folder
EXTENSION_SUFFIXES = (".cu", ".cpp")


def reward(solution_ms: float, eager_ms: float | None, compile_ms: float | None) -> tuple[int, str]:
    """The reward of a correct solution and why: 3 more than 5 % faster than both eager and torch.compile, 2
    than eager only, else 1 (a baseline not known is not beaten). An incorrect solution is -1, decided before."""
    beats_eager = eager_ms is not None and eager_ms / max(solution_ms, 1e-9) > FASTER
    beats_compile = compile_ms is not None and compile_ms / max(solution_ms, 1e-9) > FASTER
    if beats_eager and beats_compile:
        return 3, "correct; more than 5 % faster than eager and than torch.compile"
    if beats_eager:
        known = "" if compile_ms is not None else " (no torch.compile time to beat)"
        return 2, f"correct; more than 5 % faster than eager, not than torch.compile{known}"
    return 1, "correct; not more than 5 % faster than eager"


def _timed_ms(fn, inputs: list, cuda: bool) -> float:
    """One forward's time after WARMUP forwards: over ITERS profiled (CUDA), or their median by the host clock."""
    if not cuda:
        return host_time_ms(fn, inputs, WARMUP, ITERS)
    with torch.no_grad():
        for _ in range(WARMUP):
            fn(*inputs)
        torch.cuda.synchronize()
    prof = profile_forwards([(fn, "timing")], inputs, ITERS, contextlib.nullcontext(), PhaseClock())
    return device_ms(prof.events(), ITERS)


def reference_case(task_source: str, seed: int, device: str, measure: bool) -> tuple[dict, dict]:
    """The task's side: (the case the solution gets: init inputs, weights, the draws' inputs, all on the CPU;
    what stays with the scorer: the draws' outputs and, where `measure`, the eager and compiled times). The
    draws are seeded by `seed`, which the scorer picks at random, so no solution can know them in advance."""
    task = load_task(task_source)
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    torch.manual_seed(seed)
    init_inputs = list(task.get_init_inputs())
    with torch.device(dev):
        model = task.model_class(*init_inputs)
    model = model.to(dev).eval()
    draws, outputs = [], []
    with torch.no_grad():
        for i in range(NUM_DRAWS):
            inputs = draw_inputs(task, seed, i, dev)
            outputs.append([t.detach().cpu() for t in flatten_outputs(model(*inputs))])
            draws.append(to_device(inputs, torch.device("cpu")))
    case = {"init_inputs": init_inputs, "weights": {k: v.cpu() for k, v in model.state_dict().items()},
            "draws": draws, "model_seed": seed}  # fmt: skip
    kept: dict[str, Any] = {"outputs": outputs}
    if measure:
        inputs = to_device(draws[0], dev)
        kept["eager_ms"] = _timed_ms(model, inputs, cuda)
        try:
            kept["compile_ms"] = _timed_ms(torch.compile(model), inputs, cuda)
        except Exception as e:  # a task torch.compile cannot take has no compiled time to beat
            kept["compile_error"] = f"{type(e).__name__}: {e}"[:300]
    return case, kept


class FunctionalDisabled(Exception):
    """A solution called a public callable of torch.nn.functional."""


@contextlib.contextmanager
def functional_disabled():
    """Within the block every public callable of torch.nn.functional raises, as in the paper's checker: a
    solution may not fall back to PyTorch's own operators through it."""
    import torch.nn.functional as F

    saved = {name: value for name, value in vars(F).items() if not name.startswith("_") and callable(value)
             and not isinstance(value, type) and getattr(value, "__module__", "").startswith("torch")}  # fmt: skip

    def blocked(name: str):
        def call(*args, **kwargs):
            raise FunctionalDisabled(f"the solution calls torch.nn.functional.{name}, which the checker forbids")

        return call

    for name in saved:
        setattr(F, name, blocked(name))
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(F, name, value)


def build_extension(folder: str, build_dir: str, solution: str) -> None:
    """Where the solution imports EXTENSION_NAME: compile its folder's .cu and .cpp sources into that module,
    importable from then on (torch.utils.cpp_extension); a compiler error raises with the compiler's message.
    A solution that builds its sources itself (`load` or `load_inline`, paths from its `__file__`) does so."""
    from torch.utils.cpp_extension import is_ninja_available, load

    if EXTENSION_NAME not in solution:
        return
    sources = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(EXTENSION_SUFFIXES))
    if sources:
        os.makedirs(build_dir, exist_ok=True)
        if is_ninja_available():
            module = load(name=EXTENSION_NAME, sources=sources, build_directory=build_dir, verbose=False)
        else:
            module = _built_without_ninja(sources, build_dir)
        sys.modules[EXTENSION_NAME] = module


def _built_without_ninja(sources: list[str], build_dir: str):
    """The extension built by setuptools, one source at a time (torch's `load` needs ninja, which a machine may
    lack); the compiler's messages go to this process's output."""
    import importlib.machinery

    from setuptools import setup
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

    kind = CUDAExtension if any(s.endswith(".cu") for s in sources) else CppExtension
    temp = os.path.join(build_dir, "temp")
    setup(name=EXTENSION_NAME, ext_modules=[kind(EXTENSION_NAME, sources)],
          cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
          script_args=["-q", "build_ext", "--build-lib", build_dir, "--build-temp", temp])  # fmt: skip
    (library,) = [f for f in os.listdir(build_dir) if f.startswith(f"{EXTENSION_NAME}.") and f.endswith(".so")]
    loader = importlib.machinery.ExtensionFileLoader(EXTENSION_NAME, os.path.join(build_dir, library))
    spec = importlib.util.spec_from_loader(EXTENSION_NAME, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _solution_module(source: str, path: str):
    spec = importlib.util.spec_from_loader("model_new", loader=None, origin=path)
    module = importlib.util.module_from_spec(spec)
    module.__file__ = path  # a solution may find its sources beside it
    sys.modules["model_new"] = module
    exec(compile(source, path, "exec"), module.__dict__)
    model_new = module.__dict__.get("ModelNew")
    if not callable(model_new):
        raise AttributeError("the solution defines no ModelNew")
    return model_new


def solution_run(source: str, path: str, case: dict, device: str) -> tuple[list[list[torch.Tensor]], float]:
    """The solution's side: ModelNew built in eval mode with the task's weights loaded, its outputs on each of
    the case's draws and its time on the first, torch.nn.functional disabled throughout (its import too, so it
    cannot keep the functions aside). After the timed forwards, the timed inputs take the second draw's values
    in place and the solution runs once more: that output, last in the list, must be the second draw's, so a
    solution that keeps its outputs by the inputs' storage (fast to time, right on each fresh draw) fails."""
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    with functional_disabled(), torch.no_grad():
        model_new = _solution_module(source, path)
        torch.manual_seed(case["model_seed"])
        with torch.device(dev):
            model = model_new(*case["init_inputs"])
        model = model.to(dev).eval()
        model.load_state_dict(case["weights"], strict=False)
        outputs = []
        for draw in case["draws"]:
            out = model(*to_device(draw, dev))
            outputs.append([t.detach().cpu() for t in flatten_outputs(out)])
        if cuda:
            torch.cuda.synchronize()
        inputs = to_device(case["draws"][0], dev)
        solution_ms = _timed_ms(model, inputs, cuda)
        timed, second = flatten_outputs(inputs), flatten_outputs(case["draws"][1])
        if [t.shape for t in timed] == [t.shape for t in second]:
            for tensor, values in zip(timed, second, strict=True):
                tensor.copy_(values)
        else:  # a task whose draws differ in shape: a fresh copy
            inputs = to_device(case["draws"][1], dev)
        outputs.append([t.detach().cpu() for t in flatten_outputs(model(*inputs))])
    return outputs, solution_ms
