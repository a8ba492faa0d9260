import ast
import importlib.resources
import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opsynth.config import COMPOSE_ATTEMPTS, WORKLOADS
from opsynth.filters.ast_similarity import profile, score
from opsynth.filters.decontamination import decontaminate, similarity
from opsynth.filters.kernelbench_index import (
    EMBEDDED_INDEX,
    KernelBenchIndex,
    ReferenceError_,
    embedded_index_path,
    fingerprint,
    load_reference,
    tasks_from_parquet,
)
from opsynth.operator_catalog.codegen import render
from opsynth.operator_catalog.compose import compose
from opsynth.reasons import KEEP, KERNELBENCH_NEAR_DUPLICATE
from tests import fixtures


@pytest.fixture(scope="module")
def kb_tasks(kernelbench_parquet):
    return tasks_from_parquet(kernelbench_parquet)


def test_embedded_index_equals_one_rebuilt_from_kernelbench(kb_tasks, tmp_path):
    rebuilt = KernelBenchIndex.from_tasks(kb_tasks)
    embedded = load_reference("embedded")
    assert embedded.to_json() == rebuilt.to_json()
    assert len(embedded.names) == 250 and embedded.names[0].startswith("level1/")
    rebuilt.save(tmp_path / "index.json.gz")
    shipped = importlib.resources.files("filters") / "data" / EMBEDDED_INDEX
    assert (tmp_path / "index.json.gz").read_bytes() == shipped.read_bytes()


def test_the_shipped_index_is_loaded_once_per_process_and_is_the_file_s():
    """A run's plan and its stages read the same index, not a load each (1.3 s on 2 cores)."""
    first = load_reference("embedded")
    assert load_reference("embedded") is first
    assert first.to_json() == KernelBenchIndex.load(embedded_index_path()).to_json()


def test_index_holds_no_kernelbench_source(kb_tasks):
    text = json.dumps(load_reference("embedded").to_json())
    for _, code in kb_tasks:
        model = code[code.index("class Model") :].splitlines()
        assert not any(len(line.strip()) > 30 and line.strip() in text for line in model)


def _docstring(code):
    return code.replace("class Model(nn.Module):", 'class Model(nn.Module):\n    """A fused layer, benchmarked."""', 1)


def _renamed(code):
    return re.sub(r"\bx\b", "hidden", code)


def _annotated(code):
    return code.replace("def forward(self, x):", "def forward(self, x: torch.Tensor) -> torch.Tensor:")


def _dead_code(code):
    return re.sub(r"(\n        return )", r"\n        unused_scale = 1.0\1", code, count=1)


def _commented(code):
    return "\n".join(line + "  # step" if line.strip().startswith("x = ") else line for line in code.splitlines())


def _all_at_once(code):
    return _commented(_dead_code(_annotated(_renamed(_docstring(code)))))


def _class_renamed(code):
    """The class renamed and `Model` bound to it afterwards: what KernelBench's loader runs is unchanged."""
    code = re.sub(r"\bclass Model\b", "class FusedBlock", code)
    return re.sub(r"super\(Model,", "super(FusedBlock,", code) + "\n\nModel = FusedBlock\n"


@pytest.mark.parametrize(
    "disguise", [_docstring, _renamed, _annotated, _dead_code, _commented, _all_at_once, _class_renamed]
)
def test_disguised_kernelbench_copies_are_flagged(kb_tasks, disguise):
    index = load_reference("embedded")
    missed = [name for name, code in kb_tasks[::5] if decontaminate(disguise(code), index).kept]
    assert missed == []


def test_a_docstring_fools_the_papers_score_but_not_the_normalized_one(kb_tasks):
    index = load_reference("embedded")
    name, code = kb_tasks[110]
    plain, disguised = similarity(code, index), similarity(_docstring(code), index)
    assert plain.ast == 1.0 and plain.nearest == name
    assert disguised.ast < 0.9 and disguised.ast_normalized == 1.0


def test_generated_and_released_tasks_are_kept(ops6k_examples):
    index = load_reference("embedded")
    sources = [render(compose(seed, 1 + seed % 5, WORKLOADS["tiny"], COMPOSE_ATTEMPTS)).source for seed in range(40)]
    sources += pq.read_table(ops6k_examples, columns=["code"]).column("code").to_pylist()
    for source in sources:
        verdict = decontaminate(source, index)
        assert verdict.reason == KEEP, verdict.detail
        assert verdict.measurements["kb_nearest"].startswith("level")


def test_scores_equal_continuous_eval(kb_tasks, ops6k_examples):
    metrics = pytest.importorskip(
        "continuous_eval.metrics.code.python.code_deterministic_metrics",
        reason="continuous-eval is a dev-only parity reference: pip install continuous-eval",
    )
    metric = metrics.PythonASTSimilarity()
    index = load_reference("embedded")
    sources = pq.read_table(ops6k_examples, columns=["code"]).column("code").to_pylist()[::12]
    references = kb_tasks[::10]
    for source in sources:
        p = profile(index.table, fingerprint(index.table, source).raw_root)
        for _, kb_code in references:
            theirs = metric(answer=_model_class(source), ground_truth_answers=[_model_class(kb_code)])
            ours = score(index.table, p, profile(index.table, fingerprint(index.table, kb_code).raw_root))
            assert abs(ours - theirs["Python_AST_Similarity"]) <= 1e-3


def _model_class(code):
    tree = ast.parse(code)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model")
    return ast.get_source_segment(code, node)


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


def test_the_model_class_is_the_one_model_names_once_the_program_has_run():
    from opsynth.filters.task_loading import model_class_node

    def named(source):
        node = model_class_node(source)
        return None if node is None else node.name

    assert named("class Model:\n    pass\n") == "Model"
    assert named("class A:\n    pass\nclass B:\n    pass\nImpl = B\nModel = Impl\n") == "B"  # aliases followed
    assert named("class Model:\n    pass\nclass B:\n    pass\nModel = B\n") == "B"  # the last binding wins
    assert named("class Model:\n    pass\nfrom torch.nn import Linear as Model\n") is None  # not a class here
    assert named("class A:\n    pass\ndef Model():\n    return A()\n") is None
    assert named("import torch\nx = 1\n") is None  # no Model: nothing is compared, not the whole file
    assert named("class A(:\n") is None
