"""`opsynth score`'s reward and its isolation: hand-written solutions (correct, wrong, crashing, hanging, and some
that try to cheat) scored on the CPU against one task. Rewards of correct solutions are asserted against
baselines far from any machine's speed, so no test depends on how fast this machine is."""

import os
import shutil
from pathlib import Path

import pytest
import torch

from opsynth.filters.scorer import TaskFailed, score
from opsynth.filters.scoring import FunctionalDisabled, functional_disabled, reward

TASK = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2


def get_inputs():
    return [torch.randn(16, 32)]


def get_init_inputs():
    return [32]
"""
HEADER = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def __init__(self, n):\n" \
         "        super().__init__()\n        self.lin = nn.Linear(n, n)\n\n    def forward(self, x):\n"  # fmt: skip
SAME = "torch.clamp_min(torch.addmm(self.lin.bias, x, self.lin.weight.t()), 0) * 2"
CORRECT = HEADER + f"        return {SAME}\n"
WRONG = HEADER + f"        return {SAME} * 1.1\n"
MATMUL = "torch.addmm(self.lin.bias, x, self.lin.weight.t())"
USES_FUNCTIONAL = HEADER + f"        return torch.nn.functional.relu({MATMUL}) * 2\n"
KEEPS_FUNCTIONAL = "from torch.nn.functional import linear\n" + HEADER + \
    "        return torch.clamp_min(linear(x, self.lin.weight, self.lin.bias), 0) * 2\n"  # fmt: skip
CRASHES = "import ctypes\n" + HEADER + "        return ctypes.string_at(0)\n"
HANGS = HEADER + "        while True:\n            pass\n"
EXITS = "import sys\nsys.exit(0)\n"
PATCHES_THE_CHECKER = (
    "import torch, torch.testing\ntorch.allclose = lambda *a, **k: True\ntorch.equal = lambda *a, **k: True\n"
    "torch.testing.assert_close = lambda *a, **k: None\n" + HEADER + "        return torch.zeros(x.shape[0], 32)\n"
)
CACHES_ITS_FIRST_OUTPUT = HEADER + (
    f"        if not hasattr(self, 'kept'):\n            self.kept = {SAME}\n        return self.kept\n"
)
FAR_SLOWER_BASELINES = (1000.0, 1000.0)  # ms: any machine's correct solution beats them by far
FAR_FASTER_BASELINES = (1e-6, 1e-6)


def _score(solution: str, tmp_path, recorded=FAR_SLOWER_BASELINES, timeout_s=120.0, task=TASK):
    path = tmp_path / "model_new.py"
    path.write_text(solution)
    return score(task, solution, str(path), None, "cpu", recorded, timeout_s)


def test_the_reward_follows_the_papers_rule():
    assert reward(1.0, 2.0, 2.0)[0] == 3
    assert reward(1.0, 2.0, 1.0)[0] == 2
    assert reward(1.0, 1.04, 0.5)[0] == 1  # 4 % faster than eager is not more than 5 %
    assert reward(1.0, 1.06, 1.06)[0] == 3
    assert reward(1.0, 2.0, None)[0] == 2  # no compiled time to beat


def test_functional_is_disabled_inside_the_block_and_given_back_after():
    with functional_disabled(), pytest.raises(FunctionalDisabled, match="relu"):
        torch.nn.functional.relu(torch.ones(2))
    assert torch.equal(torch.nn.functional.relu(-torch.ones(2)), torch.zeros(2))


def test_a_correct_solution_is_scored_by_its_time_against_the_baselines(tmp_path):
    fast = _score(CORRECT, tmp_path)
    assert (fast.reward, fast.baseline) == (3, "recorded") and fast.solution_ms > 0, fast.reason
    slow = _score(CORRECT, tmp_path, recorded=FAR_FASTER_BASELINES)
    assert slow.reward == 1 and "not more than 5 % faster" in slow.reason


@pytest.mark.parametrize(
    ("solution", "expected"),
    [
        (WRONG, "incorrect: draw 1: outputs differ"),
        (USES_FUNCTIONAL, "torch.nn.functional.relu"),
        (KEEPS_FUNCTIONAL, "torch.nn.functional.linear"),  # imported before its forward: blocked all the same
        (CRASHES, "crashed (SIGSEGV)"),
        (EXITS, "it raises: SystemExit"),
        (PATCHES_THE_CHECKER, "incorrect: draw 1"),  # the comparison runs in the scorer, not beside the solution
        (CACHES_ITS_FIRST_OUTPUT, "incorrect: draw 2"),  # each draw is fresh
        ("class Model:\n    pass\n", "defines no ModelNew"),
    ],
)
def test_a_failing_or_cheating_solution_gets_minus_one_and_the_reason(solution, expected, tmp_path):
    result = _score(solution, tmp_path)
    assert result.reward == -1 and expected in result.reason, result.reason
    assert result.solution_ms is None and result.eager_ms == FAR_SLOWER_BASELINES[0]


def test_a_hanging_solution_is_stopped_at_the_time_limit(tmp_path):
    result = _score(HANGS, tmp_path, timeout_s=8.0)  # on a slow machine its start-up alone may take that: -1 too
    assert result.reward == -1 and "gave no result within 8 s" in result.reason


def test_baselines_measured_now_where_none_are_recorded(tmp_path):
    result = _score(CORRECT, tmp_path, recorded=None)
    assert result.baseline == "measured" and result.reward in (1, 2, 3), result.reason
    assert result.eager_ms > 0 and result.compile_ms > 0


def test_a_task_that_does_not_run_is_not_the_solutions_fault(tmp_path):
    with pytest.raises(TaskFailed, match="the task does not run: ValueError: boom"):
        _score(CORRECT, tmp_path, task=TASK.replace("return [torch.randn(16, 32)]", "raise ValueError('boom')"))


# A C++ extension built as torch builds one (torch's include paths and flags), its tensor work done through
# Python objects: pybind11 alone builds in seconds, where torch/extension.h takes half a minute on 2 cores, and the
# scorer builds either the same way (the H200 runs have built .cu kernels with torch's headers).
CPP_SOURCE = """#include <pybind11/pybind11.h>
namespace py = pybind11;
py::object twice_relu(py::object y) { return y.attr("clamp_min")(0).attr("mul")(2); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("twice_relu", &twice_relu); }
"""
WITH_EXTENSION = "import cuda_extension\n" + HEADER + \
    "        return cuda_extension.twice_relu(torch.addmm(self.lin.bias, x, self.lin.weight.t()))\n"  # fmt: skip


NEEDS_A_BUILD = pytest.mark.skipif(not (shutil.which("ninja") and shutil.which("c++")),
                                   reason="needs ninja and a C++ compiler")  # fmt: skip


def _folder_builds_and_a_broken_source_does_not(tmp_path) -> None:
    folder = tmp_path / "solution"
    folder.mkdir()
    (folder / "model_new.py").write_text(WITH_EXTENSION)
    (folder / "ops.cpp").write_text(CPP_SOURCE)
    built = score(TASK, WITH_EXTENSION, str(folder / "model_new.py"), str(folder), "cpu", FAR_SLOWER_BASELINES, 300)
    assert built.reward == 3, built.reason
    # a header that does not exist: the compiler stops at once, not after torch's headers
    (folder / "ops.cpp").write_text("#include <retrun.h>\n" + CPP_SOURCE)
    broken = score(TASK, WITH_EXTENSION, str(folder / "model_new.py"), str(folder), "cpu", FAR_SLOWER_BASELINES, 300)
    assert broken.reward == -1 and "its sources do not build" in broken.reason and "retrun" in broken.reason


@NEEDS_A_BUILD
def test_a_solution_folder_builds_its_sources_and_a_build_error_is_the_solutions_fault(tmp_path):
    _folder_builds_and_a_broken_source_does_not(tmp_path)


KEEPS_OUTPUTS_BY_STORAGE = HEADER + (
    "        if not hasattr(self, 'kept'):\n"
    "            self.kept = {}\n"
    "        if x.data_ptr() not in self.kept:\n"
    f"            self.kept[x.data_ptr()] = {SAME}\n"
    "        return self.kept[x.data_ptr()]\n"
)


def test_a_solution_that_keeps_outputs_by_its_inputs_storage_is_caught_after_its_timing(tmp_path):
    """Right on every fresh draw, and near free to time (the timed forwards repeat one input)."""
    result = _score(KEEPS_OUTPUTS_BY_STORAGE, tmp_path)
    assert result.reward == -1 and "outputs kept by storage" in result.reason, result.reason


BUILDS_ITS_OWN = (
    """import os
from torch.utils.cpp_extension import load

ops = load(name="own_ops", sources=[os.path.join(os.path.dirname(__file__), "ops.cpp")], verbose=False)
"""
    + HEADER
    + "        return ops.twice_relu(torch.addmm(self.lin.bias, x, self.lin.weight.t()))\n"
)


@NEEDS_A_BUILD
def test_a_solution_may_build_the_sources_beside_it_itself(tmp_path):
    (tmp_path / "ops.cpp").write_text(CPP_SOURCE)
    result = score(TASK, BUILDS_ITS_OWN, str(tmp_path / "model_new.py"), None, "cpu", FAR_SLOWER_BASELINES, 300)
    assert result.reward == 3, result.reason


@NEEDS_A_BUILD
def test_without_ninja_a_solution_folder_is_built_by_setuptools(tmp_path, monkeypatch):
    """torch's `load` needs ninja, which a GPU machine may lack: the folder's sources are built all the same."""
    tools = tmp_path / "bin"  # every program on PATH but ninja
    tools.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        for program in Path(folder).glob("*") if Path(folder).is_dir() else []:
            if program.name != "ninja" and not (tools / program.name).exists():
                (tools / program.name).symlink_to(program)
    monkeypatch.setenv("PATH", str(tools))
    _folder_builds_and_a_broken_source_does_not(tmp_path)
