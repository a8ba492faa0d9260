"""What a task computes, as a graph of ATen operators recorded on the meta device, and how alike two such graphs
are, by the weighted Jaccard of their Weisfeiler-Lehman features (docs/decontamination.md, "What a task computes").
Recording runs task code: in a contained worker (the shape check), or on trusted reference code."""

from __future__ import annotations

import functools
import hashlib
from collections import Counter

GRAPH_WL_ROUNDS = 2
MAX_GRAPH_NODES = 20_000  # a forward of more operators (a long recurrence, unrolled) is fingerprinted on these
# Operators that compute nothing of a task's own: views, copies, layouts, allocations, fills (and the draws of
# random values, which `get_inputs` makes on the same device).
PASSTHROUGH = frozenset([
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "new_zeros", "new_ones", "lift_fresh",
    "detach", "alias", "clone", "contiguous", "_to_copy", "copy", "to", "expand", "expand_as", "t", "view",
    "reshape", "_unsafe_view", "unsqueeze", "squeeze", "permute", "transpose", "flatten", "unflatten", "select",
    "slice", "as_strided", "split", "split_with_sizes", "chunk", "unbind", "zeros", "ones", "full", "zeros_like",
    "ones_like", "full_like", "scalar_tensor", "randn", "rand", "randint", "normal", "uniform", "fill", "zero",
    "bernoulli", "arange",
])  # fmt: skip
# ATen spellings of one computation: the label each records, or the chain of labels it stands for.
SAME = {"mm": ("matmul",), "bmm": ("matmul",), "addmm": ("matmul", "add"), "baddbmm": ("matmul", "add"),
        "addmv": ("matmul", "add"), "mv": ("matmul",), "addbmm": ("matmul", "add")}  # fmt: skip


def _label(func, args) -> str:
    """An operator's name without its overload, and its in-place form told as the plain one (`relu_` as `relu`);
    a convolution's with what makes it another operator in a program: its spatial dimensions, transposed,
    grouped (`convolution2d_grouped`: a depthwise convolution is not a dense one)."""
    name = func.__name__.split(".")[0]
    name = name.rstrip("_") if not name.startswith("_") else name
    if name == "convolution" and len(args) >= 9 and hasattr(args[1], "dim"):
        name += f"{args[1].dim() - 2}d" + ("_transposed" if args[6] else "") + ("_grouped" if args[8] != 1 else "")
    return name


@functools.cache
def _trace_class():
    """The dispatch mode that records, made on first use: importing this module must not import torch."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    def tensors(values) -> list:
        return [t for t in tree_flatten(values)[0] if isinstance(t, torch.Tensor)]

    class GraphTrace(TorchDispatchMode):
        """Records `nodes`: (label, indices of the nodes it reads), in the order they run."""

        def __init__(self):
            super().__init__()
            self.nodes: list[tuple[str, tuple[int, ...]]] = []
            self._made: dict[int, int] = {}  # id of a tensor -> the node that made it
            self._alive: list = []  # the tensors of `_made`, kept so that their ids are not reused

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if len(self.nodes) >= MAX_GRAPH_NODES:
                return out
            reads = sorted({self._made[id(t)] for t in tensors((args, kwargs)) if id(t) in self._made})
            label = _label(func, args)
            if func.is_view or label in PASSTHROUGH:
                made = reads[0] if len(reads) == 1 else None  # a view or copy of one node is that node
            else:
                made = None
                for part in SAME.get(label, (label,)):
                    self.nodes.append((part, tuple(reads) if made is None else (made, *reads[1:])))
                    made = len(self.nodes) - 1
            if made is not None:
                for t in tensors(out):
                    self._made[id(t)] = made
                    self._alive.append(t)
            return out

    return GraphTrace


class ComputeGraph:
    """A context manager around a forward (on the meta device); `nodes` is then its graph (see the module)."""

    def __enter__(self) -> ComputeGraph:
        self._trace = _trace_class()()
        self._trace.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._trace.__exit__(*exc)
        self.nodes = self._trace.nodes
        self._trace = None


def _digest(text: str) -> str:
    """A label of round 1 and later: `#` and a hash (an operator's name never starts with `#`)."""
    return "#" + hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def graph_features(nodes: list[tuple[str, tuple[int, ...]]], rounds: int = GRAPH_WL_ROUNDS) -> dict[str, int]:
    """The Weisfeiler-Lehman features of a graph: every node's operator (as itself), then its label with its
    inputs' labels, `rounds` times (hashed), each counted."""
    labels = [label for label, _ in nodes]
    features = Counter(labels)
    for _ in range(rounds):
        labels = [_digest(f"{labels[i]}({','.join(sorted(labels[j] for j in reads))})")
                  for i, (_, reads) in enumerate(nodes)]  # fmt: skip
        features.update(labels)
    return dict(features)


def operators(features: dict[str, int]) -> dict[str, int]:
    """The operators counted in a fingerprint (its features of round 0), by name."""
    return {name: n for name, n in features.items() if not name.startswith("#")}


def graph_similarity(a: dict[str, int], b: dict[str, int], a_total: int | None = None,
                     b_total: int | None = None) -> float:  # fmt: skip
    """The weighted Jaccard of two fingerprints: shared feature counts over all of them. `a_total`, `b_total`:
    their counts' sums, where known (decontamination compares one graph with every reference's)."""
    a_total = sum(a.values()) if a_total is None else a_total
    b_total = sum(b.values()) if b_total is None else b_total
    shared = sum(min(n, b.get(feature, 0)) for feature, n in a.items())
    union = a_total + b_total - shared
    return shared / union if union else 0.0


def shared_operators(a: dict[str, int], b: dict[str, int]) -> list[str]:
    """The operators two fingerprints share, by name."""
    return sorted(set(operators(a)) & set(operators(b)))
