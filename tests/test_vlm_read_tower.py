"""A tower no layout here names, read from its config as transformers builds it (``any_vlm.read_tower``, issue 113):
the sizes the cost model counts where the config states them under other names than one tower's — towers in
sequence nested in the vision config (Unlimited-OCR's SAM then CLIP, their ``sam_config`` and ``encoder_config``),
or no tower with layers at all, the image's patches embedded straight into the language model (Fuyu's linear over
its config's 30-px patches, Gemma 4 Unified's encoder-free embedder over its ``model_patch_size``: the patch times
its pooling kernel, as its ``Gemma4UnifiedVisionEmbedder`` reads ``model_patch_size ** 2 * 3`` values a patch)."""

import pytest

transformers = pytest.importorskip("transformers")
from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402

from vit.sources.vlm.any_vlm import read_tower  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds


def test_towers_nested_in_sequence_are_counted_together():
    config = CONFIG_MAPPING["unlimited_ocr"]()
    sam, clip = config.vision_config.sam_config, config.vision_config.encoder_config
    tower = read_tower(config.to_dict())
    assert (tower.shape.num_layers, tower.shape.num_heads, tower.shape.hidden_size) == (
        sam.num_hidden_layers + clip.num_hidden_layers, max(sam.num_attention_heads, clip.num_attention_heads),
        max(sam.hidden_size, clip.hidden_size))
    assert tower.missing == "a patch_size in its vision config"  # two patches, none the vision config's own


def test_an_encoder_free_embedder_is_a_tower_without_layers_each_patch_a_token():
    fuyu = CONFIG_MAPPING["fuyu"]()
    tower = read_tower(fuyu.to_dict())
    assert tower.shape.num_layers == 0 and tower.shape.patch_hw == (fuyu.patch_size, fuyu.patch_size) == (30, 30)
    assert tower.unit == 1 and tower.missing == "" and tower.shape.hidden_size == fuyu.text_config.hidden_size
    unified = CONFIG_MAPPING["gemma4_unified"]()
    unified.vision_config = type(unified).sub_configs["vision_config"]()
    vision = unified.vision_config
    tower = read_tower(unified.to_dict())
    assert tower.shape.num_layers == 0 and tower.unit == 1 and tower.shape.hidden_size == vision.mm_embed_dim
    assert tower.shape.patch_hw == (vision.patch_size * vision.pooling_kernel_size,) * 2 == (48, 48)
