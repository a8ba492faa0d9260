"""The typed catalog entry and the records a sampler returns.

An entry knows which inputs it accepts and samples one concrete use of itself (an `OpCall`); the same `OpCall`
is what the code renderer emits and what `operator_catalog.calls.apply_call` runs on the meta device, so the two
cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from opsynth.workload import TASK_DTYPES, Workload

Domain = Literal["real", "positive", "unit"]
EntryKind = Literal["torch", "transformers"]

# A chain carries its task's dtype, one of TASK_DTYPES; glue casts anything else (integers, float64) back to it.
# The tensor method that casts to each (`x.half()`), as glue spells it.
CAST_METHODS = {"float32": "float", "bfloat16": "bfloat16", "float16": "half"}


class NotApplicable(Exception):
    """Raised by a sampler when the operator cannot take the given input (the composer then tries another)."""


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of a tensor flowing through a composed chain."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def is_float(self) -> bool:
        return self.dtype in TASK_DTYPES

    @property
    def is_complex(self) -> bool:
        return self.dtype.startswith("complex")


@dataclass(frozen=True)
class X:
    """Placeholder for the tensor flowing through the chain, inside an `OpCall`'s arguments."""


@dataclass(frozen=True)
class Expr:
    """A small expression of the flowing tensor inside a call (`Expr("{x} > 0")` renders as `x > 0`)."""

    template: str  # Python source with `{x}` where the flowing tensor goes

    def render(self, x_name: str) -> str:
        return self.template.format(x=x_name)


@dataclass(frozen=True)
class Operand:
    """An extra tensor an operator consumes: a learnable parameter of the Model or an extra forward input."""

    role: Literal["parameter", "input"]
    shape: tuple[int, ...]
    hint: str = "weight"  # base of the generated name (`self.weight`, `bias_1`, `y`)
    init: Literal["randn", "rand", "ones"] = "randn"  # the torch factory that fills it (`rand` for variances)


@dataclass(frozen=True)
class Submodule:
    """A module built inside another's constructor (`nn.Sequential(nn.Linear(8, 16), nn.ReLU())`)."""

    target: str  # `nn.Linear`
    args: tuple[Any, ...] = ()  # constructor literals or nested `Submodule`s


@dataclass(frozen=True)
class Hoisted:
    """A constructor argument lifted to a module-level constant and passed through `get_init_inputs()`."""

    name: str  # base of the constant's name (`in_channels`); the renderer makes it unique
    value: Any


@dataclass(frozen=True)
class OpCall:
    """One sampled use of a catalog entry.

    `style` says how it is spelled: `module` builds `target(*init)` in `__init__` and calls it in `forward`;
    `function` calls `target(*args, **kwargs)`; `binary` writes `args[0] <target> args[1]`.
    """

    name: str  # the operator name as the released set spells it (goes into `ops`)
    style: Literal["module", "function", "binary"]
    target: str  # `nn.Conv2d`, `torch.cumsum`, `F.gelu`, or an operator symbol for `binary`
    init_args: tuple[Any, ...] = ()  # module constructor positional args: literals or `Hoisted`
    init_kwargs: tuple[tuple[str, Any], ...] = ()  # module constructor keyword literals
    args: tuple[Any, ...] = (X(),)  # call positional args: `X()`, `Operand`, `Expr`, literals, lists
    kwargs: tuple[tuple[str, Any], ...] = ()  # call keyword literals
    output_index: int | None = None  # select one element of a tuple result (`torch.max(x, dim=1)[0]`)
    # A template that combines the call's result with the flowing tensor, for operators that do not consume it
    # (`{x}.mul({call})` renders `x = x.mul(torch.linspace(...))`); tensor methods, so never an operator itself.
    wrap: str | None = None


@dataclass
class SampleContext:
    """What a sampler sees: the incoming tensor (None for a transformers module, which stands alone), a seeded
    RNG and the workload's size scale."""

    x: TensorSpec | None
    rng: random.Random
    workload: Workload

    def choice(self, options):
        return self.rng.choice(list(options))

    def out_channels(self) -> int:
        return self.choice(self.workload.channels)

    def non_batch_dim(self) -> int:
        """A dimension of x other than the batch (dim 0), uniformly."""
        return self.rng.randrange(1, self.x.rank)


def styled_call(
    name: str,
    style: str,
    operands: tuple[Any, ...] = (X(),),
    params: tuple[Any, ...] = (),
    keywords: tuple[tuple[str, Any], ...] = (),
) -> OpCall:
    """One operator in module or function form: hyperparameters (`params`, `keywords`) go to the constructor of a
    module and after the operands of a function (`nn.PixelShuffle(r)(x)` / `F.pixel_shuffle(x, r)`,
    `nn.MSELoss(reduction='none')(x, y)` / `F.mse_loss(x, y, reduction='none')`)."""
    if style == "module":
        return OpCall(name=name, style="module", target=name, init_args=params, init_kwargs=keywords, args=operands)
    values = tuple(p.value if isinstance(p, Hoisted) else p for p in params)
    return OpCall(name=name, style="function", target=name, args=(*operands, *values), kwargs=keywords)


def keyword_call(name: str, style: str, kwargs: tuple[tuple[str, Any], ...]) -> OpCall:
    """An operator whose hyperparameters are keywords: of the constructor for a module, of the call for a
    function (`nn.Softmax(dim=1)` / `F.softmax(x, dim=1)`)."""
    return styled_call(name, style, keywords=kwargs)


# Samples one use of an entry: an `OpCall` for a torch operator, a `ModuleUse` (transformers_render) for a
# transformers module.
Sampler = Callable[[SampleContext], Any]


@dataclass(frozen=True)
class RenderedTask:
    """The rendered program and what a runner needs to know about it."""

    source: str
    ops: tuple[str, ...]  # the operators that occur in `forward`, in order
    init_inputs: tuple[Any, ...]  # the values `get_init_inputs()` returns
    input_shapes: tuple[TensorSpec, ...]  # what `get_inputs()` returns


def tensor_factory(factory: str, shape: tuple[int, ...], dtype: str = "float32") -> str:
    """The code that makes a tensor of `shape` in a task of `dtype`: `torch.randn(4, 8)`, or
    `torch.randn(4, 8, dtype=torch.float16)` in a task of another dtype than float32."""
    if dtype == "float32":
        return f"torch.{factory}{shape!r}"
    return f"torch.{factory}({', '.join(map(str, shape))}, dtype=torch.{dtype})"


def within_input_budget(
    shape: list[int] | tuple[int, ...], workload: Workload, fixed: tuple[int, ...] = (1,)
) -> tuple[int, ...]:
    """Halve the largest free dimension until the input holds at most `workload.input_share`'s share of the
    element budget, so that a chain has room to grow; the batch (the first dimension), where it is the largest,
    is cut to fit at once, not halved (a batch grown toward the runtime window would fall back by up to half).
    `fixed` dimensions (channels, a model's hidden size) are never changed."""
    shape = list(shape)
    budget = workload.max_elements // workload.input_share
    while math.prod(shape) > budget:
        free = [d for d in range(len(shape)) if d not in fixed and shape[d] > 1]
        if not free:
            break
        i = max(free, key=lambda d: shape[d])
        shape[i] = max(1, budget // math.prod(shape[1:])) if i == 0 else shape[i] // 2
    return tuple(shape)


@dataclass(frozen=True)
class OpEntry:
    """One operator of the catalog: a torch operator, chained with others, or a transformers module, a task of
    its own (`kind`)."""

    name: str  # spelling in the released set's `ops` lists (`nn.Conv2d`, `torch.cumsum`, `F.gelu`, `add`)
    family: str  # catalog module that defines it (activations, convolution, ...)
    sampler: Sampler  # samples one concrete use for a given input; raises NotApplicable when it cannot
    ranks: tuple[int, ...]  # input ranks it accepts (none for a transformers module); glue reaches one
    domain: Domain = "real"  # values it is defined on; the composer maps other inputs into it with glue
    terminal: bool = False  # may only end a chain (its output is not a float tensor worth chaining)
    takes_integers: bool = False  # accepts integer / bool inputs without a cast
    kind: EntryKind = "torch"  # torch operator or a standalone transformers module
    excluded: str | None = None  # why the entry is never sampled, or None
    notes: str = field(default="", compare=False)  # why it is sampled the way it is
    # Only for operators the meta device cannot run (control flow on values) or runs slowly (a recurrence): the
    # float output shape of a call on an input spec. Everything else is shaped by running it on meta.
    output_shape: Callable[[OpCall, TensorSpec], tuple[int, ...]] | None = field(default=None, compare=False)
    module: str | None = None  # a transformers module's: the modeling module that defines its class
    dtypes: tuple[str, ...] = TASK_DTYPES  # the task dtypes it is sampled in (a chain in any other omits it)

    def __post_init__(self) -> None:
        if not self.name or not self.family:
            raise ValueError("an OpEntry needs a name and a family")
        if self.kind == "transformers":
            if not (self.module or "").startswith("transformers.models."):
                raise ValueError(f"{self.name}: module must be a transformers modeling module, got {self.module}")
        elif not self.ranks or any(r < 0 or r > 5 for r in self.ranks):
            raise ValueError(f"{self.name}: ranks must be a non-empty subset of 0..5, got {self.ranks}")
        if self.domain not in ("real", "positive", "unit"):
            raise ValueError(f"{self.name}: unknown domain {self.domain!r}")
        if not callable(self.sampler):
            raise ValueError(f"{self.name}: sampler must be callable")
        if "float32" not in self.dtypes or not set(self.dtypes) <= set(TASK_DTYPES):
            raise ValueError(f"{self.name}: dtypes must include float32 and be among {TASK_DTYPES}, got {self.dtypes}")

    def module_class(self) -> type:
        """A transformers module's class, imported."""
        return getattr(importlib.import_module(self.module), self.name)

    def sample(self, ctx: SampleContext) -> OpCall:
        if ctx.x.rank not in self.ranks:
            raise NotApplicable(f"{self.name} takes rank {self.ranks}, got {ctx.x.rank}")
        call = self.sampler(ctx)
        if call.name != self.name:
            raise ValueError(f"sampler of {self.name} returned a call named {call.name}")
        return call


def float32_only(entries: list[OpEntry], names: set[str]) -> list[OpEntry]:
    """`entries`, those `names` sampled in float32 tasks alone: their kernels lack bfloat16 or float16 on the CPU
    or on CUDA, so a task of another dtype would only fail to run."""
    unknown = names - {e.name for e in entries}
    if unknown:
        raise ValueError(f"float32_only: no entries named {sorted(unknown)}")
    return [dataclasses.replace(e, dtypes=("float32",)) if e.name in names else e for e in entries]


def excluded_entry(name: str, family: str, reason: str) -> OpEntry:
    """A released name the catalog lists but never samples, with the reason; its sampler always declines."""

    def decline(ctx: SampleContext) -> OpCall:
        raise NotApplicable(f"{name} is excluded: {reason}")

    return OpEntry(name=name, family=family, sampler=decline, ranks=(2, 3, 4, 5), excluded=reason)
