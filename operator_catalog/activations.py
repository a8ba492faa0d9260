"""Activation functions: elementwise nonlinearities, the softmax family, and the layers that are the identity
at inference (dropout, `nn.Identity`).

Each row of the tables below is one operator; module forms are built without arguments unless a sampler says
otherwise, function forms are called on the flowing tensor.
"""

from __future__ import annotations

from opsynth.operator_catalog.entry import NotApplicable, OpCall, OpEntry, SampleContext, keyword_call

FAMILY = "activations"
ANY_RANK = (2, 3, 4, 5)


def plain_call(name: str, style: str):
    """A sampler of one call without arguments of its own (`torch.relu(x)`, `nn.Identity()`)."""

    def sample(ctx: SampleContext) -> OpCall:
        return OpCall(name=name, style=style, target=name)

    return sample


def _with_kwargs(name: str, style: str, choices: dict[str, tuple]):
    """A call whose keyword hyperparameters are drawn from fixed choices."""

    def sample(ctx: SampleContext) -> OpCall:
        kw = tuple((k, ctx.choice(v)) for k, v in choices.items())
        return keyword_call(name, style, kw)

    return sample


def _softmax_like(name: str, style: str):
    """Softmax-style ops normalise along one dimension, chosen among the non-batch ones."""

    def sample(ctx: SampleContext) -> OpCall:
        dim = ctx.non_batch_dim()
        return keyword_call(name, style, (("dim", dim),))

    return sample


def _prelu(ctx: SampleContext) -> OpCall:
    # One slope per channel (dim 1), as convolutional nets use it.
    return OpCall(name="nn.PReLU", style="module", target="nn.PReLU", init_kwargs=(("num_parameters", ctx.x.shape[1]),))


def _glu(name: str, style: str):
    def sample(ctx: SampleContext) -> OpCall:
        dims = [d for d in range(1, ctx.x.rank) if ctx.x.shape[d] % 2 == 0]
        if not dims:
            raise NotApplicable("GLU needs an even dimension")
        dim = ctx.choice(dims)
        return keyword_call(name, style, (("dim", dim),))

    return sample


# Parameter-free activations: (name, style).
PLAIN = [
    ("nn.ReLU", "module"),
    ("nn.Sigmoid", "module"),
    ("nn.Tanh", "module"),
    ("nn.GELU", "module"),
    ("nn.SiLU", "module"),
    ("nn.Mish", "module"),
    ("nn.Hardswish", "module"),
    ("nn.ReLU6", "module"),
    ("nn.Softsign", "module"),
    ("torch.relu", "function"),
    ("torch.sigmoid", "function"),
    ("torch.tanh", "function"),
    ("torch.selu", "function"),
    ("F.gelu", "function"),
    ("F.silu", "function"),
    ("F.mish", "function"),
    ("F.hardswish", "function"),
    ("F.hardsigmoid", "function"),
    ("F.relu", "function"),
    ("F.relu6", "function"),
    ("F.sigmoid", "function"),
]

# Activations with hyperparameters: (name, style, {keyword: choices}).
PARAMETRISED = [
    ("nn.LeakyReLU", "module", {"negative_slope": (0.01, 0.1, 0.2)}),
    ("nn.ELU", "module", {"alpha": (0.5, 1.0)}),
    ("nn.CELU", "module", {"alpha": (0.5, 1.0, 2.0)}),
    ("nn.Softplus", "module", {"beta": (1.0, 2.0), "threshold": (20.0,)}),
    ("nn.Hardtanh", "module", {"min_val": (-1.0, -0.5), "max_val": (0.5, 1.0)}),
    ("nn.Softshrink", "module", {"lambd": (0.1, 0.5)}),
    ("F.leaky_relu", "function", {"negative_slope": (0.01, 0.1, 0.2)}),
    ("F.elu", "function", {"alpha": (0.5, 1.0)}),
    ("F.softplus", "function", {"beta": (1.0, 2.0)}),
    ("F.hardtanh", "function", {"min_val": (-1.0, -0.5), "max_val": (0.5, 1.0)}),
]

SOFTMAX = [
    ("nn.Softmax", "module"),
    ("nn.LogSoftmax", "module"),
    ("nn.Softmin", "module"),
    ("F.softmax", "function"),
    ("F.log_softmax", "function"),
    ("F.softmin", "function"),
    ("torch.softmax", "function"),
    ("torch.log_softmax", "function"),
]


def _rrelu(ctx: SampleContext) -> OpCall:
    # Outside training RReLU is deterministic: a leaky ReLU with the mean of its slope range.
    return OpCall(
        name="F.rrelu",
        style="function",
        target="F.rrelu",
        kwargs=(("lower", 0.125), ("upper", ctx.choice((0.25, 1 / 3))), ("training", False)),
    )


def _threshold(ctx: SampleContext) -> OpCall:
    return OpCall(
        name="nn.Threshold",
        style="module",
        target="nn.Threshold",
        init_args=(ctx.choice((-0.5, 0.0, 0.1)), ctx.choice((0.0, -1.0))),
    )


def _dropout(name: str, style: str):
    """Dropout as an inference task runs it: identity in eval mode (modules), `training=False` (functions)."""

    def sample(ctx: SampleContext) -> OpCall:
        p = ctx.choice((0.1, 0.2, 0.5))
        if style == "module":
            return OpCall(name=name, style="module", target=name, init_kwargs=(("p", p),))
        return OpCall(name=name, style="function", target=name, kwargs=(("p", p), ("training", False)))

    return sample


ENTRIES = (
    [OpEntry(name=n, family=FAMILY, sampler=plain_call(n, s), ranks=ANY_RANK) for n, s in PLAIN]
    + [OpEntry(name=n, family=FAMILY, sampler=_with_kwargs(n, s, c), ranks=ANY_RANK) for n, s, c in PARAMETRISED]
    + [OpEntry(name=n, family=FAMILY, sampler=_softmax_like(n, s), ranks=ANY_RANK) for n, s in SOFTMAX]
    + [
        OpEntry(name="nn.PReLU", family=FAMILY, sampler=_prelu, ranks=ANY_RANK),
        OpEntry(name="nn.GLU", family=FAMILY, sampler=_glu("nn.GLU", "module"), ranks=ANY_RANK),
        OpEntry(name="F.rrelu", family=FAMILY, sampler=_rrelu, ranks=ANY_RANK),
        OpEntry(name="nn.Threshold", family=FAMILY, sampler=_threshold, ranks=ANY_RANK),
        OpEntry(name="nn.Identity", family=FAMILY, sampler=plain_call("nn.Identity", "module"), ranks=ANY_RANK),
        OpEntry(name="nn.Dropout", family=FAMILY, sampler=_dropout("nn.Dropout", "module"), ranks=ANY_RANK),
        OpEntry(name="F.dropout", family=FAMILY, sampler=_dropout("F.dropout", "function"), ranks=ANY_RANK),
        OpEntry(name="nn.Dropout2d", family=FAMILY, sampler=_dropout("nn.Dropout2d", "module"), ranks=(4,)),
        OpEntry(name="F.dropout2d", family=FAMILY, sampler=_dropout("F.dropout2d", "function"), ranks=(4,)),
    ]
)
