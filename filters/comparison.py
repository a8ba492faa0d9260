"""How two forwards' outputs are compared: every tensor of a result, in order, and the agent's tolerance rule
(assert_close's, without its message), deciding large tensors that differ on their first elements there; and
how many of their elements differ, for telling input draws apart."""

from __future__ import annotations

from typing import Any

import torch

PROBE_ELEMENTS = 4096  # outputs are compared on their first elements first: one that differs there is decided
COUNT_CHUNK = 1 << 24  # elements compared at a time when counting those that differ (a bounded temporary)


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


def to_device(value: Any, device: torch.device) -> Any:
    """A forward's inputs or outputs on `device`: its tensors moved, in nested lists and tuples too."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, list | tuple):
        return type(value)(to_device(v, device) for v in value)
    return value


def _probe(t: torch.Tensor) -> torch.Tensor | None:
    """The first PROBE_ELEMENTS elements of a large contiguous tensor, as a view; None for any other tensor."""
    return t.view(-1)[:PROBE_ELEMENTS] if t.numel() > PROBE_ELEMENTS and t.is_contiguous() else None


def discrete(t: torch.Tensor) -> bool:
    """Whether `t` holds discrete values (bool or integer), compared exactly: no tolerance applies."""
    return not (t.is_floating_point() or t.is_complex())


def _all_close(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> bool:
    b = b.to(a.dtype)
    if torch.equal(a, b):  # one fused pass; a rerun mostly gives the very same bits
        return True
    return not discrete(a) and bool(torch.allclose(a, b, atol=atol, rtol=rtol))


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


def _beyond(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> int:
    """Elements of a beyond the tolerance of b (unequal, for integers and bools)."""
    if discrete(a):
        return int((a != b.to(a.dtype)).sum())
    return int((~torch.isclose(a, b.to(a.dtype), rtol=rtol, atol=atol)).sum())


def differing_elements(a: list[torch.Tensor], b: list[torch.Tensor], atol: float, rtol: float, enough: int) -> int:
    """How many elements of the outputs `a` lie beyond the tolerance of `b`'s, counted COUNT_CHUNK at a time
    and no further than `enough`; a tensor of another shape (or a missing one) counts all its elements."""
    if len(a) != len(b):
        return enough
    found = 0
    for x, y in zip(a, b, strict=True):
        if found >= enough:
            break
        if x.shape != y.shape:
            found += max(1, x.numel())
            continue
        x, y = x.reshape(-1), y.reshape(-1)
        for start in range(0, x.numel(), COUNT_CHUNK):
            found += _beyond(x[start : start + COUNT_CHUNK], y[start : start + COUNT_CHUNK], atol, rtol)
            if found >= enough:
                break
    return min(found, enough)
