"""Pooling: max, average and adaptive pooling in 1, 2 and 3 spatial dimensions.

Windows never exceed the input's smallest spatial extent, so every sampled pool has a non-empty output.
"""

from __future__ import annotations

from opsynth.operator_catalog.entry import (
    NotApplicable,
    OpCall,
    OpEntry,
    SampleContext,
    X,
    float32_only,
    keyword_call,
)

FAMILY = "pooling"


def _window(ctx: SampleContext, name: str) -> int:
    """A pooling window of 2 or 3 that fits the input's smallest spatial extent."""
    extent = min(ctx.x.shape[2:])
    if extent < 2:
        raise NotApplicable(f"{name} needs a spatial extent >= 2")
    return ctx.choice([k for k in (2, 3) if k <= extent])


def _pool(name: str, style: str):
    def sample(ctx: SampleContext) -> OpCall:
        kernel = _window(ctx, name)
        kwargs = (("kernel_size", kernel), ("stride", ctx.choice((kernel, 1))))
        return keyword_call(name, style, kwargs)

    return sample


def _adaptive(name: str, style: str):
    def sample(ctx: SampleContext) -> OpCall:
        extent = min(ctx.x.shape[2:])
        size = ctx.choice([s for s in (1, 2, 4, 8) if s <= extent])
        if style == "module":
            return OpCall(name=name, style="module", target=name, init_args=(size,))
        return OpCall(name=name, style="function", target=name, args=(X(), size))

    return sample


def _with_indices(name: str, adaptive: bool):
    """`*_with_indices` forms return (values, indices): the values."""
    inner = _adaptive(name, "function") if adaptive else _pool(name, "function")

    def sample(ctx: SampleContext) -> OpCall:
        call = inner(ctx)
        return OpCall(name=name, style="function", target=name, args=call.args, kwargs=call.kwargs, output_index=0)

    return sample


def _lp_pool(name: str, style: str):
    """Power-average pooling; p = 2 is the root of the mean square (times the window size)."""

    def sample(ctx: SampleContext) -> OpCall:
        kernel = _window(ctx, name)
        p = ctx.choice((1.0, 2.0))
        if style == "module":
            return OpCall(name=name, style="module", target=name, init_args=(p, kernel))
        return OpCall(name=name, style="function", target=name, args=(X(), p, kernel))

    return sample


_ENTRIES = [
    *(
        OpEntry(name=f"nn.{k}Pool{d}d", family=FAMILY, sampler=_pool(f"nn.{k}Pool{d}d", "module"), ranks=(d + 2,))
        for k in ("Max", "Avg")
        for d in (1, 2, 3)
    ),
    *(
        OpEntry(
            name=f"F.{k}_pool{d}d",
            family=FAMILY,
            sampler=_pool(f"F.{k}_pool{d}d", "function"),
            ranks=(d + 2,),
        )
        for k in ("max", "avg")
        for d in (2, 3)
    ),
    *(
        OpEntry(
            name=f"nn.AdaptiveAvgPool{d}d",
            family=FAMILY,
            sampler=_adaptive(f"nn.AdaptiveAvgPool{d}d", "module"),
            ranks=(d + 2,),
        )
        for d in (1, 2, 3)
    ),
    *(
        OpEntry(
            name=f"nn.AdaptiveMaxPool{d}d",
            family=FAMILY,
            sampler=_adaptive(f"nn.AdaptiveMaxPool{d}d", "module"),
            ranks=(d + 2,),
        )
        for d in (1, 3)
    ),
    OpEntry(
        name="F.adaptive_avg_pool2d",
        family=FAMILY,
        sampler=_adaptive("F.adaptive_avg_pool2d", "function"),
        ranks=(4,),
    ),
    OpEntry(
        name="F.adaptive_avg_pool3d",
        family=FAMILY,
        sampler=_adaptive("F.adaptive_avg_pool3d", "function"),
        ranks=(5,),
    ),
    OpEntry(
        name="F.adaptive_max_pool1d_with_indices",
        family=FAMILY,
        sampler=_with_indices("F.adaptive_max_pool1d_with_indices", adaptive=True),
        ranks=(3,),
    ),
    *(
        OpEntry(
            name=f"F.adaptive_max_pool{d}d",
            family=FAMILY,
            sampler=_adaptive(f"F.adaptive_max_pool{d}d", "function"),
            ranks=(d + 2,),
        )
        for d in (2, 3)
    ),
    *(
        OpEntry(
            name=f"F.max_pool{d}d_with_indices",
            family=FAMILY,
            sampler=_with_indices(f"F.max_pool{d}d_with_indices", adaptive=False),
            ranks=(d + 2,),
        )
        for d in (1, 2)
    ),
    *(
        OpEntry(name=f"nn.LPPool{d}d", family=FAMILY, sampler=_lp_pool(f"nn.LPPool{d}d", "module"), ranks=(d + 2,))
        for d in (1, 2)
    ),
    *(
        OpEntry(name=f"F.lp_pool{d}d", family=FAMILY, sampler=_lp_pool(f"F.lp_pool{d}d", "function"), ranks=(d + 2,))
        for d in (2, 3)
    ),
]
# avg_pool3d has no bfloat16 or float16 kernel on the CPU (lp_pool3d is built on it).
ENTRIES = float32_only(_ENTRIES, {"nn.AvgPool3d", "F.avg_pool3d", "F.lp_pool3d"})
