import csv

import pytest
import torch

from opsynth.commands.catalog_check import check_entry, execute_entries
from opsynth.config import WORKLOADS
from opsynth.filters.execution import execution_config
from opsynth.filters.workers import WorkerPool
from opsynth.operator_catalog import OpEntry, all_entries, get
from opsynth.operator_catalog.activations import plain_call
from opsynth.operator_catalog.entry import SampleContext
from opsynth.operator_catalog.registry import UnknownOperator

ENTRIES = [e for e in all_entries() if e.excluded is None]
REQUIRED_FAMILIES = {
    "activations", "arithmetic", "normalization", "convolution", "linear", "pooling", "reductions", "scans",
    "shape_ops", "logical", "indexing", "losses", "sequence", "spectral", "creation", "containers",
}  # fmt: skip


def test_catalog_has_at_least_60_entries_over_every_family():
    assert len(ENTRIES) >= 60
    assert {e.family for e in ENTRIES} >= REQUIRED_FAMILIES


def test_convolutions_and_transposed_convolutions_in_1d_2d_3d():
    names = {e.name for e in ENTRIES}
    for kind in ("Conv", "ConvTranspose"):
        for d in (1, 2, 3):
            assert f"nn.{kind}{d}d" in names


def test_names_are_spelled_as_in_the_released_vocabulary(ops6k_vocabulary):
    with open(ops6k_vocabulary) as f:
        vocabulary = {row["op"] for row in csv.DictReader(f, delimiter="\t")}
    unknown = sorted(e.name for e in all_entries() if e.kind == "torch" and e.name not in vocabulary)
    assert unknown == []


def test_every_released_torch_name_is_an_entry_and_300_are_sampled(ops6k_vocabulary):
    with open(ops6k_vocabulary) as f:
        vocabulary = {row["op"] for row in csv.DictReader(f, delimiter="\t")}
    torch_entries = {e.name: e for e in all_entries() if e.kind == "torch"}
    assert sorted(vocabulary - set(torch_entries)) == []  # none silently missing
    assert sum(1 for e in torch_entries.values() if e.excluded is None) >= 300


def test_ops6k_weights_cover_every_torch_entry(ops6k_vocabulary):
    from opsynth.operator_catalog.weights import OPS6K_COUNTS

    with open(ops6k_vocabulary) as f:
        counts = {row["op"]: int(row["count_in_ops6k"]) for row in csv.DictReader(f, delimiter="\t")}
    assert counts == OPS6K_COUNTS  # no entry is drawn with a default weight
    assert {e.name for e in all_entries() if e.kind == "torch"} == set(OPS6K_COUNTS)


def test_excluded_entries_say_why_and_are_never_drawn():
    from opsynth.operator_catalog.registry import sampleable

    excluded = [e for e in all_entries() if e.excluded is not None]
    assert excluded and all(len(e.excluded) > 20 for e in excluded)
    drawn = {e.name for kind in ("torch", "transformers") for e in sampleable(kind)}
    assert not drawn & {e.name for e in excluded}


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_every_entry_builds_and_runs_on_meta(entry, workload):
    assert check_entry(entry, WORKLOADS[workload]) is None


# Eager checks only: the compile check of every entry (inductor, minutes on 2 cores) is `opsynth catalog check
# --execute`, run before a catalog change lands.
EXECUTE_CONFIG = execution_config(
    "cpu", WORKLOADS["tiny"].runtime_window_ms, WORKLOADS["tiny"].timeout_s, compile_check=False, workers=2
)


@pytest.fixture(scope="module")
def executed_entries() -> dict[str, str | None]:
    """Every entry's task through the execution filters on the CPU, in the contained workers of one pool."""
    with WorkerPool(EXECUTE_CONFIG) as pool:
        return execute_entries(ENTRIES, WORKLOADS["tiny"], pool)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_every_entry_appears_in_a_task_that_passes_the_filters_on_cpu(entry, executed_entries):
    assert executed_entries[entry.name] is None


def test_entry_validation_rejects_bad_entries():
    with pytest.raises(ValueError, match="ranks"):
        OpEntry(name="torch.relu", family="activations", sampler=plain_call("torch.relu", "function"), ranks=())
    with pytest.raises(ValueError, match="domain"):
        OpEntry(name="torch.relu", family="activations", sampler=plain_call("torch.relu", "function"), ranks=(2,),
                domain="complex")  # fmt: skip
    # A transformers module takes no chained input (no ranks), but names the modeling module of its class.
    with pytest.raises(ValueError, match="modeling module"):
        OpEntry(name="ResNetShortCut", family="transformers", sampler=get("ResNetShortCut").sampler, ranks=(),
                kind="transformers", module="resnet")  # fmt: skip
    assert get("ResNetShortCut").module_class().__name__ == "ResNetShortCut"


def test_unknown_operator_lookup_raises():
    assert get("nn.Conv2d").family == "convolution"
    with pytest.raises(UnknownOperator):
        get("nn.Conv4d")


def test_transformers_entries_are_released_classes(ops6k_transformers):
    with open(ops6k_transformers) as f:
        released = {row["class"] for row in csv.DictReader(f, delimiter="\t")}
    entries = [e for e in all_entries() if e.kind == "transformers"]
    assert {e.name for e in entries} == released  # every released class: sampled, or excluded with the reason
    assert sum(1 for e in entries if e.excluded is None) >= 40


def test_a_feature_pyramid_module_takes_its_maps_as_one_list():
    import random

    from opsynth.filters.task_loading import load_task
    from opsynth.operator_catalog.transformers_modules import transformers_task

    task = transformers_task(get("DepthAnythingNeck"), random.Random(0), WORKLOADS["tiny"])
    loaded = load_task(task.source)
    inputs = loaded.get_inputs()
    assert isinstance(inputs[0], list) and len(inputs[0]) == 4 and all(isinstance(i, int) for i in inputs[1:])
    with torch.no_grad():
        outs = loaded.model_class(*loaded.get_init_inputs()).eval()(*inputs)
    assert len(outs) == 4 and all(o.dim() == 4 for o in outs)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_transformers_task_computes_in_its_dtype(dtype):
    import random

    from opsynth.filters.comparison import flatten_outputs
    from opsynth.filters.task_loading import load_task
    from opsynth.operator_catalog.transformers_modules import transformers_task

    task = transformers_task(get("DepthAnythingNeck"), random.Random(0), WORKLOADS["tiny"], dtype=dtype)
    assert {s.dtype for s in task.input_shapes} == {dtype}
    loaded = load_task(task.source)
    model = loaded.model_class(*loaded.get_init_inputs()).eval()  # its __init__ ends casting itself
    assert {p.dtype for p in model.parameters()} == {getattr(torch, dtype)}
    with torch.no_grad():
        outs = flatten_outputs(model(*loaded.get_inputs()))
    assert outs and all(o.dtype == getattr(torch, dtype) for o in outs)


def test_every_transformers_class_casts_itself_in_its_own_init():
    import ast
    import random

    from opsynth.operator_catalog.transformers_modules import ENTRIES, transformers_task

    for entry in (e for e in ENTRIES if e.excluded is None and "bfloat16" in e.dtypes):
        task = transformers_task(entry, random.Random(0), WORKLOADS["tiny"], dtype="bfloat16")
        (model,) = [n for n in ast.parse(task.source).body if isinstance(n, ast.ClassDef) and n.name == "Model"]
        (init,) = [n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
        assert ast.unparse(init.body[-1]) == "self.to(torch.bfloat16)", entry.name


def test_a_transformers_module_whose_kernels_lack_a_dtype_is_drawn_in_float32_alone():
    from dataclasses import replace

    from opsynth.operator_catalog.transformers_modules import compose_transformers

    assert get("NystromformerSelfAttention").dtypes == ("float32",)
    half = replace(WORKLOADS["tiny"], dtypes=(("float16", 1.0),))
    assert all(compose_transformers(seed, half).ops != ("NystromformerSelfAttention",) for seed in range(60))


def test_transformers_task_inlines_its_class_and_helpers():
    import random

    from opsynth.filters.task_loading import load_task
    from opsynth.operator_catalog.transformers_render import render_transformers

    entry = get("ResNetBasicLayer")
    task = render_transformers(entry, entry.sampler(SampleContext(None, random.Random(0), WORKLOADS["tiny"])))
    assert task.ops == ("ResNetBasicLayer",) and "ResNetBasicLayer" in task.source
    assert "class Model(nn.Module):" in task.source and "class ResNetConvLayer" in task.source  # the helper
    assert "@" not in task.source  # decorators are dropped
    loaded = load_task(task.source)
    model = loaded.model_class(*loaded.get_init_inputs())
    assert "transformers" not in type(model).__module__  # the computation is the inlined code, not a library call


def test_a_transformers_module_is_read_once_per_process_and_renders_alike(monkeypatch):
    import random

    from opsynth import syntax
    from opsynth.operator_catalog import transformers_render

    reads = []
    source_of = syntax.source_of
    monkeypatch.setattr(syntax, "source_of", lambda obj: reads.append(obj) or source_of(obj))
    transformers_render.inline_source.cache_clear()
    entry = get("ResNetBasicLayer")
    tasks = [
        transformers_render.render_transformers(
            entry, entry.sampler(SampleContext(None, random.Random(s), WORKLOADS["tiny"]))
        )
        for s in (0, 0, 1)
    ]
    assert reads and len(reads) == len(set(reads))  # the class and each helper read once, for all three tasks
    assert tasks[0] == tasks[1] and "class Model(nn.Module):" in tasks[2].source
