"""Composition: sample k distinct operators, choose an input, and chain them with the smallest glue.

Every step is run on the `meta` device as it is chosen, so a composition that comes out of here has a known
shape at every node; glue (casts, rank changes, domain maps) is recorded as glue, never as an operator.
"""

from __future__ import annotations

import math
import random
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from opsynth.operator_catalog.calls import apply_call, build_module, operands_of
from opsynth.operator_catalog.entry import (
    CAST_METHODS,
    NotApplicable,
    OpCall,
    OpEntry,
    SampleContext,
    TensorSpec,
    Workload,
    within_input_budget,
)
from opsynth.operator_catalog.registry import sampleable
from opsynth.operator_catalog.weights import OPS6K_COUNTS


class CompositionError(Exception):
    """No valid chain was found for a candidate within the allowed attempts."""


# What a try at a chain may raise when its operators do not fit together (a sampler declining, meta rejecting
# a shape): the try is dropped and another made.
CHAIN_ERRORS = (NotApplicable, RuntimeError, ValueError, TypeError, IndexError)


@dataclass(frozen=True)
class GlueNode:
    """Tensor-method calls that adapt the flowing tensor to the next operator (`x = x.flatten(2)`)."""

    steps: tuple[tuple[str, tuple[Any, ...]], ...]  # (method name, positional args) applied in order
    why: str  # `rank`, `dtype` or `domain`: what the glue fixes

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        for method, args in self.steps:
            x = getattr(x, method)(*args)
        return x


@dataclass(frozen=True)
class OpNode:
    call: OpCall


@dataclass(frozen=True)
class Composition:
    """A chain ready to render: the input, the nodes in order, and the output."""

    input: TensorSpec
    nodes: tuple[OpNode | GlueNode, ...]
    output: TensorSpec

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(n.call.name for n in self.nodes if isinstance(n, OpNode))


def sample_input(
    rank: int, workload: Workload, rng: random.Random, batch_scale: float = 1.0, dtype: str = "float32"
) -> TensorSpec:
    """A KernelBench-shaped input of the given rank: (B, F), (B, C, L), (B, C, H, W) or (B, C, D, H, W), in
    `dtype`; `batch_scale` multiplies the sampled batch (shape calibration) without changing any other draw."""
    batch = rng.choice(workload.batch_sizes)
    if rank == 2:
        rest = [rng.choice(workload.features)]
    else:
        extent = rng.choice(workload.spatial[rank])
        rest = [rng.choice(workload.channels), *([extent] * (rank - 2))]
    # The gpu workload wants one dimension of at least min_largest_dim (the released set: 99.4 % of tasks): the
    # batch grows to it, and `batch_scale` scales the batch so grown (else a scale short of it would do nothing).
    if max(batch, *rest) < workload.min_largest_dim:
        batch = workload.min_largest_dim
    scaled = max(1, round(batch * batch_scale))
    if scaled < workload.min_largest_dim and max(rest) < workload.min_largest_dim and rank > 2:
        # The batch alone holds min_largest_dim: it stays there and the shrink goes to the spatial extents of the
        # input the draw gives unscaled, else a task drawn with large extents could never be made lighter (on one
        # H200, a fifth of a 6K run's rows were held at batch 512 over the sizing's aim of 2 ms, a median of 7.8
        # ms: two fifths of the rows' summed eager time).
        unscaled = _within_budget(batch, rest, workload)
        shape = (*unscaled[:2], *shrunk_extents(unscaled[2:], scaled / batch))
    else:
        shape = _within_budget(scaled, rest, workload)
    return TensorSpec(shape, dtype)


def _within_budget(batch: int, rest: list[int], workload: Workload) -> tuple[int, ...]:
    shape = within_input_budget([batch, *rest], workload)
    if max(shape) < workload.min_largest_dim:
        # Shrunk below it, or cut to the budget: the batch at min_largest_dim, the spatial extents giving way.
        shape = within_input_budget((workload.min_largest_dim, *shape[1:]), workload, fixed=(0, 1))
    return shape


def shrunk_extents(extents: tuple[int, ...], factor: float) -> list[int]:
    """Spatial extents shrunk together so that their product moves by about `factor` (< 1), each at least 1."""
    each = factor ** (1 / len(extents))
    return [max(1, round(e * each)) for e in extents]


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def balanced_factors(n: int, parts: int) -> tuple[int, ...]:
    """Split n into `parts` factors as equal as its divisors allow (64, 3 -> (4, 4, 4); a prime gets 1s)."""
    dims = []
    for remaining in range(parts, 1, -1):
        target = n ** (1 / remaining)
        d = min(_divisors(n), key=lambda v: (abs(v - target), v))
        dims.append(d)
        n //= d
    return (*dims, n)


def glue_for(entry: OpEntry, x: TensorSpec, dtype: str = "float32") -> list[GlueNode]:
    """The smallest glue that makes `x` acceptable to `entry` in a task of `dtype`: a cast, a rank change, a
    domain map."""
    glue: list[GlueNode] = []
    if x.is_complex:
        glue.append(GlueNode((("abs", ()),), "dtype"))
    elif not x.is_float and not entry.takes_integers:
        glue.append(GlueNode(((CAST_METHODS[dtype], ()),), "dtype"))
    if x.rank not in entry.ranks:
        target = min(entry.ranks, key=lambda r: (abs(r - x.rank), -r))
        if target < x.rank:
            glue.append(GlueNode((("flatten", (target - 1,)),), "rank"))
        else:
            factors = balanced_factors(x.shape[-1], target - x.rank + 1)
            glue.append(GlueNode((("unflatten", (-1, factors)),), "rank"))
    if entry.domain == "positive":
        glue.append(GlueNode((("abs", ()), ("add", (1e-3,))), "domain"))
    elif entry.domain == "unit":
        glue.append(GlueNode((("clamp", (-0.999, 0.999)),), "domain"))
    return glue


def spec_of(t: torch.Tensor) -> TensorSpec:
    dtype = str(t.dtype).removeprefix("torch.")
    return TensorSpec(tuple(t.shape), dtype)


def _parameter_count(module: torch.nn.Module) -> int:
    """Elements of a module's parameters and buffers; a lazy module's are not shaped yet and count as none."""
    tensors = (*module.parameters(), *module.buffers())
    return sum(t.numel() for t in tensors if not isinstance(t, torch.nn.parameter.UninitializedTensorMixin))


def chain(
    entries: list[OpEntry], rng: random.Random, workload: Workload, batch_scale: float = 1.0, dtype: str = "float32"
) -> Composition:
    """The entries chained on the meta device in a task of `dtype`: its input, operands and parameters in it."""
    first = entries[0]
    spec = input_spec = sample_input(rng.choice(first.ranks), workload, rng, batch_scale, dtype)
    torch_dtype = getattr(torch, dtype)
    nodes: list[OpNode | GlueNode] = []
    # Deprecated spellings of the released vocabulary (F.upsample, nn.NLLLoss2d) warn on every use; a generated
    # task is meant to use them, so their warnings are not news.
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x = torch.empty(spec.shape, dtype=torch_dtype)
        for entry in entries:
            for glue in glue_for(entry, spec, dtype):
                x = glue.apply(x)
                nodes.append(glue)
                spec = spec_of(x)
            call = entry.sample(SampleContext(spec, rng, workload))
            operands = {o: torch.empty(o.shape, dtype=torch_dtype) for o in operands_of(call)}
            if any(math.prod(o.shape) > workload.max_elements for o in operands):
                raise NotApplicable(f"{entry.name}: an operand exceeds the element budget")
            # Built once (on meta): its parameters are budgeted like every tensor, then it runs.
            module = build_module(call).to(torch_dtype) if call.style == "module" else None
            if module is not None and _parameter_count(module) > workload.max_elements:
                raise NotApplicable(f"{entry.name}: its parameters exceed the element budget")
            if entry.output_shape is None:
                out = apply_call(call, x, operands, module)
            else:  # meta cannot run it, or only slowly: the entry states its output shape
                out = torch.empty(entry.output_shape(call, spec))
            if not isinstance(out, torch.Tensor) or out.numel() == 0 or (out.dim() == 0 and not entry.terminal):
                raise NotApplicable(f"{entry.name} produced no chainable tensor")
            if out.numel() > workload.max_elements:
                raise NotApplicable(f"{entry.name} output exceeds the element budget")
            x = out
            spec = spec_of(x)
            nodes.append(OpNode(call))
        if spec.is_complex:  # a task returns real values: the magnitude of a complex result
            glue = GlueNode((("abs", ()),), "dtype")
            spec = spec_of(glue.apply(x))
            nodes.append(glue)
    return Composition(input=input_spec, nodes=tuple(nodes), output=spec)


OP_WEIGHTS: dict[str, dict[str, int] | None] = {"uniform": None, "ops6k": OPS6K_COUNTS}


def draw_operators(pool: tuple[OpEntry, ...], k: int, weights: dict[str, int] | None, rng: random.Random) -> list:
    """k distinct entries: uniformly, or each draw in proportion to its weight among those not yet drawn."""
    if weights is None:
        return rng.sample(pool, k)
    remaining = list(pool)
    mass = [max(1, weights.get(e.name, 1)) for e in remaining]
    drawn = []
    for _ in range(k):
        i = rng.choices(range(len(remaining)), weights=mass)[0]
        drawn.append(remaining.pop(i))
        mass.pop(i)
    return drawn


def compose(
    seed: int,
    num_ops: int,
    workload: Workload,
    attempts: int,
    batch_scale: float = 1.0,
    op_weights: str = "uniform",
) -> Composition:
    """A chain of `num_ops` distinct torch operators in the task's dtype (`Workload.task_dtype`), deterministic
    in `seed`, `batch_scale` and `op_weights` (`uniform`, or `ops6k`: as often as CUDA-Agent-Ops-6K uses each
    operator), drawn from the entries that take that dtype."""
    rng = random.Random(seed)
    dtype = workload.task_dtype(seed)
    pool = tuple(e for e in sampleable("torch") if dtype in e.dtypes)
    weights = OP_WEIGHTS[op_weights]
    last_error: Exception | None = None
    for _ in range(attempts):
        entries = draw_operators(pool, num_ops, weights, rng)
        if any(e.terminal for e in entries[:-1]):
            continue
        try:
            return chain(entries, rng, workload, batch_scale, dtype)
        except CHAIN_ERRORS as e:
            last_error = e
    raise CompositionError(f"no valid chain of {num_ops} ops in {attempts} attempts (last: {last_error})")
