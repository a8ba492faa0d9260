import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from filters.decontamination import (
    KernelBenchIndex,
    ReferenceError_,
    decontaminate,
    load_reference,
    tasks_from_parquet,
)
from filters.reasons import KEEP, KERNELBENCH_NEAR_DUPLICATE
from operator_catalog.codegen import render
from operator_catalog.compose import compose
from pipeline.config import COMPOSE_ATTEMPTS, WORKLOADS
from tests import fixtures


@pytest.fixture(scope="module")
def kb_tasks(kernelbench_parquet):
    return tasks_from_parquet(kernelbench_parquet)


def test_embedded_index_equals_one_rebuilt_from_kernelbench(kb_tasks):
    rebuilt = KernelBenchIndex.from_tasks(kb_tasks)
    embedded = load_reference("embedded")
    assert embedded.names == rebuilt.names
    assert (embedded.signatures == rebuilt.signatures).all()
    assert len(embedded.names) == 250 and embedded.names[0].startswith("level1/")


def test_kernelbench_copies_are_flagged_even_disguised(kb_tasks):
    index = load_reference("embedded")
    for name, code in kb_tasks[100:110]:
        disguised = code.replace("class Model(nn.Module):", 'class Model(nn.Module):\n    """A fused layer."""  # ok')
        for source in (code, disguised):
            verdict = decontaminate(source, index)
            assert verdict.reason == KERNELBENCH_NEAR_DUPLICATE
            assert verdict.measurements["kb_nearest"] == name


def test_generated_tasks_are_kept_with_their_nearest_task():
    index = load_reference("embedded")
    for seed in range(10):
        verdict = decontaminate(render(compose(seed, 2, WORKLOADS["tiny"], COMPOSE_ATTEMPTS)).source, index)
        assert verdict.reason == KEEP
        assert 0.0 <= verdict.measurements["kb_minhash_jaccard"] < 0.8
        assert verdict.measurements["kb_nearest"].startswith("level")


def test_reference_from_a_folder_of_py_files(tmp_path):
    (tmp_path / "level9").mkdir()
    (tmp_path / "level9" / "1_Good.py").write_text(fixtures.GOOD)
    index = load_reference(str(tmp_path))
    assert index.names == ("level9/1_Good",)
    assert decontaminate(fixtures.GOOD, index).reason == KERNELBENCH_NEAR_DUPLICATE


def test_wrong_schema_missing_and_empty_references_are_refused(tmp_path):
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"text": ["x"]}), bad)
    with pytest.raises(ReferenceError_, match="needs `code`"):
        load_reference(str(bad))
    with pytest.raises(ReferenceError_, match="no such file"):
        load_reference(str(tmp_path / "missing.parquet"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReferenceError_, match=r"no \.py"):
        load_reference(str(tmp_path / "empty"))
    garbage = tmp_path / "garbage.parquet"
    garbage.write_text("not parquet")
    with pytest.raises(ReferenceError_, match="cannot read"):
        load_reference(str(garbage))
