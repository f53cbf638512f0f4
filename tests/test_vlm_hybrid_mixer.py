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
from test_vlm_answer import NEW_TOKENS, QUESTION, noisy, picture, processor_inputs  # noqa: E402

import vit  # noqa: E402
from vit.core.recording_attention import attention_of  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds


@pytest.fixture(scope="module")
def asked(tmp_path_factory):
    from bench.census_vlm import generic_build

    torch.manual_seed(0)
    model, processor = generic_build("nemotron_h_omni")
    folder = tmp_path_factory.mktemp("nemotron_h_omni")
    noisy(model).save_pretrained(folder)
    processor.save_pretrained(folder)
    vlm = vit.open_vlm(folder)
    answer = vit.ask_vlm(vlm, picture(), QUESTION, max_new_tokens=NEW_TOKENS)
    inputs = processor_inputs(folder, picture())
    reference = type(model).from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        out = reference.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, return_dict_in_generate=True,
                                 output_attentions=True)
    return vlm, answer, out, inputs


def test_the_hybrids_answer_is_generates(asked):
    vlm, answer, out, inputs = asked
    layers = vlm.language_model.layers
    assert not any(hasattr(layer, "self_attn") for layer in layers)
    kinds = {layer.block_type for layer in layers}
    assert "full_attention" in kinds and kinds - {"full_attention"}  # attention beside other mixers
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist() and len(answer.tokens) > 1


def test_each_attention_layers_row_is_the_eager_one_and_no_other_mixer_is_read(asked):
    vlm, answer, out, _ = asked
    attending = [layer for layer in vlm.language_model.layers if attention_of(layer) is not None]
    assert [layer.block_type for layer in attending] == ["full_attention"] * len(attending)
    assert len(out.attentions[0]) == len(attending)
    for i in range(len(answer.tokens)):
        for layer in range(len(attending)):
            seen = out.attentions[0][layer].shape[-2] + i
            np.testing.assert_allclose(answer.row(i, layer).numpy(), out.attentions[i][layer][0, :, -1, :seen].numpy(),
                                       rtol=0, atol=1e-5)
