"""Pooling: max, average and adaptive pooling in 1, 2 and 3 spatial dimensions.

Windows never exceed the input's smallest spatial extent, so every sampled pool has a non-empty output.
"""

from __future__ import annotations

from operator_catalog.entry import NotApplicable, OpCall, OpEntry, SampleContext, X, keyword_call

FAMILY = "pooling"


def _pool(name: str, style: str):
    def sample(ctx: SampleContext) -> OpCall:
        extent = min(ctx.x.shape[2:])
        if extent < 2:
            raise NotApplicable(f"{name} needs a spatial extent >= 2")
        kernel = ctx.choice([k for k in (2, 3) if k <= extent])
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


ENTRIES = [
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
]
