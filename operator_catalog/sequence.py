"""Sequence models: recurrent layers and attention over a rank-3 input read as (batch, sequence, features).

The sequence is dim 1 (the channels of a KernelBench (B, C, L) input), so recurrences stay short enough to
unroll on the meta device; outputs keep the batch-first layout.
"""

from __future__ import annotations

from opsynth.operator_catalog.entry import Hoisted, NotApplicable, OpCall, OpEntry, Operand, SampleContext, X

FAMILY = "sequence"


# Steps of a recurrence: the meta device unrolls it step by step (a few ms each, in composition and again in the
# shape check), so longer sequences would dominate the CPU stages' time.
MAX_RECURRENT_STEPS = 32


def _recurrent(name: str):
    def sample(ctx: SampleContext) -> OpCall:
        if ctx.x.shape[1] > MAX_RECURRENT_STEPS:
            raise NotApplicable(f"{name}: {ctx.x.shape[1]} steps; at most {MAX_RECURRENT_STEPS} are sampled")
        features = ctx.x.shape[-1]
        hidden = ctx.choice(ctx.workload.features)
        kwargs: tuple = (("num_layers", ctx.choice((1, 2))), ("batch_first", True))
        if ctx.rng.random() < 0.3:
            kwargs += (("bidirectional", True),)
        return OpCall(
            name=name,
            style="module",
            target=name,
            init_args=(Hoisted("input_size", features), Hoisted("hidden_size", hidden)),
            init_kwargs=kwargs,
            output_index=0,  # the sequence of hidden states; [1] is the final state
        )

    return sample


def _scores_fit(ctx: SampleContext, batch: int, heads: int, seq: int, name: str) -> None:
    """Attention holds a (batch, heads, seq, seq) score matrix that its output does not show; keep it within
    the workload's element budget like every output."""
    if batch * heads * seq * seq > ctx.workload.max_elements:
        raise NotApplicable(f"{name}: a {seq}-long sequence makes {batch * heads * seq * seq:,} attention scores")


def _heads(ctx: SampleContext, embed: int) -> int:
    heads = [h for h in (1, 2, 4, 8, 16) if embed % h == 0 and embed // h >= 8]
    if not heads:
        raise NotApplicable(f"no head count divides an embedding of {embed} into heads of >= 8")
    return ctx.choice(heads)


def _multihead_attention(ctx: SampleContext) -> OpCall:
    batch, seq, embed = ctx.x.shape
    heads = _heads(ctx, embed)
    _scores_fit(ctx, batch, heads, seq, "nn.MultiheadAttention")
    return OpCall(
        name="nn.MultiheadAttention",
        style="module",
        target="nn.MultiheadAttention",
        init_args=(Hoisted("embed_dim", embed), Hoisted("num_heads", heads)),
        init_kwargs=(("batch_first", True),),
        args=(X(), X(), X()),
        kwargs=(("need_weights", False),),
        output_index=0,
    )


def _sdpa(ctx: SampleContext) -> OpCall:
    *lead, seq, _ = ctx.x.shape
    _scores_fit(ctx, lead[0], lead[1] if len(lead) > 1 else 1, seq, "F.scaled_dot_product_attention")
    return OpCall(
        name="F.scaled_dot_product_attention",
        style="function",
        target="F.scaled_dot_product_attention",
        args=(X(), Operand("input", ctx.x.shape, "key"), Operand("input", ctx.x.shape, "value")),
        kwargs=(("is_causal", ctx.rng.random() < 0.5),),
    )


def _mha_forward(ctx: SampleContext) -> OpCall:
    # The functional core of nn.MultiheadAttention on a (sequence, batch, embed) reading of x.
    seq, batch, embed = ctx.x.shape
    heads = _heads(ctx, embed)
    _scores_fit(ctx, batch, heads, seq, "F.multi_head_attention_forward")
    return OpCall(
        name="F.multi_head_attention_forward",
        style="function",
        target="F.multi_head_attention_forward",
        args=(
            X(),
            X(),
            X(),
            embed,
            heads,
            Operand("parameter", (3 * embed, embed), "in_proj_weight"),
            Operand("parameter", (3 * embed,), "in_proj_bias"),
            None,
            None,
            False,
            0.0,
            Operand("parameter", (embed, embed), "out_proj_weight"),
            Operand("parameter", (embed,), "out_proj_bias"),
        ),
        kwargs=(("training", False), ("need_weights", False)),
        output_index=0,
    )


def _recurrent_output_shape(call: OpCall, x) -> tuple[int, ...]:
    """The sequence of hidden states of a batch-first recurrence (what `_recurrent` samples): composing a chain
    needs only this, and meta would unroll the recurrence step by step to find it (about a second for a
    two-layer bidirectional LSTM, most of a composition's time). The shape check still runs it whole."""
    hidden = next(a.value for a in call.init_args if isinstance(a, Hoisted) and a.name == "hidden_size")
    directions = 2 if dict(call.init_kwargs).get("bidirectional") else 1
    batch, steps, _ = x.shape
    return (batch, steps, hidden * directions)


ENTRIES = [
    *(
        OpEntry(name=name, family=FAMILY, sampler=_recurrent(name), ranks=(3,), output_shape=_recurrent_output_shape)
        for name in ("nn.LSTM", "nn.GRU", "nn.RNN")
    ),
    OpEntry(name="nn.MultiheadAttention", family=FAMILY, sampler=_multihead_attention, ranks=(3,)),
    OpEntry(name="F.scaled_dot_product_attention", family=FAMILY, sampler=_sdpa, ranks=(3, 4)),
    OpEntry(name="F.multi_head_attention_forward", family=FAMILY, sampler=_mha_forward, ranks=(3,)),
]
