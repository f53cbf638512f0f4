"""AttnLRP of a SAM / SAM 2 mask (issue 81, item 4): ``vit.segment(..., methods=["attnlrp"])`` equals lxt's own
AttnLRP rules patched into transformers' whole ``SamModel`` / ``Sam2Model``, input x gradient of the same mask score
at ``pixel_values`` summed over the channels, to 1e-5 of the map's largest value; and each rule, dropped from ours,
moves the map off lxt's.

The models are ``test_sam_prompts``' tiny random SAM and SAM 2 (eager attention), saved whole with their processors.
lxt has no map for SAM, so its rules are patched in as its ``efficient`` module patches a generic torch model's
classes: ``layer_norm_forward`` on ``torch.nn.LayerNorm`` (which reaches ``SamLayerNorm`` / ``Sam2LayerNorm``,
channels-first in the neck and the upscaling: their forward calls ``nn.LayerNorm.forward``), ``non_linear_forward``
on every activation class (the encoder's GELU, the decoder's ReLU and GELU), ``wrap_attention_forward`` on the
modeling file's ``eager_attention_forward`` (the decoder's attention function, and SAM 2's Hiera's: the uniform rule
on both matmuls). Two places lxt's patching cannot reach are written here with its own ``divide_gradient``:

- SAM's image encoder attention (``SamVisionAttention``) computes its weights inline, with SAM's decomposed relative
  positions read from the query: its forward below is transformers' with ``wrap_attention_forward``'s division of q,
  k and v where the attention function would begin, the relative positions (the logits' additive mask) computed from
  the query before it, as a model passing them as the function's ``attention_mask`` has them;
- the masks ``hyper_in @ upscaled_embedding`` (a product of two image-dependent factors): the uniform rule, each
  factor's gradient halved (``gated_mlp_forward``'s rule on SwiGLU's product), by hooks on the hypernetwork MLPs and
  the upscaling's last GELU.

Reference: rachtibat/LRP-eXplains-Transformers @ f0434417, lxt/efficient/{rules,patches}.py (tests/reference/lxt).
"""

import numpy as np
import pytest
import torch
from test_sam_prompts import PROMPTS, image, library_inputs, library_run, whole  # noqa: F401  (fixtures)

import vit
from tests.reference.lxt.patches import layer_norm_forward, non_linear_forward, wrap_attention_forward
from tests.reference.lxt.rules import divide_gradient

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing transformers takes seconds

RTOL = 1e-5


def vision_attention_forward(self, hidden_states, output_attentions=None):
    """transformers' ``SamVisionAttention.forward`` with lxt's ``wrap_attention_forward`` division of q, k and v
    where an attention function would receive them (after the relative positions are read from the query)."""
    batch_size, height, width, _ = hidden_states.shape
    qkv = (self.qkv(hidden_states).reshape(batch_size, height * width, 3, self.num_attention_heads, -1)
           .permute(2, 0, 3, 1, 4))
    query, key, value = qkv.reshape(3, batch_size * self.num_attention_heads, height * width, -1).unbind(0)
    mask = None
    if self.use_rel_pos:
        mask = self.get_decomposed_rel_pos(query, self.rel_pos_h, self.rel_pos_w, (height, width), (height, width))
    query, key, value = divide_gradient(query, 4), divide_gradient(key, 4), divide_gradient(value, 2)
    attn_weights = (query * self.scale) @ key.transpose(-2, -1)
    if mask is not None:
        attn_weights = attn_weights + mask.reshape_as(attn_weights)
    attn_weights = torch.nn.functional.softmax(attn_weights, dtype=torch.float32, dim=-1).to(query.dtype)
    attn_output = (attn_weights @ value).reshape(batch_size, self.num_attention_heads, height, width, -1)
    attn_output = attn_output.permute(0, 2, 3, 1, 4).reshape(batch_size, height, width, -1)
    return self.proj(attn_output), attn_weights


def _activation_classes(model: torch.nn.Module) -> set[type]:
    from transformers import activations

    return {type(m) for m in model.modules()
            if type(m).__module__ == activations.__name__ or isinstance(m, (torch.nn.GELU, torch.nn.ReLU))}


def lxt_relevance(family, model, processor, picture, prompt, mask: int, at, monkeypatch) -> torch.Tensor:
    """lxt's AttnLRP of mask ``mask``'s low-resolution logits (summed where > 0, or at the cell under ``at``) on
    transformers' whole ``model``: ``(H, W)``, input x gradient at ``pixel_values`` summed over the channels."""
    modeling = __import__(f"transformers.models.{family}.modeling_{family}", fromlist=["eager_attention_forward"])
    inputs = library_inputs(processor, picture, **prompt)
    decoder = model.mask_decoder

    def halved_factor(module, args, out):  # the upscaling's last GELU (hidden / 8 channels): the masks' factor
        return divide_gradient(out, 2) if out.shape[1] == decoder.hidden_size // 8 else None

    hooks = [m.register_forward_hook(lambda module, args, out: divide_gradient(out, 2))
             for m in decoder.output_hypernetworks_mlps]
    hooks.append(decoder.activation.register_forward_hook(halved_factor))
    try:
        with monkeypatch.context() as m:  # lxt patches classes; undone before ours runs
            m.setattr(torch.nn.LayerNorm, "forward", layer_norm_forward)
            for act in _activation_classes(model):
                m.setattr(act, "original_forward", act.forward, raising=False)
                m.setattr(act, "forward", non_linear_forward)
            m.setattr(modeling, "eager_attention_forward", wrap_attention_forward(modeling.eager_attention_forward))
            if family == "sam":  # SAM 2's Hiera calls the attention function: the wrapper above reaches it
                m.setattr(modeling.SamVisionAttention, "forward", vision_attention_forward)
            pixels = inputs["pixel_values"].clone().requires_grad_(True)
            with torch.enable_grad():
                out, _ = library_run(family, model, processor, inputs, pixels)
                logits = out.pred_masks[0, 0, mask]  # (h, w) over the whole input, SAM's padding included
                if at is None:
                    score = logits[logits.detach() > 0].sum()
                else:  # the cell under the point: the prompt's own mapping into the input
                    x, y = inputs["input_points"][0, 0, 0].tolist()
                    h, w = logits.shape
                    score = logits[int(y * h / pixels.shape[2]), int(x * w / pixels.shape[3])]
                [grad] = torch.autograd.grad(score, pixels)
    finally:
        for hook in hooks:
            hook.remove()
    return (pixels.detach() * grad).sum(dim=1)[0]  # (H, W)


def distance(ours: np.ndarray, theirs: torch.Tensor) -> float:
    """The largest difference, as a share of the reference's largest value."""
    scale = float(theirs.abs().max())
    assert ours.shape == tuple(theirs.shape) and scale > 0
    return float(np.abs(ours - theirs.numpy()).max()) / scale


@pytest.mark.parametrize("at", [None, (52, 30)])
def test_attnlrp_of_a_mask_equals_lxts_rules_on_the_librarys_model(whole, image, at, monkeypatch):  # noqa: F811
    family, model, processor, checkpoint = whole
    prompt = PROMPTS["mixed"]
    ours = vit.segment(checkpoint, image, **prompt, mask=1, methods=["attnlrp", "gradient_x_input"], at=at)
    theirs = lxt_relevance(family, model, processor, image, prompt, 1, at, monkeypatch)
    assert distance(ours.maps["attnlrp"], theirs) <= RTOL
    assert distance(ours.maps["gradient_x_input"], theirs) > 1e-2  # the rules changed the map: not the gradient
    assert ours.patch_maps["attnlrp"].shape == checkpoint.model.patch_grid(*theirs.shape)


def _plain_norm(module, args, output):
    return None  # a hook returning None keeps the module's own output: the LayerNorm's plain gradient


@pytest.mark.parametrize("dropped", ["decoder attention", "masks product", "norms", "activations",
                                     "encoder rules"])
def test_each_rule_dropped_moves_the_map_off_lxts(whole, image, dropped, monkeypatch):  # noqa: F811
    """What the parity test above tells apart: with any one of the rules gone, the map is not lxt's."""
    from vit.explain.methods import segment
    from vit.explain.methods.relevance import AttnLRPRules

    family, model, processor, checkpoint = whole
    prompt = PROMPTS["mixed"]
    theirs = lxt_relevance(family, model, processor, image, prompt, 1, None, monkeypatch)
    if dropped == "decoder attention":
        monkeypatch.setattr(segment, "_attention_rule", lambda factor: _plain_norm)
    elif dropped == "masks product":
        monkeypatch.setattr(segment, "_masks_rule", _plain_norm)
    elif dropped == "norms":
        monkeypatch.setattr(segment, "_norm_rule", _plain_norm)
    elif dropped == "activations":
        monkeypatch.setattr(segment, "_activation_rule", _plain_norm)
    else:
        monkeypatch.setattr(segment, "use_rules", lambda rules: segment.contextlib.nullcontext())
        assert AttnLRPRules  # the encoder's rules are the ones the relevance tests check
    ours = vit.segment(checkpoint, image, **prompt, mask=1, methods=["attnlrp"])
    assert distance(ours.maps["attnlrp"], theirs) > 1e-3


def test_predict_saves_the_attnlrp_map_of_the_mask_equal_to_lxts(whole, image, tmp_path, capsys, monkeypatch):  # noqa: F811
    import json

    from vit.predict import main

    family, model, processor, checkpoint = whole
    image.save(tmp_path / "photo.png")
    code = main([checkpoint.metadata["source"]["path"], str(tmp_path / "photo.png"), "--points", "52,30", "--box",
                 "10,5,80,45", "--mask", "1", "--save-maps", str(tmp_path / "maps"), "--relevance", "attnlrp",
                 "--device", "cpu"])
    [record] = json.loads(capsys.readouterr().out)
    theirs = lxt_relevance(family, model, processor, image, PROMPTS["mixed"], 1, None, monkeypatch)
    assert code == 0 and "attnlrp" in record["maps"]
    assert distance(np.load(record["maps"]["npz"])["map/attnlrp"], theirs) <= RTOL


def test_the_clis_prompt_maps_are_the_engines():
    # written in the parser (parsing loads no torch): every pixel map of a mask, and nothing else
    from vit.explain.methods.segment import SEGMENT_METHODS
    from vit.predict import PROMPT_MAPS

    assert set(PROMPT_MAPS) == set(SEGMENT_METHODS) - {"decoder_attention"}


def test_attnlrps_rule_hooks_leave_another_threads_gradient_map_as_it_was(whole, image):  # noqa: F811
    """The AttnLRP rules are hooks on the prompt half's modules, which every session shares: while visitor A's
    rules are on, visitor B's gradient x input of the same model, computed in another thread, is its map alone (it
    had A's LayerNorm, activation, attention and masks rules in its backward)."""
    import threading

    from vit.explain.methods import segment
    from vit.sources.sam_prompts import open_prompt_half

    _, _, _, checkpoint = whole
    prompt = PROMPTS["mixed"]

    def gradient_map():
        return vit.segment(checkpoint, image, **prompt, mask=1, methods=["gradient_x_input"]).maps["gradient_x_input"]

    alone, seen = gradient_map(), []
    with segment.library_rules(segment.segmenter(checkpoint, open_prompt_half).half):  # A's rules on the model
        other = threading.Thread(target=lambda: seen.append(gradient_map()))
        other.start()
        other.join(120)
    assert seen, "B's map was computed while A's rules were on"
    np.testing.assert_array_equal(seen[0], alone)
