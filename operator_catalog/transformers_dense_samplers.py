"""How the dense-prediction modules of the catalog are sized for a workload: feature pyramids, fusion stages,
necks and depth or mask heads, whose inputs are several maps of one batch (see transformers_samplers for the
rest and for what a sampler returns).
"""

from __future__ import annotations

from opsynth.operator_catalog.entry import SampleContext, within_input_budget
from opsynth.operator_catalog.transformers_inputs import head_count, small_image_shape, token_shape
from opsynth.operator_catalog.transformers_render import ModuleUse


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


def glpn_selective_fusion(ctx: SampleContext) -> ModuleUse:
    rng, wl = ctx.rng, ctx.workload
    channels = rng.choice(wl.channels)
    shape = small_image_shape(rng, wl, channels)
    return ModuleUse((str(channels),), (shape, shape))


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
