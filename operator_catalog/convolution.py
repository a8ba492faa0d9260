"""Convolutions and transposed convolutions in 1, 2 and 3 spatial dimensions.

In-channels come from dim 1 of the input; kernel sizes never exceed the input's spatial extent.
"""

from __future__ import annotations

from operator_catalog.entry import Hoisted, NotApplicable, OpCall, OpEntry, SampleContext

FAMILY = "convolution"


def _conv(name: str, spatial_dims: int, transposed: bool):
    def sample(ctx: SampleContext) -> OpCall:
        extent = min(ctx.x.shape[2:])
        kernels = [k for k in (1, 3, 5) if k <= extent]
        if not kernels:
            raise NotApplicable(f"{name} needs spatial extent >= 1")
        kernel = ctx.choice(kernels[1:] or kernels)
        stride = ctx.choice((1, 1, 2))
        kwargs: list[tuple[str, object]] = [("stride", stride)]
        padding = ctx.choice((0, kernel // 2))
        if padding:
            kwargs.append(("padding", padding))
        if transposed and stride > 1 and ctx.rng.random() < 0.5:
            kwargs.append(("output_padding", 1))
        return OpCall(
            name=name,
            style="module",
            target=name,
            init_args=(
                Hoisted("in_channels", ctx.x.shape[1]),
                Hoisted("out_channels", ctx.out_channels()),
                Hoisted("kernel_size", kernel),
            ),
            init_kwargs=tuple(kwargs),
        )

    return sample


ENTRIES = [
    OpEntry(
        name=f"nn.{kind}{d}d",
        family=FAMILY,
        sampler=_conv(f"nn.{kind}{d}d", d, kind.startswith("ConvT")),
        ranks=(d + 2,),
    )
    for kind in ("Conv", "ConvTranspose")
    for d in (1, 2, 3)
]
