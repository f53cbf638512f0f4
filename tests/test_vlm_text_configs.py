"""A VLM's language model read where transformers reads it (issue 113): configs the census's generic builder met that
the checks before a folder is opened misread, each checked on transformers' own config and model classes.

- GLM-5 Next's latent attention states ``head_dim: 0`` (transformers' convention: the rotary part's width, none
  here); the declared parameters' bound counts what a latent attention surely has instead of refusing the folder,
  and stays at most what transformers' own model holds. Its linear-attention layers name their mixer ``self_attn``
  but state their kind: none of them is read as attention.
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # importing transformers takes seconds

GLM5_NEXT = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                 intermediate_size=64, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
                 kv_lora_rank=16, q_lora_rank=16, qk_nope_head_dim=8, v_head_dim=8, vocab_size=100, pad_token_id=0,
                 linear_head_dim=8, linear_num_heads=4, index_head_dim=8, index_n_heads=2, index_topk=32,
                 index_kpool=16)


@pytest.fixture(scope="module")
def glm5_next():
    config = transformers.Glm5NextTextConfig(**GLM5_NEXT)
    with torch.device("meta"):
        return config, transformers.Glm5NextTextModel(config)


def test_a_latent_attention_with_head_dim_0_is_counted_by_its_value_heads_and_latent_rank(glm5_next):
    from vit.sources.vlm.declared import text_parameters

    config, model = glm5_next
    assert config.head_dim == 0 and config.layer_types[-1] == "indexed_attention"
    hidden, heads, layers = 32, 4, 4
    attention = heads * 8 * hidden + hidden * 16  # o_proj from 4 heads' 8-wide values; the keys' down-projection
    expected = 100 * hidden + layers * (attention + 2 * hidden * 64)
    assert text_parameters(config) == expected
    assert expected <= sum(p.numel() for p in model.parameters())  # a bound transformers' own model holds


def test_linear_attention_layers_named_self_attn_are_not_read_as_attention(glm5_next):
    from vit.core.recording_attention import attention_of
    from vit.explain.language.vlm_attention import attention_layers, linear_layers

    config, model = glm5_next
    kinds = [layer.block_type for layer in model.layers]
    assert kinds == ["linear_attention"] * 3 + ["indexed_attention"]
    assert [attention_of(layer) for layer in model.layers[:3]] == [None] * 3
    assert [n for n, _ in attention_layers(model)] == [3]
    assert attention_layers(model)[0][1] is model.layers[3].self_attn
    assert linear_layers(model) == ["Glm5NextTextLinearAttention"]
