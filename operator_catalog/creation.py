"""Tensor factories: ranges, grids and scalars made on the input's device and combined with it.

They do not consume the flowing tensor, so each call is wrapped in a tensor-method combination with it
(`x = x.add(torch.arange(...))`); the method is glue, the factory is the operator.
"""

from __future__ import annotations

from opsynth.operator_catalog.entry import Expr, OpCall, OpEntry, SampleContext, excluded_entry

FAMILY = "creation"
RANKS = (2, 3, 4, 5)
ON_X = (("dtype", Expr("{x}.dtype")), ("device", Expr("{x}.device")))


def _arange(ctx: SampleContext) -> OpCall:
    n = ctx.x.shape[-1]
    return OpCall(
        name="torch.arange", style="function", target="torch.arange", args=(n,), kwargs=ON_X, wrap="{x}.add({call})"
    )


def _linspace(ctx: SampleContext) -> OpCall:
    start = ctx.choice((-1.0, 0.0))
    return OpCall(
        name="torch.linspace",
        style="function",
        target="torch.linspace",
        args=(start, ctx.choice((1.0, 2.0)), ctx.x.shape[-1]),
        kwargs=ON_X,
        wrap=ctx.choice(("{x}.mul({call})", "{x}.add({call})")),
    )


def _scalar_tensor(ctx: SampleContext) -> OpCall:
    return OpCall(
        name="torch.scalar_tensor",
        style="function",
        target="torch.scalar_tensor",
        args=(ctx.choice((0.5, 2.0, 3.0)),),
        kwargs=ON_X,
        wrap=ctx.choice(("{x}.mul({call})", "{x}.sub({call})")),
    )


def _meshgrid(ctx: SampleContext) -> OpCall:
    # A grid of the row means and the column means of x's last two dimensions, added back onto x.
    rows = Expr("{x}.transpose(-2, -1).flatten(0, -2).mean(0)")
    cols = Expr("{x}.flatten(0, -2).mean(0)")
    return OpCall(
        name="torch.meshgrid",
        style="function",
        target="torch.meshgrid",
        args=(rows, cols),
        kwargs=(("indexing", "ij"),),
        output_index=ctx.choice((0, 1)),
        wrap="{x}.add({call})",
    )


ENTRIES = [
    OpEntry(name="torch.arange", family=FAMILY, sampler=_arange, ranks=RANKS),
    OpEntry(name="torch.linspace", family=FAMILY, sampler=_linspace, ranks=RANKS),
    OpEntry(name="torch.scalar_tensor", family=FAMILY, sampler=_scalar_tensor, ranks=RANKS),
    OpEntry(name="torch.meshgrid", family=FAMILY, sampler=_meshgrid, ranks=RANKS),
    excluded_entry(
        "torch.normal", FAMILY, "draws random numbers: its outputs differ between runs, so no kernel can be checked"
    ),
]
