"""BEiT, BEiT v2 and Data2Vec-vision opened through ``vit.sources`` match their libraries: logits (or the pooled
output) and every layer's attention to 1e-5, with the relative position bias per layer and shared.

- HF: tiny random ``BeitForImageClassification`` / ``BeitModel`` / ``Data2VecVisionModel`` (eager attention), at the
  native size and a non-square one (``interpolate_pos_encoding``: HF resizes the bias table bilinearly).
- timm: tiny random ``beit_base_patch16_224`` / ``beitv2_base_patch16_224`` (fused attention off), at the native
  size, built at a non-square one (``img_size=(40, 24)``: tables of a 5 x 3 grid) and set to one after it was built
  (``set_input_size``: timm's ``resize_rel_pos_bias_table``), its attention read by a forward hook on ``attn_drop``.
"""

import json

import pytest
import torch
from parity_helpers import assert_parity, capture_inputs, randomize

from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")
pytestmark = pytest.mark.slow  # importing transformers and timm takes seconds

TINY = dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=2, layer_scale_init_value=0.1, hidden_dropout_prob=0.0, drop_path_rate=0.0)


@pytest.mark.parametrize("architecture, options", [
    ("BeitForImageClassification", dict(use_relative_position_bias=True)),
    ("BeitForImageClassification", dict(use_shared_relative_position_bias=True, use_mean_pooling=False)),
    ("BeitModel", dict(use_relative_position_bias=True, use_absolute_position_embeddings=True)),
    ("Data2VecVisionModel", dict(use_shared_relative_position_bias=True)),
])
def test_hf_beit_matches_transformers(tmp_path, architecture, options):
    family = transformers.Data2VecVisionConfig if architecture.startswith("Data2Vec") else transformers.BeitConfig
    config = family(**TINY, **options, num_labels=3)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = randomize(getattr(transformers, architecture)(config))
    model.save_pretrained(tmp_path / "beit")
    checkpoint = open_source(tmp_path / "beit")
    assert checkpoint.config.rel_pos == ("beit" if options.get("use_relative_position_bias") else "beit_shared")
    for label, size in (("native", (32, 32)), ("40x24", (40, 24))):
        images = torch.randn(2, 3, *size)
        with torch.no_grad():
            out = model(pixel_values=images, output_attentions=True, interpolate_pos_encoding=label != "native")
            ours = checkpoint.model.encode(images, output_attentions=True)
        if architecture.endswith("Classification"):
            output, expected = ours.logits, out.logits
        elif out.pooler_output is not None:
            output, expected = ours.embedding, out.pooler_output
        else:  # Data2VecVisionModel has no pooler: its output is the last block's, every token
            output, expected = checkpoint.model.run_with_cache(images, ["blocks.1.hook_resid_post"])[1][
                "blocks.1.hook_resid_post"], out.last_hidden_state
        assert_parity(f"BEiT | HF {architecture} | {label}", output, expected, ours.attentions, out.attentions)


@pytest.mark.parametrize("options", [dict(use_relative_position_bias=True),
                                     dict(use_shared_relative_position_bias=True)], ids=["per-layer", "shared"])
def test_hf_beit_built_at_a_non_square_size_matches_transformers_there_and_interpolated(tmp_path, options):
    config = transformers.BeitConfig(**{**TINY, "image_size": [40, 24]}, **options, num_labels=3)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = randomize(transformers.BeitForImageClassification(config))
    model.save_pretrained(tmp_path / "beit")
    checkpoint = open_source(tmp_path / "beit")
    assert checkpoint.config.image_size == (40, 24)
    for label, size in (("40x24", (40, 24)), ("32x48", (32, 48))):
        images = torch.randn(2, 3, *size)
        with torch.no_grad():
            out = model(pixel_values=images, output_attentions=True, interpolate_pos_encoding=label != "40x24")
            ours = checkpoint.model.encode(images, output_attentions=True)
        assert_parity(f"BEiT | HF built at 40x24 | {label}", ours.logits, out.logits, ours.attentions,
                      out.attentions)


def timm_beit(name: str, shared: bool, img_size=32, **options):
    timm.layers.set_fused_attn(False)
    try:
        torch.manual_seed(0)
        model = timm.create_model(name, pretrained=False, img_size=img_size, patch_size=8, embed_dim=32, depth=2,
                                  num_heads=2, num_classes=3, use_rel_pos_bias=not shared,
                                  use_shared_rel_pos_bias=shared, init_values=0.1, **options)
    finally:
        timm.layers.set_fused_attn(True)
    return randomize(model)


@pytest.mark.parametrize("name, shared", [("beit_base_patch16_224", False), ("beitv2_base_patch16_224", False),
                                          ("beit_base_patch16_224", True)])
def test_timm_beit_matches_timm(tmp_path, name, shared):
    model = timm_beit(name, shared)
    timm.models.save_for_hf(model, tmp_path / "beit", model_args=dict(num_heads=2), safe_serialization=True)
    checkpoint = open_source(tmp_path / "beit")
    assert checkpoint.config.rel_pos == ("beit_shared" if shared else "beit")
    images = torch.randn(2, 3, 32, 32)
    expected, attentions = capture_inputs([b.attn.attn_drop for b in model.blocks], lambda: model(images))
    with torch.no_grad():
        ours = checkpoint.model.encode(images, output_attentions=True)
    assert_parity(f"BEiT | timm {name}{' shared' if shared else ''} | native", ours.logits, expected,
                  ours.attentions, attentions)


@pytest.mark.parametrize("shared", [False, True], ids=["per-layer", "shared"])
def test_timm_beit_built_at_a_non_square_size_opens_at_that_size_and_matches_timm(tmp_path, shared):
    model = timm_beit("beit_base_patch16_224", shared, img_size=(40, 24))  # a 5 x 3 grid: tables of 9 x 5 + 3 rows
    timm.models.save_for_hf(model, tmp_path / "beit", model_args=dict(num_heads=2, img_size=(40, 24)),
                            safe_serialization=True)
    checkpoint = open_source(tmp_path / "beit")
    assert checkpoint.config.image_size == (40, 24) and checkpoint.preprocessing.image_size == (40, 24)
    images = torch.randn(2, 3, 40, 24)
    expected, attentions = capture_inputs([b.attn.attn_drop for b in model.blocks], lambda: model(images))
    with torch.no_grad():
        ours = checkpoint.model.encode(images, output_attentions=True)
    assert_parity(f"BEiT | timm beit{' shared' if shared else ''} | 40x24", ours.logits, expected, ours.attentions,
                  attentions)


@pytest.mark.parametrize("shared, absolute", [(False, False), (True, True)], ids=["per-layer", "shared-absolute"])
def test_timm_beit_at_another_non_square_size_matches_timm_set_to_that_size(tmp_path, shared, absolute):
    # timm's set_input_size resizes the 7 x 7 offset table to 9 x 5 by unilm's geometric offsets
    # (resize_rel_pos_bias_table) and the absolute table bicubically with antialias; ours at 40x24 does the same
    model = timm_beit("beit_base_patch16_224", shared, use_abs_pos_emb=absolute)
    timm.models.save_for_hf(model, tmp_path / "beit", safe_serialization=True)
    checkpoint = open_source(tmp_path / "beit")
    model.set_input_size((40, 24))
    images = torch.randn(2, 3, 40, 24)
    expected, attentions = capture_inputs([b.attn.attn_drop for b in model.blocks], lambda: model(images))
    with torch.no_grad():
        ours = checkpoint.model.encode(images, output_attentions=True)
    assert_parity(f"BEiT | timm beit{' shared' if shared else ''} set_input_size | 40x24", ours.logits, expected,
                  ours.attentions, attentions)


def test_timm_beit_with_a_non_square_table_and_no_img_size_is_refused_in_one_line(tmp_path):
    model = timm_beit("beit_base_patch16_224", False, img_size=(40, 24))
    timm.models.save_for_hf(model, tmp_path / "beit", safe_serialization=True)
    config = json.loads((tmp_path / "beit" / "config.json").read_text())
    del config["model_args"]["img_size"]  # timm records it; without it the grid is the table's square
    (tmp_path / "beit" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="img_size") as error:
        open_source(tmp_path / "beit")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("options", [dict(use_relative_position_bias=True),
                                     dict(use_shared_relative_position_bias=True)], ids=["per-layer", "shared"])
def test_hf_beit_with_its_bias_formed_per_query_chunk_matches_transformers(tmp_path, monkeypatch, options):
    # Chunks of at most 4 query rows (of 17) on both paths: the attentions asked for (the scores' rows added to in
    # place) and the fused one; the shared table too is never formed as its 17 x 17 whole.
    from vit.model import blocks, layouts

    config = transformers.BeitConfig(**TINY, **options, num_labels=3)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = randomize(transformers.BeitForImageClassification(config))
    model.save_pretrained(tmp_path / "beit")
    checkpoint = open_source(tmp_path / "beit")
    formed = []
    forward = layouts.RelativePositionBias.forward

    def recorded(self, grid, rows=None):
        bias = forward(self, grid, rows)
        formed.append(bias.shape[1])
        return bias

    monkeypatch.setattr(layouts.RelativePositionBias, "forward", recorded)
    monkeypatch.setattr(blocks, "BIAS_CHUNK_BYTES", 2 * 2 * 4 * 17 * 4)  # (B, nh, 4 rows, 17 keys) float32
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = model(pixel_values=images, output_attentions=True)
        ours = checkpoint.model.encode(images, output_attentions=True)
        fused = checkpoint.model.encode(images).logits
    assert max(formed) == 4 and sum(formed) == 2 * 2 * 17  # each layer's rows once per path, 4 at most at a time
    assert_parity("BEiT | HF | bias per query chunk", ours.logits, out.logits, ours.attentions, out.attentions)
    assert torch.allclose(fused, out.logits, atol=1e-5)
