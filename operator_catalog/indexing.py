"""Indexing, sorting and lookup: gathers, scatters, masks, splits, sorts, histograms and embedding tables.

Indices are never random draws at run time: they are literal index lists written into the code, or computed
from the flowing tensor (`x.argsort(dim=1)`), so every task stays deterministic; a scatter writes through a
permutation, never twice to one place.
"""

from __future__ import annotations

from opsynth.operator_catalog.entry import (
    Expr,
    Hoisted,
    NotApplicable,
    OpCall,
    OpEntry,
    Operand,
    SampleContext,
    X,
    excluded_entry,
)

FAMILY = "indexing"
RANKS = (2, 3, 4, 5)
DATA_DEPENDENT = "its output length depends on the values of its input, so the task has no fixed output shape"


def _indices(ctx: SampleContext, size: int, unique: bool) -> list[int]:
    k = ctx.rng.randint(1, min(size, 16))
    if unique:
        return sorted(ctx.rng.sample(range(size), k))
    return [ctx.rng.randrange(size) for _ in range(k)]


def _index_select(ctx: SampleContext) -> OpCall:
    dim = ctx.non_batch_dim()
    index = _indices(ctx, ctx.x.shape[dim], unique=False)
    return OpCall(
        name="torch.index_select",
        style="function",
        target="torch.index_select",
        args=(X(), dim, Expr(f"{{x}}.new_tensor({index}, dtype=torch.long)")),
    )


def _index_copy(ctx: SampleContext) -> OpCall:
    # Copies rows of a scaled x into distinct positions of x along dim.
    dim = ctx.non_batch_dim()
    index = _indices(ctx, ctx.x.shape[dim], unique=True)
    source = f"{{x}}.narrow({dim}, 0, {len(index)}) * 2.0"
    return OpCall(
        name="torch.index_copy",
        style="function",
        target="torch.index_copy",
        args=(X(), dim, Expr(f"{{x}}.new_tensor({index}, dtype=torch.long)"), Expr(source)),
    )


def _gather(ctx: SampleContext) -> OpCall:
    dim = ctx.non_batch_dim()
    k = ctx.rng.randint(1, max(1, ctx.x.shape[dim] // 2))
    return OpCall(
        name="torch.gather",
        style="function",
        target="torch.gather",
        args=(X(), dim, Expr(f"{{x}}.argsort(dim={dim}).narrow({dim}, 0, {k})")),
    )


def _scatter(ctx: SampleContext) -> OpCall:
    dim = ctx.non_batch_dim()
    return OpCall(
        name="torch.scatter",
        style="function",
        target="torch.scatter",
        args=(X(), dim, Expr(f"{{x}}.argsort(dim={dim})"), Expr("{x}.exp()")),
    )


def _masked_fill(ctx: SampleContext) -> OpCall:
    t = ctx.choice((-0.5, 0.0, 0.5))
    return OpCall(
        name="torch.masked_fill",
        style="function",
        target="torch.masked_fill",
        args=(X(), Expr(f"{{x}} < {t}"), ctx.choice((0.0, -1.0))),
    )


def _masked_scatter(ctx: SampleContext) -> OpCall:
    return OpCall(
        name="torch.masked_scatter",
        style="function",
        target="torch.masked_scatter",
        args=(X(), Expr("{x} > 0"), Expr("{x}.flip(-1)")),
    )


def _diagonal_scatter(ctx: SampleContext) -> OpCall:
    d1, d2 = ctx.x.rank - 2, ctx.x.rank - 1
    return OpCall(
        name="torch.diagonal_scatter",
        style="function",
        target="torch.diagonal_scatter",
        args=(X(), Expr(f"{{x}}.diagonal(dim1={d1}, dim2={d2}).sigmoid()")),
        kwargs=(("dim1", d1), ("dim2", d2)),
    )


def _diag(ctx: SampleContext) -> OpCall:
    return OpCall(name="torch.diag", style="function", target="torch.diag", kwargs=(("diagonal", ctx.choice((0, 1))),))


def _split(name: str):
    """The first piece of a split along a non-batch dimension (the others are discarded, as in the released set)."""

    def sample(ctx: SampleContext) -> OpCall:
        dims = [d for d in range(1, ctx.x.rank) if ctx.x.shape[d] >= 2]
        if not dims:
            raise NotApplicable(f"{name} needs a dimension of at least 2")
        dim = ctx.choice(dims)
        size = ctx.x.shape[dim]
        if name == "torch.split":
            arg = max(1, size // ctx.choice((2, 4)))
        else:
            first = ctx.rng.randint(1, size - 1)
            arg = [first, size - first]
        return OpCall(name=name, style="function", target=name, args=(X(), arg), kwargs=(("dim", dim),), output_index=0)

    return sample


def _unbind(ctx: SampleContext) -> OpCall:
    dim = ctx.non_batch_dim()
    return OpCall(
        name="torch.unbind",
        style="function",
        target="torch.unbind",
        kwargs=(("dim", dim),),
        output_index=ctx.rng.randrange(min(ctx.x.shape[dim], 4)),
    )


def _sort(name: str):
    def sample(ctx: SampleContext) -> OpCall:
        kwargs = (("dim", ctx.non_batch_dim()), ("descending", ctx.rng.random() < 0.5))
        return OpCall(
            name=name, style="function", target=name, kwargs=kwargs, output_index=0 if name == "torch.sort" else None
        )

    return sample


def _topk(ctx: SampleContext) -> OpCall:
    dim = ctx.non_batch_dim()
    k = ctx.rng.randint(1, max(1, min(ctx.x.shape[dim] // 2, 64)))
    return OpCall(
        name="torch.topk", style="function", target="torch.topk", args=(X(), k), kwargs=(("dim", dim),), output_index=0
    )


def _histc(ctx: SampleContext) -> OpCall:
    edge = ctx.choice((1.0, 2.0, 3.0))
    return OpCall(
        name="torch.histc",
        style="function",
        target="torch.histc",
        kwargs=(("bins", ctx.choice((16, 32, 64, 100))), ("min", -edge), ("max", edge)),
    )


def _one_hot(ctx: SampleContext) -> OpCall:
    classes = ctx.x.shape[-1]
    return OpCall(
        name="F.one_hot",
        style="function",
        target="F.one_hot",
        args=(Expr("{x}.argmax(dim=-1)"),),
        kwargs=(("num_classes", classes),),
    )


def _embedding(name: str):
    """A table lookup whose indices are the arg-max class of x's last dimension."""

    def sample(ctx: SampleContext) -> OpCall:
        rows, dim = ctx.x.shape[-1], ctx.choice(ctx.workload.features)
        index = Expr("{x}.argmax(dim=-1)")
        if name == "F.embedding":
            return OpCall(name=name, style="function", target=name, args=(index, Operand("parameter", (rows, dim))))
        return OpCall(
            name=name,
            style="module",
            target=name,
            init_args=(Hoisted("num_embeddings", rows), Hoisted("embedding_dim", dim)),
            args=(index,),
        )

    return sample


def _embedding_bag(name: str):
    """Bags of indices: x (B, ..., F) -> the arg-max class along dim 1 of a rank-3 view, one bag per sample."""

    def sample(ctx: SampleContext) -> OpCall:
        rows, dim = ctx.x.shape[-1], ctx.choice(ctx.workload.features)
        index = Expr("{x}.argmax(dim=-1)")
        mode = ctx.choice(("mean", "sum", "max"))
        if name == "F.embedding_bag":
            return OpCall(
                name=name,
                style="function",
                target=name,
                args=(index, Operand("parameter", (rows, dim))),
                kwargs=(("mode", mode),),
            )
        return OpCall(
            name=name,
            style="module",
            target=name,
            init_args=(Hoisted("num_embeddings", rows), Hoisted("embedding_dim", dim)),
            init_kwargs=(("mode", mode),),
            args=(index,),
        )

    return sample


ENTRIES = [
    OpEntry(name="torch.index_select", family=FAMILY, sampler=_index_select, ranks=RANKS),
    OpEntry(name="torch.index_copy", family=FAMILY, sampler=_index_copy, ranks=RANKS),
    OpEntry(name="torch.gather", family=FAMILY, sampler=_gather, ranks=RANKS),
    OpEntry(name="torch.scatter", family=FAMILY, sampler=_scatter, ranks=RANKS),
    OpEntry(name="torch.masked_fill", family=FAMILY, sampler=_masked_fill, ranks=RANKS),
    OpEntry(name="torch.masked_scatter", family=FAMILY, sampler=_masked_scatter, ranks=RANKS),
    OpEntry(name="torch.diagonal_scatter", family=FAMILY, sampler=_diagonal_scatter, ranks=RANKS),
    OpEntry(name="torch.diag", family=FAMILY, sampler=_diag, ranks=(2,)),
    *(
        OpEntry(name=n, family=FAMILY, sampler=_split(n), ranks=RANKS)
        for n in ("torch.split", "torch.split_with_sizes", "torch.split_with_sizes_copy")
    ),
    OpEntry(name="torch.unbind", family=FAMILY, sampler=_unbind, ranks=(3, 4, 5)),
    OpEntry(name="torch.sort", family=FAMILY, sampler=_sort("torch.sort"), ranks=RANKS),
    OpEntry(name="torch.argsort", family=FAMILY, sampler=_sort("torch.argsort"), ranks=RANKS),
    OpEntry(name="torch.topk", family=FAMILY, sampler=_topk, ranks=RANKS),
    OpEntry(name="torch.histc", family=FAMILY, sampler=_histc, ranks=RANKS),
    OpEntry(name="F.one_hot", family=FAMILY, sampler=_one_hot, ranks=RANKS),
    OpEntry(name="F.embedding", family=FAMILY, sampler=_embedding("F.embedding"), ranks=(2, 3, 4)),
    OpEntry(name="nn.Embedding", family=FAMILY, sampler=_embedding("nn.Embedding"), ranks=(2, 3, 4)),
    OpEntry(name="F.embedding_bag", family=FAMILY, sampler=_embedding_bag("F.embedding_bag"), ranks=(3,)),
    OpEntry(name="nn.EmbeddingBag", family=FAMILY, sampler=_embedding_bag("nn.EmbeddingBag"), ranks=(3,)),
    excluded_entry("torch.masked_select", FAMILY, DATA_DEPENDENT),
    excluded_entry("torch.nonzero", FAMILY, DATA_DEPENDENT),
]
