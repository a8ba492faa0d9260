"""Convolutions and transposed convolutions in 1, 2 and 3 spatial dimensions: modules, lazy modules (which
infer their in-channels) and the functional forms with learnable weight and bias.

In-channels come from dim 1 of the input; kernel sizes never exceed the input's spatial extent.
"""

from __future__ import annotations

from dataclasses import dataclass

from opsynth.operator_catalog.entry import Hoisted, NotApplicable, OpCall, OpEntry, Operand, SampleContext, X

FAMILY = "convolution"


@dataclass(frozen=True)
class _Geometry:
    kernel: int
    kwargs: tuple[tuple[str, object], ...]  # stride, and padding / output_padding where drawn


def _geometry(ctx: SampleContext, name: str, transposed: bool) -> _Geometry:
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
    return _Geometry(kernel, tuple(kwargs))


def _conv(name: str, transposed: bool, lazy: bool = False):
    """A module convolution; a lazy one (nn.LazyConv*) infers its input channels, so it is not given them."""

    def sample(ctx: SampleContext) -> OpCall:
        g = _geometry(ctx, name, transposed)
        in_channels = () if lazy else (Hoisted("in_channels", ctx.x.shape[1]),)
        return OpCall(
            name=name,
            style="module",
            target=name,
            init_args=(*in_channels, Hoisted("out_channels", ctx.out_channels()), Hoisted("kernel_size", g.kernel)),
            init_kwargs=g.kwargs,
        )

    return sample


def _f_conv(name: str, spatial_dims: int, transposed: bool):
    """F.conv*d(x, weight, bias, ...): a transposed weight is (in, out, k...), a direct one (out, in, k...)."""

    def sample(ctx: SampleContext) -> OpCall:
        g = _geometry(ctx, name, transposed)
        c_in, c_out = ctx.x.shape[1], ctx.out_channels()
        weight = (c_in, c_out) if transposed else (c_out, c_in)
        return OpCall(
            name=name,
            style="function",
            target=name,
            args=(
                X(),
                Operand("parameter", (*weight, *(g.kernel,) * spatial_dims), "weight"),
                Operand("parameter", (c_out,), "bias"),
            ),
            kwargs=g.kwargs,
        )

    return sample


ENTRIES = [
    *(
        OpEntry(
            name=f"nn.{kind}{d}d",
            family=FAMILY,
            sampler=_conv(f"nn.{kind}{d}d", kind.startswith("ConvT")),
            ranks=(d + 2,),
        )
        for kind in ("Conv", "ConvTranspose")
        for d in (1, 2, 3)
    ),
    *(
        OpEntry(name=name, family=FAMILY, sampler=_f_conv(name, d, transposed), ranks=(d + 2,))
        for name, d, transposed in (
            ("F.conv1d", 1, False),
            ("F.conv2d", 2, False),
            ("F.conv3d", 3, False),
            ("torch.conv2d", 2, False),
            ("F.conv_transpose1d", 1, True),
            ("F.conv_transpose2d", 2, True),
        )
    ),
    *(
        OpEntry(name=name, family=FAMILY, sampler=_conv(name, "Transpose" in name, lazy=True), ranks=(d + 2,))
        for name, d in (
            ("nn.LazyConv3d", 3),
            ("nn.LazyConvTranspose1d", 1),
            ("nn.LazyConvTranspose2d", 2),
            ("nn.LazyConvTranspose3d", 3),
        )
    ),
]
