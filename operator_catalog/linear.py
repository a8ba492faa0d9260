"""Linear layers and matrix products: nn.Linear, F.linear, matmul, mm, bmm, addmm, baddbmm, einsum.

The contracted dimension is always the input's last; the weight is a learnable parameter, or for batched
products an extra forward input, as KernelBench's matmul tasks take it.
"""

from __future__ import annotations

from opsynth.operator_catalog.entry import Hoisted, OpCall, OpEntry, Operand, SampleContext, X

FAMILY = "linear"


def _features(ctx: SampleContext) -> int:
    return ctx.choice(ctx.workload.features)


def _linear(ctx: SampleContext) -> OpCall:
    return OpCall(
        name="nn.Linear",
        style="module",
        target="nn.Linear",
        init_args=(Hoisted("in_features", ctx.x.shape[-1]), Hoisted("out_features", _features(ctx))),
    )


def _f_linear(ctx: SampleContext) -> OpCall:
    out = _features(ctx)
    return OpCall(
        name="F.linear",
        style="function",
        target="F.linear",
        args=(
            X(),
            Operand("parameter", (out, ctx.x.shape[-1]), "weight"),
            Operand("parameter", (out,), "bias"),
        ),
    )


def _right_weight(name: str):
    """x @ W with W a (K, N) parameter: torch.matmul, torch.mm."""

    def sample(ctx: SampleContext) -> OpCall:
        return OpCall(
            name=name,
            style="function",
            target=name,
            args=(X(), Operand("parameter", (ctx.x.shape[-1], _features(ctx)), "weight")),
        )

    return sample


def _addmm(ctx: SampleContext) -> OpCall:
    n = _features(ctx)
    return OpCall(
        name="torch.addmm",
        style="function",
        target="torch.addmm",
        args=(Operand("parameter", (n,), "bias"), X(), Operand("parameter", (ctx.x.shape[-1], n), "weight")),
    )


def _bmm(ctx: SampleContext) -> OpCall:
    b, _, k = ctx.x.shape
    return OpCall(
        name="torch.bmm",
        style="function",
        target="torch.bmm",
        args=(X(), Operand("input", (b, k, _features(ctx)), "y")),
    )


def _baddbmm(ctx: SampleContext) -> OpCall:
    b, m, k = ctx.x.shape
    n = _features(ctx)
    return OpCall(
        name="torch.baddbmm",
        style="function",
        target="torch.baddbmm",
        args=(Operand("parameter", (m, n), "bias"), X(), Operand("input", (b, k, n), "y")),
        kwargs=(("beta", 0.5), ("alpha", 1.0)),
    )


def _einsum(ctx: SampleContext) -> OpCall:
    # Contract the last dimension with a weight, written as the einsum string of the input's rank.
    letters = "bcdhw"[: ctx.x.rank - 1]
    spec = f"{letters}k,kn->{letters}n"
    return OpCall(
        name="torch.einsum",
        style="function",
        target="torch.einsum",
        args=(spec, X(), Operand("parameter", (ctx.x.shape[-1], _features(ctx)), "weight")),
    )


def _lazy_linear(ctx: SampleContext) -> OpCall:
    return OpCall(
        name="nn.LazyLinear",
        style="module",
        target="nn.LazyLinear",
        init_args=(Hoisted("out_features", _features(ctx)),),
    )


ENTRIES = [
    OpEntry(name="nn.Linear", family=FAMILY, sampler=_linear, ranks=(2, 3, 4)),
    OpEntry(name="nn.LazyLinear", family=FAMILY, sampler=_lazy_linear, ranks=(2, 3, 4)),
    OpEntry(name="F.linear", family=FAMILY, sampler=_f_linear, ranks=(2, 3)),
    OpEntry(name="torch.matmul", family=FAMILY, sampler=_right_weight("torch.matmul"), ranks=(2, 3, 4)),
    OpEntry(name="torch.mm", family=FAMILY, sampler=_right_weight("torch.mm"), ranks=(2,)),
    OpEntry(name="torch.addmm", family=FAMILY, sampler=_addmm, ranks=(2,)),
    OpEntry(name="torch.bmm", family=FAMILY, sampler=_bmm, ranks=(3,)),
    OpEntry(name="torch.baddbmm", family=FAMILY, sampler=_baddbmm, ranks=(3,)),
    OpEntry(name="torch.einsum", family=FAMILY, sampler=_einsum, ranks=(2, 3, 4)),
]
