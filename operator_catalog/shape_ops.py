"""Shape and data-movement operators: flips, transposes, rolls, masks, concatenation, padding, resampling.

They move or replicate data without arithmetic; samplers keep every result within the workload's size.
"""

from __future__ import annotations

from operator_catalog.entry import Hoisted, NotApplicable, OpCall, OpEntry, Operand, SampleContext, X, keyword_call

FAMILY = "shape_ops"
RANKS = (2, 3, 4, 5)


def _dim(ctx: SampleContext) -> int:
    return ctx.rng.randrange(1, ctx.x.rank)


def _flip(ctx: SampleContext) -> OpCall:
    return OpCall(name="torch.flip", style="function", target="torch.flip", kwargs=(("dims", [_dim(ctx)]),))


def _transpose(ctx: SampleContext) -> OpCall:
    if ctx.x.rank < 3:
        a, b = 0, 1
    else:
        a, b = sorted(ctx.rng.sample(range(1, ctx.x.rank), 2))
    return OpCall(name="torch.transpose", style="function", target="torch.transpose", args=(X(), a, b))


def _permute(ctx: SampleContext) -> OpCall:
    rest = list(range(1, ctx.x.rank))
    while rest == sorted(rest):
        ctx.rng.shuffle(rest)
    return OpCall(name="torch.permute", style="function", target="torch.permute", args=(X(), (0, *rest)))


def _roll(ctx: SampleContext) -> OpCall:
    dim = _dim(ctx)
    shift = ctx.rng.randrange(1, max(2, ctx.x.shape[dim]))
    return OpCall(name="torch.roll", style="function", target="torch.roll", kwargs=(("shifts", shift), ("dims", dim)))


def _triangle(name: str):
    def sample(ctx: SampleContext) -> OpCall:
        return OpCall(name=name, style="function", target=name, kwargs=(("diagonal", ctx.choice((-1, 0, 1))),))

    return sample


def _join(name: str):
    """torch.cat / torch.stack of x with a second forward input of the same shape."""

    def sample(ctx: SampleContext) -> OpCall:
        dim = _dim(ctx)
        return OpCall(
            name=name,
            style="function",
            target=name,
            args=([X(), Operand("input", ctx.x.shape, "y")],),
            kwargs=(("dim", dim),),
        )

    return sample


def _flatten(ctx: SampleContext) -> OpCall:
    return OpCall(name="nn.Flatten", style="module", target="nn.Flatten")


def _pixel_shuffle(ctx: SampleContext) -> OpCall:
    factors = [r for r in (2, 3) if ctx.x.shape[1] % (r * r) == 0]
    if not factors:
        raise NotApplicable("PixelShuffle needs channels divisible by r^2")
    return OpCall(
        name="nn.PixelShuffle",
        style="module",
        target="nn.PixelShuffle",
        init_args=(Hoisted("upscale_factor", ctx.choice(factors)),),
    )


def _resample(name: str, style: str):
    def sample(ctx: SampleContext) -> OpCall:
        mode = ctx.choice(
            {3: ("nearest", "linear"), 4: ("nearest", "bilinear"), 5: ("nearest", "trilinear")}[ctx.x.rank]
        )
        kwargs = (("scale_factor", 2.0), ("mode", mode))
        return keyword_call(name, style, kwargs)

    return sample


def _f_pad(ctx: SampleContext) -> OpCall:
    p = ctx.choice((1, 2))
    return OpCall(name="F.pad", style="function", target="F.pad", args=(X(), (p, p)), kwargs=(("value", 0.0),))


def _pad2d(name: str, with_value: bool = False):
    def sample(ctx: SampleContext) -> OpCall:
        p = ctx.choice([q for q in (1, 2, 3) if q < min(ctx.x.shape[2:])] or [0])
        if p == 0:
            raise NotApplicable(f"{name} needs spatial extent >= 2")
        args = (p, ctx.choice((0.0, 0.5))) if with_value else (p,)
        return OpCall(name=name, style="module", target=name, init_args=args)

    return sample


def _rot90(ctx: SampleContext) -> OpCall:
    return OpCall(
        name="torch.rot90",
        style="function",
        target="torch.rot90",
        kwargs=(("k", ctx.choice((1, 2, 3))), ("dims", [ctx.x.rank - 2, ctx.x.rank - 1])),
    )


def _repeat_interleave(ctx: SampleContext) -> OpCall:
    return OpCall(
        name="torch.repeat_interleave",
        style="function",
        target="torch.repeat_interleave",
        kwargs=(("repeats", 2), ("dim", _dim(ctx))),
    )


def _unfold(name: str, style: str):
    def sample(ctx: SampleContext) -> OpCall:
        if min(ctx.x.shape[2:]) < 2:
            raise NotApplicable(f"{name} needs spatial extent >= 2")
        kwargs = (("kernel_size", 2), ("stride", ctx.choice((1, 2))))
        return keyword_call(name, style, kwargs)

    return sample


ENTRIES = [
    OpEntry(name="torch.flip", family=FAMILY, sampler=_flip, ranks=RANKS),
    OpEntry(name="torch.transpose", family=FAMILY, sampler=_transpose, ranks=RANKS),
    OpEntry(name="torch.permute", family=FAMILY, sampler=_permute, ranks=(3, 4, 5)),
    OpEntry(name="torch.roll", family=FAMILY, sampler=_roll, ranks=RANKS),
    OpEntry(name="torch.triu", family=FAMILY, sampler=_triangle("torch.triu"), ranks=RANKS),
    OpEntry(name="torch.tril", family=FAMILY, sampler=_triangle("torch.tril"), ranks=RANKS),
    OpEntry(name="torch.cat", family=FAMILY, sampler=_join("torch.cat"), ranks=RANKS),
    OpEntry(name="torch.stack", family=FAMILY, sampler=_join("torch.stack"), ranks=(2, 3, 4)),
    OpEntry(name="nn.Flatten", family=FAMILY, sampler=_flatten, ranks=(3, 4, 5)),
    OpEntry(name="nn.PixelShuffle", family=FAMILY, sampler=_pixel_shuffle, ranks=(4,)),
    OpEntry(name="nn.Upsample", family=FAMILY, sampler=_resample("nn.Upsample", "module"), ranks=(3, 4, 5)),
    OpEntry(name="F.interpolate", family=FAMILY, sampler=_resample("F.interpolate", "function"), ranks=(3, 4, 5)),
    OpEntry(name="F.pad", family=FAMILY, sampler=_f_pad, ranks=RANKS),
    OpEntry(name="nn.ReflectionPad2d", family=FAMILY, sampler=_pad2d("nn.ReflectionPad2d"), ranks=(4,)),
    OpEntry(name="nn.ZeroPad2d", family=FAMILY, sampler=_pad2d("nn.ZeroPad2d"), ranks=(4,)),
    OpEntry(
        name="nn.ConstantPad2d",
        family=FAMILY,
        sampler=_pad2d("nn.ConstantPad2d", with_value=True),
        ranks=(4,),
    ),
    OpEntry(name="torch.rot90", family=FAMILY, sampler=_rot90, ranks=(3, 4, 5)),
    OpEntry(name="torch.repeat_interleave", family=FAMILY, sampler=_repeat_interleave, ranks=RANKS),
    OpEntry(name="nn.Unfold", family=FAMILY, sampler=_unfold("nn.Unfold", "module"), ranks=(4,)),
    OpEntry(name="F.unfold", family=FAMILY, sampler=_unfold("F.unfold", "function"), ranks=(4,)),
]
