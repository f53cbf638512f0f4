"""InternVL 2.5 / 3 / 3.5's vision tower (InternViT) and pixel-shuffle projector, opened from the VLM's own ``-hf``
folder (issue 68).

References are transformers' own ``InternVLForConditionalGeneration`` with random weights (σ 0.05 noise on every
parameter, eager attention, a one-layer language model), saved whole with ``save_pretrained`` in many shards with
its image processor: every tower layer's attention (``output_attentions``) and the projector's output
(``get_image_features``) equal to 1e-5, with the 6B tower's QK norm and RMSNorm blocks each once.
"""

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vit.sources.open import SourceError, open_source

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing transformers takes seconds

ATOL = 1e-5
TOWER = dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
             num_attention_heads=2, attention_bias=True)
TEXT = dict(model_type="qwen2", hidden_size=24, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=2, vocab_size=64)
# InternVL 3's 300M tower; the 6B's (InternVL 2.5 / 3 -38B, -78B) QK norm and RMSNorm; a tower read at layer -2; one
# whose final LayerNorm is read (use_mean_pooling false, vision_feature_layer -1)
VARIANTS = {"plain": ({}, {}), "qk_norm": (dict(use_qk_norm=True, attention_bias=False), {}),
            "rms_norm": (dict(norm_type="rms_norm"), {}), "layer_-2": ({}, dict(vision_feature_layer=-2)),
            "final_norm": (dict(use_mean_pooling=False), {})}
DEPTH = {"layer_-2": 2}  # of the tower's 3 layers; 3 for the others
NATIVE, SQUARE, OTHER = (32, 32), (48, 48), (24, 40)  # the tower's tile, a larger tile, another aspect


def noisy(model: torch.nn.Module) -> torch.nn.Module:
    """σ 0.05 noise on every parameter (norms, layer scale, biases and the projector included), eval mode."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    return model.eval()


def processor():
    return transformers.GotOcr2ImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.485, 0.456, 0.406],
                                              image_std=[0.229, 0.224, 0.225], max_patches=6)


@pytest.fixture(scope="module")
def vlms(tmp_path_factory):
    """Each variant built by transformers, saved whole in many shards with its image processor:
    ``{variant: (folder, model)}``."""
    built = {}
    for name, (tower, top) in VARIANTS.items():
        config = transformers.InternVLConfig(vision_config=dict(TOWER, **tower), text_config=TEXT, image_token_id=3,
                                             **top)
        torch.manual_seed(0)
        model = noisy(transformers.InternVLForConditionalGeneration(config))
        model.set_attn_implementation("eager")
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder, max_shard_size="20KB")
        processor().save_pretrained(folder)
        built[name] = folder, model
    return built


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_tower_layer_attends_as_transformers_at_three_sizes(vlms, variant):
    folder, model = vlms[variant]
    checkpoint = open_source(folder)
    depth = DEPTH.get(variant, 3)
    assert checkpoint.config.num_layers == depth and checkpoint.model.head is None
    assert checkpoint.config.qk_norm == (variant == "qk_norm")
    for size in (NATIVE, SQUARE, OTHER):  # the positions interpolated bicubically at the last two, as HF does
        images = torch.randn(2, 3, *size)
        with torch.no_grad():
            theirs = model.model.vision_tower(pixel_values=images, output_attentions=True)
            ours = checkpoint.model.encode(images, output_attentions=True)
        assert len(ours.attentions) == depth
        for mine, reference in zip(ours.attentions, theirs.attentions[:depth], strict=True):
            assert mine.shape == reference.shape == (2, 2, 1 + size[0] * size[1] // 64, 1 + size[0] * size[1] // 64)
            torch.testing.assert_close(mine, reference, rtol=0, atol=ATOL)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_projector_gives_what_get_image_features_gives_the_language_model(vlms, variant):
    folder, model = vlms[variant]
    checkpoint = open_source(folder)
    for size in (NATIVE, SQUARE):  # HF's pixel shuffle reads a square grid
        images = torch.randn(2, 3, *size)
        with torch.no_grad():
            expected = model.get_image_features(pixel_values=images).pooler_output
            x, _ = checkpoint.model.tokens(images)
            ours = checkpoint.model.project(x, checkpoint.model.patch_grid(*size))
        assert ours.shape == expected.shape == (2, size[0] * size[1] // 256, 24)
        torch.testing.assert_close(ours, expected, rtol=0, atol=ATOL)


def test_the_pixel_shuffle_concatenates_each_units_patches_row_major_as_internvls():
    """On an 8 x 8 grid of tokens that differ, the projector alone against HF's pixel_shuffle and projector: a unit
    read column-major (or units taken column-major) gives other rows, so this fails on a wrong order."""
    from vit.model import ViT, ViTConfig

    config = transformers.InternVLConfig(vision_config=dict(TOWER), text_config=TEXT)
    hf = noisy(transformers.InternVLModel(config))
    model = ViT(ViTConfig(64, 8, 3, 0, hidden_size=32, num_layers=1, num_heads=2, mlp_size=48, pooling="avg",
                          projector="internvl", projector_dim=24, projector_skip=1, projector_unit=2)).eval()
    theirs = hf.multi_modal_projector
    model.projector.load_state_dict({"norm.weight": theirs.layer_norm.weight, "norm.bias": theirs.layer_norm.bias,
                                     "fc1.weight": theirs.linear_1.weight, "fc1.bias": theirs.linear_1.bias,
                                     "fc2.weight": theirs.linear_2.weight, "fc2.bias": theirs.linear_2.bias})
    tokens = torch.randn(2, 64, 32)  # the patches, row-major on the 8 x 8 grid
    with torch.no_grad():
        expected = theirs(hf.pixel_shuffle(tokens.reshape(2, 8, 8, 32)).reshape(2, 16, 128))
        torch.testing.assert_close(model.projector(tokens, (8, 8)), expected, rtol=0, atol=ATOL)
        transposed = tokens.reshape(2, 8, 8, 32).transpose(1, 2).reshape(2, 64, 32)
        assert not torch.allclose(model.projector(transposed, (8, 8)), expected, atol=1e-3)


def test_a_grid_of_odd_sides_is_refused_by_the_pixel_shuffle_in_one_line(vlms):
    checkpoint = open_source(vlms["plain"][0])
    with torch.no_grad():
        x, _ = checkpoint.model.tokens(torch.randn(1, 3, 24, 40))
        with pytest.raises(ValueError, match="3x5 patch grid is not made of whole 2x2") as e:
            checkpoint.model.project(x, (3, 5))
    assert "\n" not in str(e.value)


def _index(folder) -> dict[str, str]:
    return json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]


def _is_tower_tensor(name: str, variant: str) -> bool:
    """Whether a tensor of the saved VLM belongs to what the tower opened here computes (by hand)."""
    if name.startswith("multi_modal_projector."):
        return True
    if not name.startswith("vision_tower."):
        return False
    inner = name[len("vision_tower."):]
    layers = tuple(f"encoder.layer.{i}." for i in range(DEPTH.get(variant, 3)))
    return inner.startswith(("embeddings.", *layers, *(("layernorm.",) if variant == "final_norm" else ())))


@pytest.mark.parametrize("variant", ["plain", "layer_-2"])
def test_only_the_towers_tensors_are_read_and_only_the_shards_that_hold_them_opened(vlms, variant, monkeypatch):
    from safetensors import safe_open

    folder, _ = vlms[variant]
    opened, read = [], []

    class Recording:
        def __init__(self, path, **kwargs):
            opened.append(Path(path).name)
            self.file = safe_open(path, **kwargs)

        def __enter__(self):
            self.file.__enter__()
            return self

        def __exit__(self, *exc):
            return self.file.__exit__(*exc)

        def get_tensor(self, name):
            read.append(name)
            return self.file.get_tensor(name)

    monkeypatch.setattr("safetensors.safe_open", Recording)
    monkeypatch.setattr("safetensors.torch.load_file", lambda *a, **k: pytest.fail("a whole file was read"))
    open_source(folder)
    weight_map = _index(folder)
    tower = sorted(k for k in weight_map if _is_tower_tensor(k, variant))
    assert sorted(read) == tower  # the language model's and the later layers' never
    assert set(opened) == {weight_map[k] for k in tower}
    assert len(set(weight_map.values())) >= 5 and set(weight_map.values()) - set(opened)  # the LM's stay shut


def _picture(width: int, height: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(width).integers(0, 256, (height, width, 3), dtype=np.uint8))


def test_the_image_shown_is_the_processors_thumbnail_the_last_of_its_tiles(vlms):
    from vit.core.inference import preprocess

    checkpoint = open_source(vlms["plain"][0])
    tiles = transformers.GotOcr2ImageProcessor.from_pretrained(vlms["plain"][0])
    for width, height in ((130, 60), (50, 90)):  # 4 x 2 and 1 x 2 tiles, then the thumbnail
        image = _picture(width, height)
        ours = preprocess([image], checkpoint.preprocessing)[0]
        alone = tiles(images=image, return_tensors="pt")["pixel_values"][0]  # crop_to_patches false: one image
        tiled = tiles(images=image, crop_to_patches=True, return_tensors="pt")["pixel_values"]
        assert tiled.shape[0] > 2 and ours.shape == alone.shape == (3, 32, 32)
        torch.testing.assert_close(ours, alone, rtol=0, atol=1e-5)
        torch.testing.assert_close(ours, tiled[-1], rtol=0, atol=1e-5)
    note = checkpoint.metadata["tower"]
    assert "all 3 layers (vision_feature_layer -1)" in note and "the CLS" in note and "2x2 unit" in note
    assert "up to 6 tiles of 32x32 plus a thumbnail" in note and "here the thumbnail alone" in note


def test_a_folder_without_its_processor_gets_internvls_own_transform_said_as_assumed(vlms, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(vlms["plain"][0], bare, ignore=shutil.ignore_patterns("preprocessor_config.json"))
    checkpoint = open_source(bare)
    p = checkpoint.preprocessing
    assert p.image_hw == (32, 32) and p.resample == "bicubic" and p.mean == pytest.approx((0.485, 0.456, 0.406))
    assert "No preprocessor_config.json" in checkpoint.metadata["preprocessing_guessed"]


def test_vit_load_explains_attention_and_refuses_the_class_maps_in_one_line(vlms):
    import vit

    checkpoint = vit.load(str(vlms["qk_norm"][0]))
    assert set(vit.methods(checkpoint)) >= {"attention", "rollout"} and "lrp" not in vit.methods(checkpoint)
    image = np.asarray(_picture(120, 100))
    explanation = vit.explain(checkpoint, image, "attention", layer=-1, head=0)
    assert explanation.map.shape == (4, 4)
    for method in ("class", "legrad", "attnlrp"):
        with pytest.raises(ValueError, match=f"{method} does not apply to this model") as e:
            vit.explain(checkpoint, image, method)
        assert "\n" not in str(e.value)


def test_the_catalogue_lists_and_describes_the_tower_from_its_shard_headers_alone(vlms, monkeypatch):
    from vit.app.catalog import Candidate, describe_import

    parameters = sum(p.numel() for p in open_source(vlms["plain"][0]).model.parameters())
    monkeypatch.setattr("vit.sources.weights_files._read_tensors", lambda *a, **k: pytest.fail("a tensor was read"))
    entry = describe_import(Candidate(vlms["plain"][0], "file", "internvl"))
    assert entry.ok, entry.error
    assert entry.metadata["architecture"] == "hf:InternVLForConditionalGeneration" and entry.class_names == ()
    assert entry.num_layers == 3 and entry.image_size == 32 and entry.parameters == parameters
    assert "here the thumbnail alone" in entry.description and "no classifier" in entry.description


def test_a_hub_id_downloads_the_towers_shards_alone_then_opens_from_the_cache(vlms, fake_hub):
    from vit.app.catalog import hf_cache_listing

    folder, _ = vlms["plain"]
    fake_hub.add_folder("OpenGVLab/InternVL3-tiny-hf", folder)
    by_path = open_source(folder).model.state_dict()
    for _ in range(2):  # downloaded, then read from the HF cache
        by_id = open_source("OpenGVLab/InternVL3-tiny-hf").model.state_dict()
        assert by_id.keys() == by_path.keys() and all(torch.equal(by_id[k], by_path[k]) for k in by_path)
    weight_map = _index(folder)
    shards = sorted(f for f in fake_hub.fetched("GET") if f.endswith(".safetensors"))
    assert shards == sorted({weight_map[k] for k in weight_map if _is_tower_tensor(k, "plain")})
    assert len(shards) < len(set(weight_map.values()))  # the language model's shards never leave the Hub
    listed = hf_cache_listing().candidates
    assert [c.name for c in listed] == ["OpenGVLab/InternVL3-tiny-hf"]
    assert open_source(listed[0].path).config.num_layers == 3


def _edited(folder, tmp_path, config=None, processor=None, vision=None):
    copy = tmp_path / "edited"
    shutil.copytree(folder, copy)
    values = json.loads((copy / "config.json").read_text())
    values.update(config or {})
    values["vision_config"].update(vision or {})
    (copy / "config.json").write_text(json.dumps(values))
    if processor:
        values = json.loads((copy / "preprocessor_config.json").read_text())
        values.update(processor)
        (copy / "preprocessor_config.json").write_text(json.dumps(values))
    return copy


@pytest.mark.parametrize("config, vision, processor, message", [
    (dict(vision_feature_select_strategy="full"), None, None, "vision_feature_select_strategy 'full' is not"),
    (dict(vision_feature_layer=[-2, -1]), None, None, "vision_feature_layer must be one layer index"),
    (dict(vision_feature_layer=0), None, None, "vision_feature_layer 0 reads no layer of a 3-layer tower"),
    (dict(downsample_ratio=0.3), None, None, "downsample_ratio 0.3 is not 1 / n"),
    (None, dict(norm_type="group_norm"), None, "norm_type 'group_norm' is not supported"),
    (None, None, dict(size={"height": 32, "width": 48}), "names no square tile"),
])
def test_what_an_internvl_folder_asks_for_that_is_not_reproduced_is_refused_in_one_line(vlms, tmp_path, config,
                                                                                       vision, processor, message):
    with pytest.raises(SourceError, match=message) as e:
        open_source(_edited(vlms["plain"][0], tmp_path, config, processor, vision))
    assert "\n" not in str(e.value)


def test_the_keys_the_hubs_internvl_configs_carry_beyond_transformers_fields_open(vlms, tmp_path):
    """OpenGVLab's -hf configs keep the original InternViT's ``dropout`` and ``initializer_factor``, which
    transformers ignores."""
    extra = dict(architectures=["InternVisionModel"], dropout=0.0, initializer_factor=0.1, torch_dtype="bfloat16")
    checkpoint = open_source(_edited(vlms["plain"][0], tmp_path, vision=extra))
    assert checkpoint.config == open_source(vlms["plain"][0]).config


def test_every_internvl_vision_config_field_is_read_or_known_to_change_nothing():
    from vit.sources.vlm import import_internvl

    fields = {f.name for f in dataclasses.fields(transformers.InternVLVisionConfig)} - {
        f.name for f in dataclasses.fields(transformers.PretrainedConfig)}
    assert fields - import_internvl.HONOURED - import_internvl.INERT == set()
