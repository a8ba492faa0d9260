"""The operator graph of what a task computes: the same whatever spelling the task uses, and what decontamination
compares it by."""

import pyarrow.parquet as pq
import pytest

from opsynth.filters.compute_graph import graph_similarity, operators, shared_operators
from opsynth.filters.decontamination import decontaminate, similarity
from opsynth.filters.kernelbench_index import load_reference, recorded_graphs, tasks_from_parquet
from opsynth.filters.shape_check import check_shapes

FOOTER = """

def get_inputs():
    return [torch.randn(8, 3, 32, 32)]


def get_init_inputs():
    return [3, 16]
"""
MODULES = (
    """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3)
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(cout, 10)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        x = self.pool(x)
        x = torch.mean(x, dim=(2, 3))
        return torch.add(self.head(x), 1.0)
"""
    + FOOTER
)
# The same computation, spelled as a launderer of benchmark tasks would: functional calls for modules, helper
# methods, a container, operators for functions, another class name bound to `Model`, a docstring.
FUNCTIONAL = (
    '''import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """A convolutional head."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(in_channels, out_channels, 3), nn.ReLU())
        self.weight = nn.Parameter(torch.randn(10, out_channels))
        self.bias = nn.Parameter(torch.randn(10))

    def _reduce(self, h):
        return F.max_pool2d(h, 2).mean(dim=(2, 3))

    def _project(self, h):
        return h @ self.weight.t() + self.bias + 1.0

    def forward(self, inp):
        return self._project(self._reduce(self.features(inp)))


Model = Block
'''
    + FOOTER
)


def graph_of(source):
    verdict = check_shapes(source)
    return verdict.measurements["graph"], verdict.measurements["graph_nodes"]


def test_the_same_computation_spelled_otherwise_has_the_same_graph():
    (plain, nodes), (disguised, _) = graph_of(MODULES), graph_of(FUNCTIONAL)
    assert nodes == 7  # convolution, relu, pooling, mean, matmul, the bias's add, the constant's add
    assert plain == disguised and graph_similarity(plain, disguised) == 1.0
    assert operators(plain) == {"convolution2d": 1, "relu": 1, "max_pool2d_with_indices": 1, "mean": 1,
                                "matmul": 1, "add": 2}  # fmt: skip


def test_a_different_computation_of_the_same_operators_is_told_apart():
    before = "x = torch.relu(self.conv(x))\n        x = self.pool(x)"
    after = "x = self.pool(self.conv(x))\n        x = torch.relu(x)"
    (plain, _), (reordered, _) = graph_of(MODULES), graph_of(MODULES.replace(before, after))
    assert operators(plain) == operators(reordered) and graph_similarity(plain, reordered) < 0.7
    grouped, _ = graph_of(MODULES.replace("nn.Conv2d(cin, cout, 3)", "nn.Conv2d(cin, cout * cin, 3, groups=cin)")
                          .replace("nn.Linear(cout, 10)", "nn.Linear(cout * cin, 10)"))  # fmt: skip
    assert "convolution2d_grouped" in operators(grouped)  # a depthwise convolution is another operator


def _helper_split(code):
    """`forward` moved into a helper method that a new `forward` calls."""
    return code.replace(
        "    def forward(self",
        "    def forward(self, *args, **kwargs):\n        return self._compute(*args, **kwargs)\n\n"
        "    def _compute(self",
        1,
    )


def _class_renamed(code):
    code = code.replace("class Model(", "class Kernel(", 1).replace("super(Model,", "super(Kernel,")
    return code + "\n\nModel = Kernel\n"


def test_kernelbench_tasks_of_several_operators_split_and_renamed_are_flagged_by_what_they_compute(kernelbench_parquet):
    """Their code runs in contained workers, as the shape check runs any task's."""
    index = load_reference("embedded")
    missed, checked = [], 0
    tasks = [
        (name, _class_renamed(_helper_split(code))) for name, code in tasks_from_parquet(kernelbench_parquet)[100::3]
    ]
    for (name, disguised), (graph, nodes) in zip(tasks, recorded_graphs([c for _, c in tasks]), strict=True):
        if nodes < 2:
            continue  # a forward meta cannot run, or one operator (kept by rule)
        checked += 1
        s = similarity(disguised, index, graph, nodes)
        verdict = decontaminate(disguised, index, graph=graph, nodes=nodes)
        if verdict.kept or s.graph < 1.0:
            missed.append(name)
    assert checked >= 40 and missed == []


def test_released_rows_of_several_operators_are_kept_and_a_flag_names_the_task_and_shared_operators(ops6k_examples):
    index = load_reference("embedded")
    rows = pq.read_table(ops6k_examples, columns=["code", "data_source"]).to_pylist()
    flagged = []
    for row, (graph, nodes) in zip(rows, recorded_graphs([row["code"] for row in rows]), strict=True):
        verdict = decontaminate(row["code"], index, graph=graph, nodes=nodes)
        if not verdict.kept:
            flagged.append((row["data_source"], verdict.detail))
    # One released transformers row is a ResNet basic block, as KernelBench's level 3 has one: the same graph.
    assert [source for source, _ in flagged] == ["transformers"]
    (detail,) = [d for _, d in flagged]
    assert detail.startswith("computes what level3/8_ResNetBasicBlock does: operator-graph similarity 1.0000")
    assert "shared operators: add, convolution2d, native_batch_norm, relu" in detail


def test_a_single_operator_is_not_judged_by_its_graph():
    single = MODULES.replace(
        "x = torch.relu(self.conv(x))\n        x = self.pool(x)\n        x = torch.mean(x, dim=(2, 3))\n"
        "        return torch.add(self.head(x), 1.0)",
        "return torch.tanh(x)",
    )
    graph, nodes = graph_of(single)
    assert nodes == 1
    s = similarity(single, load_reference("embedded"), graph, nodes)
    assert s.graph is None and "kb_graph_similarity" not in s.measurements()


@pytest.mark.parametrize("source", [MODULES, FUNCTIONAL])
def test_shared_operators_are_named(source):
    graph, _ = graph_of(source)
    assert shared_operators(graph, graph) == ["add", "convolution2d", "matmul", "max_pool2d_with_indices", "mean",
                                              "relu"]  # fmt: skip


def _functional(code):
    """Modules turned into functional calls on their parameters."""
    code = code.replace("x = torch.relu(self.conv(x))", "x = F.relu(F.conv2d(x, self.conv.weight, self.conv.bias))")
    code = code.replace("x = self.pool(x)", "x = F.max_pool2d(x, 2)")
    return code.replace("import torch.nn as nn\n", "import torch.nn as nn\nimport torch.nn.functional as F\n", 1)


def _contained(code):
    """The layers wrapped in `nn.Sequential`."""
    return code.replace("self.conv = nn.Conv2d(cin, cout, 3)", "self.conv = nn.Sequential(nn.Conv2d(cin, cout, 3))")


def _operators(code):
    """Functions written as operators."""
    return code.replace("torch.add(self.head(x), 1.0)", "self.head(x) + 1.0").replace(
        "torch.mean(x, dim=(2, 3))", "x.mean(dim=(2, 3))"
    )


@pytest.fixture(scope="module")
def one_task_reference(tmp_path_factory):
    """A reference of one task, its graph recorded in a worker."""
    root = tmp_path_factory.mktemp("reference")
    (root / "mine").mkdir()
    (root / "mine" / "conv_head.py").write_text(MODULES)
    index = load_reference(str(root))
    assert load_reference(str(root)) is index  # built once: every stage of a run loads the reference
    return index


@pytest.mark.parametrize("disguise", [_functional, _helper_split, _contained, _operators, _class_renamed])
def test_each_rewrite_of_a_reference_task_is_flagged_by_its_graph(disguise, one_task_reference):
    index = one_task_reference
    disguised = disguise(MODULES)
    assert disguised != MODULES
    graph, nodes = graph_of(disguised)
    verdict = decontaminate(disguised, index, graph=graph, nodes=nodes)
    assert verdict.reason == "kernelbench_near_duplicate", verdict.measurements
    assert (
        verdict.measurements["kb_graph_similarity"] == 1.0
        and verdict.measurements["kb_nearest_graph"] == "mine/conv_head"
    )
