"""A hybrid language model whose decoder layers name their token mixer ``mixer`` (Nemotron-H's: Mamba 2 in some
layers, an MLP or MoE in others, attention in the rest) answers through the recording attention (issue 113): its
attention layers are read by what they are (a ``mixer`` whose forward asks transformers' attention interface,
``recording_attention.attention_of``), not by the name ``self_attn``. Built tiny by the VLM census's generic builder
(Nemotron-H Omni) and saved whole: its answer is ``generate``'s, and each answer token's attention at every attention
layer is the eager row (transformers' ``output_attentions`` numbers the attention layers alone)."""

import pytest

transformers = pytest.importorskip("transformers")
from vlm_saved import answered_tokens, asked, assert_rows_are_eager, saved  # noqa: E402

from vit.core.recording_attention import attention_of  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nemotron_h_omni")
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
