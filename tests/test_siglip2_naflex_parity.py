"""SigLIP 2 NaFlex opened through ``vit.sources`` matches transformers: the pixels its processor gives, every layer's
attention over the real tokens, the probe's attention, the pooled embedding and the zero-shot logits, to 1e-5, at
three aspect ratios and two patch budgets; a padded batch of images on different grids equals each image alone.

The reference is a tiny random ``Siglip2Model`` (eager attention, σ 0.05 noise on every parameter) saved with
``save_pretrained``, with transformers' own processor as ``AutoImageProcessor`` resolves it: its torchvision backend
(``Siglip2ImageProcessor``, whichever class the folder was saved with), matched to float32 rounding; with
``VIT_HF_IMAGE_BACKEND=pil`` its PIL backend (``Siglip2ImageProcessorPil``) is, and the two pick the same grid but
resize with other kernels (tests/test_library_transforms.py). HF pads every image to ``max_num_patches`` tokens and
masks the padding; its attentions are compared over the real tokens."""

import numpy as np
import pytest
import torch
from parity_helpers import assert_parity, randomize
from PIL import Image

from vit.core.images import naflex_size
from vit.core.inference import input_box, input_shape, preprocess, seen_region
from vit.model import blocks
from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing transformers takes seconds

VISION = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2, patch_size=8,
              num_patches=16)
TEXT = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2, vocab_size=49408,
            max_position_embeddings=16)
SIZES = [(50, 30), (30, 70), (40, 40)]  # (width, height): landscape, portrait, square
BUDGETS = [16, 24]  # the table's own 4 x 4 grid, and more patches than it has
LABELS = ["a cat", "a dog", "a red car"]


def noise_image(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed + width * 7 + height)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def naflex(tmp_path_factory):
    """``(folder, reference model, opened checkpoint)`` of a tiny random Siglip2Model with processor and tokenizer."""
    from test_prompts import bpe_tokenizer_files

    folder = tmp_path_factory.mktemp("siglip2-naflex")
    config = transformers.Siglip2Config(vision_config=VISION, text_config=TEXT)
    config._attn_implementation = "eager"
    config.vision_config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = randomize(transformers.Siglip2Model(config)).eval()
    model.save_pretrained(folder)
    transformers.Siglip2ImageProcessorPil(patch_size=8, max_num_patches=16).save_pretrained(folder)
    bpe_tokenizer_files(folder)
    return folder, model, open_source(folder)


def hf_inputs(folder, images, budget, backend=None):
    """The processor's inputs; ``backend`` None: the one ``AutoImageProcessor`` resolves the folder to."""
    processor = transformers.AutoImageProcessor.from_pretrained(folder, backend=backend)
    return processor(images=images, max_num_patches=budget, return_tensors="pt")


def with_budget(checkpoint, budget):
    from dataclasses import replace

    return replace(checkpoint.preprocessing, max_num_patches=budget)


def as_patches(x: torch.Tensor, patch: int) -> torch.Tensor:
    """``(C, H, W)`` -> HF's ``(gh*gw, p*p*C)`` rows (``convert_image_to_patches``)."""
    C, H, W = x.shape
    return x.reshape(C, H // patch, patch, W // patch, patch).permute(1, 3, 2, 4, 0).reshape(-1, patch * patch * C)


def test_naflex_size_is_transformers_rule():
    from transformers.models.siglip2.image_processing_siglip2 import get_image_size_for_max_num_patches

    for height, width in [(1, 1), (30, 50), (70, 30), (224, 224), (1000, 17), (17, 1000), (480, 640), (333, 500)]:
        for patch, budget in [(8, 16), (8, 24), (16, 256), (16, 1024), (14, 100)]:
            assert naflex_size(height, width, patch, budget) == get_image_size_for_max_num_patches(
                height, width, patch, budget)


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("size", SIZES)
def test_pixels_are_transformers_processors(naflex, size, budget, monkeypatch):
    from dataclasses import replace

    folder, _, checkpoint = naflex
    image = noise_image(*size)
    p = with_budget(checkpoint, budget)
    assert p.backend == "torchvision"  # what AutoImageProcessor resolves the folder's Siglip2ImageProcessorPil to
    for backend in ("torchvision", "pil"):  # the default, then VIT_HF_IMAGE_BACKEND=pil's
        ours = preprocess([image], replace(p, backend=backend))  # (1, C, H, W) at the image's own aspect
        expected = hf_inputs(folder, [image], budget, backend)
        gh, gw = expected["spatial_shapes"][0].tolist()
        assert tuple(ours.shape[2:]) == (gh * 8, gw * 8) == input_shape(image, p, 8)
        n = gh * gw
        assert int(expected["pixel_attention_mask"][0].sum()) == n
        torch.testing.assert_close(as_patches(ours[0], 8), expected["pixel_values"][0, :n], rtol=0, atol=1e-6)
    monkeypatch.setenv("VIT_HF_IMAGE_BACKEND", "pil")
    assert open_source(folder).preprocessing.backend == "pil"
    assert input_box(image.size, p) == (0.0, 0.0, float(size[0]), float(size[1]))  # every pixel, no crop
    assert seen_region(image, p) is image


def hf_probe_attention(head, tokens, mask):
    probe = head.probe.expand(tokens.shape[0], -1, -1)
    bias = torch.zeros(mask.shape, dtype=tokens.dtype).masked_fill(mask == 0, torch.finfo(tokens.dtype).min)
    bias = bias[:, None, None, :].expand(-1, head.num_heads, 1, -1).reshape(-1, 1, tokens.shape[1])
    return head.attention(probe, tokens, tokens, attn_mask=bias, need_weights=True,
                          average_attn_weights=False)[1]  # (B, nh, 1, T)


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("size", SIZES)
def test_attentions_and_pooled_output_match_transformers(naflex, size, budget):
    folder, model, checkpoint = naflex
    image = noise_image(*size)
    inputs = hf_inputs(folder, [image], budget)
    n = int(inputs["pixel_attention_mask"][0].sum())
    x = preprocess([image], with_budget(checkpoint, budget))
    with torch.no_grad():
        out = model.vision_model(**inputs, output_attentions=True)
        probe = hf_probe_attention(model.vision_model.head, out.last_hidden_state, inputs["pixel_attention_mask"])
        ours = checkpoint.model.encode(x, output_attentions=True)
    assert ours.attentions[0].shape[-1] == n  # the real tokens alone, never padding
    row = f"SigLIP 2 NaFlex | HF Siglip2Model | {size[0]}x{size[1]} px, {budget} patches"
    assert_parity(row, ours.embedding, out.pooler_output, ours.attentions,
                  [a[:, :, :n, :n] for a in out.attentions])
    assert_parity(row + " probe", ours.embedding, out.pooler_output, [ours.pool_attention], [probe[..., :n]])
    # the real tokens' rows of HF's padded run give nothing to padding
    assert all(float(a[:, :, :n, n:].abs().sum()) == 0 for a in out.attentions)


def test_a_padded_batch_equals_transformers_batch_and_each_image_alone(naflex, monkeypatch):
    folder, model, checkpoint = naflex
    images = [noise_image(*size) for size in SIZES]
    inputs = hf_inputs(folder, images, 24)
    xs = [preprocess([image], with_budget(checkpoint, 24))[0] for image in images]
    vit = checkpoint.model
    with torch.no_grad():
        out = model.vision_model(**inputs, output_attentions=True)
        padded = vit.encode_padded(xs, output_attentions=True)
        alone = [vit.encode(x[None], output_attentions=True) for x in xs]
        fused = vit.encode_padded(xs)  # SDPA with the mask as its attn_mask
        monkeypatch.setattr(blocks, "FUSED_CHUNK_FLOPS", 1)  # the chunked path: one query row per call
        chunked = vit.encode_padded(xs)
    for i, (one, single) in enumerate(zip(padded, alone, strict=True)):
        n = int(inputs["pixel_attention_mask"][i].sum())
        assert one.attentions[0].shape[-1] == single.attentions[0].shape[-1] == n
        assert one.pool_attention.shape[-1] == n
        torch.testing.assert_close(one.embedding, single.embedding, rtol=0, atol=1e-5)
        torch.testing.assert_close(one.embedding, out.pooler_output[i:i + 1], rtol=0, atol=1e-5)
        torch.testing.assert_close(fused[i].embedding, single.embedding, rtol=0, atol=1e-5)
        torch.testing.assert_close(chunked[i].embedding, single.embedding, rtol=0, atol=1e-5)
        for ours, theirs, reference in zip(one.attentions, single.attentions, out.attentions, strict=True):
            torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
            torch.testing.assert_close(ours, reference[i:i + 1, :, :n, :n], rtol=0, atol=1e-5)
            torch.testing.assert_close(ours.sum(-1), torch.ones_like(ours.sum(-1)))  # no mass left on padding
        torch.testing.assert_close(one.pool_attention, single.pool_attention, rtol=0, atol=1e-5)


def test_padding_that_leaked_would_change_the_outputs(naflex):
    """The check above has teeth: without the mask, the padded batch's short image differs from it alone."""
    _, _, checkpoint = naflex
    vit = checkpoint.model
    xs = [preprocess([noise_image(*size)], with_budget(checkpoint, 24))[0] for size in SIZES]
    with torch.no_grad():
        embedded = [vit.embed(x[None]) for x in xs]
        longest = max(e.shape[1] for e in embedded)
        batch = torch.cat([torch.nn.functional.pad(e, (0, 0, 0, longest - e.shape[1])) for e in embedded])
        leaked, _ = vit.run_blocks(batch, None)  # no key mask: padding read as keys
        alone, _ = vit.run_blocks(embedded[2], None)
    n = embedded[2].shape[1]
    assert n < longest and float((leaked[2:3, :n] - alone).abs().max()) > 1e-3


def test_zero_shot_logits_equal_transformers(naflex):
    from vit.explain.language import prompts
    from vit.sources.vlm.text_tower import open_text_tower

    folder, model, checkpoint = naflex
    tower = open_text_tower(checkpoint)
    assert tower.kind == "sigmoid"
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    tokens = tokenizer(LABELS, padding="max_length", max_length=16, truncation=True, return_tensors="pt")
    for size in SIZES:
        image = noise_image(*size)
        inputs = hf_inputs(folder, [image], 16)
        with torch.no_grad():
            expected = model(**inputs, **tokens).logits_per_image  # (1, labels)
        x = preprocess([image], checkpoint.preprocessing)
        logits, probs = prompts.zero_shot(checkpoint.model, x, tower.encode(LABELS), tower.logit_scale,
                                          tower.logit_bias, tower.kind)
        torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(probs, expected.sigmoid(), rtol=1e-5, atol=1e-5)


def test_a_vision_folder_and_a_hub_id_open_the_same_naflex_model(tmp_path, fake_hub):
    config = transformers.Siglip2VisionConfig(**VISION)
    torch.manual_seed(1)
    model = randomize(transformers.Siglip2VisionModel(config)).eval()
    model.save_pretrained(tmp_path / "vision")
    transformers.Siglip2ImageProcessorPil(patch_size=8, max_num_patches=24).save_pretrained(tmp_path / "vision")
    fake_hub.add_folder("google/siglip2-naflex-tiny", tmp_path / "vision")
    by_path, by_id = open_source(tmp_path / "vision"), open_source("google/siglip2-naflex-tiny")
    assert by_id.preprocessing == by_path.preprocessing and by_path.preprocessing.max_num_patches == 24
    image = noise_image(30, 70)
    inputs = hf_inputs(tmp_path / "vision", [image], 24)
    with torch.no_grad():
        expected = model(**inputs).pooler_output
        for checkpoint in (by_path, by_id):
            ours = checkpoint.model.encode(preprocess([image], checkpoint.preprocessing)).embedding
            torch.testing.assert_close(ours, expected, rtol=0, atol=1e-5)


# --- timm naflexvit_* ---------------------------------------------------------------------------------------------

TIMM_NAMES = ["naflexvit_base_patch16_gap", "naflexvit_so150m2_patch16_reg1_gap", "naflexvit_base_patch16_siglip",
              "naflexvit_base_patch16_map", "naflexvit_so150m2_patch16_reg1_map"]


def timm_naflexvit(tmp_path, name, **options):
    """A tiny random timm ``name`` (explicit attention, σ 0.05 noise) and what ``open_source`` makes of its folder."""
    timm = pytest.importorskip("timm")
    args = dict(patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5, pos_embed_grid_size=(4, 4))
    timm.layers.set_fused_attn(False)
    try:
        torch.manual_seed(0)
        model = randomize(timm.create_model(name, pretrained=False, **args, **options)).eval()
    finally:
        timm.layers.set_fused_attn(True)
    timm.models.save_for_hf(model, tmp_path / "timm", model_args=dict(num_heads=2, patch_size=8, **options),
                            safe_serialization=True)
    return model, open_source(tmp_path / "timm")


@pytest.mark.parametrize("name", TIMM_NAMES)
def test_timm_naflexvit_matches_timm_at_three_aspects(tmp_path, name):
    from parity_helpers import capture_inputs

    model, checkpoint = timm_naflexvit(tmp_path, name)
    assert checkpoint.preprocessing.max_num_patches == 16
    for size in SIZES:
        image = noise_image(*size)
        x = preprocess([image], checkpoint.preprocessing)  # the image's own aspect, at most 16 patches
        expected, attentions = capture_inputs([b.attn.attn_drop for b in model.blocks], lambda x=x: model(x))
        with torch.no_grad():
            logits, ours = checkpoint.model(x, output_attentions=True)
        assert_parity(f"NaFlex | timm {name} | {size[0]}x{size[1]} px", logits, expected, ours, attentions)


@pytest.mark.parametrize("include", [False, True])
def test_timm_naflexvit_probe_skips_the_register_and_class_tokens_unless_told_to_read_them(tmp_path, include):
    """timm's ``pool_include_prefix``: False (its default, *_map and *_reg1_map) slices the prefix tokens off before
    the probe; our probe masks them, so it gives them exactly zero and reads the patches as timm's does."""
    model, checkpoint = timm_naflexvit(tmp_path, "naflexvit_base_patch16_map", class_token=True,
                                       pool_include_prefix=include)
    vit = checkpoint.model
    assert vit.num_prefix_tokens == 2 and vit.config.pool_prefix is include  # CLS and one register
    for size in SIZES:
        x = preprocess([noise_image(*size)], checkpoint.preprocessing)
        with torch.no_grad():
            ours = vit.encode(x, output_attentions=True)
            expected = model(x)
        torch.testing.assert_close(ours.logits, expected, rtol=0, atol=1e-5)
        prefix_mass = ours.pool_attention[..., :2].sum()
        assert (float(prefix_mass) > 1e-3) if include else float(prefix_mass) == 0.0
        torch.testing.assert_close(ours.pool_attention.sum(-1), torch.ones(1, 2, 1))


def test_timm_naflexvit_with_a_table_we_lack_is_refused_in_one_line(tmp_path):
    timm = pytest.importorskip("timm")
    model = timm.create_model("naflexvit_base_patch16_par_gap", pretrained=False, patch_size=8, embed_dim=32,
                              depth=1, num_heads=2, pos_embed_grid_size=(4, 4))
    timm.models.save_for_hf(model, tmp_path / "timm", model_args=dict(num_heads=2, patch_size=8),
                            safe_serialization=True)
    from vit.sources.open import SourceError

    with pytest.raises(SourceError, match="aspect-preserving or factorized") as error:
        open_source(tmp_path / "timm")
    assert "\n" not in str(error.value)


# --- maps: every one on the image's own grid, drawn over exactly the pixels the model saw ----------------------

def test_every_map_of_a_naflex_model_is_on_the_images_own_grid_over_the_whole_image(naflex):
    from vit import api

    _, _, checkpoint = naflex
    image = noise_image(50, 30)
    grid = tuple(s // 8 for s in input_shape(image, checkpoint.preprocessing, 8))
    assert grid == (3, 5)  # a landscape grid within the 16 patches of its processor
    drawn = []
    for method in api.methods():
        try:
            explanation = api.explain(checkpoint, image, method)
        except ValueError as error:  # the methods for classifiers; a SigLIP's go through words (below)
            assert "does not apply" in str(error) or "vit.ask" in str(error)
            continue
        assert explanation.map.shape == explanation.grid == grid
        assert explanation.input_box == (0.0, 0.0, 50.0, 30.0) and explanation.seen.size == (50, 30)
        drawn.append(method)
    assert {"attention", "rollout", "flow", "norms", "probe", "probe_rollout"} <= set(drawn)
    answer = api.ask(checkpoint, image, LABELS)
    for method in api.ask_methods(checkpoint):  # LeGrad and AttnLRP of each label
        explanation = answer.explain("a dog", method)
        assert explanation.map.shape == grid and np.isfinite(explanation.map).all()


def test_predict_save_maps_writes_each_images_attention_over_its_real_tokens(naflex, tmp_path, capsys):
    from test_prompts import predict_json

    folder, model, checkpoint = naflex
    paths = []
    for width, height in SIZES:
        paths.append(tmp_path / f"{width}x{height}.png")
        noise_image(width, height).save(paths[-1])
    status, results, _ = predict_json(capsys, folder, *paths, "--save-maps", tmp_path / "maps")
    assert status == 0 and len(results) == 3
    for path, (width, height) in zip(paths, SIZES, strict=True):
        saved = np.load(tmp_path / "maps" / f"{path.stem}.npz")
        inputs = hf_inputs(folder, [Image.open(path)], 16)
        n = int(inputs["pixel_attention_mask"][0].sum())
        assert tuple(saved["grid"]) == tuple(inputs["spatial_shapes"][0].tolist())
        assert tuple(saved["input_box"]) == (0, 0, width, height)
        with torch.no_grad():
            expected = model.vision_model(**inputs, output_attentions=True).attentions
        for i, layer in enumerate(expected):
            assert saved[f"layer_{i}"].shape == (2, n, n)  # real tokens only, never the padding
            np.testing.assert_allclose(saved[f"layer_{i}"], layer[0, :, :n, :n].numpy(), rtol=0, atol=1e-5)


def test_predict_runs_images_on_different_grids_in_one_padded_forward_equal_to_timm(tmp_path):
    """``vit.core.inference.predict`` over a landscape, a portrait and a square: one forward through the blocks (batch
    3, padded), each image's logits timm's for it alone and its attentions timm's over its real tokens."""
    from parity_helpers import capture_inputs

    from vit.core.inference import predict

    model, checkpoint = timm_naflexvit(tmp_path, "naflexvit_so150m2_patch16_reg1_map")
    images = [noise_image(*size) for size in SIZES]
    batches = []
    with checkpoint.model.hooks([("blocks.0.hook_resid_pre", lambda x, hook: batches.append(x.shape[0]))]):
        predictions = predict(checkpoint, images, top_k=5, output_attentions=True)
    assert batches == [3]
    for image, prediction in zip(images, predictions, strict=True):
        x = preprocess([image], checkpoint.preprocessing)
        expected, attentions = capture_inputs([b.attn.attn_drop for b in model.blocks], lambda x=x: model(x))
        np.testing.assert_allclose(prediction.logits, expected[0].numpy(), rtol=0, atol=1e-5)
        for ours, theirs in zip(prediction.attentions, attentions, strict=True):
            assert ours.shape == theirs.shape[1:]  # (heads, T_i, T_i): the real tokens alone
            np.testing.assert_allclose(ours, theirs[0].numpy(), rtol=0, atol=1e-5)
