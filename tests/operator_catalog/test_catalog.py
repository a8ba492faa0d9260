import csv

import pytest

from operator_catalog import OpEntry, all_entries, get
from operator_catalog.activations import _plain
from operator_catalog.check import check_entry
from operator_catalog.registry import UnknownOperator
from pipeline.config import WORKLOADS

ENTRIES = [e for e in all_entries() if e.excluded is None]
REQUIRED_FAMILIES = {
    "activations", "arithmetic", "normalization", "convolution", "linear", "pooling", "reductions", "scans",
    "shape_ops",
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


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_every_entry_builds_and_runs_on_meta(entry, workload):
    assert check_entry(entry, WORKLOADS[workload]) is None


def test_entry_validation_rejects_bad_entries():
    with pytest.raises(ValueError, match="ranks"):
        OpEntry(name="torch.relu", family="activations", sampler=_plain("torch.relu", "function"), ranks=())
    with pytest.raises(ValueError, match="domain"):
        OpEntry(name="torch.relu", family="activations", sampler=_plain("torch.relu", "function"), ranks=(2,),
                domain="complex")  # fmt: skip


def test_unknown_operator_lookup_raises():
    assert get("nn.Conv2d").family == "convolution"
    with pytest.raises(UnknownOperator):
        get("nn.Conv4d")


def test_transformers_entries_are_released_classes(ops6k_transformers):
    with open(ops6k_transformers) as f:
        released = {row["class"] for row in csv.DictReader(f, delimiter="\t")}
    names = [e.name for e in all_entries() if e.kind == "transformers"]
    assert names and set(names) <= released


def test_transformers_task_inlines_its_class_and_helpers():
    import random

    from filters.task_loading import load_task
    from operator_catalog.transformers_modules import render_transformers

    entry = get("ResNetBasicLayer")
    task = render_transformers(entry, entry.sampler(random.Random(0), WORKLOADS["tiny"]))
    assert task.ops == ("ResNetBasicLayer",) and "ResNetBasicLayer" in task.source
    assert "class Model(nn.Module):" in task.source and "class ResNetConvLayer" in task.source  # the helper
    assert "@" not in task.source  # decorators are dropped
    loaded = load_task(task.source)
    model = loaded.model_class(*loaded.get_init_inputs())
    assert "transformers" not in type(model).__module__  # the computation is the inlined code, not a library call
