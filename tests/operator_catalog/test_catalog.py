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
