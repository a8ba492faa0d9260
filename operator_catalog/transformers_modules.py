"""The catalog's transformers modules: one entry per module class, each with the sampler that sizes one use of
it for a workload (transformers_samplers, transformers_dense_samplers); a task around one of them is rendered by
transformers_render.
"""

from __future__ import annotations

import random

from opsynth.operator_catalog import transformers_dense_samplers as dense
from opsynth.operator_catalog import transformers_samplers as samplers
from opsynth.operator_catalog.entry import OpEntry, RenderedTask, SampleContext, within_input_budget
from opsynth.operator_catalog.transformers_render import ModuleUse, render_transformers
from opsynth.workload import TASK_DTYPES, Workload

FAMILY = "transformers"
# What every one of these modules' tasks imports first: transformers' model base (seconds, cold, on one H200's
# host). A run's workers, the shape check's and the execution's, import it as they start (pipeline.run).
SHARED_MODULE = "transformers.modeling_utils"


def _entry(name: str, module: str, sampler, excluded: str | None = None, dtypes: tuple[str, ...] = TASK_DTYPES):
    return OpEntry(
        name=name,
        family=FAMILY,
        sampler=sampler,
        ranks=(),
        terminal=True,
        kind="transformers",
        excluded=excluded,
        module=f"transformers.models.{module}",
        dtypes=dtypes,
    )


ENTRIES = [
    _entry("ResNetBasicLayer", "resnet.modeling_resnet", samplers.resnet_basic),
    _entry("ResNetBottleNeckLayer", "resnet.modeling_resnet", samplers.resnet_bottleneck),
    _entry("ResNetShortCut", "resnet.modeling_resnet", samplers.resnet_shortcut),
    _entry("ConvNextLayer", "convnext.modeling_convnext", samplers.convnext_layer),
    _entry("ConvNextStage", "convnext.modeling_convnext", samplers.convnext_stage),
    _entry("PoolFormerLayer", "poolformer.modeling_poolformer", samplers.poolformer_layer),
    _entry("GLPNOverlapPatchEmbeddings", "glpn.modeling_glpn", samplers.glpn_patches),
    _entry("GLPNSelectiveFeatureFusion", "glpn.modeling_glpn", dense.glpn_selective_fusion),
    _entry("MPNetLMHead", "mpnet.modeling_mpnet", samplers.mpnet_head),
    _entry("MobileBertLMPredictionHead", "mobilebert.modeling_mobilebert", samplers.mobilebert_head),
    _entry(
        "MobileBertPreTrainingHeads", "mobilebert.modeling_mobilebert", samplers.pretraining_heads("MobileBertConfig")
    ),
    _entry("ErniePreTrainingHeads", "ernie.modeling_ernie", samplers.pretraining_heads("ErnieConfig")),
    _entry("FNetPreTrainingHeads", "fnet.modeling_fnet", samplers.pretraining_heads("FNetConfig")),
    _entry(
        "MegatronBertPreTrainingHeads",
        "megatron_bert.modeling_megatron_bert",
        samplers.pretraining_heads("MegatronBertConfig"),
    ),
    _entry("TDNNLayer", "wav2vec2.modeling_wav2vec2", samplers.tdnn_layer),
    _entry("HieraMaskUnitAttention", "hiera.modeling_hiera", samplers.hiera_attention),
    _entry("HieraLayer", "hiera.modeling_hiera", samplers.hiera_layer),
    _entry("HieraStage", "hiera.modeling_hiera", samplers.hiera_stage),
    _entry("MaskFormerSwinSelfAttention", "maskformer.modeling_maskformer_swin", samplers.swin_window_attention),
    _entry("MaskFormerSwinAttention", "maskformer.modeling_maskformer_swin", samplers.swin_window_attention),
    _entry("MultiHeadAttention", "ctrl.modeling_ctrl", samplers.ctrl_attention),
    _entry("SegGptDecoder", "seggpt.modeling_seggpt", samplers.seggpt_decoder),
    _entry("SegGptAttention", "seggpt.modeling_seggpt", samplers.seggpt_attention),
    _entry("SpeechT5FeatureEncoder", "speecht5.modeling_speecht5", samplers.speecht5_features),
    _entry("VitDetAttention", "vitdet.modeling_vitdet", samplers.vitdet_attention),
    _entry(
        "ASTPatchEmbeddings",
        "audio_spectrogram_transformer.modeling_audio_spectrogram_transformer",
        samplers.ast_patches,
    ),
    _entry("BlipTextAttention", "blip.modeling_blip_text", samplers.blip_text_attention),
    _entry("BridgeTowerMLMHead", "bridgetower.modeling_bridgetower", samplers.bridgetower_mlm_head),
    _entry("BridgeTowerResidualAttention", "bridgetower.modeling_bridgetower", samplers.bridgetower_residual),
    _entry("BrosBboxEmbeddings", "bros.modeling_bros", samplers.bros_bbox),
    _entry("DPTFeatureFusionLayer", "dpt.modeling_dpt", dense.dpt_fusion_layer),
    _entry("DPTFeatureFusionStage", "dpt.modeling_dpt", dense.dpt_like_pyramid("DPTConfig", 4, "fusion_hidden_size")),
    _entry("Data2VecVisionPyramidPoolingBlock", "data2vec.modeling_data2vec_vision", dense.pyramid_pooling),
    _entry("EncodecLSTM", "encodec.modeling_encodec", samplers.encodec_lstm),
    _entry("FlavaImageCodebookLayerGroup", "flava.modeling_flava", samplers.flava_codebook_group),
    _entry("LevitPatchEmbeddings", "levit.modeling_levit", samplers.levit_patches),
    _entry("Mask2FormerMaskPredictor", "mask2former.modeling_mask2former", dense.mask2former_predictor),
    _entry("MaskFormerFPNModel", "maskformer.modeling_maskformer", dense.maskformer_fpn),
    _entry(
        "NystromformerSelfAttention",
        "nystromformer.modeling_nystromformer",
        samplers.nystromformer_attention,
        dtypes=("float32",),  # its landmark attention makes float32 tensors of its own, whatever its input's dtype
    ),
    _entry("OneFormerTextTransformerLayer", "oneformer.modeling_oneformer", samplers.oneformer_text_layer),
    _entry("Swin2SRPatchEmbeddings", "swin2sr.modeling_swin2sr", samplers.swin2sr_patches),
    _entry("VitMatteFusionBlock", "vitmatte.modeling_vitmatte", dense.vitmatte_fusion),
    _entry("ZoeDepthConditionalLogBinomialSoftmax", "zoedepth.modeling_zoedepth", dense.zoedepth_log_binomial),
    _entry(
        "ZoeDepthFeatureFusionStage",
        "zoedepth.modeling_zoedepth",
        dense.dpt_like_pyramid("ZoeDepthConfig", 4, "fusion_hidden_size"),
    ),
    _entry("DPTDepthEstimationHead", "dpt.modeling_dpt", dense.dpt_like_pyramid("DPTConfig", 4, "fusion_hidden_size")),
    _entry(
        "ZoeDepthRelativeDepthEstimationHead",
        "zoedepth.modeling_zoedepth",
        dense.dpt_like_pyramid("ZoeDepthConfig", 4, "fusion_hidden_size"),
    ),
    _entry("DepthAnythingNeck", "depth_anything.modeling_depth_anything", dense.depth_anything_neck),
    _entry(
        "DepthAnythingFeatureFusionStage",
        "depth_anything.modeling_depth_anything",
        dense.dpt_like_pyramid("DepthAnythingConfig", 4, "fusion_hidden_size"),
    ),
]


def _not_sampled(ctx: SampleContext) -> ModuleUse:
    raise NotImplementedError("an excluded entry is never sampled")


# Released classes the catalog lists but never samples, with the reason.
EXCLUDED = [
    _entry(
        "SwinSelfAttention",
        "swin.modeling_swin",
        _not_sampled,
        excluded="no longer a class of transformers 5.x: Swin's attention is one SwinAttention module there",
    ),
    _entry(
        "ConditionalDetrMaskHeadSmallConv",
        "conditional_detr.modeling_conditional_detr",
        _not_sampled,
        excluded="its inputs are a DETR decoder's per-query attention maps and a three-level FPN of matching sizes; "
        "random tensors of those shapes are not yet sampled",
    ),
]
ENTRIES += EXCLUDED


def compose_transformers(seed: int, workload: Workload, batch_scale: float = 1.0) -> RenderedTask:
    """A standalone task around one transformers module in the task's dtype (`Workload.task_dtype`),
    deterministic in `seed`; `batch_scale` multiplies the batch of its inputs (shape calibration)."""
    rng = random.Random(seed)
    dtype = workload.task_dtype(seed)
    entry = rng.choice([e for e in ENTRIES if e.excluded is None and dtype in e.dtypes])
    return transformers_task(entry, rng, workload, batch_scale, dtype)


def transformers_task(entry: OpEntry, rng: random.Random, workload: Workload, batch_scale: float = 1.0,
                      dtype: str = "float32") -> RenderedTask:  # fmt: skip
    """One sampled use of transformers module `entry` in `dtype`, its input batch multiplied by `batch_scale`."""
    use = entry.sampler(SampleContext(None, rng, workload))
    if batch_scale != 1.0:
        fixed = tuple(range(1, 5))  # only the batch moves: every other dimension is tied to the module's config
        shapes = tuple(
            within_input_budget((max(1, round(s[0] * batch_scale)), *s[1:]), workload, fixed) for s in use.input_shapes
        )
        use = ModuleUse(use.init_args, shapes, use.as_list, use.extra_args)
    return render_transformers(entry, use, dtype)
