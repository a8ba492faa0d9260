"""Elementwise math and arithmetic: unary math functions, arithmetic with a scalar or a learnable tensor.

Operators defined on part of the real line carry a `domain`; the composer maps their input into it with glue.
"""

from __future__ import annotations

from opsynth.operator_catalog.entry import Expr, OpCall, OpEntry, Operand, SampleContext, X

FAMILY = "arithmetic"
ANY_RANK = (2, 3, 4, 5)

# Unary math functions: (name, domain).
UNARY = [
    ("torch.abs", "real"),
    ("torch.exp", "real"),
    ("torch.expm1", "real"),
    ("torch.cos", "real"),
    ("torch.sin", "real"),
    ("torch.erf", "real"),
    ("torch.neg", "real"),
    ("torch.square", "real"),
    ("torch.sign", "real"),
    ("torch.round", "real"),
    ("torch.floor", "real"),
    ("torch.ceil", "real"),
    ("torch.sinc", "real"),
    ("torch.deg2rad", "real"),
    ("torch.tan", "real"),
    ("torch.log", "positive"),
    ("torch.log2", "positive"),
    ("torch.log10", "positive"),
    ("torch.log1p", "positive"),
    ("torch.sqrt", "positive"),
    ("torch.rsqrt", "positive"),
    ("torch.acos", "unit"),
]


def _unary(name: str):
    def sample(ctx: SampleContext) -> OpCall:
        return OpCall(name=name, style="function", target=name)

    return sample


def _broadcast_operand(ctx: SampleContext, hint: str) -> Operand:
    """A learnable tensor that broadcasts against x: per-channel (C, 1, ..., 1) or over the last dim."""
    shape = ctx.x.shape
    if ctx.rng.random() < 0.5 and len(shape) >= 3:
        return Operand("parameter", (shape[1],) + (1,) * (len(shape) - 2), hint)
    return Operand("parameter", (shape[-1],), hint)


def _scalar_or_operand(ctx: SampleContext, hint: str, scalars: tuple[float, ...]):
    return ctx.choice(scalars) if ctx.rng.random() < 0.4 else _broadcast_operand(ctx, hint)


# Bare arithmetic as the released set spells it: name -> (operator symbol, scalar choices, operand name hint).
BINARY = {
    "add": ("+", (0.5, 1.0, 2.0), "bias"),
    "sub": ("-", (0.5, 1.0, 0.25), "bias"),
    "mul": ("*", (0.5, 2.0, 1.5), "scale"),
    "div": ("/", (2.0, 4.0, 1.5), "divisor"),
    "+": ("+", (0.5, 1.0), "bias"),
    "*": ("*", (2.0, 0.5), "scale"),
    "/": ("/", (2.0, 3.0), "divisor"),
}


def _binary(name: str):
    symbol, scalars, hint = BINARY[name]

    def sample(ctx: SampleContext) -> OpCall:
        # A learnable divisor could cross zero; divide by a scalar instead.
        other = ctx.choice(scalars) if symbol == "/" else _scalar_or_operand(ctx, hint, scalars)
        return OpCall(name=name, style="binary", target=symbol, args=(X(), other))

    return sample


# torch functions of two tensors: name -> operand name hint.
TORCH_BINARY = {
    "torch.add": "bias",
    "torch.sub": "bias",
    "torch.mul": "scale",
    "torch.multiply": "scale",
    "torch.maximum": "floor",
    "torch.minimum": "ceiling",
    "torch.logaddexp": "other",
}


def _torch_binary(name: str):
    def sample(ctx: SampleContext) -> OpCall:
        return OpCall(name=name, style="function", target=name, args=(X(), _broadcast_operand(ctx, TORCH_BINARY[name])))

    return sample


def _div(ctx: SampleContext) -> OpCall:
    return OpCall(name="torch.div", style="function", target="torch.div", args=(X(), ctx.choice((2.0, 3.0, 0.5))))


def _modulo(name: str):
    def sample(ctx: SampleContext) -> OpCall:
        return OpCall(name=name, style="function", target=name, args=(X(), ctx.choice((0.5, 1.0, 2.0))))

    return sample


def _clamp(name: str):
    def sample(ctx: SampleContext) -> OpCall:
        low = ctx.choice((-1.0, -0.5, 0.0))
        return OpCall(
            name=name,
            style="function",
            target=name,
            kwargs=(("min", low), ("max", low + ctx.choice((1.0, 2.0)))),
        )

    return sample


def _clamp_min(ctx: SampleContext) -> OpCall:
    return OpCall(
        name="torch.clamp_min",
        style="function",
        target="torch.clamp_min",
        args=(X(), ctx.choice((-0.5, 0.0, 0.1))),
    )


def _pow(ctx: SampleContext) -> OpCall:
    return OpCall(name="torch.pow", style="function", target="torch.pow", args=(X(), ctx.choice((2, 3))))


def _addcmul(ctx: SampleContext) -> OpCall:
    a, b = _broadcast_operand(ctx, "scale"), _broadcast_operand(ctx, "gain")
    return OpCall(
        name="torch.addcmul",
        style="function",
        target="torch.addcmul",
        args=(X(), a, b),
        kwargs=(("value", 0.5),),
    )


def _addcdiv(ctx: SampleContext) -> OpCall:
    # The divisor is kept away from zero: 1 + |x|.
    return OpCall(
        name="torch.addcdiv",
        style="function",
        target="torch.addcdiv",
        args=(X(), _broadcast_operand(ctx, "scale"), Expr("{x}.abs() + 1.0")),
        kwargs=(("value", ctx.choice((0.5, 1.0))),),
    )


def _where(ctx: SampleContext) -> OpCall:
    # A leaky gate: keeps positive values, scales the rest; the condition is computed from x itself.
    return OpCall(
        name="torch.where",
        style="function",
        target="torch.where",
        args=(Expr("{x} > 0"), X(), Expr("{x} * 0.1")),
    )


def _nan_to_num(ctx: SampleContext) -> OpCall:
    return OpCall(
        name="torch.nan_to_num",
        style="function",
        target="torch.nan_to_num",
        kwargs=(("nan", 0.0), ("posinf", 1.0), ("neginf", -1.0)),
    )


ENTRIES = (
    [OpEntry(name=n, family=FAMILY, sampler=_unary(n), ranks=ANY_RANK, domain=d) for n, d in UNARY]
    + [OpEntry(name=n, family=FAMILY, sampler=_binary(n), ranks=ANY_RANK) for n in BINARY]
    + [OpEntry(name=n, family=FAMILY, sampler=_torch_binary(n), ranks=ANY_RANK) for n in TORCH_BINARY]
    + [
        OpEntry(name="torch.div", family=FAMILY, sampler=_div, ranks=ANY_RANK),
        OpEntry(name="torch.remainder", family=FAMILY, sampler=_modulo("torch.remainder"), ranks=ANY_RANK),
        OpEntry(name="torch.fmod", family=FAMILY, sampler=_modulo("torch.fmod"), ranks=ANY_RANK),
        OpEntry(name="torch.clamp", family=FAMILY, sampler=_clamp("torch.clamp"), ranks=ANY_RANK),
        OpEntry(name="torch.clip", family=FAMILY, sampler=_clamp("torch.clip"), ranks=ANY_RANK),
        OpEntry(name="torch.clamp_min", family=FAMILY, sampler=_clamp_min, ranks=ANY_RANK),
        OpEntry(name="torch.pow", family=FAMILY, sampler=_pow, ranks=ANY_RANK),
        OpEntry(name="torch.addcmul", family=FAMILY, sampler=_addcmul, ranks=ANY_RANK),
        OpEntry(name="torch.addcdiv", family=FAMILY, sampler=_addcdiv, ranks=ANY_RANK),
        OpEntry(name="torch.where", family=FAMILY, sampler=_where, ranks=ANY_RANK),
        OpEntry(name="torch.nan_to_num", family=FAMILY, sampler=_nan_to_num, ranks=ANY_RANK),
    ]
)
