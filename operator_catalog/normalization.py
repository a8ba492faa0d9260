"""Normalization layers: batch, instance, group, layer and RMS norms, in module and functional form.

Channel-wise norms read the channel count from dim 1 of their input; last-dimension norms from dim -1.
"""

from __future__ import annotations

from opsynth.operator_catalog.entry import (
    Hoisted,
    NotApplicable,
    OpCall,
    OpEntry,
    Operand,
    SampleContext,
    X,
    excluded_entry,
    float32_only,
)

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
        kwargs=(("p", 2.0), ("dim", ctx.non_batch_dim())),
    )


def _local_response_norm(ctx: SampleContext) -> OpCall:
    return OpCall(
        name="nn.LocalResponseNorm",
        style="module",
        target="nn.LocalResponseNorm",
        init_args=(ctx.choice((2, 3, 5)),),
    )


def _lazy_channel_norm(name: str):
    """Lazy norms infer the channel count from their first input."""

    def sample(ctx: SampleContext) -> OpCall:
        kwargs = (("affine", True),) if "Instance" in name else ()
        return OpCall(name=name, style="module", target=name, init_kwargs=kwargs)

    return sample


def _statistics(ctx: SampleContext) -> tuple[Operand, Operand, Operand, Operand]:
    """Running mean and (positive) running variance, weight and bias of an inference-time batch norm."""
    c = ctx.x.shape[1]
    return (
        Operand("parameter", (c,), "running_mean"),
        Operand("parameter", (c,), "running_var", "rand"),
        Operand("parameter", (c,), "bn_weight"),
        Operand("parameter", (c,), "bn_bias"),
    )


def _f_batch_norm(ctx: SampleContext) -> OpCall:
    mean, var, weight, bias = _statistics(ctx)
    return OpCall(
        name="F.batch_norm",
        style="function",
        target="F.batch_norm",
        args=(X(), mean, var, weight, bias),
        kwargs=(("training", False), ("eps", 1e-5)),
    )


def _native_batch_norm(ctx: SampleContext) -> OpCall:
    mean, var, weight, bias = _statistics(ctx)
    return OpCall(
        name="torch.native_batch_norm",
        style="function",
        target="torch.native_batch_norm",
        args=(X(), weight, bias, mean, var, False, 0.1, 1e-5),
        output_index=0,
    )


def _native_layer_norm(ctx: SampleContext) -> OpCall:
    size = ctx.x.shape[-1]
    return OpCall(
        name="torch.native_layer_norm",
        style="function",
        target="torch.native_layer_norm",
        args=(
            X(),
            [size],
            Operand("parameter", (size,), "ln_weight"),
            Operand("parameter", (size,), "ln_bias"),
            1e-5,
        ),
        output_index=0,
    )


def _f_instance_norm(ctx: SampleContext) -> OpCall:
    c = ctx.x.shape[1]
    return OpCall(
        name="F.instance_norm",
        style="function",
        target="F.instance_norm",
        kwargs=(("weight", Operand("parameter", (c,), "in_weight")), ("bias", Operand("parameter", (c,), "in_bias"))),
    )


def _f_local_response_norm(ctx: SampleContext) -> OpCall:
    return OpCall(
        name="F.local_response_norm",
        style="function",
        target="F.local_response_norm",
        args=(X(), ctx.choice((2, 3, 5))),
    )


def _cross_map_lrn(ctx: SampleContext) -> OpCall:
    return OpCall(
        name="nn.CrossMapLRN2d",
        style="module",
        target="nn.CrossMapLRN2d",
        init_args=(ctx.choice((3, 5)),),
        init_kwargs=(("alpha", 1e-4), ("beta", 0.75), ("k", 1.0)),
    )


_ENTRIES = [
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
    OpEntry(name="F.local_response_norm", family=FAMILY, sampler=_f_local_response_norm, ranks=(3, 4)),
    OpEntry(name="nn.CrossMapLRN2d", family=FAMILY, sampler=_cross_map_lrn, ranks=(4,)),
    OpEntry(name="nn.SyncBatchNorm", family=FAMILY, sampler=_channel_norm("nn.SyncBatchNorm"), ranks=(2, 3, 4, 5)),
    OpEntry(name="nn.LazyBatchNorm2d", family=FAMILY, sampler=_lazy_channel_norm("nn.LazyBatchNorm2d"), ranks=(4,)),
    *(
        OpEntry(
            name=f"nn.LazyInstanceNorm{d}d",
            family=FAMILY,
            sampler=_lazy_channel_norm(f"nn.LazyInstanceNorm{d}d"),
            ranks=(d + 2,),
        )
        for d in (1, 2, 3)
    ),
    OpEntry(name="F.batch_norm", family=FAMILY, sampler=_f_batch_norm, ranks=(2, 3, 4, 5)),
    OpEntry(name="F.instance_norm", family=FAMILY, sampler=_f_instance_norm, ranks=(3, 4, 5)),
    OpEntry(name="torch.native_batch_norm", family=FAMILY, sampler=_native_batch_norm, ranks=(2, 3, 4, 5)),
    OpEntry(name="torch.native_layer_norm", family=FAMILY, sampler=_native_layer_norm, ranks=(2, 3, 4)),
    excluded_entry(
        "torch.cudnn_batch_norm",
        FAMILY,
        "a cuDNN-only kernel with no CPU or meta implementation, so tasks using it cannot be checked or run on CPU",
    ),
]
# local_response_norm pools a 4-d input with avg_pool3d, which has no bfloat16 or float16 kernel on the CPU.
ENTRIES = float32_only(_ENTRIES, {"nn.LocalResponseNorm", "F.local_response_norm"})
