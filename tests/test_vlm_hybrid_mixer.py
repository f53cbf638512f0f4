"""A hybrid language model whose decoder layers name their token mixer ``mixer`` (Nemotron-H's: Mamba 2 in some
layers, an MLP or MoE in others, attention in the rest) answers through the recording attention (issue 113): its
attention layers are read by what they are (a ``mixer`` whose forward asks transformers' attention interface,
``recording_attention.attention_of``), not by the name ``self_attn``. Built tiny by the VLM census's generic builder
(Nemotron-H Omni) and saved whole: its answer is ``generate``'s, and each answer token's attention at every attention
layer is the eager row (transformers' ``output_attentions`` numbers the attention layers alone)."""

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from test_vlm_answer import picture  # noqa: E402
from test_vlm_answer_attnlrp import _eager, _inputs  # noqa: E402
from vlm_saved import answered_tokens, asked, assert_rows_are_eager, saved  # noqa: E402

from vit.core.recording_attention import attention_of  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("nemotron_h_omni")


@pytest.fixture(scope="module")
def hybrid(folder):
    vlm, answer, inputs, outputs = asked(saved("nemotron_h_omni", folder), folder)
    return vlm, answer, outputs["eager"], inputs


def test_the_hybrids_answer_is_generates(hybrid):
    vlm, answer, out, inputs = hybrid
    layers = vlm.language_model.layers
    assert not any(hasattr(layer, "self_attn") for layer in layers)
    kinds = {layer.block_type for layer in layers}
    assert "full_attention" in kinds and kinds - {"full_attention"}  # attention beside other mixers
    assert list(answer.tokens) == answered_tokens(out, inputs) and len(answer.tokens) > 1


def test_each_attention_layers_row_is_the_eager_one_and_no_other_mixer_is_read(hybrid):
    vlm, answer, out, _ = hybrid
    attending = [layer for layer in vlm.language_model.layers if attention_of(layer) is not None]
    assert [layer.block_type for layer in attending] == ["full_attention"] * len(attending)
    assert len(out.attentions[0]) == len(attending)
    assert_rows_are_eager(answer, out)


def test_the_maps_are_drawn_over_the_pixels_the_tower_read(hybrid):
    """The layout's pixels are the resized image the processor cut into patches: transformers' own
    ``convert_image_to_patches`` of them (rescaled and normalised as the processor does) is its ``pixel_values``
    (clamped to what 8-bit pixels can hold: its bicubic resize in float32 overshoots), within the pixels' rounding.
    Drawn transposed or over the image given (90 x 70), they differ."""
    from transformers.models.nemotron_h_omni.image_processing_nemotron_h_omni import convert_image_to_patches

    vlm, answer, _, inputs = hybrid
    images = vlm.processor.image_processor
    (gh, gw), side = (int(v) for v in inputs["image_grid_hw"][0]), images.patch_size
    pixels = answer.layout.pixels
    assert pixels.shape == (gh * side, gw * side, 3) and gh != gw and pixels.shape[:2] != picture().size[::-1]
    mean = torch.tensor(images.image_mean).view(1, 3, 1, 1)
    std = torch.tensor(images.image_std).view(1, 3, 1, 1)
    x = (torch.from_numpy(pixels).permute(2, 0, 1)[None].float() * images.rescale_factor - mean) / std
    patches = convert_image_to_patches(x, side)[0]  # (patches, C x p x p)
    low = (-mean / std).flatten().repeat_interleave(side * side)
    high = ((1 - mean) / std).flatten().repeat_interleave(side * side)
    expected = torch.maximum(torch.minimum(inputs["pixel_values"], high), low)
    atol = 0.51 / 255 / min(images.image_std)  # half a level of 8 bits
    torch.testing.assert_close(patches, expected, rtol=0, atol=atol)


def test_the_logit_lens_reads_the_stacks_own_final_norm_norm_f(hybrid, folder):
    """The lens at answer tokens 0 and 1: transformers' eager model's hidden states at the query, each read through
    the stack's ``norm_f`` and the language model's head, softmax, the token's entry; the last the model's own
    logits'."""
    vlm, answer, _, _ = hybrid
    model, processor = _eager(folder)
    stack, head = model.language_model.model, model.language_model.lm_head  # NemotronHForCausalLM's
    for i in (0, 1):
        inputs = _inputs(model, processor, list(answer.tokens), i)
        with torch.no_grad():
            out = model(**inputs, output_hidden_states=True, use_cache=False)
        states = out.hidden_states
        expected = [float(head(stack.norm_f(state[0, -1])).float().softmax(-1)
                          [answer.tokens[i]]) for state in states[:-1]]
        expected.append(float(out.logits[0, -1].float().softmax(-1)[answer.tokens[i]]))
        assert len(expected) == len(stack.layers) + 1
        np.testing.assert_allclose(answer.logit_lens(i), np.array(expected, dtype=np.float32), rtol=0, atol=1e-5)
