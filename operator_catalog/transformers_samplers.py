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


def dpt_fusion_layer(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    channels = rng.choice(wl.channels)
    config = f"transformers.DPTConfig(fusion_hidden_size={channels})"
    return ModuleUse((config,), (small_image_shape(rng, wl, channels),) * 2)


def pyramid_pooling(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    scale, c_in, c_out = rng.choice((1, 2, 3, 6)), rng.choice(wl.channels), rng.choice(wl.channels)
    shape = small_image_shape(rng, wl, c_in)
    return ModuleUse((str(scale), str(c_in), str(c_out)), (shape,), extra_args=(repr(tuple(shape[2:])),))


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


def glpn_selective_fusion(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    channels = rng.choice(wl.channels)
    shape = small_image_shape(rng, wl, channels)
    return ModuleUse((str(channels),), (shape, shape))


def levit_patches(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    hidden = rng.choice(wl.channels) * 8
    config = f"transformers.LevitConfig(hidden_sizes=[{hidden}, {hidden}, {hidden}])"
    return ModuleUse((config,), (small_image_shape(rng, wl, 3, 16),))


def mask2former_predictor(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    hidden, masks = rng.choice(wl.features), rng.choice(wl.channels)
    queries = rng.choice((16, 32, 64))
    pixels = small_image_shape(rng, wl, masks, 2)
    batch = pixels[0]
    target = (pixels[2] // 2, pixels[3] // 2)
    args = (str(hidden), str(head_count(rng, hidden)), str(masks))
    return ModuleUse(args, ((queries, batch, hidden), pixels), extra_args=(repr(target),))


def maskformer_fpn(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    widths = [32 * rng.choice((1, 2)) for _ in range(3)]  # its norms are GroupNorm(32, width)
    feature = 32 * rng.choice((1, 2))
    batch, side = rng.choice(wl.batch_sizes), rng.choice(wl.spatial[4]) // 4 * 4
    shapes = tuple(
        within_input_budget((batch, w, side >> i, side >> i), wl, fixed=(1, 2, 3)) for i, w in enumerate(widths)
    )
    batch = min(s[0] for s in shapes)
    shapes = tuple((batch, *s[1:]) for s in shapes)
    args = (str(widths[-1]), repr(widths[:-1]), str(feature))
    return ModuleUse(args, shapes, as_list=True)


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


def vitmatte_fusion(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    c_feat, c_detail, c_out = rng.choice(wl.channels), rng.choice((3, *wl.channels)), rng.choice(wl.channels)
    feat = small_image_shape(rng, wl, c_feat)
    detail = within_input_budget((feat[0], c_detail, 2 * feat[2], 2 * feat[3]), wl, fixed=(0, 1, 2, 3))
    args = ("transformers.VitMatteConfig()", str(c_feat + c_detail), str(c_out))
    return ModuleUse(args, (feat, detail))


def zoedepth_log_binomial(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    c_main, c_cond = rng.choice(wl.channels), rng.choice(wl.channels)
    main = small_image_shape(rng, wl, c_main)
    # Few bins: with many, the per-bin probabilities of two inputs differ by less than the checker's tolerance.
    args = ("transformers.ZoeDepthConfig()", str(c_main), str(c_cond), str(rng.choice((4, 8))))
    return ModuleUse(args, (main, (main[0], c_cond, *main[2:])))


def dpt_like_pyramid(config: str, count: int, hidden_key: str, reverse: bool = False):
    """Feature-fusion stages and depth heads: `count` maps of one width, each twice the size of the next."""

    def sample(ctx: SampleContext) -> ModuleUse:
        rng, wl = ctx.rng, ctx.workload
        channels = rng.choice(wl.channels)
        batch, side = rng.choice(wl.batch_sizes), max(2**count, rng.choice(wl.spatial[4]) // 2**count * 2**count)
        sizes = [side >> i for i in range(count)]
        if reverse:
            sizes.reverse()
        shapes = tuple(within_input_budget((batch, channels, s, s), wl, fixed=(1, 2, 3)) for s in sizes)
        batch = min(s[0] for s in shapes)
        shapes = tuple((batch, *s[1:]) for s in shapes)
        return ModuleUse((f"transformers.{config}({hidden_key}={channels})",), shapes, as_list=True)

    return sample


def depth_anything_neck(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    # Four token maps of a ViT backbone (with the class token) reassembled into a pyramid and fused.
    hidden, fusion = rng.choice(wl.features), rng.choice(wl.channels)
    patches = rng.choice((4, 8, 16))
    widths = sorted(rng.choice(wl.channels) for _ in range(4))
    config = (
        f"transformers.DepthAnythingConfig(fusion_hidden_size={fusion}, neck_hidden_sizes={widths}, "
        f"reassemble_hidden_size={hidden})"
    )
    shape = token_shape(rng, wl, hidden, patches * patches + 1)
    return ModuleUse((config,), (shape,) * 4, as_list=True, extra_args=(str(patches), str(patches)))
