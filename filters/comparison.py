"""How two forwards' outputs are compared: every tensor of a result, in order, and the agent's tolerance rule
(assert_close's, without its message), deciding large tensors that differ on their first elements there."""

from __future__ import annotations

from typing import Any

import torch

PROBE_ELEMENTS = 4096  # outputs are compared on their first elements first: one that differs there is decided


def flatten_outputs(out: Any) -> list[torch.Tensor]:
    """All tensors of a forward's result, in order (nested tuples, lists and dicts included)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, list | tuple):
        return [t for item in out for t in flatten_outputs(item)]
    if isinstance(out, int | float | bool):
        return [torch.tensor(out)]
    return []


def _probe(t: torch.Tensor) -> torch.Tensor | None:
    """The first PROBE_ELEMENTS elements of a large contiguous tensor, as a view; None for any other tensor."""
    return t.view(-1)[:PROBE_ELEMENTS] if t.numel() > PROBE_ELEMENTS and t.is_contiguous() else None


def _all_close(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> bool:
    b = b.to(a.dtype)
    if torch.equal(a, b):  # one fused pass; a rerun mostly gives the very same bits
        return True
    return (a.is_floating_point() or a.is_complex()) and bool(torch.allclose(a, b, atol=atol, rtol=rtol))


def tensors_close(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> bool:
    """assert_close's rule without the message: |a - b| <= atol + rtol * |b|, exact for integers and bools.
    Large tensors that differ on their first elements are told apart there, without a pass over the rest."""
    if a.shape != b.shape:
        return False
    pa, pb = _probe(a), _probe(b)
    if pa is not None and pb is not None and not _all_close(pa, pb, atol, rtol):
        return False
    return _all_close(a, b, atol, rtol)


def outputs_close(a: list[torch.Tensor], b: list[torch.Tensor], atol: float, rtol: float) -> bool:
    return len(a) == len(b) and all(tensors_close(x, y, atol, rtol) for x, y in zip(a, b, strict=True))
