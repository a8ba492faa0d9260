"""Shape and data-movement operators: flips, transposes, rolls, masks, concatenation, padding, resampling.

They move or replicate data without arithmetic; samplers keep every result within the workload's size.
"""

from __future__ import annotations

from opsynth.operator_catalog.entry import (
    Expr,
    Hoisted,
    NotApplicable,
    OpCall,
    OpEntry,
    Operand,
    SampleContext,
    X,
    keyword_call,
    styled_call,
)

FAMILY = "shape_ops"
RANKS = (2, 3, 4, 5)


def _flip(ctx: SampleContext) -> OpCall:
    return OpCall(name="torch.flip", style="function", target="torch.flip", kwargs=(("dims", [ctx.non_batch_dim()]),))


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
    dim = ctx.non_batch_dim()
    shift = ctx.rng.randrange(1, max(2, ctx.x.shape[dim]))
    return OpCall(name="torch.roll", style="function", target="torch.roll", kwargs=(("shifts", shift), ("dims", dim)))


def _triangle(name: str):
    def sample(ctx: SampleContext) -> OpCall:
        return OpCall(name=name, style="function", target=name, kwargs=(("diagonal", ctx.choice((-1, 0, 1))),))

    return sample


def _join(name: str):
    """torch.cat / torch.stack of x with a second forward input of the same shape."""

    def sample(ctx: SampleContext) -> OpCall:
        dim = ctx.non_batch_dim()
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


def _factor_op(name: str, style: str, param: str, factors_of):
    """Pixel (un)shuffles and channel shuffles: one integer factor that must divide some of x's dimensions."""

    def sample(ctx: SampleContext) -> OpCall:
        factors = factors_of(ctx.x.shape)
        if not factors:
            raise NotApplicable(f"{name}: no factor divides the input's shape {ctx.x.shape}")
        return styled_call(name, style, params=(Hoisted(param, ctx.choice(factors)),))

    return sample


def _pixel_shuffle(name: str, style: str):
    return _factor_op(name, style, "upscale_factor", lambda shape: [r for r in (2, 3) if shape[1] % (r * r) == 0])


def _pixel_unshuffle(name: str, style: str):
    return _factor_op(
        name, style, "downscale_factor", lambda shape: [r for r in (2, 3) if all(d % r == 0 for d in shape[2:])]
    )


def _channel_shuffle(name: str, style: str):
    return _factor_op(
        name, style, "groups", lambda shape: [g for g in (2, 3, 4, 8) if shape[1] % g == 0 and g < shape[1]]
    )


def _squeeze(ctx: SampleContext) -> OpCall:
    # Drops a size-1 dimension (after a keepdim reduction, say); without one it is the identity.
    ones = [d for d in range(1, ctx.x.rank) if ctx.x.shape[d] == 1]
    args = (X(), ctx.choice(ones)) if ones else (X(),)
    return OpCall(name="torch.squeeze", style="function", target="torch.squeeze", args=args)


def _unsqueeze(ctx: SampleContext) -> OpCall:
    return OpCall(
        name="torch.unsqueeze",
        style="function",
        target="torch.unsqueeze",
        args=(X(), ctx.rng.randrange(1, ctx.x.rank + 1)),
    )


def _reshape(ctx: SampleContext) -> OpCall:
    """Merge the two trailing dimensions, or split the last one in two."""
    *lead, a, b = ctx.x.shape
    split = ctx.x.rank <= 3 and b % 2 == 0 and ctx.rng.random() < 0.5
    shape = (*lead, a, 2, b // 2) if split else (*lead, a * b)
    return OpCall(name="torch.reshape", style="function", target="torch.reshape", args=(X(), (-1, *shape[1:])))


def _copy(name: str):
    def sample(ctx: SampleContext) -> OpCall:
        return OpCall(name=name, style="function", target=name)

    return sample


def _constant_pad_nd(ctx: SampleContext) -> OpCall:
    pad = [ctx.choice((0, 1, 2)) for _ in range(2 * min(2, ctx.x.rank - 1))]
    return OpCall(
        name="torch.constant_pad_nd",
        style="function",
        target="torch.constant_pad_nd",
        args=(X(), pad, ctx.choice((0.0, 1.0))),
    )


def _upsample_fixed(name: str, style: str):
    """The fixed-mode resamplers: bilinear (2-D) or nearest, by a factor of 2."""

    def sample(ctx: SampleContext) -> OpCall:
        return keyword_call(name, style, (("scale_factor", 2),))

    return sample


def _grid_sample(ctx: SampleContext) -> OpCall:
    n, _, h, w = ctx.x.shape
    out = (max(1, h // ctx.choice((1, 2))), max(1, w // ctx.choice((1, 2))))
    return OpCall(
        name="F.grid_sample",
        style="function",
        target="F.grid_sample",
        args=(X(), Operand("input", (n, *out, 2), "grid", "rand")),
        kwargs=(("mode", ctx.choice(("bilinear", "nearest"))), ("align_corners", False)),
    )


def _affine_grid(ctx: SampleContext) -> OpCall:
    # A per-sample affine sampling grid whose matrix is read from x, its (x, y) sum added back per pixel.
    n, c, h, w = ctx.x.shape
    if c * h * w < 6:
        raise NotApplicable("torch.affine_grid_generator needs 6 values per sample for the matrix")
    return OpCall(
        name="torch.affine_grid_generator",
        style="function",
        target="torch.affine_grid_generator",
        args=(Expr("{x}.flatten(1)[:, :6].unflatten(1, (2, 3))"), [n, c, h, w], False),
        wrap="{x}.add({call}.sum(-1).unsqueeze(1))",
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


def _pad(name: str, with_value: bool = False):
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
        kwargs=(("repeats", 2), ("dim", ctx.non_batch_dim())),
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
    OpEntry(name="nn.PixelShuffle", family=FAMILY, sampler=_pixel_shuffle("nn.PixelShuffle", "module"), ranks=(4,)),
    OpEntry(name="F.pixel_shuffle", family=FAMILY, sampler=_pixel_shuffle("F.pixel_shuffle", "function"), ranks=(4,)),
    OpEntry(
        name="nn.PixelUnshuffle", family=FAMILY, sampler=_pixel_unshuffle("nn.PixelUnshuffle", "module"), ranks=(4,)
    ),
    *(
        OpEntry(name=n, family=FAMILY, sampler=_pixel_unshuffle(n, "function"), ranks=(4,))
        for n in ("F.pixel_unshuffle", "torch.pixel_unshuffle")
    ),
    OpEntry(
        name="nn.ChannelShuffle",
        family=FAMILY,
        sampler=_channel_shuffle("nn.ChannelShuffle", "module"),
        ranks=(3, 4, 5),
    ),
    *(
        OpEntry(name=n, family=FAMILY, sampler=_channel_shuffle(n, "function"), ranks=(3, 4, 5))
        for n in ("F.channel_shuffle", "torch.channel_shuffle", "F.native_channel_shuffle")
    ),
    OpEntry(name="torch.squeeze", family=FAMILY, sampler=_squeeze, ranks=RANKS),
    OpEntry(name="torch.unsqueeze", family=FAMILY, sampler=_unsqueeze, ranks=(2, 3, 4)),
    OpEntry(name="torch.reshape", family=FAMILY, sampler=_reshape, ranks=RANKS),
    OpEntry(name="torch.clone", family=FAMILY, sampler=_copy("torch.clone"), ranks=RANKS),
    OpEntry(name="torch.detach", family=FAMILY, sampler=_copy("torch.detach"), ranks=RANKS),
    OpEntry(name="torch.t", family=FAMILY, sampler=_copy("torch.t"), ranks=(2,)),
    OpEntry(name="torch.constant_pad_nd", family=FAMILY, sampler=_constant_pad_nd, ranks=RANKS),
    OpEntry(name="F.upsample", family=FAMILY, sampler=_resample("F.upsample", "function"), ranks=(3, 4, 5)),
    OpEntry(
        name="F.upsample_nearest",
        family=FAMILY,
        sampler=_upsample_fixed("F.upsample_nearest", "function"),
        ranks=(3, 4, 5),
    ),
    OpEntry(
        name="F.upsample_bilinear",
        family=FAMILY,
        sampler=_upsample_fixed("F.upsample_bilinear", "function"),
        ranks=(4,),
    ),
    OpEntry(
        name="nn.UpsamplingBilinear2d",
        family=FAMILY,
        sampler=_upsample_fixed("nn.UpsamplingBilinear2d", "module"),
        ranks=(4,),
    ),
    OpEntry(name="F.grid_sample", family=FAMILY, sampler=_grid_sample, ranks=(4,)),
    OpEntry(name="torch.affine_grid_generator", family=FAMILY, sampler=_affine_grid, ranks=(4,)),
    OpEntry(name="nn.Upsample", family=FAMILY, sampler=_resample("nn.Upsample", "module"), ranks=(3, 4, 5)),
    OpEntry(name="F.interpolate", family=FAMILY, sampler=_resample("F.interpolate", "function"), ranks=(3, 4, 5)),
    OpEntry(name="F.pad", family=FAMILY, sampler=_f_pad, ranks=RANKS),
    OpEntry(name="nn.ReflectionPad2d", family=FAMILY, sampler=_pad("nn.ReflectionPad2d"), ranks=(4,)),
    OpEntry(name="nn.ZeroPad2d", family=FAMILY, sampler=_pad("nn.ZeroPad2d"), ranks=(4,)),
    OpEntry(name="nn.ZeroPad3d", family=FAMILY, sampler=_pad("nn.ZeroPad3d"), ranks=(5,)),
    OpEntry(name="nn.ReflectionPad3d", family=FAMILY, sampler=_pad("nn.ReflectionPad3d"), ranks=(5,)),
    OpEntry(name="nn.ReplicationPad2d", family=FAMILY, sampler=_pad("nn.ReplicationPad2d"), ranks=(4,)),
    OpEntry(name="nn.CircularPad1d", family=FAMILY, sampler=_pad("nn.CircularPad1d"), ranks=(3,)),
    OpEntry(name="nn.CircularPad3d", family=FAMILY, sampler=_pad("nn.CircularPad3d"), ranks=(5,)),
    OpEntry(name="nn.ConstantPad1d", family=FAMILY, sampler=_pad("nn.ConstantPad1d", with_value=True), ranks=(3,)),
    OpEntry(name="nn.ConstantPad3d", family=FAMILY, sampler=_pad("nn.ConstantPad3d", with_value=True), ranks=(5,)),
    OpEntry(
        name="nn.ConstantPad2d",
        family=FAMILY,
        sampler=_pad("nn.ConstantPad2d", with_value=True),
        ranks=(4,),
    ),
    OpEntry(name="torch.rot90", family=FAMILY, sampler=_rot90, ranks=(3, 4, 5)),
    OpEntry(name="torch.repeat_interleave", family=FAMILY, sampler=_repeat_interleave, ranks=RANKS),
    OpEntry(name="nn.Unfold", family=FAMILY, sampler=_unfold("nn.Unfold", "module"), ranks=(4,)),
    OpEntry(name="F.unfold", family=FAMILY, sampler=_unfold("F.unfold", "function"), ranks=(4,)),
]
