"""What a forward costs, counted on the meta device: bytes moved, floating-point operations and kernels, from
which a device's speed predicts its time before it runs. The shape check counts it; the pipeline sizes a
candidate with it, so that most candidates' first execution lands in the runtime window.
"""

from __future__ import annotations

import functools

# Operators that launch no kernel of their own (metadata, or outputs made lazily).
_FREE = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh", "detach", "alias"}


@functools.cache
def _counter_class():
    """The dispatch mode that counts, made on first use: importing this module must not import torch."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    def nbytes(values) -> int:
        return sum(t.numel() * t.element_size() for t in tree_flatten(values)[0] if isinstance(t, torch.Tensor))

    class Counter(TorchDispatchMode):
        """Counts, for every operator that computes (views and allocations do not), the bytes of its tensor
        inputs and outputs (each read or written once) and one kernel."""

        def __init__(self):
            super().__init__()
            self.bytes = 0
            self.kernels = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if not func.is_view and func.__name__.split(".")[0] not in _FREE:
                self.bytes += nbytes((args, kwargs)) + nbytes(out)
                self.kernels += 1
            return out

    return Counter


class ForwardCost:
    """A context manager around a forward on the meta device; `cost` is then {bytes, flops, kernels}."""

    def __enter__(self) -> ForwardCost:
        from torch.utils.flop_counter import FlopCounterMode

        self._flops = FlopCounterMode(display=False)
        self._counter = _counter_class()()
        self._flops.__enter__()
        self._counter.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._counter.__exit__(*exc)
        self._flops.__exit__(*exc)

    @property
    def cost(self) -> dict[str, int]:
        return {"bytes": self._counter.bytes, "flops": self._flops.get_total_flops(), "kernels": self._counter.kernels}
