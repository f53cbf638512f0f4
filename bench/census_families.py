"""Census of the vision families transformers, timm and open_clip ship (issue 91's "Done when"): each family built
TINY with random weights in its own library, saved natively, opened by path with ``vit.load`` in a fresh HOME /
HF_HOME (no network), and asked for its maps. Run from the repository root::

    .venv/bin/python -m bench.census_families [--json PATH] [--only NAME ...] [--timeout SECONDS]

Each family runs in its own try/except under a time limit, so one failure never stops the census. A family's result
is ``port`` or ``library`` (the road ``vit.load`` took; then the maps ``vit.methods`` lists and whether
``vit.explain(checkpoint, image, "attention")`` draws), ``refused`` (the one-line message ``vit.load`` gave; a
message of more than one line, or an exception that is not the loader's own, is flagged), ``no attention`` (a pure
CNN or MLP, opened all the same and reported) or ``build failed`` (the census could not build the tiny model in its
library: the census's own gap, not a refusal). The families are every entry of the libraries' own registries
(``bench.census_registry``: transformers' vision auto-mappings, timm's architecture families, open_clip's configs);
the hand list below tunes the builds of some (a config that builds tiny) and adds the vision towers of composite
models, and ``--hand`` runs it alone (issue 91's census); the issue's named ones are marked ``named``.
"""

from __future__ import annotations

import sys
import tempfile

if __name__ == "__main__":  # run as the census: a fresh home before anything imports huggingface_hub
    from bench.census_home import fresh_home

    _HOME: str | None = fresh_home()
else:  # imported (the tests, bench.census_vlm): the process's environment is its own
    _HOME = None

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

from bench.census_registry import registry_families  # noqa: E402

RESULTS = Path("bench/results/cpu-2026-11-27")
MAX_PARAMETERS = 150_000_000  # a model the census builds on a CPU; past it, "build failed" says its size
IMAGE = 32  # every tiny model's image side (patch 8: a 4 x 4 grid) unless its spec says otherwise


@dataclass
class Family:
    name: str  # what the table shows
    library: str  # transformers | timm | open_clip
    build: str  # transformers: the model class; timm: the architecture; open_clip: "timm:<trunk>" or "vit"
    attention: bool = True  # False: a pure CNN / MLP (the "pure CNNs left out")
    overrides: dict = field(default_factory=dict)  # config (transformers) or constructor (timm) fields
    named: bool = False  # named in issue 91
    note: str = ""
    processor: dict = field(default_factory=dict)  # transformers: extra image processor fields; timm: pretrained_cfg
    registry: str = ""  # the registry entry it stands for ("transformers:vit", "timm:cait", "open_clip:ViT-B-32")


def with_processor(family: Family, **fields) -> Family:
    family.processor = fields
    return family


def hf(name, cls, attention=True, named=False, note="", **overrides) -> Family:
    return Family(name, "transformers", cls, attention, overrides, named, note)


def tm(name, arch, attention=True, named=False, note="", **overrides) -> Family:
    return Family(name, "timm", arch, attention, overrides, named, note)


VIT_TINY = dict(depth=2, embed_dim=64, num_heads=2, img_size=IMAGE, patch_size=8)
HIERARCHY = dict(embed_dim=16, depths=(1, 1), num_heads=(1, 2))
DEPTH_BACKBONE = dict(model_type="dinov2", hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                      intermediate_size=64, image_size=IMAGE, patch_size=8, out_indices=[1, 2, 3, 4],
                      reshape_hidden_states=False)
SAM2 = dict(backbone_channel_list=[64, 32, 16], backbone_feature_sizes=[[8, 8], [4, 4], [2, 2]], fpn_hidden_size=16,
            fpn_top_down_levels=[1, 2], num_feature_levels=3,
            backbone_config=dict(model_type="sam2_hiera_det_model", hidden_size=16, image_size=[IMAGE, IMAGE],
                                 blocks_per_stage=[1, 1, 1], embed_dim_per_stage=[16, 32, 64],
                                 num_attention_heads_per_stage=[1, 1, 2], window_size_per_stage=[2, 2, 2],
                                 global_attention_blocks=[2], num_query_pool_stages=2,
                                 window_positional_embedding_background_size=[2, 2]))
SAM3 = dict(fpn_hidden_size=16, backbone_feature_sizes=[[16, 16], [8, 8], [4, 4]],
            backbone_config=dict(model_type="sam3_vit_model", hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=2, num_attention_heads=2, image_size=IMAGE, patch_size=8,
                                 window_size=2, global_attn_indexes=[1], pretrain_image_size=IMAGE))
DETR_SIZE = dict(height=64, width=96)
# EdgeTAM's default config names its RepViT trunk under a misspelt key ("archirecture"), so it builds a ResNet-50 its
# FPN's channels do not fit; the trunk as its checkpoints name it, its feature maps at 32 px
EDGETAM = dict(backbone_config=dict(architecture="repvit_m1"), backbone_feature_sizes=[[8, 8], [4, 4], [2, 2]],
               fpn_hidden_size=32)  # the width of the shrunk mask decoder it feeds
QWEN_PROCESSOR = dict(patch_size=8, merge_size=2, size=dict(shortest_edge=32 * 32, longest_edge=64 * 64))
# ImageGPT's colour clusters (its tiny vocabulary of 128 ids: 125 colours, a 5-level lattice in [-1, 1])
PALETTE = [[r / 2 - 1, g / 2 - 1, b / 2 - 1] for r in range(5) for g in range(5) for b in range(5)]
DEPTH_HEAD = dict(neck_hidden_sizes=[8, 16, 16, 16], fusion_hidden_size=16)

FAMILIES: list[Family] = [
    # --- transformers: plain ViTs and their kin (a patch embedding, a prefix, global attention)
    hf("ViT", "ViTForImageClassification"),
    hf("DeiT (distilled)", "DeiTForImageClassificationWithTeacher"),
    hf("BEiT", "BeitForImageClassification"),
    hf("Data2Vec-Vision", "Data2VecVisionForImageClassification"),
    hf("DINOv2", "Dinov2ForImageClassification"),
    hf("DINOv2 with registers", "Dinov2WithRegistersForImageClassification"),
    hf("DINOv3 ViT", "DINOv3ViTModel"),
    hf("I-JEPA", "IJepaForImageClassification", named=True),
    hf("ViT-MSN", "ViTMSNForImageClassification"),
    hf("ViT-MAE", "ViTMAEModel", mask_ratio=0.0),
    hf("Pixio", "PixioModel"),
    hf("YOLOS", "YolosModel"),
    hf("ViTDet", "VitDetModel"),
    hf("ViTPose backbone", "VitPoseBackbone"),
    hf("C-RADIO", "RadioModel", named=True),
    hf("TIPSv2 vision", "Tipsv2VisionModel"),
    hf("Sapiens2 backbone", "Sapiens2Backbone", num_first_full_attention_layers=1, num_last_full_attention_layers=1,
       num_key_value_attention_heads=2, num_key_value_heads_per_layer=[2, 2]),  # its per-layer lists at 2 layers
    hf("LW-DETR ViT backbone", "LwDetrViTBackbone", num_windows=4, num_windows_side=2,  # the side its config
       window_block_indices=[0]),  # derives from num_windows, which the default's dict (16 windows: 4) would keep
    with_processor(hf("ImageGPT", "ImageGPTForImageClassification", note="pixel tokens from a colour palette, "
                      "no patches"), clusters=PALETTE),  # its processor's clusters, as the Hub's ship 512
    hf("Perceiver (learned)", "PerceiverForImageClassificationLearned", note="latents cross-attend the pixels",
       num_latents=16, d_latents=32, num_self_attends_per_block=1, num_self_attention_heads=2,
       num_cross_attention_heads=1),  # its 26 self-attention layers of 1,280 wide, 1 GB at 32 px, made tiny
    hf("timm wrapper (ViT)", "TimmWrapperForImageClassification", architecture="vit_tiny_patch16_224",
       model_args=dict(VIT_TINY)),
    # --- transformers: CLIP-like towers
    hf("CLIP vision", "CLIPVisionModel"),
    hf("CLIP (dual encoder)", "CLIPModel"),
    hf("MetaCLIP 2 vision", "MetaClip2VisionModel", named=True),
    hf("MetaCLIP 2 (dual encoder)", "MetaClip2Model", named=True),
    hf("SigLIP vision", "SiglipVisionModel"),
    with_processor(hf("SigLIP 2 vision (NaFlex)", "Siglip2VisionModel", num_patches=16), patch_size=8,
                   max_num_patches=16),
    hf("AIMv2 vision", "Aimv2VisionModel"),
    hf("MLCD vision", "MLCDVisionModel"),
    hf("Chinese-CLIP vision", "ChineseCLIPVisionModel"),
    hf("AltCLIP vision", "AltCLIPVisionModel"),
    hf("BLIP vision", "BlipVisionModel"),
    hf("BLIP-2 vision", "Blip2VisionModel"),
    hf("GIT vision", "GitVisionModel"),
    hf("OWL-ViT vision", "OwlViTVisionModel"),
    hf("OWLv2 vision", "Owlv2VisionModel"),
    hf("CLIPSeg vision", "CLIPSegVisionModel"),
    hf("X-CLIP vision", "XCLIPVisionModel"),
    hf("GroupViT vision", "GroupViTVisionModel", note="group tokens merge the patches between stages"),
    hf("Idefics3 / SmolVLM vision", "Idefics3VisionTransformer"),
    hf("InternVL vision", "InternVLVisionModel", patch_size=[8, 8], image_size=[IMAGE, IMAGE]),
    hf("Llama 4 vision", "Llama4VisionModel", intermediate_size=128, projector_input_dim=32,
       projector_output_dim=32),  # its pixel shuffle's 4 x hidden into its adapter, as its full size has
    hf("Mllama vision", "MllamaVisionModel", num_global_layers=1, intermediate_layers_indices=[0, 1]),  # within
    # its 2 tiny local layers
    # Qwen-VL's processor flattens each image at its own size (smart_resize): its patch size made the shrunk
    # config's, its pixel budget a few merge units
    with_processor(hf("Qwen2.5-VL vision", "Qwen2_5_VisionTransformerPretrainedModel"), **QWEN_PROCESSOR),
    with_processor(hf("Qwen3-VL vision", "Qwen3VLVisionModel"), **QWEN_PROCESSOR),
    # --- transformers: whole folders as the Hub ships them (issue 117), beside the parts above
    hf("TIPSv2 (whole)", "Tipsv2Model"),
    hf("ViTPose (pose estimation)", "VitPoseForPoseEstimation"),
    hf("Pixtral vision", "PixtralVisionModel"),
    hf("Molmo 2 vision", "Molmo2VisionModel", num_position_embeddings=16),  # its 4x4 grid at 32 px
    # --- transformers: SAM's kind (windows, a relative position bias, a neck)
    hf("SAM vision encoder", "SamVisionModel", global_attn_indexes=[1], output_channels=16, mlp_dim=64,
       window_size=2),
    hf("SAM-HQ vision encoder", "SamHQVisionModel", named=True, global_attn_indexes=[1], output_channels=16,
       mlp_dim=64, window_size=2),
    hf("SAM 2 vision encoder", "Sam2VisionModel", **SAM2),
    hf("SAM 3 vision encoder", "Sam3VisionModel", named=True, **SAM3),
    hf("SAM 3 tracker", "Sam3TrackerModel", named=True, vision_config=SAM3),
    # the whole SAM / SAM-HQ / SAM 2 folders the Hub ships: their vision encoders as tiny as the parts' above (the
    # shrink leaves a global-attention list and the stages' widths at their full depth)
    hf("SAM (whole)", "SamModel", vision_config=dict(global_attn_indexes=[1], output_channels=16, mlp_dim=64,
                                                     window_size=2)),
    hf("SAM-HQ (whole)", "SamHQModel", named=True, vision_config=dict(global_attn_indexes=[1], output_channels=16,
                                                                      mlp_dim=64, window_size=2)),
    hf("SAM 2 (whole)", "Sam2Model", vision_config=SAM2),
    hf("EdgeTAM vision", "EdgeTamVisionModel", **EDGETAM),
    # --- transformers: an encoder over a CNN's feature map (stride 32), then learnt object queries: a 64x96-px input,
    # a 2x3 map (at 32 px the encoder runs over one token)
    with_processor(hf("DETR", "DetrModel"), size=DETR_SIZE),
    with_processor(hf("Conditional DETR", "ConditionalDetrModel"), size=DETR_SIZE),
    with_processor(hf("DAB-DETR", "DabDetrModel"), size=DETR_SIZE),
    with_processor(hf("Table Transformer", "TableTransformerModel"), size=DETR_SIZE),
    with_processor(hf("Deformable DETR", "DeformableDetrModel"), size=dict(height=256, width=384)),  # its levels
    # past the backbone's one, strides 64 to 256: a 1x1 map at 128 px, which its GroupNorm refuses
    hf("Swin2SR", "Swin2SRModel", patch_size=1),  # its own patch size (one pixel a token), not the shrink's 8
    # --- transformers: dense heads around a ViT
    hf("CHMv2", "CHMv2ForDepthEstimation", backbone_config=dict(num_hidden_layers=4, out_indices=[1, 2, 3, 4])),
    hf("TIPSv2 DPT", "Tipsv2DptForDepthEstimation", backbone_config=dict(num_hidden_layers=4, out_indices=[1, 2, 3, 4]),
       **DEPTH_HEAD),  # a neck fed by 4 of its backbone's layers
    hf("DPT", "DPTForDepthEstimation", named=True, backbone_out_indices=[0, 1, 2, 3], num_hidden_layers=4,
       reassemble_factors=[4, 2, 1, 0.5], **DEPTH_HEAD),
    hf("Depth Anything", "DepthAnythingForDepthEstimation", named=True, backbone_config=DEPTH_BACKBONE,
       reassemble_hidden_size=32, patch_size=8, **DEPTH_HEAD),
    hf("Prompt Depth Anything", "PromptDepthAnythingForDepthEstimation", backbone_config=DEPTH_BACKBONE,
       reassemble_hidden_size=32, patch_size=8, **DEPTH_HEAD),
    # hooks within its 2 tiny layers; 16-px crops (each encoder's input side) of 4-px patches, so that its image
    # encoder's grid is 4x4 over the whole 64-px input (at 8 px of 8-px patches it was one patch)
    with_processor(hf("Depth Pro", "DepthProForDepthEstimation", intermediate_hook_ids=[1, 0], patch_size=16,
                      **{part: dict(patch_size=4) for part in ("image_model_config", "patch_model_config",
                                                               "fov_model_config")}),
                   size={"height": 64, "width": 64}),
    # a neck fed by 4 of its backbone's layers, its bottleneck as wide as the shrunk fusion; its processor's multiple
    # the Hub's ZoeDepth folders name (transformers 5's processor class defaults to 1/32 of a pixel)
    with_processor(hf("ZoeDepth", "ZoeDepthForDepthEstimation", backbone_config=dict(num_hidden_layers=4,
                                                                                     out_indices=[1, 2, 3, 4]),
                      bottleneck_features=16, **DEPTH_HEAD), ensure_multiple_of=32),
    # a UperNet head over a Swin backbone (openmmlab's upernet-swin), its four stages handed to the head
    hf("upernet (UperNetForSemanticSegmentation)", "UperNetForSemanticSegmentation", hidden_size=16,
       auxiliary_channels=16, auxiliary_in_channels=None,
       backbone_config=dict(model_type="swin", embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2],
                            patch_size=4, window_size=2, image_size=IMAGE,
                            out_features=["stage1", "stage2", "stage3", "stage4"])),
    # transformers' wrapper of a timm model by name (its config cannot make the model smaller): timm's ViT-Ti
    hf("timm_backbone (TimmBackbone)", "TimmBackbone", backbone="vit_tiny_patch16_224", image_size=224),
    hf("EoMT", "EomtForUniversalSegmentation", num_blocks=1),
    hf("EoMT-DINOv3", "EomtDinov3ForUniversalSegmentation", named=True, num_blocks=1),
    # --- transformers: video (tubelets or divided space-time attention)
    hf("ViViT", "VivitForVideoClassification", named=True, num_frames=2, tubelet_size=[1, 8, 8]),
    hf("VideoMAE", "VideoMAEForVideoClassification", num_frames=2, tubelet_size=1),
    hf("TimeSformer", "TimesformerForVideoClassification", num_frames=2),
    hf("V-JEPA 2", "VJEPA2ForVideoClassification", frames_per_clip=2, tubelet_size=1),
    hf("VideoPrism vision", "VideoPrismVisionModel", num_frames=2, tubelet_size=[1, 8, 8]),  # its 18-px tubelets
    hf("videoprism (VideoPrismClipModel)", "VideoPrismClipModel",  # (of 288 px) would cut 32 px into one patch
       vision_config=dict(num_frames=2, tubelet_size=[1, 8, 8])),
    hf("videomt (VideomtForUniversalSegmentation)", "VideomtForUniversalSegmentation", num_blocks=1),  # of its 2
    hf("PE video", "PeVideoEncoder", named=True,  # its timm PE-Core trunk made tiny too (model_args)
       vision_config=dict(architecture="vit_pe_core_tiny_patch16_384",
                          model_args=dict(depth=2, embed_dim=32, num_heads=2, img_size=IMAGE, patch_size=8,
                                          attn_pool_num_heads=2, ref_feat_shape=[IMAGE // 8, IMAGE // 8]))),
    # --- transformers: stages and windows
    hf("Swin", "SwinForImageClassification", embed_dim=16, depths=[1, 1], num_heads=[1, 2], patch_size=4,
       window_size=4),
    hf("Swin V2", "Swinv2ForImageClassification", embed_dim=16, depths=[1, 1], num_heads=[1, 2], patch_size=4,
       window_size=4),
    hf("Donut-Swin", "DonutSwinForImageClassification", embed_dim=16, depths=[1, 1], num_heads=[1, 2], patch_size=4,
       window_size=4),
    hf("Hiera", "HieraForImageClassification", embed_dim=16, depths=[1, 1], num_heads=[1, 2], patch_size=[4, 4],
       patch_stride=[4, 4], patch_padding=[0, 0], image_size=[IMAGE, IMAGE], masked_unit_size=[2, 2],
       query_stride=[2, 2], num_query_pool=1, embed_dim_multiplier=2.0, masked_unit_attention=[True, False]),
    hf("DiNAT", "DinatForImageClassification", embed_dim=16, depths=[1, 1], num_heads=[1, 2], dilations=[[1], [1]],
       kernel_size=3),
    hf("LeViT", "LevitForImageClassificationWithTeacher", patch_size=16),  # its stem's four stride-2 convolutions
    hf("CvT", "CvtForImageClassification"),
    hf("PVT", "PvtForImageClassification"),
    hf("PVT v2", "PvtV2ForImageClassification"),
    hf("SegFormer", "SegformerForImageClassification"),
    hf("GLPN", "GLPNForDepthEstimation"),
    hf("MobileViT", "MobileViTForImageClassification"),
    hf("MobileViT V2", "MobileViTV2ForImageClassification", image_size=256),  # its pooling is built for 256 px
    hf("SwiftFormer", "SwiftFormerForImageClassification", note="additive attention, no token-by-token matrix"),
    # --- transformers: no attention
    hf("ConvNeXt", "ConvNextForImageClassification", attention=False),
    hf("ConvNeXt V2", "ConvNextV2ForImageClassification", attention=False),
    hf("DINOv3 ConvNeXt", "DINOv3ConvNextModel", attention=False),
    hf("ResNet", "ResNetForImageClassification", attention=False),
    hf("RegNet", "RegNetForImageClassification", attention=False),
    hf("BiT", "BitForImageClassification", attention=False, hidden_sizes=[256, 512, 1024, 2048], embedding_size=64),
    hf("EfficientNet", "EfficientNetForImageClassification", attention=False),
    hf("MobileNet V1", "MobileNetV1ForImageClassification", attention=False),
    hf("MobileNet V2", "MobileNetV2ForImageClassification", attention=False),
    hf("FocalNet", "FocalNetForImageClassification", attention=False),
    hf("PoolFormer", "PoolFormerForImageClassification", attention=False),
    hf("HGNet V2", "HGNetV2ForImageClassification", attention=False),
    hf("TextNet", "TextNetForImageClassification", attention=False),
    # --- timm: ViTs and their kin
    tm("timm ViT", "vit_tiny_patch16_224", **VIT_TINY),
    tm("timm ViT, registers, no CLS (reg4 gap)", "vit_betwixt_patch16_reg4_gap_256", **VIT_TINY),
    tm("timm ViT, attention pooling (SigLIP)", "vit_base_patch16_siglip_224", **VIT_TINY),
    tm("timm ViT, DINOv2 registers", "vit_small_patch14_reg4_dinov2", **dict(VIT_TINY, img_size=28, patch_size=14)),
    tm("timm ViT, CLIP (pre-norm)", "vit_base_patch16_clip_224", **VIT_TINY),
    tm("timm ViT, relative position", "vit_relpos_small_patch16_224", **VIT_TINY),
    tm("timm ViT, SAM (windows)", "samvit_base_patch16", depth=2, embed_dim=64, num_heads=2, img_size=IMAGE,
       patch_size=8, window_size=2, global_attn_indexes=(1,), neck_chans=16, num_classes=0),
    tm("timm FlexiViT", "flexivit_small", named=True, **VIT_TINY),
    tm("timm RoPE ViT (reg1 gap)", "vit_base_patch16_rope_reg1_gap_256", named=True, **VIT_TINY),
    tm("timm RoPE ViT (mixed)", "vit_small_patch16_rope_mixed_224", named=True, **VIT_TINY),
    tm("timm InternViT-300M", "vit_intern300m_patch14_448", named=True, **dict(VIT_TINY, img_size=28, patch_size=14)),
    tm("timm NaFlexViT", "naflexvit_base_patch16_gap", **VIT_TINY),
    tm("timm DeiT", "deit_tiny_patch16_224", **VIT_TINY),
    tm("timm DeiT (distilled)", "deit_tiny_distilled_patch16_224", **VIT_TINY),
    tm("timm DeiT III", "deit3_small_patch16_224", **VIT_TINY),
    tm("timm BEiT", "beit_base_patch16_224", **VIT_TINY),
    tm("timm BEiT v2", "beitv2_base_patch16_224", **VIT_TINY),
    tm("timm EVA-02", "eva02_tiny_patch14_224", **dict(VIT_TINY, img_size=28, patch_size=14)),
    tm("timm PE-Core", "vit_pe_core_tiny_patch16_384", **VIT_TINY),
    tm("timm AIMv2", "aimv2_large_patch14_224", **dict(VIT_TINY, img_size=28, patch_size=14)),
    tm("timm CaiT", "cait_xxs24_224", **VIT_TINY),
    tm("timm XCiT", "xcit_nano_12_p8_224", depth=2, embed_dim=64, num_heads=2, img_size=IMAGE, patch_size=8),
    tm("timm TNT", "tnt_s_patch16_224", depth=2),
    tm("timm CrossViT", "crossvit_tiny_240"),
    tm("timm PiT", "pit_ti_224"),
    tm("timm Twins", "twins_svt_small"),
    tm("timm VOLO", "volo_d1_224"),
    tm("timm MViT v2", "mvitv2_tiny"),
    tm("timm Swin", "swin_tiny_patch4_window7_224", img_size=IMAGE, window_size=4, **HIERARCHY),
    tm("timm Swin V2", "swinv2_tiny_window8_256", img_size=IMAGE, window_size=4, **HIERARCHY),
    tm("timm Hiera", "hiera_tiny_224", img_size=IMAGE, embed_dim=16, num_heads=1, stages=(1, 1), q_pool=1,
       mask_unit_attn=(True, False)),
    tm("timm LeViT", "levit_128s"),
    tm("timm EfficientFormer", "efficientformer_l1"),
    tm("timm MaxViT", "maxvit_tiny_tf_224"),
    # over the census's cap as registered: made tiny by their own constructor's fields (issue 117)
    tm("timm deepseek_vit (deepseek_vit_412m)", "deepseek_vit_412m", depth=2, embed_dim=64, num_heads=2,
       img_size=56, patch_size=14),
    tm("timm gemma4_vit (gemma4_vit_167m)", "gemma4_vit_167m", depth=2, embed_dim=64, num_heads=2, head_dim=32,
       intermediate_size=128, img_size=48, patch_size=16),
    with_processor(tm("timm mobilenetv5 (mobilenetv5_300m)", "mobilenetv5_300m", channel_multiplier=0.25),
                   input_size=(3, 256, 256)),  # its 768 px made 256 (a CNN: no img_size field)
    with_processor(tm("timm hieradet_sam2 (sam2_hiera_tiny)", "sam2_hiera_tiny"), input_size=(3, 256, 256)),
    tm("timm FastViT", "fastvit_t8", attention=False, note="RepMixer stages (the attention variants are sa*)"),
    tm("timm ConvNeXt", "convnext_atto", attention=False),
    tm("timm ResNet", "resnet18", attention=False),
    tm("timm MLP-Mixer", "mixer_s16_224", attention=False, img_size=IMAGE),
    tm("timm ResMLP", "resmlp_12_224", attention=False, img_size=IMAGE),
    # --- open_clip
    Family("open_clip ViT (its own)", "open_clip", "vit"),
    Family("open_clip SigLIP 2 (timm trunk)", "open_clip", "timm:vit_base_patch16_siglip_224", named=True,
           overrides=dict(image_size=224, timm_pool="map", timm_proj="none")),
    Family("open_clip PE-Core (timm trunk)", "open_clip", "timm:vit_pe_core_tiny_patch16_384", named=True,
           overrides=dict(image_size=384, timm_pool="map", timm_proj=None)),
]

# Shrinking every config the same way: integers set small where a config has the field (nested configs too).
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, intermediate_size=64,
             image_size=IMAGE, patch_size=8, projection_dim=16, mlp_dim=64, num_layers=2, depth=2, d_model=32,
             encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
             encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=128, out_hidden_size=32, num_heads=2,
             encoder_hidden_size=32, head_dim=16, vision_output_dim=32, projection_hidden_size=32)
STAGES = ("depths", "num_heads", "hidden_sizes", "num_attention_heads", "embed_dims", "num_encoder_blocks")


def shrink(config: dict) -> dict:
    """The config dict with its sizes made tiny; lists of per-stage sizes kept at their length."""
    out = {}
    for key, value in config.items():
        if key in ("out_features", "out_indices", "stage_names"):
            continue  # a backbone's outputs named for the full depth; the config derives them again
        if isinstance(value, dict):
            out[key] = shrink(value)
        elif key in SMALL and isinstance(value, int) and not isinstance(value, bool):
            out[key] = SMALL[key]
        elif key == "layer_types" and isinstance(value, list) and isinstance(config.get("num_hidden_layers"), int):
            out[key] = value[:SMALL["num_hidden_layers"]]  # one a layer: as many as the layers it keeps (Cohere 2's)
        elif key == "image_size" and isinstance(value, (list, tuple)) and len(value) == 2:
            out[key] = [IMAGE, IMAGE]
        elif key in STAGES and isinstance(value, list) and all(isinstance(v, int) for v in value):
            out[key] = {"depths": [1] * len(value), "num_encoder_blocks": [1] * len(value)}.get(
                key, [min(v, 2 ** i) if "head" in key else 16 * 2 ** i for i, v in enumerate(value)])
        else:
            out[key] = value
    return out


def merge(base: dict, edits: dict) -> dict:
    out = dict(base)
    for key, value in edits.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def save_transformers(family: Family, folder: Path) -> None:
    import torch
    import transformers
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    cls = getattr(transformers, family.build)
    config_cls = cls.config_class
    config = config_cls.from_dict(merge(shrink(config_cls().to_dict()), family.overrides))
    torch.manual_seed(0)
    model = cls(config).eval()
    model.save_pretrained(folder)
    side = getattr(config, "image_size", None) or getattr(getattr(config, "vision_config", None), "image_size", IMAGE)
    side = side[0] if isinstance(side, (list, tuple)) else side
    names = IMAGE_PROCESSOR_MAPPING_NAMES.get(config.model_type) or IMAGE_PROCESSOR_MAPPING_NAMES.get(
        config.model_type.replace("_vision_model", "").replace("_vision", "")) or {}
    name = names.get("torchvision") or names.get("pil") if isinstance(names, dict) else (names or None)
    processor_cls = getattr(transformers, name, None) if isinstance(name, str) else None
    processor = None
    sizes = dict(size={"height": side, "width": side}, crop_size={"height": side, "width": side})
    for fields in (dict(sizes, **family.processor), dict(family.processor), None):
        if processor_cls is None or fields is None:
            break
        try:
            processor = processor_cls(**fields)
            break
        except Exception:  # noqa: BLE001 - a processor whose sizes are another shape: fewer fields, then ViT's
            continue
    (processor or transformers.ViTImageProcessor(**dict(sizes, **family.processor))).save_pretrained(folder)


def save_timm(family: Family, folder: Path) -> None:
    import timm
    import torch
    from timm.models import _hub

    kwargs = dict(dict(num_classes=3), **family.overrides)
    with torch.device("meta"):  # its size first, as for open_clip
        size = sum(p.numel() for p in timm.create_model(family.build, pretrained=False, **kwargs).parameters())
    if size > MAX_PARAMETERS:
        raise ValueError(f"{size / 1e6:,.0f} M parameters, over the census's {MAX_PARAMETERS / 1e6:,.0f} M")
    torch.manual_seed(0)
    # ``processor``: the pretrained_cfg's fields (a smaller input_size for a model without an img_size field)
    overlay = dict(pretrained_cfg_overlay=family.processor) if family.processor else {}
    model = timm.create_model(family.build, pretrained=False, **kwargs, **overlay).eval()
    try:
        _hub.save_for_hf(model, folder, model_args=dict(family.overrides), safe_serialization=True)
    except RuntimeError as error:  # weights it ties under several names (CoaT's): saved once, as safetensors
        if "share memory" not in str(error):  # does for shared weights (``save_model``)
            raise
        from safetensors.torch import save_model

        save_model(model, str(folder / "model.safetensors"))
        _hub.save_config_for_hf(model, folder / "config.json", model_args=dict(family.overrides))


# A Hub text tower's model type, by its name (open_clip's hf_model_name), and the sizes its tiny config takes
HF_TEXT_TYPES = (("xlm-roberta", "xlm-roberta"), ("roberta", "roberta"), ("mt5", "mt5"), ("nllb", "m2m_100"))
HF_TEXT_TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, d_model=32,
                    num_layers=1, num_heads=2, d_ff=64, d_kv=16, encoder_layers=1, decoder_layers=1,
                    encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                    vocab_size=128, max_position_embeddings=64)


def tiny_text_config(name: str, folder: Path) -> str:
    """A tiny transformers config of the type of open_clip's Hub text tower ``name``, saved in ``folder`` (which
    open_clip's ``AutoConfig.from_pretrained`` then reads offline): the image tower is what the census opens."""
    import transformers

    kind = next((t for word, t in HF_TEXT_TYPES if word in name.lower()), None)
    if kind is None:
        raise ValueError(f"no tiny text config for {name!r} (a Hub text tower the census cannot build offline)")
    config = transformers.AutoConfig.for_model(kind)
    for key, value in HF_TEXT_TINY.items():
        if hasattr(config, key):
            setattr(config, key, value)
    config.save_pretrained(folder)
    return str(folder)


def save_open_clip(family: Family, folder: Path) -> None:
    import importlib

    import open_clip
    import torch
    from safetensors.torch import save_file

    cls = open_clip.model.CLIP
    if family.build.startswith("config:"):  # a registry config, its own ViT and text tower made tiny
        from bench.census_registry import open_clip_model_cfg

        model_cfg = open_clip_model_cfg(family.build.split(":", 1)[1])
        if model_cfg.get("text_cfg", {}).get("hf_model_name"):  # its Hub text tower, offline: a tiny config of
            model_cfg["text_cfg"]["hf_model_name"] = tiny_text_config(  # that type, written in the folder
                model_cfg["text_cfg"]["hf_model_name"], folder / "text_config")
            model_cfg["text_cfg"]["hf_model_pretrained"] = False  # built from that config, random weights
        if model_cfg.pop("custom_text", False) or model_cfg.get("text_cfg", {}).get("hf_model_name"):
            cls = open_clip.model.CustomTextCLIP
        if "multimodal_cfg" in model_cfg:
            cls = open_clip.CoCa
    else:
        if family.build == "vit":
            vision = dict(image_size=IMAGE, patch_size=8, width=32, layers=2, head_width=16)
        else:
            vision = dict(family.overrides, timm_model_name=family.build.split(":", 1)[1],
                          timm_model_pretrained=False)
        model_cfg = dict(embed_dim=16, vision_cfg=vision,
                         text_cfg=dict(context_length=8, vocab_size=64, width=64, heads=1, layers=1))
    counted = model_cfg  # a Hub text tower (transformers refuses to build one on the meta device) counted as ours
    if model_cfg.get("text_cfg", {}).get("hf_model_name"):
        counted = dict(model_cfg, text_cfg=dict(context_length=8, vocab_size=64, width=32, heads=1, layers=1))
    with torch.device("meta"):  # its size first: a full-size trunk (EVA01-g, ConvNeXt-XXL) is past a CPU's memory
        size = sum(p.numel() for p in cls(**counted).parameters())
    if size > MAX_PARAMETERS:
        raise ValueError(f"{size / 1e6:,.0f} M parameters as its config builds it, over the census's "
                         f"{MAX_PARAMETERS / 1e6:,.0f} M (a timm trunk keeps its full size)")
    torch.manual_seed(0)
    model = cls(**model_cfg)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "open_clip_model.safetensors")
    model.visual.image_mean, model.visual.image_std = open_clip.OPENAI_DATASET_MEAN, open_clip.OPENAI_DATASET_STD
    hub = importlib.import_module("open_clip.push_to_hf_hub")  # the package's name resolves to a function
    hub.save_config_for_hf(model, folder / "open_clip_config.json", model_config=model_cfg)


SAVE = {"transformers": save_transformers, "timm": save_timm, "open_clip": save_open_clip}


class TimeLimit(Exception):
    pass


def _alarm(signum, frame):
    raise TimeLimit


def one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def census_one(family: Family, root: Path, timeout: int) -> dict:
    """Build, save, open and draw one family; every outcome is a row, none raises."""
    import numpy as np
    from PIL import Image

    import vit

    row = dict(family=family.name, library=family.library, build=family.build, attention=family.attention,
               registry=family.registry, named=family.named, note=family.note, result=None, road=None, methods=[],
               draws=None, message="", flag="", seconds=None)
    folder = Path(tempfile.mkdtemp(prefix="".join(c if c.isalnum() or c in "-." else "_" for c in family.name)[:60],
                                   dir=root))
    start = time.perf_counter()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        try:
            SAVE[family.library](family, folder)
        except TimeLimit:
            raise
        except Exception as error:  # noqa: BLE001 - the census's own gap, reported as such
            row.update(result="build failed", message=" / ".join(
                line.strip() for line in one_line(error).splitlines() if line.strip())[:300])
            return row
        try:
            checkpoint = vit.load(folder, device="cpu")
        except TimeLimit:
            raise
        except Exception as error:  # noqa: BLE001 - a refusal is a row, whatever raised it
            message = str(error)
            row.update(result="refused", message=message.splitlines()[0][:400] if message else type(error).__name__,
                       error=type(error).__name__, missing=missing_piece(message))
            if family.library == "transformers" and row["missing"].startswith("no port"):
                row["missing"] = why_not_library(folder)
            if NO_ATTENTION in message or NO_IMAGE_ATTENTION in message:  # the recorder saw no attention call (a
                row.update(attention=False, result="no attention")  # pure CNN or MLP), or none over image tokens
            if "\n" in message.strip():
                row["flag"] = "multi-line message"
            if type(error).__module__.split(".")[0] != "vit" and type(error).__name__ not in (
                    "ValueError", "NotImplementedError"):
                row["flag"] = (row["flag"] + "; " if row["flag"] else "") + (
                    f"{type(error).__name__} from {traceback.extract_tb(error.__traceback__)[-1].filename}")
            return row
        row.update(result=checkpoint.road, road=checkpoint.road)
        left_out = getattr(checkpoint, "metadata", {}).get("left_out")  # attention it runs but never draws, named
        if left_out:
            row["left_out"] = dict(left_out)
        try:
            row["methods"] = list(vit.methods(checkpoint))
        except Exception as error:  # noqa: BLE001
            row["message"] = f"vit.methods failed: {one_line(error)}".splitlines()[0]
        side = getattr(getattr(checkpoint, "preprocessing", None), "image_size", IMAGE) or IMAGE
        side = side[0] if isinstance(side, (list, tuple)) else side
        rng = np.random.default_rng(0)
        image = Image.fromarray(rng.integers(0, 255, (int(side) + 8, int(side) + 16, 3), dtype=np.uint8))
        from vit.explain.views import video
        clip = video.is_video(checkpoint) or getattr(checkpoint.model, "takes_clips", False)  # PE video's too
        row["input"] = "a clip of 4 frames" if clip else "an image"
        try:
            explanation = vit.explain(checkpoint, [image] * 4 if clip else image, "attention")
            drawn = np.asarray(explanation.map)
            row["draws"] = bool(drawn.size and np.isfinite(drawn).all())
            row["map_shape"] = list(drawn.shape)
        except TimeLimit:
            raise
        except Exception as error:  # noqa: BLE001
            text = str(error)
            row.update(draws=False, message=(f"explain: {type(error).__name__}: "
                                             f"{text.splitlines()[0] if text else ''}")[:400])
            if "\n" in text.strip():
                row["flag"] = "multi-line message from explain"
        return row
    except TimeLimit:
        row.update(result="timed out", message=f"past {timeout} s")
        return row
    finally:
        signal.alarm(0)
        row["seconds"] = round(time.perf_counter() - start, 1)
        # each family's files gone once its row is written: 47 full-size open_clip towers (ViTamin-XL, SO400M) kept
        # to the end filled a 60 GB disk
        shutil.rmtree(folder, ignore_errors=True)


NO_ATTENTION = "makes no attention call this road sees"  # the recorder's words for a forward without attention
NO_IMAGE_ATTENTION = "no attention over image tokens"  # ``image_tokens``': every call among learnt queries

# What a refusal's message says is missing, read from its words (the census's grouping, not the loader's).
MISSING = [("tokens after the patches", "tokens after the patches"),
           ("attention modules for", "more than one attention module per layer"),
           ("traced on the meta device", "a forward the meta device cannot trace (data-dependent shapes)"),
           ("no embeddings module", "no embeddings module to count the prefix tokens from"),
           ("image_size None", "no fixed image size (a processor that resizes by pixel budget)"),
           ("have parts this model does not have", "weights whose names do not fit (a wrapper's prefix)"),
           ("cross-covariance attention", "attention over channels alone (cross-covariance), none over tokens"),
           ("halo attention", "halo attention (overlapping key windows): no layout"),
           ("factorized attention", "factorized attention: no query rows over tokens"),
           ("timm architecture", "a timm architecture outside the library road (no timm Attention/Eva blocks)"),
           ("does not run through transformers' attention interface",
            "attention off transformers' attention interface (no module calls ALL_ATTENTION_FUNCTIONS)"),
           ("no patch size at its top level (it sits in", "a composite config: the patch size sits in a part's config"),
           ("no patch size at its top level", "no patch size in the config (video tubelets, stages, pixels)"),
           ("is not supported", "no port and no library-road match for the architecture (generic refusal)")]


def missing_piece(message: str) -> str:
    return next((piece for words, piece in MISSING if words in message), "other")


def why_not_library(folder: Path) -> str:
    """What the library road's test (transformers' own class flags and the config's fields) finds missing in a
    folder refused with the generic message: read from transformers and config.json, not from the loader."""
    import transformers

    config = json.loads((folder / "config.json").read_text())
    cls = getattr(transformers, (config.get("architectures") or [""])[0], None)
    nested = sorted(k for k, v in config.items() if isinstance(v, dict) and "patch_size" in v)
    if cls is not None and not getattr(cls, "_supports_attention_backend", False):
        return "its class does not declare transformers' attention interface (_supports_attention_backend False)"
    if "patch_size" not in config:
        return ("no patch_size at the config's top level" + (f" (it sits in {', '.join(nested)})" if nested else ""))
    return "no port and no library-road match for the architecture (generic refusal)"


def outcome(row: dict) -> str:
    if row["result"] in ("port", "library"):
        drawn = "draws" if row["draws"] else f"does not draw ({row['message']})"
        if row.get("left_out"):  # e.g. Depth Pro's patch encoder, over crops: named, not drawn
            drawn += f"; {len(row['left_out'])} layers left out: {next(iter(row['left_out'].values()))}"
        return f"{row['result']}: {drawn}"
    return f"{row['result']}: {row['message']}" + (f"  [FLAG: {row['flag']}]" if row["flag"] else "")


def totals(rows: list[dict]) -> dict:
    attention = [r for r in rows if r["attention"]]
    opened = [r for r in attention if r["result"] in ("port", "library")]
    return dict(families=len(rows), with_attention=len(attention), open=len(opened),
                open_port=sum(r["result"] == "port" for r in opened),
                open_library=sum(r["result"] == "library" for r in opened),
                open_and_draw=sum(bool(r["draws"]) for r in opened),
                refused=sum(r["result"] == "refused" for r in attention),
                build_failed=sum(r["result"] == "build failed" for r in attention),
                timed_out=sum(r["result"] == "timed out" for r in attention),
                no_attention=len(rows) - len(attention),
                named=sum(r["named"] for r in rows),
                named_open=sum(r["named"] and r["result"] in ("port", "library") for r in rows),
                flagged=sum(bool(r["flag"]) for r in rows))


def updated(earlier: dict, rows: list[dict], meta: dict, path: Path) -> tuple[list[dict], dict]:
    """``earlier``'s rows (a census.json) in their order, each family run now replaced by its new row (marked
    ``run: "update"``), and the meta saying both runs: the totals are then the whole census's, each row as its
    latest run found it."""
    new = {r["family"]: dict(r, run="update") for r in rows}
    merged = [new.pop(r["family"], r) for r in earlier["rows"]]
    merged += list(new.values())  # a family the earlier run did not have
    # an update of an update: its rows keep their mark, and the whole run they update is still the first one's
    base = earlier.get("updated_from") or dict(path=path.as_posix(), date=earlier.get("date"),
                                               code=earlier.get("code"), command=earlier.get("command"),
                                               versions=earlier.get("versions"))
    updates = [*earlier.get("updates", []), *([dict(date=earlier.get("date"), command=earlier.get("command"),
                                                    code=earlier.get("code"))] if "updated_from" in earlier else [])]
    return merged, dict(meta, updated_from=base, updates=updates)


def source() -> str:
    """The commit the census ran on, and whether vit/ had uncommitted edits (a shared checkout's)."""
    import subprocess

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "vit"], capture_output=True, text=True).stdout
    return f"{head or 'unknown'}" + (" with uncommitted edits under vit/" if dirty.strip() else "")


def versions() -> dict:
    import open_clip
    import timm
    import torch
    import transformers
    return dict(transformers=transformers.__version__, timm=timm.__version__, open_clip=open_clip.__version__,
                torch=torch.__version__, python=sys.version.split()[0])


def markdown(rows: list[dict], summary: dict, meta: dict) -> str:
    lines = [f"# Census of vision families (issue 91), {meta['date']}", "",
             f"Command: `{meta['command']}`", "", f"Code: {meta['code']}", "",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()), ""]
    earlier = meta.get("updated_from")
    if earlier:
        versions_then = ", ".join(f"{k} {v}" for k, v in (earlier["versions"] or {}).items())
        before = "".join(f" Earlier update: {u['date']}, command `{u['command']}`, code {u['code']}."
                         for u in meta.get("updates", []))
        lines += [f"Updated: the {sum(r.get('run') == 'update' for r in rows)} rows marked (updated) are this run's "
                  f"or an earlier update's; the others are `{earlier['path']}`'s, {earlier['date']} (command "
                  f"`{earlier['command']}`, code {earlier['code']}, versions {versions_then}).{before}", ""]
    lines += ["Each family built tiny with random weights in its own library, saved natively, opened by path with "
             "`vit.load(folder, device=\"cpu\")` in a fresh HOME / HF_HOME, offline; `draws` is "
             "`vit.explain(checkpoint, image, \"attention\")` returning a finite map. `build failed` is the "
             "census's own gap (the tiny config it made), not a refusal.", "",
             "Totals: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in summary.items()), "",
             "| family | library | attention | named | result | methods |", "|---|---|---|---|---|---|"]
    groups: dict[str, list[str]] = {}
    for r in rows:
        if r["result"] == "refused" and r["attention"]:
            groups.setdefault(r["missing"], []).append(r["family"])
    head = lines[:-2] + ["Refused families with attention, by what is missing: the message's words, or for "
                         "transformers' generic \"is not supported\" (which names no missing piece) what "
                         "transformers' own class flag (`_supports_attention_backend`) and config.json show:", ""]
    head += [f"- {piece} ({len(names)}): {', '.join(names)}" for piece, names in groups.items()] + [""]
    lines = head + lines[-2:]
    for r in rows:
        cell = outcome(r).replace("|", "\\|")
        lines.append(f"| {r['family']}{' (updated)' if r.get('run') == 'update' else ''} | {r['library']} | "
                     f"{'yes' if r['attention'] else 'no'} | "
                     f"{'yes' if r['named'] else ''} | {cell} | {', '.join(r['methods'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    global MAX_PARAMETERS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=RESULTS / "census.json", help="where the rows go")
    parser.add_argument("--markdown", type=Path, default=None, help="the table (default: beside --json)")
    parser.add_argument("--only", nargs="*", default=None, help="family names (or builds) to run, for a retry")
    parser.add_argument("--timeout", type=int, default=60, help="seconds per family")
    parser.add_argument("--max-parameters", type=float, default=MAX_PARAMETERS / 1e6,
                        help="millions of parameters past which a family is not built (its size said instead)")
    parser.add_argument("--update", type=Path, default=None,
                        help="an earlier census.json: its rows are kept for every family not run now (each run's "
                        "families replace theirs), and the table says which rows came from which run")
    parser.add_argument("--hand", action="store_true", help="the hand list only (issue 91's census), not every "
                        "registry entry")
    parser.add_argument("--list", action="store_true", help="print the families it would run and stop")
    parser.add_argument("--code", default=None, help="the code it runs, said in the results when this folder is "
                        "not a git checkout (a `git archive` export of a commit)")
    args = parser.parse_args(argv)
    MAX_PARAMETERS = int(args.max_parameters * 1e6)
    import warnings

    import torch
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    import transformers
    transformers.logging.set_verbosity_error()
    families = FAMILIES if args.hand else registry_families(FAMILIES, Family, hf, tm)
    chosen = [f for f in families if args.only is None or f.name in args.only or f.build in args.only
              or f.registry in args.only]
    if args.list:
        for f in chosen:
            print(f"{f.registry or '(hand list)':40} {f.library:12} {f.build}")
        print(f"{len(chosen)} families")
        return
    root = Path(tempfile.mkdtemp(prefix="census-"))
    rows = []
    for family in chosen:
        row = census_one(family, root, args.timeout)
        rows.append(row)
        print(f"{row['family'][:40]:40} {row['library']:12} {'yes' if row['attention'] else 'no ':3} "
              f"{row['seconds']:6.1f}s  {outcome(row)[:160]}", flush=True)
        if len(rows) % 25 == 0:  # the rows so far, should the run be stopped
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.with_suffix(".partial.json").write_text(json.dumps(rows, indent=1) + "\n")
    shutil.rmtree(root, ignore_errors=True)
    if _HOME is not None:
        shutil.rmtree(_HOME, ignore_errors=True)
    command = "python -m bench.census_families " + shlex.join(argv if argv is not None else sys.argv[1:])
    meta = dict(date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                command=command.strip(), code=args.code or source(), versions=versions())
    if args.update is not None:
        rows, meta = updated(json.loads(args.update.read_text()), rows, meta, args.update)
    summary = totals(rows)
    print("\nTotals: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in summary.items()))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(dict(meta, totals=summary, rows=rows), indent=1) + "\n")
    (args.markdown or args.json.with_suffix(".md")).write_text(markdown(rows, summary, meta))


if __name__ == "__main__":
    main()
