"""Comparisons, logical and bitwise operators, value tests and membership: they return bool or integer tensors.

Each compares against a threshold, a set or a rounded value that splits random inputs into both outcomes, so the
result carries information; the composer casts it back to float when another operator follows.
"""

from __future__ import annotations

from statistics import NormalDist

from opsynth.operator_catalog.entry import Expr, OpCall, OpEntry, Operand, SampleContext, X, excluded_entry

FAMILY = "logical"
RANKS = (2, 3, 4, 5)


def _compare(name: str):
    """x against a learnable per-feature threshold, or a rounded x against a small integer (`eq`, `ne`)."""

    def sample(ctx: SampleContext) -> OpCall:
        if name in ("torch.eq", "torch.ne"):
            return OpCall(name=name, style="function", target=name, args=(Expr("{x}.round()"), ctx.choice((0.0, 1.0))))
        if ctx.rng.random() < 0.5:
            other = Operand("parameter", (ctx.x.shape[-1],), "threshold")
        else:
            other = ctx.choice((-0.5, 0.0, 0.5))
        return OpCall(name=name, style="function", target=name, args=(X(), other))

    return sample


def _logical_pair(name: str):
    """or: outside [-t, t]; and: inside (-t, t)."""

    def sample(ctx: SampleContext) -> OpCall:
        t = ctx.choice((0.5, 1.0))
        lo, hi = (
            (Expr(f"{{x}} > {-t}"), Expr(f"{{x}} < {t}"))
            if name == "torch.logical_and"
            else (Expr(f"{{x}} < {-t}"), Expr(f"{{x}} > {t}"))
        )
        return OpCall(name=name, style="function", target=name, args=(lo, hi))

    return sample


def _logical_not(ctx: SampleContext) -> OpCall:
    return OpCall(name="torch.logical_not", style="function", target="torch.logical_not", args=(Expr("{x}.round()"),))


def _bitwise_xor(ctx: SampleContext) -> OpCall:
    return OpCall(
        name="torch.bitwise_xor",
        style="function",
        target="torch.bitwise_xor",
        args=(Expr("{x} > 0"), Expr(f"{{x}}.abs() > {ctx.choice((0.5, 1.0))}")),
    )


# Value tests and the expression that makes both outcomes occur on random inputs.
VALUE_TESTS = {
    "torch.isnan": "{x}.sqrt()",  # negative entries become NaN
    "torch.isinf": "1.0 / {x}.round()",  # entries that round to zero become infinite
    "torch.isneginf": "{x}.round().log()",  # log(0) = -inf; negatives are NaN, positives finite
    "torch.signbit": "{x}",
}


def _value_test(name: str):
    def sample(ctx: SampleContext) -> OpCall:
        return OpCall(name=name, style="function", target=name, args=(Expr(VALUE_TESTS[name]),))

    return sample


def _quantifier(name: str):
    """all / any over the smallest non-batch dimension, at the standard-normal threshold that makes the answer
    a coin flip for N(0, 1) inputs: all(x > t) and any(x > t) each hold with probability 1/2."""

    def sample(ctx: SampleContext) -> OpCall:
        dim = min(range(1, ctx.x.rank), key=lambda d: ctx.x.shape[d])
        n = ctx.x.shape[dim]
        p_above = 0.5 ** (1 / n) if name == "torch.all" else 1 - 0.5 ** (1 / n)
        t = round(NormalDist().inv_cdf(min(max(1 - p_above, 1e-6), 1 - 1e-6)), 4)
        return OpCall(name=name, style="function", target=name, args=(Expr(f"{{x}} > {t}"),), kwargs=(("dim", dim),))

    return sample


def _count_nonzero(ctx: SampleContext) -> OpCall:
    return OpCall(
        name="torch.count_nonzero",
        style="function",
        target="torch.count_nonzero",
        args=(Expr("{x}.round()"),),
        kwargs=(("dim", ctx.non_batch_dim()),),
    )


def _isin(ctx: SampleContext) -> OpCall:
    values = sorted(ctx.rng.sample((-2.0, -1.0, 0.0, 1.0, 2.0), 2))
    return OpCall(
        name="torch.isin",
        style="function",
        target="torch.isin",
        args=(Expr("{x}.round()"), Expr(f"{{x}}.new_tensor({values})")),
    )


def _bucketize(ctx: SampleContext) -> OpCall:
    edges = ctx.choice(([-1.0, 0.0, 1.0], [-2.0, -0.5, 0.5, 2.0], [-1.5, -0.75, 0.0, 0.75, 1.5]))
    return OpCall(
        name="torch.bucketize",
        style="function",
        target="torch.bucketize",
        args=(X(), Expr(f"{{x}}.new_tensor({edges})")),
    )


ENTRIES = [
    *(
        OpEntry(name=n, family=FAMILY, sampler=_compare(n), ranks=RANKS)
        for n in ("torch.gt", "torch.ge", "torch.lt", "torch.eq", "torch.ne")
    ),
    *(
        OpEntry(name=n, family=FAMILY, sampler=_logical_pair(n), ranks=RANKS)
        for n in ("torch.logical_or", "torch.logical_and")
    ),
    OpEntry(name="torch.logical_not", family=FAMILY, sampler=_logical_not, ranks=RANKS),
    OpEntry(name="torch.bitwise_xor", family=FAMILY, sampler=_bitwise_xor, ranks=RANKS),
    *(OpEntry(name=n, family=FAMILY, sampler=_value_test(n), ranks=RANKS) for n in VALUE_TESTS),
    *(OpEntry(name=n, family=FAMILY, sampler=_quantifier(n), ranks=RANKS) for n in ("torch.all", "torch.any")),
    OpEntry(name="torch.count_nonzero", family=FAMILY, sampler=_count_nonzero, ranks=RANKS),
    OpEntry(name="torch.isin", family=FAMILY, sampler=_isin, ranks=RANKS),
    OpEntry(name="torch.bucketize", family=FAMILY, sampler=_bucketize, ranks=RANKS),
    excluded_entry("torch.equal", FAMILY, "returns a Python bool, not a tensor: there is no output to compute"),
    excluded_entry("torch.is_complex", FAMILY, "a dtype query answered on the host: it launches no device work"),
]
