from dataclasses import replace

import pytest
import torch

from opsynth.config import COMPOSE_ATTEMPTS, WORKLOADS
from opsynth.filters.task_loading import load_task
from opsynth.operator_catalog import get
from opsynth.operator_catalog.codegen import render
from opsynth.operator_catalog.compose import GlueNode, OpNode, balanced_factors, chain, compose
from opsynth.operator_catalog.entry import CAST_METHODS
from opsynth.operator_catalog.faithfulness import ops_faithful, ops_in_forward
from opsynth.operator_catalog.registry import sampleable

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


def test_an_input_over_its_share_of_the_budget_has_its_batch_cut_to_fit_and_its_extents_halved():
    """The batch, where it is the largest free dimension, is cut to fit at once (halving it left an input grown
    toward the window at as little as half its share); spatial extents are halved, channels never change."""
    from opsynth.operator_catalog.entry import within_input_budget

    wl = replace(TINY, max_elements=4 * 1000 * 64)  # an input may hold 64,000 elements
    assert within_input_budget((3000, 16, 4), wl) == (1000, 16, 4)
    assert within_input_budget((1001, 64), wl) == (1000, 64)
    assert within_input_budget((8, 16, 1024), wl) == (8, 16, 256)  # the length halved twice, the batch kept
    assert within_input_budget((8, 16, 1024), replace(wl, input_share=1)) == (8, 16, 1024)
    assert within_input_budget((10, 7), wl) == (10, 7)


def test_a_batch_grown_to_the_workloads_largest_dimension_is_what_the_batch_scale_scales():
    """A draw with no dimension of min_largest_dim grows its batch to it; a sizing's scale then moves that
    batch (it did nothing until the drawn batch times the scale passed min_largest_dim), and never below it."""
    import random

    from opsynth.operator_catalog.compose import sample_input

    wl = replace(WORKLOADS["gpu"], batch_sizes=(64,), channels=(16,), spatial={5: (32,)}, max_elements=1 << 31)
    shapes = {scale: sample_input(5, wl, random.Random(0), scale).shape[0] for scale in (1.0, 1.5, 2.5, 0.5)}
    assert shapes == {1.0: 512, 1.5: 768, 2.5: 1024, 0.5: 512}  # 2.5: cut to the input's share, 1024 x 16 x 32^3


def test_a_batch_that_alone_holds_the_largest_dimension_stays_and_a_shrink_moves_the_extents():
    """Shrunk past min_largest_dim, a batch that alone holds it stays there and the spatial extents of the
    unscaled input give way together, by about the scale asked; the channels never change."""
    import math
    import random

    from opsynth.operator_catalog.compose import sample_input

    wl = replace(
        WORKLOADS["gpu"], batch_sizes=(64,), channels=(16,), spatial={4: (128,), 5: (32,)}, max_elements=1 << 31
    )
    assert sample_input(4, wl, random.Random(0), 1.0).shape == (512, 16, 128, 128)
    assert sample_input(4, wl, random.Random(0), 0.25).shape == (512, 16, 64, 64)
    for rank, scale in ((4, 0.1), (5, 0.3), (5, 0.05)):
        unscaled, shrunk = (sample_input(rank, wl, random.Random(0), s).shape for s in (1.0, scale))
        assert shrunk[:2] == unscaled[:2]
        assert math.prod(shrunk) / math.prod(unscaled) == pytest.approx(scale, rel=0.15)
    # Cut to the budget unscaled (one extent halved), the shrink starts from that input, not the drawn one.
    small = replace(wl, max_elements=4 * 512 * 16 * 128 * 64)
    assert sample_input(4, small, random.Random(0), 1.0).shape == (512, 16, 64, 128)
    assert math.prod(sample_input(4, small, random.Random(0), 0.5).shape[2:]) == pytest.approx(64 * 128 / 2, rel=0.05)
    # Where another dimension holds it, the batch itself shrinks, as in the tiny workload.
    assert sample_input(3, replace(wl, spatial={3: (1024,)}), random.Random(0), 0.5).shape == (32, 16, 1024)


def test_ops6k_weights_draw_operators_as_often_as_the_released_set():
    import random
    from collections import Counter

    from opsynth.operator_catalog.compose import OP_WEIGHTS, draw_operators
    from opsynth.operator_catalog.registry import sampleable

    rng = random.Random(0)
    pool = sampleable("torch")
    weighted = Counter(e.name for _ in range(3000) for e in draw_operators(pool, 1, OP_WEIGHTS["ops6k"], rng))
    uniform = Counter(e.name for _ in range(3000) for e in draw_operators(pool, 1, None, rng))
    assert weighted.most_common(1)[0][0] == "nn.ConvTranspose2d"  # 577 uses in the released set, the most
    assert weighted["nn.ConvTranspose2d"] > 20 * max(1, weighted["nn.Softsign"])  # Softsign: 1 use
    assert max(uniform.values()) < 60  # about 18 each when uniform
    drawn = draw_operators(pool, 5, OP_WEIGHTS["ops6k"], rng)
    assert len({e.name for e in drawn}) == 5


def test_a_rescaled_candidate_keeps_its_operators_under_weights():
    from opsynth.pipeline.candidates import make_candidate, rescale_candidate
    from opsynth.records import CandidateSpec

    for index in range(10):
        spec = CandidateSpec("torch#3", index, 1000 + index)
        original = make_candidate(spec, WORKLOADS["tiny"], op_weights="ops6k")
        rescaled = rescale_candidate(original, 0.5, WORKLOADS["tiny"], op_weights="ops6k")
        if rescaled is not None:
            assert rescaled.ops == original.ops and rescaled.batch_scale == 0.5


def _one_op(name: str, seed: int = 0):
    import random

    comp = chain([get(name)], random.Random(seed), TINY)
    return comp, render(comp)


def test_a_factory_is_wrapped_in_glue_and_listed_alone():
    comp, task = _one_op("torch.arange")
    assert "x = x.add(torch.arange(" in task.source
    assert task.ops == ("torch.arange",) and ops_faithful(task.source, task.ops)
    assert comp.output.shape == comp.input.shape


def test_sequential_renders_its_layers_and_lists_only_the_container():
    _, task = _one_op("nn.Sequential")
    assert "nn.Sequential(nn.Linear(" in task.source or "nn.Sequential(nn.Conv2d(" in task.source
    assert task.ops == ("nn.Sequential",) and ops_faithful(task.source, task.ops)


def test_a_complex_result_becomes_its_magnitude():
    comp, task = _one_op("torch.stft")
    assert isinstance(comp.nodes[-1], GlueNode) and comp.nodes[-1].steps == (("abs", ()),)
    assert comp.output.dtype == "float32"
    loaded = load_task(task.source)
    with torch.no_grad():
        out = loaded.model_class(*loaded.get_init_inputs()).eval()(*loaded.get_inputs())
    assert out.dtype == torch.float32 and out.shape == comp.output.shape


def test_a_scalar_result_ends_a_chain():
    comp, _ = _one_op("torch.dist")
    assert get("torch.dist").terminal and comp.output.shape == ()


def test_a_stated_output_shape_matches_what_the_task_returns():
    # nn.AdaptiveLogSoftmaxWithLoss cannot run on meta; its entry states the shape, which execution confirms.
    comp, task = _one_op("nn.AdaptiveLogSoftmaxWithLoss")
    loaded = load_task(task.source)
    with torch.no_grad():
        out = loaded.model_class(*loaded.get_init_inputs()).eval()(*loaded.get_inputs())
    assert tuple(out.shape) == comp.output.shape == (comp.input.shape[0],)


def test_a_module_whose_parameters_exceed_the_budget_is_not_composed():
    import dataclasses
    import random

    from opsynth.operator_catalog.entry import NotApplicable

    # Inputs of at most 64 elements, and no tensor of more than 256: any linear layer of the workload's sizes
    # (16 to 64 outputs) on the input's features holds more weights than that.
    small = dataclasses.replace(TINY, max_elements=256)
    with pytest.raises(NotApplicable, match="parameters exceed"):
        chain([get("nn.Linear")], random.Random(0), small)


def test_attention_keeps_its_hidden_scores_within_the_budget():
    import random

    from opsynth.operator_catalog.entry import NotApplicable, SampleContext, TensorSpec

    entry = get("nn.MultiheadAttention")
    ctx = SampleContext(TensorSpec((8, 512, 32)), random.Random(0), TINY)  # 8 x 512 x 512 scores > 262,144
    with pytest.raises(NotApplicable, match="attention scores"):
        entry.sample(ctx)
    assert entry.sample(SampleContext(TensorSpec((8, 16, 32)), random.Random(0), TINY)).name == entry.name


def test_ops_read_loosely_need_only_occur_in_the_code():
    from opsynth.operator_catalog.faithfulness import ops_mentioned

    freeform = """import torch
import torch.nn as nn
class Model(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.pool = {"max": nn.MaxPool2d, "avg": nn.AvgPool2d}[kind](kernel_size=2)
    def forward(self, x):
        x = torch.clamp(x, min=0.0, max=1.0)
        return [torch.sum(t) for t in self.pool(x).split(2)] + [x * 2]
"""
    assert not ops_faithful(freeform, ["torch.clamp", "nn.MaxPool2d"])  # the pool is not a plain module here
    assert ops_mentioned(freeform, ["torch.clamp", "nn.MaxPool2d", "torch.sum"])
    assert ops_mentioned(freeform, ["mul", "+"])  # bare arithmetic as its operator
    assert not ops_mentioned(freeform, ["torch.clamp", "nn.Conv2d"])
    assert not ops_mentioned(freeform, ["sub"])
    assert not ops_mentioned("class Model(:", ["torch.sum"])


@pytest.mark.parametrize("name", ["nn.LSTM", "nn.GRU", "nn.RNN"])
def test_a_recurrence_states_the_output_shape_that_running_it_on_meta_gives(name):
    import random

    from opsynth.operator_catalog.calls import apply_call, build_module
    from opsynth.operator_catalog.compose import sample_input
    from opsynth.operator_catalog.entry import NotApplicable, SampleContext

    entry = get(name)
    checked, bidirectional = 0, 0
    for seed in range(60):
        rng = random.Random(seed)
        spec = sample_input(3, TINY, rng)
        try:
            call = entry.sample(SampleContext(spec, rng, TINY))
        except NotApplicable:
            continue  # too long a sequence for a recurrence
        with torch.device("meta"):
            out = apply_call(call, torch.empty(spec.shape), {}, build_module(call))
        assert tuple(out.shape) == entry.output_shape(call, spec), (call, spec)
        checked += 1
        bidirectional += dict(call.init_kwargs).get("bidirectional", False)
    assert checked >= 10 and 0 < bidirectional < checked


MIXED = replace(TINY, dtypes=(("float32", 1.0), ("bfloat16", 1.0), ("float16", 1.0)))


def test_float32_alone_draws_no_dtype_and_composes_what_it_always_did():
    """A workload of float32 alone leaves each seed's program as it was; a mix draws the dtype from an RNG of
    its own, so its float32 tasks are those programs too."""
    assert {TINY.task_dtype(seed) for seed in range(50)} == {"float32"}
    for seed in range(30):
        if MIXED.task_dtype(seed) == "float32":
            assert (
                render(compose(seed, 3, MIXED, COMPOSE_ATTEMPTS)).source
                == render(compose(seed, 3, TINY, COMPOSE_ATTEMPTS)).source
            )
    assert {MIXED.task_dtype(seed) for seed in range(50)} == {"float32", "bfloat16", "float16"}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_task_computes_in_its_dtype_inputs_and_parameters_alike(dtype):
    import random

    comp = chain([get("nn.Conv2d"), get("torch.argmax"), get("F.linear")], random.Random(3), TINY, dtype=dtype)
    task = render(comp)
    assert [s.dtype for s in task.input_shapes] == [dtype] * len(task.input_shapes)
    assert f".{CAST_METHODS[dtype]}()  # glue (dtype)" in task.source  # argmax's integers cast back
    loaded = load_task(task.source)
    inputs = loaded.get_inputs()
    model = loaded.model_class(*loaded.get_init_inputs()).eval()
    assert {t.dtype for t in inputs} | {p.dtype for p in model.parameters()} == {getattr(torch, dtype)}
    with torch.no_grad():
        out = model(*inputs)
    assert out.dtype == getattr(torch, dtype) and tuple(out.shape) == comp.output.shape


def test_a_task_draws_only_operators_that_take_its_dtype():
    half_only = [(seed, render(compose(seed, 2, replace(TINY, dtypes=(("float16", 1.0),)), COMPOSE_ATTEMPTS)))
                 for seed in range(60)]  # fmt: skip
    float32_only = {e.name for e in sampleable("torch") if "float16" not in e.dtypes}
    assert {"torch.stft", "torch.pdist", "nn.AvgPool3d"} <= float32_only
    for seed, task in half_only:
        assert not float32_only & set(task.ops), seed
        assert "dtype=torch.float16" in task.source


def test_an_entry_takes_float32_at_least():
    with pytest.raises(ValueError, match="float32"):
        replace(get("F.relu"), dtypes=("bfloat16",))
    with pytest.raises(ValueError, match="float32"):
        replace(get("F.relu"), dtypes=("float32", "float64"))
