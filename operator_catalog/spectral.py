"""Complex-valued operators: short-time Fourier transforms, complex views and polar construction.

A complex result that another operator (or the task's output) has to read is turned into its magnitude by
`abs` glue, so every task still returns real tensors.
"""

from __future__ import annotations

from opsynth.operator_catalog.entry import (
    Expr,
    NotApplicable,
    OpCall,
    OpEntry,
    Operand,
    SampleContext,
    X,
    float32_only,
)

FAMILY = "spectral"
RANKS = (2, 3, 4, 5)


def _stft(ctx: SampleContext) -> OpCall:
    length = ctx.x.shape[-1]
    sizes = [n for n in (16, 32, 64, 128, 256) if n <= length]
    if not sizes:
        raise NotApplicable("torch.stft needs a signal of at least 16 samples")
    n_fft = ctx.choice(sizes)
    return OpCall(
        name="torch.stft",
        style="function",
        target="torch.stft",
        args=(X(), n_fft),
        kwargs=(
            ("hop_length", n_fft // ctx.choice((2, 4))),
            ("window", Operand("parameter", (n_fft,), "window", "rand")),
            ("return_complex", True),
        ),
    )


def _view_as_complex(ctx: SampleContext) -> OpCall:
    if ctx.x.shape[-1] % 2:
        raise NotApplicable("torch.view_as_complex pairs up an even last dimension")
    return OpCall(
        name="torch.view_as_complex",
        style="function",
        target="torch.view_as_complex",
        args=(Expr("{x}.unflatten(-1, (-1, 2)).contiguous()"),),
    )


def _view_as_real(ctx: SampleContext) -> OpCall:
    # e^{ix}: the (cos, sin) pairs of a rotary embedding.
    return OpCall(
        name="torch.view_as_real", style="function", target="torch.view_as_real", args=(Expr("{x}.mul(1j).exp()"),)
    )


def _polar(ctx: SampleContext) -> OpCall:
    # x is the magnitude (mapped positive by domain glue), a learnable phase per feature the angle.
    return OpCall(
        name="torch.polar",
        style="function",
        target="torch.polar",
        args=(X(), Operand("parameter", (ctx.x.shape[-1],), "phase")),
    )


_ENTRIES = [
    OpEntry(name="torch.stft", family=FAMILY, sampler=_stft, ranks=(2,)),
    OpEntry(name="torch.view_as_complex", family=FAMILY, sampler=_view_as_complex, ranks=RANKS),
    OpEntry(name="torch.view_as_real", family=FAMILY, sampler=_view_as_real, ranks=(2, 3, 4)),
    OpEntry(name="torch.polar", family=FAMILY, sampler=_polar, ranks=RANKS, domain="positive"),
]
# FFTs take no bfloat16 (and float16 only at some sizes), nor do the CPU's complex half kernels: float32 alone.
ENTRIES = float32_only(_ENTRIES, {e.name for e in _ENTRIES})
