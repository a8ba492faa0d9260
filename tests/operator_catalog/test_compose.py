import pytest
import torch

from filters.task_loading import load_task
from operator_catalog import get
from operator_catalog.codegen import render
from operator_catalog.compose import GlueNode, OpNode, balanced_factors, chain, compose
from operator_catalog.faithfulness import ops_faithful, ops_in_forward
from pipeline.config import COMPOSE_ATTEMPTS, WORKLOADS

TINY = WORKLOADS["tiny"]


def test_composition_is_deterministic_in_the_seed():
    def source(seed):
        return render(compose(seed, 3, TINY, COMPOSE_ATTEMPTS)).source

    assert source(11) == source(11)
    assert source(11) != source(12)


@pytest.mark.parametrize("num_ops", [1, 2, 3, 4, 5])
def test_k_distinct_ops_listed_exactly_as_they_occur_in_forward(num_ops):
    for seed in range(40):
        task = render(compose(seed, num_ops, TINY, COMPOSE_ATTEMPTS))
        assert len(task.ops) == num_ops == len(set(task.ops))
        assert ops_faithful(task.source, task.ops), (task.ops, ops_in_forward(task.source))


def test_rendered_task_loads_the_kernelbench_way_and_matches_its_record():
    task = render(compose(5, 4, TINY, COMPOSE_ATTEMPTS))
    loaded = load_task(task.source)
    assert list(loaded.get_init_inputs()) == list(task.init_inputs)
    inputs = loaded.get_inputs()
    assert [tuple(t.shape) for t in inputs] == [s.shape for s in task.input_shapes]
    assert all(t.device.type == "cpu" for t in inputs)  # CPU tensors, as KernelBench tasks make them
    with torch.no_grad():
        loaded.model_class(*loaded.get_init_inputs()).eval()(*inputs)
    assert '"""Applies' in task.source  # the docstring names the fused ops


def test_glue_casts_integer_outputs_and_changes_rank():
    import random

    entries = [get("torch.argmax"), get("nn.Conv2d")]
    for seed in range(20):
        comp = chain(entries, random.Random(seed), TINY)
        glue = [n for n in comp.nodes if isinstance(n, GlueNode)]
        assert any(g.why == "dtype" for g in glue)  # argmax returns int64; conv needs float
        assert comp.ops == ("torch.argmax", "nn.Conv2d")
        assert [n.call.name for n in comp.nodes if isinstance(n, OpNode)] == list(comp.ops)


def test_domain_glue_keeps_log_finite():
    import random

    comp = chain([get("torch.log")], random.Random(0), TINY)
    assert any(isinstance(n, GlueNode) and n.why == "domain" for n in comp.nodes)
    task = render(comp)
    loaded = load_task(task.source)
    out = loaded.model_class(*loaded.get_init_inputs())(*loaded.get_inputs())
    assert torch.isfinite(out).all()


def test_balanced_factors():
    assert balanced_factors(64, 3) == (4, 4, 4)
    assert balanced_factors(48, 2) == (6, 8)
    assert balanced_factors(17, 2) == (1, 17)


def test_gpu_workload_inputs_are_large():
    task = render(compose(3, 2, WORKLOADS["gpu"], COMPOSE_ATTEMPTS))
    assert task.input_shapes[0].numel >= 1 << 16
