"""SAM's image encoder opened through ``vit.sources`` matches its libraries: the last block's output and every
layer's attention to 1e-5, windowed layers (grid padded to a multiple of the window) beside global ones, with
decomposed relative positions.

- HF: tiny random ``SamVisionModel`` / ``SamModel`` (eager attention; HF takes its native size only). HF returns a
  windowed layer's attention as ``(B * windows * heads, w*w, w*w)``, ours is ``(B * windows, heads, w*w, w*w)``.
- timm: a tiny random ``samvit_base_patch16`` (fused attention off), its attention read by a forward hook on
  ``attn_drop``, at its native size.
- Input: a non-square image prepared by ``vit.core.inference.preprocess`` is the ``pixel_values`` of the processor
  ``AutoImageProcessor`` resolves the folder to (``SamImageProcessor``, torchvision's resize: longest edge,
  normalised, zeros below or right) and the whole forward on it is HF's on those.
"""

import pytest
import torch
from parity_helpers import assert_parity, capture_inputs, randomize

from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")
pytestmark = pytest.mark.slow  # importing transformers and timm takes seconds

# A 7 x 7 patch grid in windows of 3: padded to 9 x 9, nine windows, the last row and column mostly padding.
TINY = dict(image_size=56, patch_size=8, hidden_size=32, mlp_dim=48, num_hidden_layers=3, num_attention_heads=2,
            window_size=3, global_attn_indexes=[1], output_channels=8)


def last_block(checkpoint, images):
    name = f"blocks.{checkpoint.config.num_layers - 1}.hook_resid_post"
    return checkpoint.model.run_with_cache(images, [name])[1][name]


@pytest.mark.parametrize("architecture", ["SamVisionModel", "SamModel", "SamHQVisionModel", "SamHQModel"])
def test_hf_sam_matches_transformers(tmp_path, architecture):
    """SAM-HQ's image encoder (issue 91) is SAM's, weight for weight: it opens by SAM's port, held to its own
    ``SamHQVisionModel``'s eager attention and last block; the whole ``SamHQModel`` folder too (issue 117, item 6),
    its image encoder held to the whole model's ``vision_encoder``."""
    if architecture == "SamModel":
        config = transformers.SamConfig(vision_config=TINY)
    elif architecture == "SamHQModel":
        config = transformers.SamHQConfig(vision_config=TINY)
    elif architecture == "SamHQVisionModel":
        config = transformers.SamHQVisionConfig(**TINY)
    else:
        config = transformers.SamVisionConfig(**TINY)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = randomize(getattr(transformers, architecture)(config))
    model.save_pretrained(tmp_path / "sam")
    checkpoint = open_source(tmp_path / "sam")
    assert checkpoint.config.window_size == 3 and checkpoint.config.global_layers == (1,)
    encoder = model.vision_encoder
    images = torch.randn(2, 3, 56, 56)
    with torch.no_grad():
        out = encoder(pixel_values=images, output_attentions=True, output_hidden_states=True)
        ours = checkpoint.model.encode(images, output_attentions=True)
    expected = [a.reshape(-1, 2, *a.shape[1:]) for a in out.attentions]  # (B * nw * nh, n, n) -> (B * nw, nh, n, n)
    assert [a.shape[0] for a in ours.attentions] == [18, 2, 18]
    assert_parity(f"SAM | HF {architecture} | native", last_block(checkpoint, images),
                  out.hidden_states[-1].flatten(1, 2), ours.attentions, expected)


def test_timm_samvit_matches_timm(tmp_path):
    timm.layers.set_fused_attn(False)
    try:
        torch.manual_seed(0)
        model = timm.create_model("samvit_base_patch16", pretrained=False, img_size=56, patch_size=8, embed_dim=32,
                                  depth=3, num_heads=2, window_size=3, global_attn_indexes=[1], neck_chans=8,
                                  num_classes=0)
    finally:
        timm.layers.set_fused_attn(True)
    model = randomize(model)
    timm.models.save_for_hf(model, tmp_path / "sam", model_args=dict(num_heads=2, window_size=3,
                                                                    global_attn_indexes=[1]),
                            safe_serialization=True)
    checkpoint = open_source(tmp_path / "sam")
    # timm's own evaluation transform, kept (not SAM's padding): the shorter side to 56 / crop_pct, bicubic, centre
    data = timm.data.resolve_data_config({}, model=model)
    p = checkpoint.preprocessing
    assert (data["crop_pct"], data["interpolation"]) == (1.0, "bicubic")
    assert (p.image_size, p.resize_size, p.resize_mode, p.resample) == (56, 56, "shortest_edge", "bicubic")
    images = torch.randn(2, 3, 56, 56)
    blocks = model.blocks
    (hidden, ), attentions = capture_inputs([b.attn.attn_drop for b in blocks],
                                            lambda: (blocks(model.patch_embed(images) + model.pos_embed),))
    with torch.no_grad():
        ours = checkpoint.model.encode(images, output_attentions=True)
    expected = [a.reshape(-1, 2, *a.shape[1:]) for a in attentions]  # timm's heads fold into its batch as HF's do
    assert_parity("SAM | timm samvit_base_patch16 | native", last_block(checkpoint, images), hidden.flatten(1, 2),
                  ours.attentions, expected)


def test_timm_samvit_built_at_a_non_square_size_opens_at_that_size_and_matches_timm(tmp_path):
    timm.layers.set_fused_attn(False)
    try:
        torch.manual_seed(0)
        model = timm.create_model("samvit_base_patch16", pretrained=False, img_size=(32, 48), patch_size=8,
                                  embed_dim=32, depth=3, num_heads=2, window_size=3, global_attn_indexes=[1],
                                  neck_chans=8, num_classes=0)
    finally:
        timm.layers.set_fused_attn(True)
    model = randomize(model)
    timm.models.save_for_hf(model, tmp_path / "sam", model_args=dict(img_size=(32, 48), num_heads=2, window_size=3,
                                                                    global_attn_indexes=[1]),
                            safe_serialization=True)
    checkpoint = open_source(tmp_path / "sam")
    assert checkpoint.preprocessing.image_size == (32, 48)  # (height, width): timm's own, not a square
    images = torch.randn(2, 3, 32, 48)
    blocks = model.blocks
    (hidden, ), attentions = capture_inputs([b.attn.attn_drop for b in blocks],
                                            lambda: (blocks(model.patch_embed(images) + model.pos_embed),))
    with torch.no_grad():
        ours = checkpoint.model.encode(images, output_attentions=True)
    expected = [a.reshape(-1, 2, *a.shape[1:]) for a in attentions]
    assert_parity("SAM | timm samvit_base_patch16 | 32x48", last_block(checkpoint, images), hidden.flatten(1, 2),
                  ours.attentions, expected)


def test_hf_sam_forward_with_its_global_bias_formed_per_query_chunk_matches_transformers(tmp_path, monkeypatch):
    # Chunks of at most 8 query rows: the 49-token global layer's bias is never formed as its 49 x 49 whole.
    from vit.model import blocks

    config = transformers.SamVisionConfig(**TINY)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = randomize(transformers.SamVisionModel(config))
    model.save_pretrained(tmp_path / "sam")
    checkpoint = open_source(tmp_path / "sam")
    formed = []

    def recorded(q, *args):
        formed.append(q.shape[2])
        return decomposed_rel_pos(q, *args)

    decomposed_rel_pos = blocks.decomposed_rel_pos
    monkeypatch.setattr(blocks, "decomposed_rel_pos", recorded)
    monkeypatch.setattr(blocks, "BIAS_CHUNK_BYTES", 2 * 2 * 8 * 49 * 4)  # (B, nh, 8 rows, 49 keys) float32
    images = torch.randn(2, 3, 56, 56)
    with torch.no_grad():
        expected = model(pixel_values=images, output_hidden_states=True).hidden_states[-1].flatten(1, 2)
        ours = last_block(checkpoint, images)
    assert max(formed) == 8 and sum(formed) == 9 + 49 + 9  # every layer's queries once, at most 8 rows at a time
    assert_parity("SAM | HF SamVisionModel | bias per query chunk", ours, expected, [], [])


def test_hf_sam_folder_without_a_preprocessor_file_takes_sam_image_processor_defaults(tmp_path):
    transformers.SamVisionModel(transformers.SamVisionConfig(**TINY)).save_pretrained(tmp_path / "sam")
    assert not (tmp_path / "sam" / "preprocessor_config.json").exists()
    p = open_source(tmp_path / "sam").preprocessing
    reference = transformers.SamImageProcessor()  # its class defaults: what HF uses when the file is missing
    assert p.mean == pytest.approx(tuple(reference.image_mean)) and p.std == pytest.approx(tuple(reference.image_std))
    assert reference.resample == 2 and p.resample == "bilinear"  # PIL's BILINEAR
    assert p.image_size == 56 and reference.pad_size.height == reference.pad_size.width  # padded to a square
    # its longest edge brought to the model's side (1024 for a real SAM) and padded to that square
    assert reference.size.longest_edge == reference.pad_size.height == 1024
    assert (p.resize_mode, p.resize_size) == ("longest_edge_pad", 56)


@pytest.fixture(scope="module")
def hf_sam_with_its_processor(tmp_path_factory):
    """A tiny random SamVisionModel saved with a SamImageProcessor (longest edge 48, padded to its 56 px)."""
    folder = tmp_path_factory.mktemp("sam") / "sam"
    config = transformers.SamVisionConfig(**TINY)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = randomize(transformers.SamVisionModel(config))
    model.save_pretrained(folder)
    transformers.SamImageProcessorPil(size={"longest_edge": 48}, pad_size={"height": 56, "width": 56}
                                      ).save_pretrained(folder)
    return folder, model


@pytest.mark.parametrize("size", [(90, 50), (50, 90)])
def test_hf_sam_on_a_non_square_image_matches_transformers_on_its_processors_pixel_values(hf_sam_with_its_processor,
                                                                                          size):
    from PIL import Image

    from vit.core.inference import preprocess

    folder, model = hf_sam_with_its_processor
    checkpoint = open_source(folder)
    p = checkpoint.preprocessing
    assert (p.image_size, p.resize_size, p.resize_mode, p.resample) == (56, 48, "longest_edge_pad", "bilinear")
    image = Image.fromarray(torch.randint(0, 256, (size[1], size[0], 3), generator=torch.Generator().manual_seed(0),
                                          dtype=torch.uint8).numpy())
    reference = transformers.AutoImageProcessor.from_pretrained(folder)  # the folder's SamImageProcessorPil resolves
    assert reference.backend == p.backend == "torchvision"  # to the torchvision backend, as opened
    pixel_values = reference(image, return_tensors="pt")["pixel_values"]  # (1, 3, 56, 56), zeros below or right
    ours = preprocess([image], p)
    torch.testing.assert_close(ours, pixel_values, rtol=0, atol=1e-6)
    with torch.no_grad():
        out = model(pixel_values=pixel_values, output_attentions=True, output_hidden_states=True)
        attentions = checkpoint.model.encode(ours, output_attentions=True).attentions
    expected = [a.reshape(-1, 2, *a.shape[1:]) for a in out.attentions]
    assert_parity(f"SAM | HF SamVisionModel | {size[0]}x{size[1]} padded", last_block(checkpoint, ours),
                  out.hidden_states[-1].flatten(1, 2), attentions, expected)


@pytest.mark.parametrize("settings, message", [
    ({"size": {"longest_edge": 64}, "pad_size": {"height": 56, "width": 56}},
     "unusable preprocessing settings: the longest edge 64 must be a whole number of pixels from 1 to the padded "
     "size 56$"),
    ({"size": {"longest_edge": 56}, "pad_size": {"height": "56"}},
     r"preprocessor_config.json cannot be used \(pad_size must be .*\); fix or remove it$"),
    ({"size": {"longest_edge": 5.5}}, r"cannot be used \(size's longest_edge must be a whole number of pixels"),
])
def test_hf_sam_processor_settings_that_cannot_be_used_are_refused_in_one_line(tmp_path, settings, message):
    import json

    from vit.sources.open import SourceError

    transformers.SamVisionModel(transformers.SamVisionConfig(**TINY)).save_pretrained(tmp_path / "sam")
    (tmp_path / "sam" / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "SamImageProcessor", "do_pad": True, **settings}))
    with pytest.raises(SourceError, match=message) as error:
        open_source(tmp_path / "sam")
    assert "\n" not in str(error.value)
