"""AttnLRP of a word's visual logit lens score on the VLM towers (issue 68, "Exact"): ``vit.explain_word(...,
"attnlrp")`` equals lxt's own AttnLRP rules patched into transformers' vision model, input x gradient summed over
each patch, to 1e-5 of the map's largest value.

The reference is the VLM transformers builds (random, σ 0.05 noise on every parameter, eager attention), saved whole
with its processor and a tiny tokenizer, and the same target: the projected image token over the patch (HF
``get_image_features``) dotted with the word's input embedding (the mean of its tokens' rows), or summed over every
token. lxt's rules are patched in as its ``efficient`` maps do: ``layer_norm_forward`` on every LayerNorm,
``rms_norm_forward`` on every RMSNorm (Qwen's and InternViT's q / k norms), ``gemma3_norm`` on Gemma 3's (its
``gemma3`` map), ``non_linear_forward`` (the identity rule)
on every activation module (its ``vit_torch`` map; the GELU of the projectors and of Qwen's merger included),
``gated_mlp_forward`` on Qwen's SwiGLU (its ``qwen2`` map), ``wrap_attention_forward`` on the modeling file's
``eager_attention_forward`` (the uniform rule on both matmuls); everything else (the patch embedding, the
projections, the layer scales, the pixel shuffle, the windows' reordering) keeps its plain gradient.

Rotary positions (Qwen2.5-VL's 2D RoPE): lxt has no rule for them. Its ``qwen2`` and ``llama`` maps patch the MLP,
the norms and the attention function and leave ``apply_rotary_pos_emb`` as it is: a linear map of q and k by cos and
sin of the positions, constants of the input, so it takes the epsilon rule (the plain gradient), and the uniform
rule divides the gradient of the rotated q and k inside the attention function. Ours does the same:
``Rules.attention_inputs`` receives q and k after the rotation and RoPE itself has no rule
(``vit.explain.methods.relevance``). Qwen2.5-VL's test below holds that on its rotated, windowed layers.

Reference: rachtibat/LRP-eXplains-Transformers @ f0434417, lxt/efficient/{rules,patches}.py (tests/reference/lxt);
its model maps lxt/efficient/models/{qwen2,llama,vit_torch}.py read there, gemma3.py copied.
"""

import numpy as np
import pytest
import torch
from PIL import Image
from test_visual_lens import (
    CLIP_TOWER,
    INTERNVL_TOWER,
    QWEN3_TEXT,
    QWEN3_VISION,
    QWEN_TEXT,
    SIGLIP_TOWER,
    TEXT,
    noisy,
    tiny_tokenizer,
)

from tests.reference.lxt.gemma3 import gemma3_norm
from tests.reference.lxt.patches import (
    gated_mlp_forward,
    layer_norm_forward,
    non_linear_forward,
    rms_norm_forward,
    wrap_attention_forward,
)

transformers = pytest.importorskip("transformers")
import vit  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

RTOL = 1e-5
WORD, WORD_IDS = "hot dog", [7, 5]  # two tokens: the mean of their embeddings, as explain_word scores it
# Qwen2.5-VL: windowed layers 0, 1 and 3 (RoPE in every one), layer 2 global; a 10 x 12 grid is cut by the 8 x 8
# windows into four of different sizes, which the window index reorders.
QWEN_VISION = dict(depth=4, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=24,
                   fullatt_block_indexes=[2])


def _build(kind: str):
    """transformers' VLM of ``kind`` and its image processor, random (seed 0, σ 0.05 noise), eager attention."""
    torch.manual_seed(0)
    if kind == "llava":
        config = transformers.LlavaConfig(vision_config=CLIP_TOWER, text_config=dict(TEXT, model_type="llama"),
                                          image_token_id=3)
        model = transformers.LlavaForConditionalGeneration(config)
        processor = transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    elif kind == "paligemma":
        config = transformers.PaliGemmaConfig(vision_config=SIGLIP_TOWER, text_config=dict(TEXT, model_type="gemma"),
                                              projection_dim=24, image_token_id=3)
        model = transformers.PaliGemmaForConditionalGeneration(config)
        processor = transformers.SiglipImageProcessor(size={"height": 32, "width": 32}, resample=3)
    elif kind == "gemma3":  # an 8 x 8 grid, average-pooled 4 x 4 into 2 x 2 image tokens
        config = transformers.Gemma3Config(vision_config=dict(SIGLIP_TOWER, image_size=64),
                                           text_config=dict(TEXT, model_type="gemma3_text"), mm_tokens_per_image=4,
                                           image_token_id=3)
        model = transformers.Gemma3ForConditionalGeneration(config)
        processor = transformers.Gemma3ImageProcessor(size={"height": 64, "width": 64})
    elif kind == "internvl":  # a 4 x 4 grid, pixel-shuffled 2 x 2 into 2 x 2 image tokens; q and k normed
        config = transformers.InternVLConfig(vision_config=INTERNVL_TOWER, text_config=dict(TEXT, model_type="qwen2"),
                                             image_token_id=3)
        model = transformers.InternVLForConditionalGeneration(config)
        processor = transformers.GotOcr2ImageProcessor(size={"height": 32, "width": 32})
    elif kind == "qwen3_vl":  # 16-px patches, global attention, a learned table resized to the grid plus 2D RoPE
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

        config = transformers.Qwen3VLConfig(vision_config=QWEN3_VISION, text_config=QWEN3_TEXT)
        model = transformers.Qwen3VLForConditionalGeneration(config)
        processor = Qwen2VLImageProcessor(patch_size=16, merge_size=2, min_pixels=64 * 64, max_pixels=32 * 32 * 64,
                                          image_mean=[0.5] * 3, image_std=[0.5] * 3)
    else:
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

        config = transformers.Qwen2_5_VLConfig(vision_config=QWEN_VISION, text_config=QWEN_TEXT)
        model = transformers.Qwen2_5_VLForConditionalGeneration(config)
        processor = Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=28 * 28 * 40)
    model = noisy(model)
    model.set_attn_implementation("eager")  # lxt wraps the eager function
    return model, processor


@pytest.fixture(scope="module")
def vlms(tmp_path_factory):
    """``kind -> (folder, model, processor)``, each built and saved on first use."""
    built = {}

    def get(kind: str):
        if kind not in built:
            model, processor = _build(kind)
            folder = tmp_path_factory.mktemp(kind)
            model.save_pretrained(folder, max_shard_size="20KB")
            processor.save_pretrained(folder)
            tiny_tokenizer().save_pretrained(folder)
            built[kind] = folder, model, processor
        return built[kind]

    return get


def picture(width: int, height: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(5).integers(0, 256, (height, width, 3), dtype=np.uint8))


def _activation_classes(model: torch.nn.Module) -> set[type]:
    """The element-wise activation modules the model holds (transformers' ACT2FN classes and torch's own)."""
    from transformers import activations

    return {type(m) for m in model.modules()
            if type(m).__module__ == activations.__name__ or isinstance(m, (torch.nn.GELU, torch.nn.SiLU))}


def lxt_relevance(model, modeling, pixel_values: torch.Tensor, word: torch.Tensor, unit: int | None, monkeypatch,
                  features=None) -> torch.Tensor:
    """lxt's AttnLRP of the word's score at image token ``unit`` (None: summed over every token) on transformers'
    VLM ``model``, whose attention lives in the module ``modeling``: input x gradient at ``pixel_values``, summed over
    the last axes but the first (Qwen's flattened patches) or over the channels (an image)."""
    norms = {type(m) for m in model.modules() if hasattr(m, "variance_epsilon")}  # transformers' RMSNorms
    with monkeypatch.context() as m:  # lxt patches classes; undone before ours runs
        m.setattr(torch.nn.LayerNorm, "forward", layer_norm_forward)
        for norm in norms:
            m.setattr(norm, "forward", rms_norm_forward)
        for norm in {type(m) for m in model.modules() if type(m).__name__ == "Gemma3RMSNorm"}:  # lxt's gemma3 map
            m.setattr(norm, "_norm", gemma3_norm)
        for act in _activation_classes(model):
            m.setattr(act, "original_forward", act.forward, raising=False)
            m.setattr(act, "forward", non_linear_forward)
        for mlp in {type(m) for m in model.modules() if hasattr(m, "gate_proj")}:  # Qwen's SwiGLU: lxt's qwen2 map
            m.setattr(mlp, "forward", gated_mlp_forward)
        m.setattr(modeling, "eager_attention_forward", wrap_attention_forward(modeling.eager_attention_forward))
        x = pixel_values.clone().requires_grad_(True)
        with torch.enable_grad():
            projected = features(x) if features is not None else model.get_image_features(pixel_values=x)
            scores = projected.pooler_output[0].reshape(-1, word.shape[0]) @ word  # (N,): the units row-major
            (scores.sum() if unit is None else scores[unit]).backward()
    return (x * x.grad).detach()


def _on_image(relevance: torch.Tensor, patch: int) -> np.ndarray:
    """``(1, C, H, W)`` input x gradient -> ``(H / patch, W / patch)``: summed over channels and each patch."""
    _, _, H, W = relevance.shape
    return relevance.sum(1)[0].reshape(H // patch, patch, W // patch, patch).sum((1, 3)).numpy()


def _word(model) -> torch.Tensor:
    return model.get_input_embeddings().weight[WORD_IDS].mean(0).detach()


def assert_equal_to_lxt(ours: np.ndarray, theirs: np.ndarray) -> None:
    scale = np.abs(theirs).max()
    assert ours.shape == theirs.shape and scale > 0
    np.testing.assert_allclose(ours / scale, theirs / scale, rtol=0, atol=RTOL)


@pytest.mark.parametrize("patch", [None, 6])
def test_attnlrp_of_a_word_on_llavas_clip_tower_equals_lxts_rules(vlms, monkeypatch, patch):
    """LLaVA's CLIP tower read at layer -2 without its CLS, QuickGELU in the tower, GELU in the projector."""
    from transformers.models.clip import modeling_clip

    folder, model, processor = vlms("llava")
    image = picture(90, 70)
    shown = vit.explain_word(vit.load(folder, device="cpu"), image, WORD, "attnlrp", patch=patch)
    pixels = processor(images=[image], return_tensors="pt")["pixel_values"]
    relevance = lxt_relevance(model, modeling_clip, pixels, _word(model), patch, monkeypatch)
    assert_equal_to_lxt(shown.map, _on_image(relevance, 8))


@pytest.mark.parametrize("patch", [None, 9])
def test_attnlrp_of_a_word_on_paligemmas_siglip_tower_equals_lxts_rules(vlms, monkeypatch, patch):
    """PaliGemma's SigLIP tower without its head (its post-layernorm kept), tanh GELU, the one linear projector."""
    from transformers.models.siglip import modeling_siglip

    folder, model, processor = vlms("paligemma")
    image = picture(90, 70)
    shown = vit.explain_word(vit.load(folder, device="cpu"), image, WORD, "attnlrp", patch=patch)
    pixels = processor(images=[image], return_tensors="pt")["pixel_values"]
    relevance = lxt_relevance(model, modeling_siglip, pixels, _word(model), patch, monkeypatch)
    assert_equal_to_lxt(shown.map, _on_image(relevance, 8))


@pytest.mark.parametrize("patch", [None, 6])
def test_attnlrp_of_a_word_on_internvls_tower_equals_lxts_rules(vlms, monkeypatch, patch):
    """InternViT with layer scale and q / k RMSNorms (lxt's ``rms_norm_forward``), the pixel shuffle, the projector's
    LayerNorm and GELU; patch 6 lies in the second 2 x 2 unit."""
    from transformers.models.internvl import modeling_internvl

    folder, model, processor = vlms("internvl")
    image = picture(90, 70)
    shown = vit.explain_word(vit.load(folder, device="cpu"), image, WORD, "attnlrp", patch=patch)
    pixels = processor(images=[image], return_tensors="pt")["pixel_values"]
    assert pixels.shape[0] == 1  # one tile: the image as the tower sees it
    unit = None if patch is None else 1
    relevance = lxt_relevance(model, modeling_internvl, pixels, _word(model), unit, monkeypatch)
    assert_equal_to_lxt(shown.map, _on_image(relevance, 8))


@pytest.mark.parametrize("patch", [None, 9 * 12 + 10])  # the last row's, in the bottom-right window (2 x 4 patches)
def test_attnlrp_of_a_word_on_qwen2_5_vls_windowed_rope_tower_equals_lxts_rules(vlms, monkeypatch, patch):
    """Qwen2.5-VL's tower: two identical frames (Conv3d), RMSNorms, SwiGLU (lxt's ``gated_mlp_forward``), 2D RoPE
    (no rule: see the module's docstring), 8 x 8 windows reordered by the window index and one global layer, the
    merger's RMSNorm and GELU. transformers' relevance is of its flattened patches, in merge-unit order."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl

    folder, model, processor = vlms("qwen2_5_vl")
    image = picture(168, 140)
    shown = vit.explain_word(vit.load(folder, device="cpu"), image, WORD, "attnlrp", patch=patch)
    inputs = processor(images=[image], return_tensors="pt")
    _, gh, gw = inputs["image_grid_thw"][0].tolist()
    assert (gh, gw) == (10, 12)  # windows of 8 x 8, 8 x 4, 2 x 8 and 2 x 4 patches
    unit = None if patch is None else (patch // gw // 2) * (gw // 2) + patch % gw // 2

    def features(x):
        return model.get_image_features(x, inputs["image_grid_thw"])

    relevance = lxt_relevance(model, modeling_qwen2_5_vl, inputs["pixel_values"], _word(model), unit, monkeypatch,
                              features)
    per_patch = relevance.sum(-1).reshape(gh // 2, gw // 2, 2, 2).permute(0, 2, 1, 3).reshape(gh, gw)  # row-major
    assert_equal_to_lxt(shown.map, per_patch.numpy())


@pytest.mark.parametrize("patch", [None, 45])  # row 5, column 5: the last row of units, the third unit across
def test_attnlrp_of_a_word_on_qwen3_vls_tower_equals_lxts_rules(vlms, monkeypatch, patch):
    """Qwen3-VL's tower: a learned position table interpolated to the 6 x 8 grid (a constant of the input) plus 2D
    RoPE, LayerNorms, tanh-GELU MLPs, the merger's LayerNorm and GELU; the DeepStack mergers run but are no target."""
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    folder, model, processor = vlms("qwen3_vl")
    image = picture(130, 100)
    shown = vit.explain_word(vit.load(folder, device="cpu"), image, WORD, "attnlrp", patch=patch)
    inputs = processor(images=[image], return_tensors="pt")
    _, gh, gw = inputs["image_grid_thw"][0].tolist()
    assert (gh, gw) == (6, 8)
    unit = None if patch is None else (patch // gw // 2) * (gw // 2) + patch % gw // 2

    def features(x):
        return model.get_image_features(x, inputs["image_grid_thw"])

    relevance = lxt_relevance(model, modeling_qwen3_vl, inputs["pixel_values"], _word(model), unit, monkeypatch,
                              features)
    per_patch = relevance.sum(-1).reshape(gh // 2, gw // 2, 2, 2).permute(0, 2, 1, 3).reshape(gh, gw)  # row-major
    assert_equal_to_lxt(shown.map, per_patch.numpy())


@pytest.mark.parametrize("patch", [None, 13])  # row 1, column 5: the second pooled token
def test_attnlrp_of_a_word_on_gemma3s_siglip_tower_equals_lxts_rules(vlms, monkeypatch, patch):
    """Gemma 3: the SigLIP tower, its 4 x 4 average pool, Gemma's RMSNorm (lxt's ``gemma3_norm``, its ``1 + weight``
    outside the rule) and the bias-free projection."""
    from transformers.models.siglip import modeling_siglip

    folder, model, processor = vlms("gemma3")
    image = picture(90, 70)
    shown = vit.explain_word(vit.load(folder, device="cpu"), image, WORD, "attnlrp", patch=patch)
    pixels = processor(images=[image], return_tensors="pt")["pixel_values"]
    unit = None if patch is None else 1
    relevance = lxt_relevance(model, modeling_siglip, pixels, _word(model), unit, monkeypatch)
    assert_equal_to_lxt(shown.map, _on_image(relevance, 8))
