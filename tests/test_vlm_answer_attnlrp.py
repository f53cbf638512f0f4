"""AttnLRP of a VLM's answer token to the pixels, through the language model, the projector and the tower (issue 80,
item 2c): ``VLMAnswer.relevance(i, method="attnlrp")`` equals lxt's rules patched into transformers' whole model.

The reference is transformers alone: the eager model opened from the same folder (``saved_whole``'s tiny random
VLMs), its processor's inputs for the question and the answer's first ``i`` tokens (extended as ``generate`` extends
them), and lxt's efficient rules patched in as lxt does (rachtibat/LRP-eXplains-Transformers @ f0434417,
``lxt/efficient``, vendored in tests/reference/lxt): in the language model exactly what its model map for that
language model patches — ``llama`` for LLaVA's LlamaMLP and LlamaRMSNorm, ``qwen2`` for Qwen2.5-VL's and InternVL's
Qwen2MLP and Qwen2RMSNorm (``gated_mlp_forward``, ``rms_norm_forward``), ``gemma3`` for Gemma 3's (``gemma3_norm`` on
``Gemma3RMSNorm._norm``; lxt has no map for Gemma and Gemma 2, whose norms are Gemma 3's: PaliGemma's take it
too), each ``patch_attention`` (``wrap_attention_forward`` on the modelling file's eager
attention) — and in the tower and the projector what ``test_vlm_attnlrp_lxt`` patches there (``layer_norm_forward``,
``rms_norm_forward``, ``gated_mlp_forward``, ``non_linear_forward`` on the activations, the wrapped eager attention).
``autograd`` of the answer token's logit at the last position to ``pixel_values``, input x gradient summed over the
channels and each patch, placed on the patch grid by hand, equals ours to 1e-5 of the map's largest value.
"""

import json
import sys

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_vlm_answer import (  # noqa: E402,F401
    NEW_TOKENS,
    PAN_AND_SCAN,
    QUESTION,
    gemma3_pas,
    idefics3_tiles,
    internvl_tiles,
    llava_next,
    llava_onevision,
    picture,
    saved_whole,
)

import vit  # noqa: E402
from tests.reference.lxt.gemma3 import gemma3_norm  # noqa: E402
from tests.reference.lxt.patches import (  # noqa: E402
    gated_mlp_forward,
    layer_norm_forward,
    non_linear_forward,
    rms_norm_forward,
    wrap_attention_forward,
)
from tests.reference.lxt.rules import divide_gradient, identity_rule_implicit  # noqa: E402
from vit.costs.bounds import TooManyTokens  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

RTOL = 1e-5
KINDS = ["llava", "qwen2_5_vl", "internvl", "gemma3", "qwen3_vl", "paligemma", "paligemma2", "glm4v", "mistral3",
         "pixtral"]
LM_RULES = ("rms_norm", "gated_mlp", "attention")  # what lxt's llama / qwen2 / gemma3 maps patch in the LM


@pytest.fixture(scope="module")
def vlms(tmp_path_factory):
    return saved_whole(tmp_path_factory, KINDS)


@pytest.fixture(scope="module")
def asked(vlms):
    return {kind: vit.ask_vlm(vit.open_vlm(folder), picture(), QUESTION, max_new_tokens=NEW_TOKENS)
            for kind, folder in vlms.items()}


def _eager(folder):
    config = json.loads((folder / "config.json").read_text())
    model = getattr(transformers, config["architectures"][0]).from_pretrained(folder, attn_implementation="eager")
    return model.eval(), transformers.AutoProcessor.from_pretrained(folder)


def _inputs(model, processor, tokens: list[int], i: int, image=None, **images_kwargs) -> dict:
    """The processor's inputs for ``picture()`` and the question, the answer's first ``i`` tokens appended and the
    rest extended as ``generate`` extends them (``test_vlm_relevance.reference``'s)."""
    if processor.chat_template is None:
        text = processor.image_token + QUESTION
    else:
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = dict(processor(images=[image or picture()], text=text, return_tensors="pt", **images_kwargs))
    inputs.pop("labels", None)
    new = torch.tensor([tokens[:i]], dtype=torch.long)
    inputs["input_ids"] = torch.cat([inputs["input_ids"], new], -1)
    inputs["attention_mask"] = torch.cat([inputs["attention_mask"], torch.ones_like(new)], -1)
    if "token_type_ids" in inputs:
        suffix = 1 if model.config.model_type == "paligemma" else 0
        inputs["token_type_ids"] = torch.cat([inputs["token_type_ids"], torch.full_like(new, suffix)], -1)
    if "mm_token_type_ids" in inputs:
        inputs["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(new)], -1)
    return inputs


def fused_gated_mlp_forward(self, x):
    """lxt's ``gated_mlp_forward`` on an MLP whose gate and up projections are one linear split in halves
    (GLM-4.1V's ``Glm4vTextMLP``: ``gate_up_proj``, ``activation_fn``; lxt has no map for it): lxt's own rule
    functions, in its order."""
    gate_out, up = self.gate_up_proj(x).chunk(2, dim=-1)
    gate_out = identity_rule_implicit(self.activation_fn, gate_out)
    weighted = divide_gradient(gate_out * up, 2)
    return self.down_proj(weighted)


def _patch_lxt(m, model, drop: str | None = None) -> None:
    """lxt's rules on ``model``'s classes through the monkeypatch context ``m``: the language model's as lxt's map
    for it patches them (its MLP, its RMSNorm, its modelling file's attention), the tower's and the projector's as
    ``test_vlm_attnlrp_lxt`` does; ``drop`` one of ``LM_RULES``: that language-model rule left out (its plain
    gradient)."""
    from transformers import activations

    lm = getattr(model.model, "language_model", None) or model.model.text_model  # Idefics3's: text_model
    lm_mlp, lm_norm = type(lm.layers[0].mlp), type(lm.norm)
    lm_modeling = sys.modules[type(lm.layers[0].self_attn).__module__]
    if drop != "gated_mlp":
        m.setattr(lm_mlp, "forward", fused_gated_mlp_forward if hasattr(lm.layers[0].mlp, "gate_up_proj")
                  else gated_mlp_forward)
    if drop != "rms_norm":
        if hasattr(lm_norm, "_norm"):  # lxt's gemma3 map (Gemma's and Gemma 2's norms are the same)
            m.setattr(lm_norm, "_norm", gemma3_norm)
        else:  # lxt's llama and qwen2 maps
            m.setattr(lm_norm, "forward", rms_norm_forward)
    lm_modules = set(lm.modules())
    outside = [module for module in model.modules() if module not in lm_modules]  # the tower, the projector
    # lxt's layer_norm_forward keeps its input's strides where torch's LayerNorm returns a contiguous tensor: the same
    # values, made contiguous as the module's, or Idefics3's pixel shuffle (a .view of its transposed patch
    # embedding's stream) cannot read them
    m.setattr(torch.nn.LayerNorm, "forward", lambda self, x: layer_norm_forward(self, x).contiguous())
    for cls in {type(x) for x in outside if hasattr(x, "variance_epsilon")} - {lm_norm}:
        m.setattr(cls, "forward", rms_norm_forward)
    for cls in {type(x) for x in outside if hasattr(x, "_norm")} - {lm_norm}:
        m.setattr(cls, "_norm", gemma3_norm)
    for cls in {type(x) for x in outside if hasattr(x, "gate_proj")} - {lm_mlp}:
        m.setattr(cls, "forward", gated_mlp_forward)
    for cls in {type(x) for x in outside
                if type(x).__module__ == activations.__name__ or isinstance(x, (torch.nn.GELU, torch.nn.SiLU))}:
        m.setattr(cls, "original_forward", cls.forward, raising=False)
        m.setattr(cls, "forward", non_linear_forward)
    towers = {sys.modules[type(x).__module__] for x in outside} - {lm_modeling}
    for modeling in [*towers, *([lm_modeling] if drop != "attention" else [])]:
        if hasattr(modeling, "eager_attention_forward"):
            m.setattr(modeling, "eager_attention_forward", wrap_attention_forward(modeling.eager_attention_forward))


def lxt_relevance(folder, tokens: list[int], i: int, monkeypatch, drop: str | None = None, image=None,
                  **images_kwargs) -> torch.Tensor:
    """lxt's AttnLRP of answer token ``i``'s logit on transformers' eager model: input x gradient at
    ``pixel_values`` (their shape); ``image`` (``picture()``) and the processor's ``images_kwargs`` as ``_inputs``
    takes them."""
    model, processor = _eager(folder)
    inputs = _inputs(model, processor, tokens, i, image, **images_kwargs)
    x = inputs["pixel_values"].clone().requires_grad_(True)
    inputs["pixel_values"] = x
    with monkeypatch.context() as m, torch.enable_grad():
        _patch_lxt(m, model, drop)
        logits = model(**inputs, use_cache=False).logits
        logits[0, -1, tokens[i]].backward()
    return (x * x.grad).detach()


def on_patches(relevance: torch.Tensor, kind: str, grid: tuple[int, int]) -> np.ndarray:
    """Input x gradient -> ``grid``, by hand: an image's channels and each patch summed; Qwen's and GLM-4.1V's
    flattened patches (merge unit after merge unit, 2 x 2 patches each) summed and laid out row-major."""
    gh, gw = grid
    if kind.startswith(("qwen", "glm")):
        return relevance.sum(-1).reshape(gh // 2, gw // 2, 2, 2).permute(0, 2, 1, 3).reshape(gh, gw).numpy()
    _, _, H, W = relevance.shape
    return relevance.sum(1)[0].reshape(gh, H // gh, gw, W // gw).sum((1, 3)).numpy()


def assert_equal_to_lxt(ours: np.ndarray, theirs: np.ndarray) -> None:
    scale = np.abs(theirs).max()
    assert ours.shape == theirs.shape and scale > 0
    np.testing.assert_allclose(ours / scale, theirs / scale, rtol=0, atol=RTOL)


@pytest.mark.parametrize("kind", KINDS)
def test_attnlrp_of_an_answer_token_equals_lxts_rules_on_transformers_whole_model(vlms, asked, monkeypatch, kind):
    """LLaVA (CLIP, GELU projector, LLaMA), Qwen2.5-VL (windowed RoPE tower with SwiGLU, the merger, Qwen2 with
    M-RoPE), Qwen3-VL (DeepStack, interleaved M-RoPE, q / k norms), InternVL (q / k norms, pixel shuffle, Qwen2),
    Gemma 3 (SigLIP, pooled tokens, Gemma 3's norms, sliding-window layers), PaliGemma and PaliGemma 2 (Gemma and
    Gemma 2, whose norms take the rule of lxt's gemma3 map; Gemma 2's soft caps): the first answer token and the
    last."""
    answer = asked[kind]
    for i in (0, NEW_TOKENS - 1):
        theirs = on_patches(lxt_relevance(vlms[kind], list(answer.tokens), i, monkeypatch), kind, answer.grid)
        assert_equal_to_lxt(answer.relevance(i, method="attnlrp"), theirs)


@pytest.mark.parametrize("drop", LM_RULES)
@pytest.mark.parametrize("kind", ["llava", "qwen2_5_vl"])
def test_each_language_model_rule_makes_a_difference(vlms, asked, monkeypatch, kind, drop):
    """lxt's reference with one of its language-model rules left out (its plain gradient) is another map: the
    equality above holds the language model's rules, not the tower's alone."""
    answer = asked[kind]
    theirs = on_patches(lxt_relevance(vlms[kind], list(answer.tokens), 1, monkeypatch, drop), kind, answer.grid)
    ours = answer.relevance(1, method="attnlrp")
    scale = np.abs(theirs).max()
    assert np.abs(ours - theirs).max() > 100 * RTOL * scale


def test_internvls_attnlrp_is_placed_where_the_processor_cut_the_tiles(internvl_tiles, monkeypatch):  # noqa: F811
    """InternVL's 3 x 2 tiles and thumbnail: each tile's patch sums on the canvas where its pixels came from
    (``where_tiles_are``), the thumbnail's as the overview."""
    from test_vlm_answer import where_tiles_are

    image = picture()
    answer = vit.ask_vlm(vit.open_vlm(internvl_tiles), image, QUESTION, max_new_tokens=NEW_TOKENS)
    relevance = lxt_relevance(internvl_tiles, list(answer.tokens), 2, monkeypatch)  # (7, 3, 32, 32)
    tiles = relevance.sum(1).reshape(-1, 4, 8, 4, 8).sum((2, 4)).numpy()  # (7, 4, 4)
    canvas = np.zeros(answer.grid, dtype=np.float32)
    for tile, (r, c) in zip(tiles, where_tiles_are(internvl_tiles, image), strict=False):
        canvas[r * 4:(r + 1) * 4, c * 4:(c + 1) * 4] = tile
    assert answer.grid == (8, 12)
    assert_equal_to_lxt(answer.relevance(2, method="attnlrp"), canvas)
    assert_equal_to_lxt(answer.relevance(2, method="attnlrp", overview=True), tiles[-1])


def test_idefics3s_attnlrp_is_placed_where_the_processor_cut_the_tiles(idefics3_tiles, monkeypatch):  # noqa: F811
    """Idefics3's and SmolVLM's 2 x 2 split: each tile's patch sums on the canvas where its pixels came from (read off
    the quadrants' colours), the global image's (the last) as the overview; lxt's rules on transformers' model."""
    from test_vlm_answer import quadrant_places, quadrants

    kind, folder = idefics3_tiles
    image = quadrants(80, 80)
    answer = vit.ask_vlm(vit.open_vlm(folder), image, QUESTION, max_new_tokens=NEW_TOKENS)
    relevance = lxt_relevance(folder, list(answer.tokens), 2, monkeypatch, image=image)[0]  # (5, 3, 32, 32)
    tiles = relevance.sum(1).reshape(-1, 4, 8, 4, 8).sum((2, 4)).numpy()  # (5, 4, 4)
    model, processor = _eager(folder)
    pixels = _inputs(model, processor, list(answer.tokens), 2, image)["pixel_values"][0, :-1]
    canvas = np.zeros(answer.grid, dtype=np.float32)
    for tile, (r, c) in zip(tiles, quadrant_places(pixels), strict=False):
        canvas[r * 4:(r + 1) * 4, c * 4:(c + 1) * 4] = tile
    assert answer.grid == (8, 8)
    assert_equal_to_lxt(answer.relevance(2, method="attnlrp"), canvas)
    assert_equal_to_lxt(answer.relevance(2, method="attnlrp", overview=True), tiles[-1])


def test_llava_nexts_attnlrp_is_placed_on_its_unpadded_canvas(llava_next, monkeypatch):  # noqa: F811
    """LLaVA-NeXT's base image (the overview) and its 2 x 3 crops of the 64 x 96-px canvas, whose padding columns
    ``unpad_image`` drops as transformers packs the crops' tokens."""
    from transformers.models.llava_next.modeling_llava_next import unpad_image

    answer = vit.ask_vlm(vit.open_vlm(llava_next), picture(), QUESTION, max_new_tokens=NEW_TOKENS)
    relevance = lxt_relevance(llava_next, list(answer.tokens), 2, monkeypatch)  # (1, 7, 3, 32, 32)
    tiles = relevance[0].sum(1).reshape(-1, 4, 8, 4, 8).sum((2, 4))  # (7, 4, 4): the base image first
    canvas = tiles[1:].reshape(2, 3, 4, 4).permute(0, 2, 1, 3).reshape(8, 12)
    unpadded = unpad_image(canvas[None], torch.tensor([70, 90]))[0].numpy()  # picture() is 90 x 70 px
    assert answer.grid == unpadded.shape == (8, 10)  # two padding columns dropped
    assert_equal_to_lxt(answer.relevance(2, method="attnlrp"), unpadded)
    assert_equal_to_lxt(answer.relevance(2, method="attnlrp", overview=True), tiles[0].numpy())


def test_llava_onevisions_attnlrp_is_placed_on_its_unpadded_canvas(llava_onevision, monkeypatch):  # noqa: F811
    """LLaVA-OneVision (SigLIP, Qwen2; shrunk past anyres_max_2 by bilinear interpolation too): its base image (the
    overview) and its 2 x 3 crops' patch sums on the canvas ``unpad_image`` keeps, as NeXT's."""
    from transformers.models.llava_next.modeling_llava_next import unpad_image

    answer = vit.ask_vlm(vit.open_vlm(llava_onevision), picture(), QUESTION, max_new_tokens=NEW_TOKENS)
    relevance = lxt_relevance(llava_onevision, list(answer.tokens), 2, monkeypatch)  # (1, 7, 3, 32, 32)
    tiles = relevance[0].sum(1).reshape(-1, 4, 8, 4, 8).sum((2, 4))  # (7, 4, 4): the base image first
    canvas = tiles[1:].reshape(2, 3, 4, 4).permute(0, 2, 1, 3).reshape(8, 12)
    unpadded = unpad_image(canvas[None], torch.tensor([70, 90]))[0].numpy()  # picture() is 90 x 70 px
    assert answer.grid == unpadded.shape == (8, 10)
    assert_equal_to_lxt(answer.relevance(2, method="attnlrp"), unpadded)
    assert_equal_to_lxt(answer.relevance(2, method="attnlrp", overview=True), tiles[0].numpy())


def test_gemma3s_pan_and_scan_attnlrp_is_placed_where_the_processor_cut_the_crops(gemma3_pas, monkeypatch):  # noqa: F811
    """Gemma 3's pan-and-scan: the original image first (the overview), then its 3 crops of a 200 x 60 image side by
    side, each crop's patch sums on the canvas where ``pan_and_scan_batched`` cut it."""
    from test_vlm_answer import where_crops_are

    image = picture(200, 60)
    answer = vit.ask_vlm(vit.open_vlm(gemma3_pas, pan_and_scan=True), image, QUESTION, max_new_tokens=NEW_TOKENS)
    relevance = lxt_relevance(gemma3_pas, list(answer.tokens), 2, monkeypatch, image=image, **PAN_AND_SCAN)
    tiles = relevance.sum(1).reshape(-1, 8, 8, 8, 8).sum((2, 4)).numpy()  # (4, 8, 8): the original first
    lefts = [left for _, left in where_crops_are(gemma3_pas, image)]
    canvas = np.zeros((8, 24), dtype=np.float32)
    for tile, left in zip(tiles[1:], lefts, strict=True):
        c = sorted(lefts).index(left)
        canvas[:, 8 * c:8 * c + 8] = tile
    assert answer.grid == (8, 24)
    assert_equal_to_lxt(answer.relevance(2, method="attnlrp"), canvas)
    assert_equal_to_lxt(answer.relevance(2, method="attnlrp", overview=True), tiles[0])


def test_attnlrp_is_counted_before_any_forward(asked, monkeypatch):
    answer = asked["llava"]
    vlm = answer._source[0]
    monkeypatch.setattr(vlm.model, "forward", lambda *a, **k: pytest.fail("the model ran"))
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "0.01")
    with pytest.raises(TooManyTokens, match=r"^AttnLRP of answer token 3 runs the model over \d+ tokens \(a "
                                            r"4x4-patch image\) with the whole graph, from the pixels to the logit: "
                                            r"about .* MB, over the 0 MB limit \(VIT_ANALYSIS_MEMORY_MB\); choose an "
                                            r"earlier token or a smaller image\.$"):
        answer.relevance(3, method="attnlrp")


def test_a_layer_or_method_that_does_not_fit_is_refused_in_one_line(asked):
    answer = asked["llava"]
    with pytest.raises(ValueError, match=r"^AttnLRP runs from the logit through every layer to the pixels; ask it "
                                         r"without a layer$"):
        answer.relevance(0, 1, method="attnlrp")
    with pytest.raises(ValueError, match=r"^method must be one of gradxattn, attnlrp, got 'lrp'$"):
        answer.relevance(0, method="lrp")


def test_the_rules_are_current_only_for_the_relevance(vlms, asked):
    """After AttnLRP the model's own forward is unchanged: a second answer equals the first, token for token, and
    its attention rows are the same."""
    answer = asked["qwen2_5_vl"]
    answer.relevance(0, method="attnlrp")
    again = vit.ask_vlm(answer._source[0], picture(), QUESTION, max_new_tokens=NEW_TOKENS)
    assert again.tokens == answer.tokens
    np.testing.assert_allclose(again.attention(2, 1), answer.attention(2, 1), rtol=0, atol=1e-6)


def test_a_copy_of_the_ruled_model_runs_its_own_modules(asked):
    """The rules' methods are bound to each module: a deep copy of the model after AttnLRP computes with its own
    weights, not the original's."""
    import copy

    vlm = asked["llava"]._source[0]
    asked["llava"].relevance(0, method="attnlrp")
    twin = copy.deepcopy(vlm.model.model.language_model)
    norm = twin.norm
    with torch.no_grad():
        norm.weight.mul_(2.0)
        x = torch.randn(1, 3, norm.weight.shape[0])
        expected = type(norm).forward(norm, x)
        assert torch.equal(norm(x), expected)
        assert not torch.equal(vlm.language_model.norm(x), expected)


@pytest.fixture(scope="module")
def experts(tmp_path_factory):
    """Qwen3-VL-MoE and GLM-4.5V: language models of experts, whose stacked expert weights no rule reaches; Qwen3.5:
    a hybrid whose linear-attention layers (the gated delta rule) no rule reaches."""
    return saved_whole(tmp_path_factory, ["qwen3_vl_moe", "glm4v_moe", "qwen3_5", "llama4"])


@pytest.mark.parametrize("kind", ["qwen3_vl_moe", "glm4v_moe", "qwen3_5", "llama4"])
def test_attnlrp_of_a_language_model_of_experts_is_refused_in_one_line(experts, kind, tmp_path, capsys):
    """lxt has no rule for a mixture of experts or a linear attention: their plain gradient would not be AttnLRP, so
    the map is refused in one line naming them, in the API before the backward and on the command line before the
    answer; gradient x attention still draws."""
    from vit.predict import main

    answer = vit.ask_vlm(vit.open_vlm(experts[kind]), picture(), QUESTION, max_new_tokens=2)
    experts_class = {"qwen3_vl_moe": "Qwen3VLMoeTextExperts", "glm4v_moe": "Glm4vMoeTextExperts",
                     "qwen3_5": "Qwen3_5GatedDeltaNet", "llama4": "Llama4TextExperts, Llama4TextMLP"}[kind]
    with pytest.raises(ValueError, match=rf"^AttnLRP is not drawn for this {kind} model: its {experts_class} take "
                                         r"no AttnLRP rule here .*; use gradient × attention or TAM \(token "
                                         r"activation map\)$"):
        answer.relevance(1, method="attnlrp")
    assert answer.relevance(1, -1).shape == answer.grid
    picture().save(tmp_path / "photo.png")
    assert main([str(experts[kind]), str(tmp_path / "photo.png"), "--ask", QUESTION, "--save-maps",
                 str(tmp_path / "maps"), "--lm-method", "attnlrp", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert f"its {experts_class} take no AttnLRP rule here" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "maps" / "photo.npz").exists()
