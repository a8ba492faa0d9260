"""Normalization layers: batch, instance, group, layer and RMS norms, in module and functional form.

Channel-wise norms read the channel count from dim 1 of their input; last-dimension norms from dim -1.
"""

from __future__ import annotations

from operator_catalog.entry import Hoisted, NotApplicable, OpCall, OpEntry, Operand, SampleContext, X

FAMILY = "normalization"


def _channel_norm(name: str):
    """nn.BatchNormNd / nn.InstanceNormNd: one statistic per channel of dim 1."""

    def sample(ctx: SampleContext) -> OpCall:
        kwargs = (("affine", True),) if "Instance" in name else ()
        return OpCall(
            name=name,
            style="module",
            target=name,
            init_args=(Hoisted("num_features", ctx.x.shape[1]),),
            init_kwargs=kwargs,
        )

    return sample


def _groups(channels: int, ctx: SampleContext) -> int:
    divisors = [g for g in (2, 4, 8, 16, 32) if channels % g == 0 and g < channels]
    if not divisors:
        raise NotApplicable(f"no group count divides {channels} channels")
    return ctx.choice(divisors)


def _group_norm(ctx: SampleContext) -> OpCall:
    channels = ctx.x.shape[1]
    return OpCall(
        name="nn.GroupNorm",
        style="module",
        target="nn.GroupNorm",
        init_args=(Hoisted("num_groups", _groups(channels, ctx)), Hoisted("num_channels", channels)),
    )


def _f_group_norm(ctx: SampleContext) -> OpCall:
    return OpCall(
        name="F.group_norm", style="function", target="F.group_norm", args=(X(), _groups(ctx.x.shape[1], ctx))
    )


def _last_dim_norm(name: str):
    def sample(ctx: SampleContext) -> OpCall:
        return OpCall(name=name, style="module", target=name, init_args=(Hoisted("normalized_shape", ctx.x.shape[-1]),))

    return sample


def _f_layer_norm(ctx: SampleContext) -> OpCall:
    size = ctx.x.shape[-1]
    return OpCall(
        name="F.layer_norm",
        style="function",
        target="F.layer_norm",
        args=(
            X(),
            (size,),
            Operand("parameter", (size,), "ln_weight"),
            Operand("parameter", (size,), "ln_bias"),
        ),
    )


def _normalize(ctx: SampleContext) -> OpCall:
    return OpCall(
        name="F.normalize",
        style="function",
        target="F.normalize",
        kwargs=(("p", 2.0), ("dim", ctx.rng.randrange(1, ctx.x.rank))),
    )


def _local_response_norm(ctx: SampleContext) -> OpCall:
    return OpCall(
        name="nn.LocalResponseNorm",
        style="module",
        target="nn.LocalResponseNorm",
        init_args=(ctx.choice((2, 3, 5)),),
    )


ENTRIES = [
    OpEntry(name="nn.BatchNorm1d", family=FAMILY, sampler=_channel_norm("nn.BatchNorm1d"), ranks=(2, 3)),
    OpEntry(name="nn.BatchNorm2d", family=FAMILY, sampler=_channel_norm("nn.BatchNorm2d"), ranks=(4,)),
    OpEntry(name="nn.BatchNorm3d", family=FAMILY, sampler=_channel_norm("nn.BatchNorm3d"), ranks=(5,)),
    OpEntry(name="nn.InstanceNorm1d", family=FAMILY, sampler=_channel_norm("nn.InstanceNorm1d"), ranks=(3,)),
    OpEntry(name="nn.InstanceNorm2d", family=FAMILY, sampler=_channel_norm("nn.InstanceNorm2d"), ranks=(4,)),
    OpEntry(name="nn.InstanceNorm3d", family=FAMILY, sampler=_channel_norm("nn.InstanceNorm3d"), ranks=(5,)),
    OpEntry(name="nn.GroupNorm", family=FAMILY, sampler=_group_norm, ranks=(3, 4, 5)),
    OpEntry(name="F.group_norm", family=FAMILY, sampler=_f_group_norm, ranks=(3, 4, 5)),
    OpEntry(name="nn.LayerNorm", family=FAMILY, sampler=_last_dim_norm("nn.LayerNorm"), ranks=(2, 3, 4)),
    OpEntry(name="nn.RMSNorm", family=FAMILY, sampler=_last_dim_norm("nn.RMSNorm"), ranks=(2, 3, 4)),
    OpEntry(name="F.layer_norm", family=FAMILY, sampler=_f_layer_norm, ranks=(2, 3, 4)),
    OpEntry(name="F.normalize", family=FAMILY, sampler=_normalize, ranks=(2, 3, 4)),
    OpEntry(name="nn.LocalResponseNorm", family=FAMILY, sampler=_local_response_norm, ranks=(3, 4)),
]
