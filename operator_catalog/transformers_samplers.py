"""How each transformers module of the catalog is sized for a workload: one sampler per entry of
transformers_modules, given the `SampleContext` every entry's sampler gets (its `x` None: a module stands alone),
returning the constructor arguments and input shapes of one use (a `ModuleUse`).
"""

from __future__ import annotations

from opsynth.operator_catalog.entry import SampleContext, within_input_budget
from opsynth.operator_catalog.transformers_inputs import (
    grid_shape,
    head_count,
    image_shape,
    sequence_shape,
    small_image_shape,
    token_shape,
)
from opsynth.operator_catalog.transformers_render import ModuleUse


def resnet_basic(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    c_in, c_out = rng.choice(wl.channels), rng.choice(wl.channels)
    stride = rng.choice((1, 2))
    return ModuleUse(
        (str(c_in), str(c_out), str(stride), repr(rng.choice(("relu", "gelu")))), (image_shape(rng, wl, c_in),)
    )


def resnet_bottleneck(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    c_in, c_out = rng.choice(wl.channels), 4 * rng.choice(wl.channels)
    return ModuleUse((str(c_in), str(c_out), str(rng.choice((1, 2)))), (image_shape(rng, wl, c_in),))


def resnet_shortcut(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    c_in, c_out = rng.choice(wl.channels), rng.choice(wl.channels)
    return ModuleUse((str(c_in), str(c_out), str(rng.choice((1, 2)))), (image_shape(rng, wl, c_in),))


def convnext_layer(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    dim = rng.choice(wl.channels)
    config = "transformers.ConvNextConfig(hidden_act='gelu', layer_scale_init_value=1e-06)"
    return ModuleUse((config, str(dim)), (image_shape(rng, wl, dim),))


def poolformer_layer(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    channels = rng.choice(wl.channels)
    config = "transformers.PoolFormerConfig(hidden_act='gelu', use_layer_scale=True, layer_scale_init_value=1e-05)"
    args = (config, str(channels), "3", str(channels), str(4 * channels), "0.0")
    return ModuleUse(args, (image_shape(rng, wl, channels),))


def glpn_patches(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    c_in, hidden = rng.choice((3, *wl.channels)), rng.choice(wl.channels)
    return ModuleUse(("7", "4", str(c_in), str(hidden)), (image_shape(rng, wl, c_in),))


def mpnet_head(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    hidden, vocab = rng.choice(wl.features), rng.choice(wl.features)
    config = f"transformers.MPNetConfig(hidden_size={hidden}, vocab_size={vocab})"
    return ModuleUse((config,), (sequence_shape(rng, wl, hidden),))


def mobilebert_head(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    hidden, vocab = rng.choice(wl.features), rng.choice(wl.features)
    # A smaller embedding than hidden size, as MobileBERT's defaults (128 of 512): the head then also runs its
    # extra projection, which is empty when the two are equal.
    config = f"transformers.MobileBertConfig(hidden_size={hidden}, embedding_size={hidden // 4}, vocab_size={vocab})"
    return ModuleUse((config,), (sequence_shape(rng, wl, hidden),))


def tdnn_layer(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    hidden = rng.choice(wl.features)
    config = f"transformers.Wav2Vec2Config(tdnn_dim=({hidden}, {hidden}), tdnn_kernel=(5, 3), tdnn_dilation=(1, 2))"
    return ModuleUse((config, "1"), (sequence_shape(rng, wl, hidden),))


def hiera_attention(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    hidden = rng.choice(wl.features)
    return ModuleUse((str(hidden), str(hidden), str(head_count(rng, hidden))), (token_shape(rng, wl, hidden),))


def hiera_layer(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    hidden = rng.choice(wl.features)
    args = ("transformers.HieraConfig()", str(hidden), str(hidden), str(head_count(rng, hidden)))
    return ModuleUse(args, (token_shape(rng, wl, hidden),))


def hiera_stage(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    hidden = rng.choice(wl.features)
    args = ("transformers.HieraConfig()", "2", str(hidden), str(hidden), str(head_count(rng, hidden)))
    args += ("[0.0, 0.0]", "[1, 1]", "0", "False")
    return ModuleUse(args, (token_shape(rng, wl, hidden),))


def swin_window_attention(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    dim, window = rng.choice(wl.features), rng.choice((4, 7))
    args = ("transformers.MaskFormerSwinConfig()", str(dim), str(head_count(rng, dim)), str(window))
    return ModuleUse(args, (token_shape(rng, wl, dim, window * window),))


def ctrl_attention(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    hidden = rng.choice(wl.features)
    shape = token_shape(rng, wl, hidden)
    return ModuleUse((f"transformers.CTRLConfig(n_embd={hidden}, n_head={head_count(rng, hidden)})",), (shape,) * 3)


def seggpt_decoder(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    hidden, decoder = rng.choice(wl.features), rng.choice(wl.channels)
    config = (
        f"transformers.SegGptConfig(hidden_size={hidden}, num_attention_heads={head_count(rng, hidden)}, "
        f"intermediate_hidden_state_indices=[5, 11], patch_size=4, decoder_hidden_size={decoder})"
    )
    return ModuleUse((config,), (grid_shape(rng, wl, 2 * hidden),))


def speecht5_features(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    dim = rng.choice(wl.channels) * 4
    config = (
        f"transformers.SpeechT5Config(conv_dim=({dim}, {dim}, {dim}), conv_stride=(5, 2, 2), "
        "conv_kernel=(10, 3, 3), feat_extract_norm='group')"
    )
    length = rng.choice(wl.spatial[3]) * 16
    return ModuleUse((config,), (within_input_budget((rng.choice(wl.batch_sizes), length), wl, fixed=()),))


def vitdet_attention(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    hidden = rng.choice(wl.features)
    config = f"transformers.VitDetConfig(hidden_size={hidden}, num_attention_heads={head_count(rng, hidden)})"
    return ModuleUse((config,), (grid_shape(rng, wl, hidden),))


def ast_patches(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    hidden, bins, frames = rng.choice(wl.features), rng.choice((32, 64, 128)), rng.choice(wl.spatial[3])
    config = f"transformers.ASTConfig(hidden_size={hidden}, num_mel_bins={bins}, max_length={frames})"
    return ModuleUse((config,), (within_input_budget((rng.choice(wl.batch_sizes), frames, bins), wl, fixed=(1, 2)),))


def blip_text_attention(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    hidden = rng.choice(wl.features)
    config = f"transformers.BlipTextConfig(hidden_size={hidden}, num_attention_heads={head_count(rng, hidden)})"
    return ModuleUse((config,), (token_shape(rng, wl, hidden),))


def bridgetower_mlm_head(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    hidden, vocab = rng.choice(wl.features), rng.choice(wl.features)
    config = (
        f"transformers.BridgeTowerConfig(hidden_size={hidden}, "
        f"text_config={{'hidden_size': {hidden}, 'vocab_size': {vocab}}})"
    )
    return ModuleUse((config,), (token_shape(rng, wl, hidden),))


def bridgetower_residual(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    hidden = 64 * max(1, rng.choice(wl.features) // 128)  # one head per 64 features
    config = f"transformers.BridgeTowerVisionConfig(hidden_size={hidden})"
    return ModuleUse((config,), (token_shape(rng, wl, hidden),))


def bros_bbox(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    proj = rng.choice(wl.channels) * 2
    config = f"transformers.BrosConfig(dim_bbox_projection={proj})"
    boxes = rng.choice((8, 16, 32))
    return ModuleUse((config,), (within_input_budget((rng.choice(wl.batch_sizes), boxes, 8), wl, fixed=(2,)),))


def convnext_stage(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    c_in, c_out = rng.choice(wl.channels), rng.choice(wl.channels)
    args = ("transformers.ConvNextConfig()", str(c_in), str(c_out))
    return ModuleUse(args, (small_image_shape(rng, wl, c_in, 2),))


def encodec_lstm(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    dim = rng.choice(wl.channels) * 4
    length = rng.choice(wl.spatial[3]) // 4
    shape = within_input_budget((rng.choice(wl.batch_sizes), dim, length), wl, fixed=(1,))
    return ModuleUse(("transformers.EncodecConfig(num_lstm_layers=2)", str(dim)), (shape,))


def pretraining_heads(config: str):
    """BERT-style heads: the masked-LM prediction from the sequence, the next-sentence score from the pooled."""

    def sample(ctx: SampleContext) -> ModuleUse:
        rng, wl = ctx.rng, ctx.workload
        hidden, vocab = rng.choice(wl.features), rng.choice(wl.features)
        tokens = token_shape(rng, wl, hidden)
        extra = f", embedding_size={hidden // 4}" if config == "MobileBertConfig" else ""
        text = f"transformers.{config}(hidden_size={hidden}, vocab_size={vocab}{extra})"
        return ModuleUse((text,), (tokens, (tokens[0], hidden)))

    return sample


def flava_codebook_group(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    c_in, c_out = rng.choice(wl.channels), rng.choice(wl.channels)
    return ModuleUse(("2", "2", str(c_in), str(c_out), "True"), (small_image_shape(rng, wl, c_in, 2),))


def levit_patches(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    hidden = rng.choice(wl.channels) * 8
    config = f"transformers.LevitConfig(hidden_sizes=[{hidden}, {hidden}, {hidden}])"
    return ModuleUse((config,), (small_image_shape(rng, wl, 3, 16),))


def nystromformer_attention(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    hidden, landmarks = rng.choice(wl.features), rng.choice((8, 16))
    length = landmarks * rng.choice((4, 8))
    config = (
        f"transformers.NystromformerConfig(hidden_size={hidden}, num_attention_heads={head_count(rng, hidden)}, "
        f"num_landmarks={landmarks}, segment_means_seq_len={length})"
    )
    return ModuleUse((config,), (token_shape(rng, wl, hidden, length),))


def oneformer_text_layer(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    width = rng.choice(wl.features)
    return ModuleUse((str(width), str(head_count(rng, width)), "None"), (token_shape(rng, wl, width),))


def seggpt_attention(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    hidden = rng.choice(wl.features)
    config = (
        f"transformers.SegGptConfig(hidden_size={hidden}, num_attention_heads={head_count(rng, hidden)}, "
        "use_relative_position_embeddings=False)"
    )
    return ModuleUse((config,), (grid_shape(rng, wl, hidden),))


def swin2sr_patches(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    dim = rng.choice(wl.channels) * 2
    config = f"transformers.Swin2SRConfig(embed_dim={dim})"
    return ModuleUse((config,), (small_image_shape(rng, wl, dim),))
