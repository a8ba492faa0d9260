"""What a forward costs, counted on the meta device (bytes moved, floating-point operations, kernels), from which a
device's speed predicts its time before it runs; a recurrence is counted over one and two steps and extended
(docs/execution.md, "Sizing before execution")."""

from __future__ import annotations

import functools

# Operators that launch no kernel of their own (metadata, or outputs made lazily).
_FREE = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh", "detach", "alias"}
RECURRENCES = ("lstm", "gru", "rnn_tanh", "rnn_relu")  # torch functions behind nn.LSTM, nn.GRU and nn.RNN
MIN_EXTENDED_STEPS = 3  # a recurrence of fewer steps is counted as it runs


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


@functools.cache
def _stepping_class():
    """The function mode that counts a recurrence on meta over its first steps only (see the module's doc)."""
    import torch
    from torch.overrides import TorchFunctionMode

    recurrences = {getattr(torch, name) for name in RECURRENCES}

    def steps_dim(func, args, kwargs) -> int | None:
        """The time dimension of a dense batched recurrence on meta (input, hx, params, has_biases, num_layers,
        dropout, train, bidirectional, batch_first); None for any other call (a packed sequence's has no
        has_biases in fourth place)."""
        if func not in recurrences or kwargs or len(args) != 9 or not isinstance(args[3], bool):
            return None
        x = args[0]
        if not isinstance(x, torch.Tensor) or x.device.type != "meta" or x.dim() != 3:
            return None
        return 1 if args[8] else 0

    def _extended(t: torch.Tensor, dim: int, steps: int) -> torch.Tensor:
        """`t` with `steps` along `dim`, laid out in memory as `t` is (a later reshape copies the same bytes)."""
        shape = list(t.shape)
        shape[dim] = steps
        order = sorted(range(t.dim()), key=lambda d: -t.stride(d))  # outermost first
        made = t.new_empty([shape[d] for d in order])
        return made.permute([order.index(d) for d in range(t.dim())])

    class Stepping(TorchFunctionMode):
        def __init__(self, cost: ForwardCost):
            super().__init__()
            self.cost = cost

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            dim = steps_dim(func, args, kwargs)
            if dim is None or args[0].shape[dim] < MIN_EXTENDED_STEPS:
                return func(*args, **kwargs)
            steps = args[0].shape[dim]
            counted = []
            for first in (1, 2):
                before = self.cost.counted()
                out = func(args[0].narrow(dim, 0, first), *args[1:])
                counted.append({k: v - before[k] for k, v in self.cost.counted().items()})
            one, two = counted
            for k in self.cost.extra:  # cost(steps) = one + (steps - 1) * (two - one); one and two are counted
                self.cost.extra[k] += one[k] + (steps - 1) * (two[k] - one[k]) - one[k] - two[k]
            return (_extended(out[0], dim, steps), *out[1:])

    return Stepping


class ForwardCost:
    """A context manager around a forward on the meta device; `cost` is then {bytes, flops, kernels}."""

    def __enter__(self) -> ForwardCost:
        from torch.utils.flop_counter import FlopCounterMode

        self.extra = {"bytes": 0, "flops": 0, "kernels": 0}  # the steps of recurrences not run (see the module)
        self._flops = FlopCounterMode(display=False)
        self._counter = _counter_class()()
        self._stepping = _stepping_class()(self)
        self._flops.__enter__()
        self._counter.__enter__()
        self._stepping.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._stepping.__exit__(*exc)
        self._counter.__exit__(*exc)
        self._flops.__exit__(*exc)

    def counted(self) -> dict[str, int]:
        """What the counters hold so far."""
        return {"bytes": self._counter.bytes, "flops": self._flops.get_total_flops(), "kernels": self._counter.kernels}

    @property
    def cost(self) -> dict[str, int]:
        return {k: v + self.extra[k] for k, v in self.counted().items()}
