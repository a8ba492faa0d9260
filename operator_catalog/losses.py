"""Losses and distances: the flowing tensor is the prediction, the target an extra forward input (or derived
from the prediction where a loss wants class indices).

Losses keep per-element or per-sample values (`reduction='none'`) so that a chain can go on after them;
`torch.dist` reduces to a scalar and therefore only ends a chain.
"""

from __future__ import annotations

from opsynth.operator_catalog.entry import (
    Expr,
    Hoisted,
    OpCall,
    OpEntry,
    Operand,
    SampleContext,
    X,
    excluded_entry,
    float32_only,
    styled_call,
)

FAMILY = "losses"
RANKS = (2, 3, 4, 5)
NONE = (("reduction", "none"),)


def _target(ctx: SampleContext, init: str = "randn") -> Operand:
    return Operand("input", ctx.x.shape, "target", init)


def _pointwise(name: str, style: str, init: str = "randn", extra: tuple = ()):
    """Losses of two same-shaped tensors; `init` fills the target (`rand`: probabilities for BCE)."""

    def sample(ctx: SampleContext) -> OpCall:
        return styled_call(name, style, (X(), _target(ctx, init)), keywords=NONE + extra)

    return sample


def _bce_aten(ctx: SampleContext) -> OpCall:
    # The aten op takes the reduction as an enum value: 0 is none.
    return OpCall(
        name="torch.binary_cross_entropy_with_logits",
        style="function",
        target="torch.binary_cross_entropy_with_logits",
        args=(X(), _target(ctx, "rand"), None, None, 0),
    )


def _class_index_loss(name: str, style: str):
    """NLL over dim 1 with class indices taken from the prediction itself (its arg-min class)."""

    def sample(ctx: SampleContext) -> OpCall:
        return styled_call(name, style, (X(), Expr("{x}.argmin(dim=1)")), keywords=NONE)

    return sample


def _triplet(ctx: SampleContext) -> OpCall:
    return OpCall(
        name="nn.TripletMarginLoss",
        style="module",
        target="nn.TripletMarginLoss",
        init_kwargs=(("margin", ctx.choice((0.5, 1.0))), *NONE),
        args=(X(), Operand("input", ctx.x.shape, "positive"), Operand("input", ctx.x.shape, "negative")),
    )


def _multilabel_margin(name: str, style: str):
    """The labels are the lower half of the classes, each listed twice (argsort // 2), with no -1 terminator:
    torch 2.13's inductor disagrees with eager on label lists that end early, so the compile check would reject
    every such task."""

    def sample(ctx: SampleContext) -> OpCall:
        return styled_call(name, style, (X(), Expr("{x}.argsort(dim=1) // 2")), keywords=NONE)

    return sample


def _adaptive_log_softmax(ctx: SampleContext) -> OpCall:
    features = ctx.x.shape[1]
    classes = max(features, 8) * ctx.choice((1, 2))
    cutoffs = [classes // 4, classes // 2]
    return OpCall(
        name="nn.AdaptiveLogSoftmaxWithLoss",
        style="module",
        target="nn.AdaptiveLogSoftmaxWithLoss",
        init_args=(Hoisted("in_features", features), Hoisted("n_classes", classes), cutoffs),
        init_kwargs=(("div_value", 2.0),),
        args=(X(), Expr("{x}.argmax(dim=1)")),
        output_index=0,  # the target log-probabilities; [1] is their mean loss
    )


def _cosine_similarity(ctx: SampleContext) -> OpCall:
    return OpCall(
        name="F.cosine_similarity",
        style="function",
        target="F.cosine_similarity",
        args=(X(), Operand("input", ctx.x.shape, "y")),
        kwargs=(("dim", ctx.non_batch_dim()),),
    )


def _dist(ctx: SampleContext) -> OpCall:
    return OpCall(
        name="torch.dist",
        style="function",
        target="torch.dist",
        args=(X(), Operand("input", ctx.x.shape, "y")),
        # The largest difference: p-norms of many values concentrate, so that two draws would agree within 1 %.
        kwargs=(("p", Expr("float('inf')")),),
    )


def _pdist(name: str):
    def sample(ctx: SampleContext) -> OpCall:
        return OpCall(name=name, style="function", target=name, kwargs=(("p", ctx.choice((1.0, 2.0))),))

    return sample


CTC = "needs integer label sequences with per-sample lengths, and has no meta kernel to check its shapes with"

_ENTRIES = [
    OpEntry(name="nn.MSELoss", family=FAMILY, sampler=_pointwise("nn.MSELoss", "module"), ranks=RANKS),
    OpEntry(name="F.mse_loss", family=FAMILY, sampler=_pointwise("F.mse_loss", "function"), ranks=RANKS),
    OpEntry(name="nn.L1Loss", family=FAMILY, sampler=_pointwise("nn.L1Loss", "module"), ranks=RANKS),
    OpEntry(name="F.l1_loss", family=FAMILY, sampler=_pointwise("F.l1_loss", "function"), ranks=RANKS),
    OpEntry(
        name="F.smooth_l1_loss",
        family=FAMILY,
        sampler=_pointwise("F.smooth_l1_loss", "function", extra=(("beta", 1.0),)),
        ranks=RANKS,
    ),
    OpEntry(
        name="nn.KLDivLoss",
        family=FAMILY,
        sampler=_pointwise("nn.KLDivLoss", "module", extra=(("log_target", True),)),
        ranks=RANKS,
    ),
    OpEntry(
        name="F.kl_div",
        family=FAMILY,
        sampler=_pointwise("F.kl_div", "function", extra=(("log_target", True),)),
        ranks=RANKS,
    ),
    OpEntry(
        name="nn.BCEWithLogitsLoss",
        family=FAMILY,
        sampler=_pointwise("nn.BCEWithLogitsLoss", "module", "rand"),
        ranks=RANKS,
    ),
    OpEntry(
        name="F.binary_cross_entropy_with_logits",
        family=FAMILY,
        sampler=_pointwise("F.binary_cross_entropy_with_logits", "function", "rand"),
        ranks=RANKS,
    ),
    OpEntry(name="torch.binary_cross_entropy_with_logits", family=FAMILY, sampler=_bce_aten, ranks=RANKS),
    # Class-probability targets over dim 1.
    OpEntry(
        name="nn.CrossEntropyLoss",
        family=FAMILY,
        sampler=_pointwise("nn.CrossEntropyLoss", "module", "rand"),
        ranks=RANKS,
    ),
    OpEntry(
        name="F.cross_entropy",
        family=FAMILY,
        sampler=_pointwise("F.cross_entropy", "function", "rand"),
        ranks=RANKS,
    ),
    OpEntry(
        name="F.multilabel_soft_margin_loss",
        family=FAMILY,
        sampler=_pointwise("F.multilabel_soft_margin_loss", "function", "rand"),
        ranks=(2,),
    ),
    OpEntry(name="nn.NLLLoss", family=FAMILY, sampler=_class_index_loss("nn.NLLLoss", "module"), ranks=RANKS),
    OpEntry(name="nn.NLLLoss2d", family=FAMILY, sampler=_class_index_loss("nn.NLLLoss2d", "module"), ranks=(4,)),
    OpEntry(name="nn.TripletMarginLoss", family=FAMILY, sampler=_triplet, ranks=(2,)),
    OpEntry(
        name="nn.MultiLabelMarginLoss",
        family=FAMILY,
        sampler=_multilabel_margin("nn.MultiLabelMarginLoss", "module"),
        ranks=(2,),
    ),
    OpEntry(
        name="F.multilabel_margin_loss",
        family=FAMILY,
        sampler=_multilabel_margin("F.multilabel_margin_loss", "function"),
        ranks=(2,),
    ),
    OpEntry(
        name="nn.AdaptiveLogSoftmaxWithLoss",
        family=FAMILY,
        sampler=_adaptive_log_softmax,
        ranks=(2,),
        # It routes rows to clusters with `nonzero` and checks the routing with `.item()`: one value per row.
        output_shape=lambda call, x: (x.shape[0],),
    ),
    OpEntry(name="F.cosine_similarity", family=FAMILY, sampler=_cosine_similarity, ranks=RANKS),
    OpEntry(name="torch.dist", family=FAMILY, sampler=_dist, ranks=RANKS, terminal=True),
    OpEntry(name="F.pdist", family=FAMILY, sampler=_pdist("F.pdist"), ranks=(2,)),
    OpEntry(name="torch.pdist", family=FAMILY, sampler=_pdist("torch.pdist"), ranks=(2,)),
    excluded_entry("F.ctc_loss", FAMILY, CTC),
    excluded_entry("nn.CTCLoss", FAMILY, CTC),
]
# multilabel_margin_loss and pdist have no bfloat16 or float16 kernel on the CPU.
ENTRIES = float32_only(_ENTRIES, {"nn.MultiLabelMarginLoss", "F.multilabel_margin_loss", "F.pdist", "torch.pdist"})
