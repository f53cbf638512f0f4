"""Qwen2.5-VL's vision tower opened from the VLM's own folder (a random tiny Qwen2_5_VLForConditionalGeneration that
transformers builds and saves in small shards, its processor beside it), against transformers itself: every layer's
attention as its ``eager_attention_forward`` computes it (windows and all), taken back to the grid, at two aspect
ratios; the merger's tokens as ``get_image_features`` gives them; the input as its processor makes it. Opened by path,
from the HF cache and by Hub id (the local Hub), reading only the tower's tensors and shards."""

import json

import numpy as np
import pytest
import torch
from parity_helpers import ATOL, randomize
from PIL import Image

transformers = pytest.importorskip("transformers")
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration  # noqa: E402
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl  # noqa: E402
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor  # noqa: E402
from transformers.vision_utils import get_vision_window_index  # noqa: E402

import vit  # noqa: E402
from vit.core.inference import preprocess  # noqa: E402
from vit.explain.methods.attention import layer_on_grid  # noqa: E402
from vit.model import LayerLayout  # noqa: E402
from vit.sources import open as sources  # noqa: E402
from vit.sources import weights_files  # noqa: E402

VISION = dict(depth=4, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=24,
              fullatt_block_indexes=[2])  # layers 0, 1, 3 in 112-px windows, 2 global
TEXT = dict(hidden_size=24, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
            vocab_size=64, max_position_embeddings=64,
            rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 1], "rope_theta": 10000.0})
MAX_PIXELS = 28 * 28 * 160  # 640 patches at most: windows of several sizes, small enough for a test
IMAGES = [(310, 230), (130, 400)]  # (width, height): landscape and a tall strip, both cut by the windows' edges


@pytest.fixture(scope="module")
def qwen():
    config = Qwen2_5_VLConfig(vision_config=VISION, text_config=TEXT)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return randomize(Qwen2_5_VLForConditionalGeneration(config))


@pytest.fixture(scope="module")
def folder(qwen, tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2_5_vl")
    qwen.save_pretrained(path, max_shard_size="20KB")  # a dozen shards, the language model's apart
    Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=MAX_PIXELS).save_pretrained(path)
    return path


def image(size: tuple[int, int], seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def transformers_attention(qwen, pixel_values, grid_thw) -> tuple[list[torch.Tensor], object]:
    """Each layer's attention as transformers computes it, ``(H, T, T)`` on the row-major grid: its eager function's
    probabilities, one call per window in a windowed layer, placed by transformers' own window index."""
    calls, eager = [], modeling_qwen2_5_vl.eager_attention_forward

    def spy(module, query, key, value, attention_mask, **kwargs):
        out, weights = eager(module, query, key, value, attention_mask, **kwargs)
        calls.append(weights.detach()[0])
        return out, weights

    modeling_qwen2_5_vl.eager_attention_forward = spy
    try:
        with torch.no_grad():
            out = qwen.model.visual(pixel_values, grid_thw=grid_thw)
    finally:
        modeling_qwen2_5_vl.eager_attention_forward = eager
    _, gh, gw = grid_thw[0].tolist()
    units, cu = get_vision_window_index(grid_thw, 2, 112, 14)
    order = torch.tensor([(u // (gw // 2) * 2 + py) * gw + u % (gw // 2) * 2 + px
                          for u in units.tolist() for py in (0, 1) for px in (0, 1)])  # its i-th token's place
    windows, layers = torch.diff(cu).tolist(), []
    for layer in range(VISION["depth"]):
        spans = [sum(order.shape)] if layer in VISION["fullatt_block_indexes"] else windows
        dense, start = torch.zeros(VISION["num_heads"], len(order), len(order)), 0
        for n in spans:
            place = order[start:start + n]
            dense[:, place[:, None], place[None, :]] = calls.pop(0)
            start += n
        layers.append(dense)
    assert not calls
    return layers, out


@pytest.mark.parametrize("size", IMAGES)
def test_every_layer_attention_and_the_merger_equal_transformers(qwen, folder, size):
    checkpoint = vit.load(folder)
    model, picture = checkpoint.model, image(size)
    x = preprocess([picture], checkpoint.preprocessing, patch_size=14)  # (1, 3, H, W)
    theirs = Qwen2VLImageProcessor.from_pretrained(folder)(images=[picture], return_tensors="pt")
    grid = tuple(theirs["image_grid_thw"][0, 1:].tolist())
    assert x.shape[-2:] == (grid[0] * 14, grid[1] * 14)
    reference, out = transformers_attention(qwen, theirs["pixel_values"], theirs["image_grid_thw"])
    with torch.no_grad():
        tokens, attentions = model.tokens(x, output_attentions=True)
        projected = model.project(tokens, grid)[0]
    for layer, (ours, want) in enumerate(zip(attentions, reference, strict=True)):
        placed = layer_on_grid(ours, model.blocks[layer].layout(grid))[0]  # (H, T, T) on the grid
        assert torch.allclose(placed, want, atol=ATOL), f"layer {layer}"
    with torch.no_grad():
        features = qwen.get_image_features(theirs["pixel_values"], theirs["image_grid_thw"]).pooler_output[0]
    assert torch.allclose(projected, features, atol=ATOL)
    assert torch.allclose(projected, out.pooler_output, atol=ATOL)


def test_the_window_order_taken_row_major_does_not_match(qwen, folder):
    """What the test above would catch: the same windows placed as if their slots were row-major."""
    checkpoint = vit.load(folder)
    picture = image(IMAGES[0])
    theirs = Qwen2VLImageProcessor.from_pretrained(folder)(images=[picture], return_tensors="pt")
    grid = tuple(theirs["image_grid_thw"][0, 1:].tolist())
    reference, _ = transformers_attention(qwen, theirs["pixel_values"], theirs["image_grid_thw"])
    x = preprocess([picture], checkpoint.preprocessing, patch_size=14)
    with torch.no_grad():
        attentions = checkpoint.model.tokens(x, output_attentions=True)[1]
    row_major = layer_on_grid(attentions[0], LayerLayout(grid, 8))[0]
    assert (row_major - reference[0]).abs().max() > 0.05


def test_the_input_is_its_processors(folder):
    checkpoint = vit.load(folder)
    for size in IMAGES:
        picture = image(size, 1)
        x = preprocess([picture], checkpoint.preprocessing, patch_size=14)
        theirs = Qwen2VLImageProcessor.from_pretrained(folder)(images=[picture], return_tensors="pt")
        _, gh, gw = theirs["image_grid_thw"][0].tolist()
        p = x.reshape(3, gh // 2, 2, 14, gw // 2, 2, 14).permute(1, 4, 2, 5, 0, 3, 6)  # units, unit's patches, pixels
        p = p.unsqueeze(5).expand(-1, -1, -1, -1, -1, 2, -1, -1).reshape(gh * gw, -1)  # two identical frames
        assert torch.allclose(p, theirs["pixel_values"], atol=1e-5)


def test_only_the_towers_tensors_and_shards_are_read(folder, monkeypatch):
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    tower = {shard for key, shard in index.items() if key.startswith("visual.")}
    assert set(index.values()) - tower  # some shards hold the language model alone
    opened, read = [], []
    real = weights_files.read_weights  # what read_hf_weights reads each shard with

    def spy(path, *args, **kwargs):
        state = real(path, *args, **kwargs)
        opened.append(path.name)
        read.extend(state)
        return state

    monkeypatch.setattr(weights_files, "read_weights", spy)
    checkpoint = sources.open_source(folder)
    assert set(opened) == tower
    assert read and all(key.startswith("visual.") for key in read)
    assert checkpoint.model.projector is not None and checkpoint.config.num_classes == 0


def test_a_hub_id_downloads_only_the_towers_shards(folder, fake_hub):
    fake_hub.add_folder("qwen/tiny-vl", folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    tower = {shard for key, shard in index.items() if key.startswith("visual.")}
    checkpoint = vit.load("qwen/tiny-vl")
    fetched = set(fake_hub.fetched("GET"))
    assert {f for f in fetched if f.endswith(".safetensors")} == tower
    assert {"config.json", "model.safetensors.index.json", "preprocessor_config.json"} <= fetched
    assert checkpoint.model.config.projector == "qwen"
    again = vit.load("qwen/tiny-vl")  # from the cache now
    assert torch.equal(again.model.blocks[0].attn.qkv.weight, checkpoint.model.blocks[0].attn.qkv.weight)


def test_the_explorers_catalogue_lists_it_from_the_cache(folder, fake_hub):
    from vit.app import catalog

    fake_hub.add_folder("qwen/tiny-vl", folder)
    checkpoint = vit.load("qwen/tiny-vl")
    [candidate] = [c for c in catalog.hf_cache_listing().candidates if c.name == "qwen/tiny-vl"]
    entry = catalog.describe_import(candidate)  # from config.json alone
    assert entry.error is None and entry.num_layers == 4 and entry.num_heads == 2 and entry.class_names == ()
    assert entry.parameters == sum(p.numel() for p in checkpoint.model.parameters())


@pytest.mark.parametrize("layer", [0, 2])  # a windowed layer, the global one
def test_explain_draws_a_query_row_on_the_grid_as_transformers_computes_it(qwen, folder, layer):
    """The contract every family keeps: tokens counted from the first patch (no prefix), row-major."""
    checkpoint, picture = vit.load(folder), image(IMAGES[0])
    theirs = Qwen2VLImageProcessor.from_pretrained(folder)(images=[picture], return_tensors="pt")
    grid = tuple(theirs["image_grid_thw"][0, 1:].tolist())
    reference, _ = transformers_attention(qwen, theirs["pixel_values"], theirs["image_grid_thw"])
    query = 7 * grid[1] + 17  # row 7, column 17: in the third column of windows, which the grid's edge cuts
    shown = vit.explain(checkpoint, picture, "attention", layer=layer, head=1, query=query)
    assert shown.grid == grid and shown.num_prefix_tokens == 0
    want = reference[layer][1, query].view(grid).numpy()
    assert np.allclose(shown.map, want, atol=ATOL)
    if layer == 0:  # zero outside the query's 8x8 window (rows 0-7, columns 16-21)
        assert np.count_nonzero(shown.map) == 8 * 6


@pytest.mark.parametrize("method", ["class", "legrad", "attnlrp"])
def test_maps_that_need_a_classifier_are_refused_in_one_line(folder, method):
    with pytest.raises(ValueError, match="does not apply to this model") as refused:
        vit.explain(vit.load(folder), image(IMAGES[0]), method)
    assert "\n" not in str(refused.value)


def test_mean_ablation_by_the_images_own_means_is_the_forward_itself(folder):
    """A windowed layer's per-position means go into its windows in Qwen's order (``LayerLayout.cut``): replacing
    heads by their own outputs on this image changes nothing (placed row-major, it moves the tokens by 0.3)."""
    from vit.explain.views.mechanism_views import ablated_checkpoint

    checkpoint, picture = vit.load(folder), image(IMAGES[0])
    x = preprocess([picture], checkpoint.preprocessing, patch_size=14)
    grid = checkpoint.model.patch_grid(*x.shape[-2:])
    means = vit.reference_means(checkpoint, [picture], picture)
    ablated = ablated_checkpoint(checkpoint, [(0, 0), (1, 1), (2, 0)], "mean", means, grid)
    zeroed = vit.ablate(checkpoint, [(0, 0)])
    with torch.no_grad():
        tokens = checkpoint.model.tokens(x)[0]
        assert torch.allclose(ablated.model.tokens(x)[0], tokens, atol=ATOL)
        assert not torch.allclose(zeroed.model.tokens(x)[0], tokens, atol=0.01)


def test_save_maps_writes_every_layer_on_the_grid_as_transformers_computes_it(qwen, folder, tmp_path):
    from vit import predict as predict_cli

    picture = image(IMAGES[1])
    picture.save(tmp_path / "strip.png")
    assert predict_cli.main([str(folder), str(tmp_path / "strip.png"), "--save-maps", str(tmp_path / "maps")]) == 0
    theirs = Qwen2VLImageProcessor.from_pretrained(folder)(images=[picture], return_tensors="pt")
    reference, _ = transformers_attention(qwen, theirs["pixel_values"], theirs["image_grid_thw"])
    saved = np.load(tmp_path / "maps" / "strip.npz")
    assert tuple(saved["grid"]) == tuple(theirs["image_grid_thw"][0, 1:].tolist()) and int(saved["prefix_tokens"]) == 0
    for layer, want in enumerate(reference):
        assert np.allclose(saved[f"layer_{layer}"], want.numpy(), atol=ATOL), f"layer {layer}"


def test_the_explorer_shows_the_image_at_qwens_own_size(folder):
    from vit.app import drawing
    from vit.explain.views import image_analysis

    checkpoint, picture = vit.load(folder), image(IMAGES[0])  # 310 x 230 px: smart_resize makes it 308 x 224
    analysis = image_analysis.analyse(checkpoint, picture)
    assert analysis.input_size == (224, 308) and analysis.grid == (16, 22) and analysis.at_training_size
    assert drawing.model_input_image(picture, checkpoint).size == (308, 224)  # not the nominal 1036 square
    caption = drawing.describe_input(analysis, picture.size)
    assert "Qwen's processor keeps the image's aspect ratio" in caption and "not its training size" not in caption


@pytest.mark.parametrize("statistic, value", [("image_mean", float("nan")), ("image_std", float("inf"))])
def test_a_processor_whose_statistics_are_not_finite_is_refused_in_one_line(folder, tmp_path, statistic, value):
    """Issue 77, item 7: an ``image_mean`` of NaN opened and gave an all-NaN map (an infinite std, zeros)."""
    import shutil

    from vit.checkpoint import CheckpointError

    copy = tmp_path / "qwen"
    shutil.copytree(folder, copy)
    processor = json.loads((copy / "preprocessor_config.json").read_text())
    processor[statistic] = [0.5, value, 0.5]
    (copy / "preprocessor_config.json").write_text(json.dumps(processor))  # NaN, Infinity: as Python's json reads
    with pytest.raises(CheckpointError, match=f"preprocessor_config.json cannot be used \\({statistic} must be a "
                                              f"list of numbers, got \\[0.5, {value}, 0.5\\]"):
        vit.load(copy)
