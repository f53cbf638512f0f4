"""Training-free dense text maps of a CLIP (issue 63, item 3; MaskCLIP: issue 94, item 2): SCLIP, NACLIP, ClearCLIP,
CLIP Surgery and MaskCLIP, each equal to its authors' segmentor output before post-processing, on the same weights.

The references are the authors' code, kept verbatim in ``tests/reference`` (repository, commit and path in each
header): SCLIP's ``CLIPForSegmentation.forward_feature`` on its ``clip/model.py``; NACLIP's ``NACLIP.forward_feature``
on its ``clip/model.py`` with the segmentor's defaults (``set_params("reduced", "naclip", 5.)``); ClearCLIP's
``ClearCLIPSegmentation.forward_feature`` on its open_clip fork's ``VisionTransformer`` (``model_type="ClearCLIP"``,
``ignore_residual``); CLIP Surgery's ``CLIPSurgery.encode_image`` and ``clip_feature_surgery`` (its demo's similarity
before ``get_similarity_map``); MaskCLIP's mmseg ``VisionTransformer.forward`` and ``MaskClipHead.forward`` (their
head's output, before the segmentor's resize), run on open_clip's modules, and on transformers' for an HF CLIP
(``CLIPVisionModelWithProjection``, opened as a folder). Each is built from the state dict of an
open_clip model made here with random weights (open_clip's init plus Gaussian noise on every parameter): ViT-B/16 as
OpenAI released it (QuickGELU), the backbone the authors ship, and ViT-B/32, which none of the first four ships, each
``LAYERS`` deep (their widths, heads, patches and 224-px input; the methods change only the last block, CLIP
Surgery the last six, so two blocks before those still run unchanged on both sides). The
segmentors' ``forward_feature`` upsamples the patch-grid logits bilinearly to the input: ours are compared through
the same upsampling (MaskCLIP's head leaves them on the grid: compared there).
"""

import contextlib
import inspect
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from skipped_init import built_holding

from vit.explain.language import prompts
from vit.explain.methods import dense_clip
from vit.model import MODEL_ATTENTION, ViT, ViTConfig
from vit.model.layouts import neighbourhood_bias
from vit.sources.ports.families.import_clip import config_from_open_clip, state_dict_from_open_clip

open_clip = pytest.importorskip("open_clip")
pytestmark = pytest.mark.slow  # ViT-B towers: seconds each

TEXT_CFG = dict(context_length=16, vocab_size=49408, width=64, heads=1, layers=1)  # the text side is not read
# The image towers' depth: CLIP Surgery's six last blocks and two plain ones before them (12 built two 86M-parameter
# models for every test of the backbones, ~1/3 more CPU; at 12 "the last six" could not be told from "the last half")
LAYERS = 8
NOISE = 0.02  # on every parameter: biases, norms and the class token are zeros or ones at init
LABELS = 4


def open_clip_backbone(name: str, seed: int = 0) -> tuple[dict, dict]:
    """open_clip's ``name`` image tower (QuickGELU, as OpenAI's weights) with a tiny text tower, random weights:
    ``(state dict, model_cfg)``."""
    cfg = open_clip.get_model_config(name)
    model_cfg = dict(embed_dim=cfg["embed_dim"], vision_cfg=dict(cfg["vision_cfg"], layers=LAYERS), text_cfg=TEXT_CFG,
                     quick_gelu=True)
    torch.manual_seed(seed)
    model = open_clip.model.CLIP(**model_cfg)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * NOISE)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, model_cfg


def our_model(state: dict, model_cfg: dict) -> ViT:
    config = config_from_open_clip(state, model_cfg, None)
    return built_holding(lambda: ViT(config), state_dict_from_open_clip(state, config)).eval()


@pytest.fixture(scope="module", params=["ViT-B-16", "ViT-B-32"])
def backbone(request):
    state, model_cfg = open_clip_backbone(request.param)
    generator = torch.Generator().manual_seed(1)
    texts = F.normalize(torch.randn(LABELS, model_cfg["embed_dim"], generator=generator), dim=-1)
    images = torch.randn(1, 3, 224, 224, generator=generator)
    return state, model_cfg, our_model(state, model_cfg), texts, images


def openai_layout(module, state: dict) -> torch.nn.Module:
    """The authors' OpenAI-layout CLIP (their ``build_model``) holding ``state`` in float32."""
    # build_model converts to float16: load float32 again
    return built_holding(lambda: module.build_model(dict(state)).float(), state).eval()


def upsampled(maps: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    """The segmentors' own last step of ``forward_feature``: bilinear to the input's size."""
    return F.interpolate(maps, size=images.shape[-2:], mode="bilinear")


def sclip_segmentor(state: dict, texts: torch.Tensor) -> types.SimpleNamespace:
    """What SCLIP's ``CLIPForSegmentation.forward_feature`` reads of its segmentor: the authors' CLIP holding
    ``state``, the labels' normalised embeddings ``texts`` (n, E)."""
    from tests.reference.sclip import model as sclip

    return types.SimpleNamespace(net=openai_layout(sclip, state), query_features=texts)


def naclip_segmentor(state: dict, texts: torch.Tensor) -> types.SimpleNamespace:
    """What ``NACLIP.forward_feature`` reads: the authors' CLIP holding ``state``, its network set up with the
    segmentor's defaults, ``texts`` (n, E)."""
    from tests.reference.naclip import model as naclip_model
    from tests.reference.naclip import naclip

    net = openai_layout(naclip_model, state)
    defaults = inspect.signature(naclip.NACLIP.__init__).parameters  # as the segmentor sets its network up
    net.visual.set_params(*(defaults[name].default for name in ("arch", "attn_strategy", "gaussian_std")))
    return types.SimpleNamespace(net=net, query_features=texts, align_corners=False)  # as its __init__ sets


def clearclip_segmentor(state: dict, model_cfg: dict, texts: torch.Tensor) -> types.SimpleNamespace:
    """What ``ClearCLIPSegmentation.forward_feature`` reads: its open_clip fork's ``VisionTransformer`` holding
    ``state``'s image tower, the segmentor's defaults, ``texts`` (n, E)."""
    from tests.reference.clearclip.clearclip_segmentor import ClearCLIPSegmentation
    from tests.reference.clearclip.open_clip import model as clearclip_model
    from tests.reference.clearclip.open_clip import transformer

    vision = model_cfg["vision_cfg"]
    visual = built_holding(lambda: transformer.VisionTransformer(
        vision["image_size"], vision["patch_size"], vision["width"], vision["layers"], vision["width"] // 64, 4.0,
        output_dim=model_cfg["embed_dim"], act_layer=transformer.QuickGELU),
        {k[len("visual."):]: v for k, v in state.items() if k.startswith("visual.")})
    net = types.SimpleNamespace(visual=visual.eval())
    net.encode_image = types.MethodType(clearclip_model.CLIP.encode_image, net)
    defaults = inspect.signature(ClearCLIPSegmentation.__init__).parameters
    return types.SimpleNamespace(net=net, query_features=texts, clip_type="CLIP", model_type="ClearCLIP",
                                 ignore_residual=defaults["ignore_residual"].default, patch_size=visual.patch_size)


def test_sclip_is_the_authors_segmentor(backbone):
    from tests.reference.sclip import clip_segmentor

    state, _, model, texts, images = backbone
    with torch.no_grad():
        expected = clip_segmentor.CLIPForSegmentation.forward_feature(sclip_segmentor(state, texts), images)
    ours = dense_clip.dense_text_maps(model, images, texts, "sclip")  # (B, n, gh, gw); expected (B, n, H, W)
    torch.testing.assert_close(upsampled(ours, images), expected, rtol=1e-5, atol=1e-5)


def test_naclip_is_the_authors_segmentor(backbone):
    from tests.reference.naclip import naclip

    state, _, model, texts, images = backbone
    with torch.no_grad():
        expected = naclip.NACLIP.forward_feature(naclip_segmentor(state, texts), images)
    ours = dense_clip.dense_text_maps(model, images, texts, "naclip")
    torch.testing.assert_close(upsampled(ours, images), expected, rtol=1e-5, atol=1e-5)


def test_clearclip_is_the_authors_segmentor(backbone):
    from tests.reference.clearclip.clearclip_segmentor import ClearCLIPSegmentation

    state, model_cfg, model, texts, images = backbone
    with torch.no_grad():
        expected = ClearCLIPSegmentation.forward_feature(clearclip_segmentor(state, model_cfg, texts), images)
    ours = dense_clip.dense_text_maps(model, images, texts, "clearclip")
    torch.testing.assert_close(upsampled(ours, images), expected, rtol=1e-5, atol=1e-5)


def surgery_reference(state: dict, model_cfg: dict):
    from tests.reference.clip_surgery.clip_surgery_model import CLIPSurgery

    vision, text = model_cfg["vision_cfg"], model_cfg["text_cfg"]
    net = built_holding(lambda: CLIPSurgery(  # build_model's arguments from these weights
        model_cfg["embed_dim"], vision["image_size"], vision["layers"], vision["width"], vision["patch_size"],
        text["context_length"], text["vocab_size"], text["width"], text["width"] // 64, text["layers"]), state)
    return net.eval()


@pytest.fixture(scope="module")
def surgery_features(backbone):
    """The authors' ``CLIPSurgery.encode_image`` of the backbone's images, normalised as their demo's next line:
    once a backbone, for both label counts (the image side does not read the labels)."""
    state, model_cfg, _, _, images = backbone
    with torch.no_grad():
        features = surgery_reference(state, model_cfg).encode_image(images)
    return features / features.norm(dim=-1, keepdim=True)


@pytest.mark.parametrize("labels", [LABELS, 1])
def test_clip_surgery_is_the_authors_demo(backbone, surgery_features, labels):
    """Several labels: the feature surgery over the label set; one: the label minus the empty text (its demo's
    single-text case, ``redundant_feats``)."""
    from tests.reference.clip_surgery.feature_surgery import clip_feature_surgery

    _, model_cfg, model, texts, images = backbone
    texts = texts[:labels]
    blank = None if labels > 1 else F.normalize(torch.randn(model_cfg["embed_dim"]), dim=-1)
    features = surgery_features
    with torch.no_grad():
        similarity = clip_feature_surgery(features, texts, None if blank is None else blank[None])  # (1, T, n)
    grid = model.patch_grid(224, 224)
    expected = similarity[:, 1:, :].transpose(1, 2).reshape(1, labels, *grid)  # get_similarity_map's reshape
    ours = dense_clip.dense_text_maps(model, images, texts, "clipsurgery", blank)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)


class Stand(types.SimpleNamespace):
    """A namespace called as the mmcv module it stands for: its ``forward``."""

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


def maskclip_reference(visual, texts: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    """The authors' MaskCLIP on ``visual`` (``open_clip_visual`` or ``hf_visual``): their backbone's
    ``VisionTransformer.forward`` (``maskclip_vit16.py``: ``pre_norm``, ``final_norm``, ``return_qkv`` at the last
    layer) and ``MaskClipHead.forward`` (``vit=True``, the visual projection a 1x1 conv as ``convert_clip_weights.py``
    stores it), run on the library's own modules where mmcv's would be: ``(B, n, gh, gw)``, the head's output before
    the segmentor's resize."""
    from tests.reference.maskclip import maskclip_head, vit

    gh, gw = images.shape[2] // visual.patch_size, images.shape[3] // visual.patch_size
    layers = []
    for block in visual.blocks:
        layer = Stand(**block)
        layer.forward = types.MethodType(vit.TransformerEncoderLayer.forward, layer)
        layers.append(layer)
    last = len(layers) - 1
    backbone = types.SimpleNamespace(
        patch_embed=lambda x: (visual.conv1(x).flatten(2).transpose(1, 2), (gh, gw)),  # mmseg's PatchEmbed
        cls_token=visual.class_embedding[None, None], pos_embed=visual.positional_embedding[None],
        img_size=(gh * visual.patch_size, gw * visual.patch_size), patch_size=visual.patch_size,
        drop_after_pos=torch.nn.Identity(), with_cls_token=True, output_cls_token=False, pre_norm=True,
        norm0=visual.ln_pre, layers=layers, final_norm=True, norm1=visual.ln_post, out_indices=[last],
        return_qkv=[i == last for i in range(len(layers))], skip_last_attn=False)  # as the config sets them
    backbone._pos_embeding = types.MethodType(vit.VisionTransformer._pos_embeding, backbone)
    defaults = inspect.signature(maskclip_head.MaskClipHead.__init__).parameters
    proj = torch.nn.Conv2d(visual.proj.shape[0], visual.proj.shape[1], 1, bias=False)
    proj.weight.data = visual.proj.detach().t()[:, :, None, None]  # convert_clip_weights, load_visual_projs
    head = types.SimpleNamespace(vit=True, proj=proj, text_embeddings=texts, training=False,
                                 ks_thresh=defaults["ks_thresh"].default, pd_thresh=defaults["pd_thresh"].default,
                                 _transform_inputs=lambda inputs: inputs[-1])  # BaseDecodeHead: in_index=-1
    head.cls_seg = types.MethodType(maskclip_head.MaskClipHead.cls_seg, head)
    head.refine_output = types.MethodType(maskclip_head.MaskClipHead.refine_output, head)
    with torch.no_grad():
        return maskclip_head.MaskClipHead.forward(head, vit.VisionTransformer.forward(backbone, images))


def open_clip_visual(state: dict, model_cfg: dict) -> types.SimpleNamespace:
    """open_clip's image tower holding ``state``, as ``maskclip_reference`` reads it: each layer's norms, its
    ``nn.MultiheadAttention`` (mmcv's wraps the same module: ``identity + attn(q, q, q)``) and its MLP (mmcv's FFN:
    ``identity + layers(x)``)."""
    clip = built_holding(lambda: open_clip.model.CLIP(**model_cfg), state)
    visual = clip.eval().visual

    def attention(block):
        def forward(query, identity):
            q = query if block.attn.batch_first else query.transpose(0, 1)
            out = block.attn(q, q, q, need_weights=False)[0]
            return identity + (out if block.attn.batch_first else out.transpose(0, 1))
        return Stand(attn=block.attn, forward=forward)

    blocks = [dict(norm1=block.ln_1, norm2=block.ln_2, attn=attention(block),
                   ffn=lambda x, identity, mlp=block.mlp: identity + mlp(x))
              for block in visual.transformer.resblocks]
    return types.SimpleNamespace(conv1=visual.conv1, class_embedding=visual.class_embedding,
                                 positional_embedding=visual.positional_embedding, ln_pre=visual.ln_pre,
                                 blocks=blocks, ln_post=visual.ln_post, proj=visual.proj,
                                 patch_size=visual.patch_size[0])


def hf_visual(model) -> types.SimpleNamespace:
    """transformers' ``CLIPVisionModelWithProjection`` as ``maskclip_reference`` reads it: each layer's own
    attention for the model's path; for the value path, its q, k, v projections packed as the OpenAI layout's
    ``in_proj`` (transformers' conversion of OpenAI's weights, inverted) and its ``out_proj``."""
    vm = model.vision_model

    def attention(layer):
        a = layer.self_attn
        packed = types.SimpleNamespace(
            in_proj_weight=torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
            in_proj_bias=torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]), out_proj=a.out_proj)
        return Stand(attn=packed, forward=lambda query, identity: identity + a(query)[0])

    blocks = [dict(norm1=layer.layer_norm1, norm2=layer.layer_norm2, attn=attention(layer),
                   ffn=lambda x, identity, mlp=layer.mlp: identity + mlp(x))
              for layer in vm.encoder.layers]
    return types.SimpleNamespace(conv1=vm.embeddings.patch_embedding, class_embedding=vm.embeddings.class_embedding,
                                 positional_embedding=vm.embeddings.position_embedding.weight,
                                 ln_pre=vm.pre_layrnorm, blocks=blocks, ln_post=vm.post_layernorm,
                                 proj=model.visual_projection.weight.t(), patch_size=vm.config.patch_size)


def test_maskclip_is_the_authors_backbone_and_head(backbone):
    state, model_cfg, model, texts, images = backbone
    expected = maskclip_reference(open_clip_visual(state, model_cfg), texts, images)  # (1, n, gh, gw)
    ours = dense_clip.dense_text_maps(model, images, texts, "maskclip")
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
    assert (ours - dense_clip.dense_text_maps(model, images, texts, "sclip")).abs().max() > 1e-3  # its own change


def test_maskclip_on_a_non_square_grid_is_the_authors_row_major_grid():
    """An open_clip tower trained at 64 x 96 (a 4 x 6 grid): the authors' ``reshape(B, h, w, C)`` of the tokens is
    the map; read column-major it would not be."""
    cfg = open_clip.get_model_config("ViT-B-16")
    vision = dict(cfg["vision_cfg"], image_size=(64, 96), layers=2)
    model_cfg = dict(embed_dim=cfg["embed_dim"], vision_cfg=vision, text_cfg=TEXT_CFG, quick_gelu=True)
    torch.manual_seed(0)
    clip = open_clip.model.CLIP(**model_cfg)
    with torch.no_grad():
        for p in clip.parameters():
            p.add_(torch.randn_like(p) * NOISE)
    state = {k: v.detach().clone() for k, v in clip.state_dict().items()}
    model = our_model(state, model_cfg)
    texts = F.normalize(torch.randn(LABELS, cfg["embed_dim"]), dim=-1)
    images = torch.randn(1, 3, 64, 96)
    expected = maskclip_reference(open_clip_visual(state, model_cfg), texts, images)  # (1, n, 4, 6)
    ours = dense_clip.dense_text_maps(model, images, texts, "maskclip")
    assert ours.shape == expected.shape == (1, LABELS, 4, 6)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
    transposed = ours.flatten(2).reshape(1, LABELS, 6, 4).transpose(2, 3)  # the tokens read column-major
    assert (transposed - expected).abs().max() > 1e-2


def test_maskclip_on_an_hf_clip_is_the_authors_backbone_and_head(tmp_path):
    """The HF layout (separate q, k, v projections, ``visual_projection``), opened as a checkpoint folder."""
    import transformers

    from vit.sources.open import open_source

    config = transformers.CLIPVisionConfig(image_size=64, patch_size=16, hidden_size=64, intermediate_size=128,
                                           num_hidden_layers=2, num_attention_heads=2, projection_dim=32)
    torch.manual_seed(0)
    model = transformers.CLIPVisionModelWithProjection(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * NOISE)
    model.save_pretrained(tmp_path / "clip")
    ours = open_source(tmp_path / "clip").model
    texts = F.normalize(torch.randn(LABELS, 32), dim=-1)
    images = torch.randn(1, 3, 64, 64)
    expected = maskclip_reference(hf_visual(model.eval()), texts, images)  # (1, n, 4, 4)
    torch.testing.assert_close(dense_clip.dense_text_maps(ours, images, texts, "maskclip"), expected,
                               rtol=1e-5, atol=1e-5)


# --- the engine's variants, on a tiny CLIP-like tower and a non-square grid ---------------------------------------

CLIP_LIKE = dict(image_size=32, patch_size=8, num_classes=0, hidden_size=32, num_layers=6, num_heads=2, mlp_size=64,
                 layer_norm_eps=1e-5, pre_norm=True, activation="quick_gelu", projection_dim=16)


def tiny_clip(**options) -> ViT:
    torch.manual_seed(0)
    model = ViT(ViTConfig(**{**CLIP_LIKE, **options}))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.1)
    return model.eval()


@pytest.mark.parametrize("std", [dense_clip.NACLIP_STD, 1.5])
def test_the_neighbourhood_is_naclips_attention_addition_on_a_non_square_grid(std):
    from tests.reference.naclip.model import VisionTransformer

    gh, gw = 3, 5
    window = VisionTransformer.gaussian_window(2 * gh - 1, 2 * gw - 1, std=std)
    expected = VisionTransformer.get_attention_addition(gh, gw, window)  # (1 + 15, 1 + 15), CLS's row and column 0
    torch.testing.assert_close(neighbourhood_bias((gh, gw), 1, std), expected, rtol=1e-6, atol=1e-6)
    rows = torch.arange(4, 11)  # a query chunk forms its own rows
    torch.testing.assert_close(neighbourhood_bias((gh, gw), 1, std, rows), expected[4:11], rtol=1e-6, atol=1e-6)


def test_the_models_own_variant_is_the_models_forward():
    model = tiny_clip()
    x = model.embed(torch.randn(2, 3, 24, 40))
    with torch.no_grad():
        plain, _ = model.run_blocks(x, (3, 5))
        variant, _ = model.run_blocks(x, (3, 5), variant=MODEL_ATTENTION)
    torch.testing.assert_close(variant, plain, rtol=0, atol=0)


VARIANTS = {**dense_clip.VARIANTS, "surgery branch": dense_clip.SURGERY_BRANCH}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_a_variants_attention_is_its_formula_on_both_paths(name):
    """The explicit path's probabilities are the sum over the pairs of ``softmax(a bᵀ / sqrt(hd) + neighbourhood)``
    (NACLIP's addition from its authors' functions) from the block's own q, k, v (no pairs, MaskCLIP's: the
    identity), and the fused path (no T x T
    tensor) gives the same block output, with or without its residual and MLP."""
    from tests.reference.naclip.model import VisionTransformer

    model, variant, grid = tiny_clip(), VARIANTS[name], (3, 5)
    last = f"blocks.{len(model.blocks) - 1}."
    x = model.embed(torch.randn(2, 3, 24, 40))
    with torch.no_grad():
        fused, _ = model.run_blocks(x, grid, variant=variant)
        explicit, attentions = model.run_blocks(x, grid, output_attentions=True, variant=variant)
        cache: dict = {}
        keep = [(last + point, lambda t, hook: cache.__setitem__(hook.name, t))
                for point in ("attn.hook_q", "attn.hook_k", "attn.hook_v", "hook_resid_pre", "hook_attn_out")]
        with model.hooks(keep):
            model.run_blocks(x, grid, variant=variant)
    named = {letter: cache[last + f"attn.hook_{letter}"] for letter in "qkv"}
    addition = 0.0
    if variant.neighbourhood:
        window = VisionTransformer.gaussian_window(2 * grid[0] - 1, 2 * grid[1] - 1, std=variant.neighbourhood)
        addition = VisionTransformer.get_attention_addition(*grid, window)
    scale = named["q"].shape[-1] ** -0.5
    expected = sum(((named[a] @ named[b].transpose(-2, -1)) * scale + addition).softmax(dim=-1)
                   for a, b in variant.pairs)
    if not variant.pairs:  # MaskCLIP: each token attends to itself alone
        expected = torch.eye(x.shape[1]).expand(*named["q"].shape[:2], -1, -1)
    torch.testing.assert_close(attentions[-1], expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused, explicit, rtol=1e-5, atol=1e-5)
    branch = cache[last + "hook_attn_out"]
    if not variant.residual and not variant.mlp:  # the block's output is its attention branch alone
        torch.testing.assert_close(fused, branch, rtol=0, atol=0)
    else:
        assert (fused - cache[last + "hook_resid_pre"] - branch).abs().max() > 1e-3  # its MLP ran on top


def test_clip_surgery_forms_each_blocks_q_k_v_once(monkeypatch):
    """Issue 116, item 12: the surgery branch and the model's own block read the same stream, and its authors'
    ``Attention`` forms q, k, v once for both paths; ours formed them twice in each of the last six blocks. Counted
    where they are formed; the maps equal the authors' (test_clip_surgery_is_the_authors_demo) and the run without
    the sharing, to rounding."""
    from vit.model.blocks import Attention

    model, formed, real = tiny_clip(num_layers=7), [], Attention.queries_keys_values
    images = torch.randn(1, 3, 24, 40, generator=torch.Generator().manual_seed(1))
    monkeypatch.setattr(Attention, "queries_keys_values", lambda self, *a: formed.append(self) or real(self, *a))
    shared = dense_clip.dense_features(model, images, "clipsurgery")
    assert len(formed) == len(model.blocks) and len(set(map(id, formed))) == len(model.blocks)
    formed.clear()
    monkeypatch.setattr(dense_clip, "qkv_once", lambda attention: contextlib.nullcontext())  # each path its own
    apart = dense_clip.dense_features(model, images, "clipsurgery")
    assert len(formed) == len(model.blocks) + dense_clip.SURGERY_BLOCKS
    torch.testing.assert_close(shared, apart, rtol=0, atol=0)


# --- where a method is not defined: one line ----------------------------------------------------------------------

@pytest.mark.parametrize(("options", "method", "words"), [
    (dict(class_token=False, pooling="map", projection_dim=0), "sclip", "attention head"),  # SigLIP
    (dict(projection_dim=0), "naclip", "projection"),  # an image tower without the joint embedding
    (dict(class_token=False, pooling="avg", window_size=2, global_layers=(5,)), "clearclip", "windows"),  # SAM-like
    (dict(num_layers=3), "clipsurgery", "last 6 blocks"),
    (dict(class_token=False, pooling="avg"), "clipsurgery", "CLS"),
])
def test_a_model_a_method_is_not_defined_for_is_refused_in_one_line(options, method, words):
    model = tiny_clip(**options)
    assert words in dense_clip.refusal(model, method)
    with pytest.raises(dense_clip.DenseMapError) as error:
        dense_clip.dense_text_maps(model, torch.randn(1, 3, 32, 32), torch.randn(2, 16), method)
    assert words in str(error.value) and "\n" not in str(error.value)


def test_a_windowed_block_refuses_a_variant_whatever_calls_it():
    model = tiny_clip(class_token=False, pooling="avg", window_size=2)
    with pytest.raises(ValueError, match="changes a global block"):
        model.run_blocks(model.embed(torch.randn(1, 3, 32, 32)), (4, 4), variant=dense_clip.VARIANTS["sclip"])


def test_feature_surgery_of_one_label_needs_the_empty_texts_embedding():
    with pytest.raises(dense_clip.DenseMapError, match="two labels or more"):
        dense_clip.feature_surgery(torch.randn(1, 5, 16), torch.randn(1, 16))


# --- under "Ask in words": vit.ask, the prompt maps, the labels' constants ----------------------------------------

@pytest.fixture(scope="module")
def clip_checkpoint(tmp_path_factory):
    """A tiny random CLIP with six blocks (CLIP Surgery changes the last six) saved as open_clip saves it."""
    from test_prompts import save_open_clip

    from vit.sources.open import open_source

    _, folder = save_open_clip(tmp_path_factory.mktemp("clip") / "open_clip", layers=6)
    return open_source(folder)


def noise_image(width=40, height=32, seed=3):
    array = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(array)


WORDS = ["a dog", "a cat", "a red ball"]


@pytest.mark.parametrize("method", list(dense_clip.METHODS))
def test_vit_ask_maps_each_label_from_the_dense_maps_of_all(clip_checkpoint, method):
    import vit
    from vit.explain.language import words
    from vit.sources.vlm.text_tower import open_text_tower

    image = noise_image()
    assert method in vit.ask_methods(clip_checkpoint)
    answer = vit.ask(clip_checkpoint, image, WORDS, "{}")
    x = words.model_input(clip_checkpoint, image)
    texts = open_text_tower(clip_checkpoint).encode(WORDS)
    expected = dense_clip.dense_text_maps(clip_checkpoint.model, x, texts, method)[0]  # (3, gh, gw)
    for i, label in enumerate(WORDS):
        explanation = answer.explain(label, method)
        assert explanation.map.shape == expected.shape[1:] and dense_clip.METHODS[method] in explanation.description
        np.testing.assert_allclose(explanation.map, expected[i].numpy(), rtol=1e-5, atol=1e-6)
    every = prompts.prompt_maps(clip_checkpoint.model, x, answer.answer.prompts, method)
    torch.testing.assert_close(every, expected, rtol=1e-5, atol=1e-6)


def test_one_label_is_weighed_against_the_empty_text_in_its_template(clip_checkpoint):
    import vit
    from vit.explain.language import words
    from vit.sources.vlm.text_tower import open_text_tower

    image = noise_image()
    answer = vit.ask(clip_checkpoint, image, ["a dog"])  # the default template, "a photo of a {}."
    blank = open_text_tower(clip_checkpoint).encode(["a photo of a ."])[0]  # demo.py: template.format("")
    torch.testing.assert_close(answer.answer.prompts.blank, blank)
    x = words.model_input(clip_checkpoint, image)
    expected = dense_clip.dense_text_maps(clip_checkpoint.model, x, answer.answer.prompts.embeddings, "clipsurgery",
                                          blank)[0, 0]
    np.testing.assert_allclose(answer.explain("a dog", "clipsurgery").map, expected.numpy(), rtol=1e-5, atol=1e-6)
    assert vit.ask(clip_checkpoint, image, ["a dog", "a cat"]).answer.prompts.blank is None  # the label set instead


def test_a_siglip_is_offered_no_dense_map_and_refused_in_one_line():
    model = tiny_clip(class_token=False, pooling="map", projection_dim=0)
    assert not set(prompts.methods_for(model)) & set(dense_clip.METHODS)
    asked = prompts.Prompts(["a", "b"], ["{}"], F.normalize(torch.randn(2, 32), dim=-1), 10.0, -10.0, "sigmoid")
    with pytest.raises(prompts.PromptError, match="attention head") as error:
        prompts.prompt_map(model, torch.randn(1, 3, 32, 32), asked, 0, "sclip")
    assert "\n" not in str(error.value)


def test_vit_explain_points_a_dense_map_to_vit_ask(clip_checkpoint):
    import vit

    with pytest.raises(ValueError, match=r"vit.ask\(checkpoint, image, labels\).explain\(label, 'naclip'\)"):
        vit.explain(clip_checkpoint, noise_image(), "naclip")
    assert "vit.ask" in vit.methods()["clearclip"]


@pytest.mark.parametrize("method", list(dense_clip.METHODS))
def test_a_dense_map_forms_no_token_by_token_attention(monkeypatch, method):
    """Every variant runs on the fused path, NACLIP's neighbourhood formed a query chunk at a time: no softmax over a
    (T, T) tensor, so a dense map holds what a forward holds (the explorer's analysis bound covers it)."""
    model, shapes = tiny_clip(), []
    softmax = torch.Tensor.softmax

    def recorded(self, *args, **kwargs):
        shapes.append(self.shape)
        return softmax(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "softmax", recorded)
    dense_clip.dense_text_maps(model, torch.randn(1, 3, 64, 48), F.normalize(torch.randn(3, 16), dim=-1), method)
    T = 1 + 8 * 6
    assert not [shape for shape in shapes if tuple(shape[-2:]) == (T, T)]
