"""CLIP image towers opened through ``vit.sources`` match their own library: the image embedding (open_clip's
``encode_image``, HF's ``image_embeds``) and every layer's attention to 1e-5.

- open_clip: a tiny random ``open_clip.model.CLIP`` saved as open_clip saves for the Hub (``open_clip_config.json`` +
  ``open_clip_model.safetensors``); attentions read from its ``nn.MultiheadAttention`` with ``need_weights=True,
  average_attn_weights=False``. open_clip does not resample positions, so only its native size is compared.
- OpenAI's layout: a flat state dict (``visual.*`` beside the text tower's keys) read by open_clip's own
  ``build_model_from_openai_state_dict`` (QuickGELU) as the reference, opened with ``--arch open_clip:quickgelu``.
- HF: tiny random ``CLIPVisionModelWithProjection`` and ``CLIPModel`` (eager attention), at the native size and at
  a non-square one with ``interpolate_pos_encoding=True``.
"""


import json

import numpy as np
import pytest
import torch
from parity_helpers import HF_TEXT, HF_VISION, assert_parity, hf_random, randomize
from safetensors.torch import save_file

from vit.sources.open import SourceError, open_source

open_clip = pytest.importorskip("open_clip")
open_clip_hub = pytest.importorskip("open_clip.push_to_hf_hub")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing open_clip and transformers takes seconds

TEXT_CFG = dict(context_length=8, vocab_size=64, width=64, heads=1, layers=1)


def open_clip_attentions(model, images):
    """open_clip's encode_image and each block's attention probabilities, asked of its own nn.MultiheadAttention."""
    captured, originals = [], []
    for block in model.visual.transformer.resblocks:
        attn = block.attn
        original = attn.forward

        def forward(*args, original=original, **kwargs):
            kwargs.update(need_weights=True, average_attn_weights=False)
            out, weights = original(*args, **kwargs)
            captured.append(weights)
            return out, weights

        attn.forward = forward
        originals.append((attn, original))
    try:
        with torch.no_grad():
            embedding = model.encode_image(images)
    finally:
        for attn, original in originals:
            attn.forward = original
    return embedding, captured


VISION_CASES = {
    "tok": dict(image_size=32, patch_size=8, width=32, layers=2, head_width=16),
    "avg-ln-after-pool-layer-scale": dict(image_size=32, patch_size=8, width=32, layers=2, head_width=16,
                                          pool_type="avg", final_ln_after_pool=True, ls_init_value=0.5),
}


@pytest.mark.parametrize("case", list(VISION_CASES))
def test_open_clip_folder_matches_open_clip(tmp_path, case):
    model_cfg = dict(embed_dim=16, vision_cfg=VISION_CASES[case], text_cfg=TEXT_CFG)
    torch.manual_seed(0)
    model = randomize(open_clip.model.CLIP(**model_cfg))
    folder = tmp_path / "open_clip"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "open_clip_model.safetensors")
    model.visual.image_mean, model.visual.image_std = open_clip.OPENAI_DATASET_MEAN, open_clip.OPENAI_DATASET_STD
    open_clip_hub.save_config_for_hf(model, folder / "open_clip_config.json", model_config=model_cfg)
    checkpoint = open_source(folder)
    assert checkpoint.metadata["architecture"] == "open_clip:gelu"
    assert checkpoint.preprocessing.mean == tuple(open_clip.OPENAI_DATASET_MEAN)
    images = torch.randn(2, 3, 32, 32)
    expected, attentions = open_clip_attentions(model, images)
    with torch.no_grad():
        ours = checkpoint.model.encode(images, output_attentions=True)
    assert_parity(f"CLIP | open_clip folder ({case}) | native", ours.embedding, expected, ours.attentions, attentions)


@pytest.mark.parametrize("preprocess_cfg", [dict(interpolation="bilinear"), dict(resize_mode="squash"),
                                            dict(resize_mode="longest"),
                                            dict(resize_mode="longest", fill_color=200, interpolation="bilinear")])
def test_a_non_square_open_clip_folder_matches_open_clip(tmp_path, preprocess_cfg):
    """open_clip builds a tower at image_size [height, width] (issue 76): its 3 x 4 grid's table of 13 entries opens,
    images are prepared by the transform open_clip gives that folder (a rectangle's shortest-edge resize is its
    ResizeKeepRatio, bicubic whatever the interpolation asked; "squash" stretches; "longest" fits the image inside
    and pads it in fill_color, black by default), and the embedding and every attention are open_clip's. The maps
    are drawn over what the model saw: the padding in that colour."""
    from PIL import Image

    from vit.core.inference import preprocess, seen_region

    vision = dict(VISION_CASES["tok"], image_size=[24, 32])
    model_cfg = dict(embed_dim=16, vision_cfg=vision, text_cfg=TEXT_CFG)
    torch.manual_seed(0)
    model = randomize(open_clip.model.CLIP(**model_cfg))
    folder = tmp_path / "open_clip"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "open_clip_model.safetensors")
    model.visual.image_mean, model.visual.image_std = open_clip.OPENAI_DATASET_MEAN, open_clip.OPENAI_DATASET_STD
    model.visual.preprocess_cfg = preprocess_cfg
    open_clip_hub.save_config_for_hf(model, folder / "open_clip_config.json", model_config=model_cfg)
    if "fill_color" in preprocess_cfg:  # save_config_for_hf keeps only interpolation and resize_mode: written as a hub
        written = json.loads((folder / "open_clip_config.json").read_text())  # config holds it
        written["preprocess_cfg"]["fill_color"] = preprocess_cfg["fill_color"]
        (folder / "open_clip_config.json").write_text(json.dumps(written))
    reference, transform = open_clip.create_model_from_pretrained(f"local-dir:{folder}")
    checkpoint = open_source(folder)
    assert checkpoint.config.grid_size == (3, 4)
    rng = torch.Generator().manual_seed(0)
    for width, height in ((150, 100), (100, 150), (90, 90)):
        pixels = torch.randint(0, 256, (height, width, 3), generator=rng, dtype=torch.uint8).numpy()
        image = Image.fromarray(pixels)
        expected = transform(image)[None]  # (1, 3, 24, 32)
        images = preprocess([image], checkpoint.preprocessing)
        torch.testing.assert_close(images, expected, rtol=0, atol=1e-6)
        if preprocess_cfg.get("resize_mode") == "longest" and width != height * 32 / 24:  # padded: drawn so too
            seen = np.asarray(seen_region(image, checkpoint.preprocessing))  # the image on its padded canvas
            fill = preprocess_cfg.get("fill_color", 0)
            edge = seen[:, 0] if width / height < 32 / 24 else seen[0]  # the first padded column, or row
            assert (edge == fill).all(), edge
        embedding, attentions = open_clip_attentions(reference.eval(), expected)
        with torch.no_grad():
            ours = checkpoint.model.encode(images, output_attentions=True)
        assert_parity("CLIP | open_clip folder (24x32) | native", ours.embedding, embedding, ours.attentions,
                      attentions)


def test_openai_layout_with_quickgelu_matches_open_clips_openai_loader(tmp_path):
    torch.manual_seed(0)
    model = randomize(open_clip.model.CLIP(embed_dim=16, vision_cfg=dict(image_size=32, patch_size=8, width=128,
                                                                           layers=2), text_cfg=TEXT_CFG,
                                           quick_gelu=True))
    # OpenAI's release is float16; round-tripping keeps the reference (which converts to float16) exact.
    state = {k: v.half().float() for k, v in model.state_dict().items()}
    state.update(input_resolution=torch.tensor(32), context_length=torch.tensor(8), vocab_size=torch.tensor(64))
    torch.save(state, tmp_path / "ViT-B-16.pt")
    reference = open_clip.model.build_model_from_openai_state_dict(dict(state), quick_gelu=True).float().eval()
    with pytest.raises(SourceError, match="does not say its activation") as error:
        open_source(tmp_path / "ViT-B-16.pt")
    assert "\n" not in str(error.value)
    checkpoint = open_source(tmp_path / "ViT-B-16.pt", arch="open_clip:quickgelu")
    assert checkpoint.config.activation == "quick_gelu" and checkpoint.config.num_heads == 2
    images = torch.randn(2, 3, 32, 32)
    expected, attentions = open_clip_attentions(reference, images)
    with torch.no_grad():
        ours = checkpoint.model.encode(images, output_attentions=True)
    assert_parity("CLIP | OpenAI layout .pt (QuickGELU) | native", ours.embedding, expected, ours.attentions,
                  attentions)


CLIP_VISION = dict(HF_VISION, projection_dim=16)


@pytest.mark.parametrize("architecture", ["CLIPVisionModel", "CLIPVisionModelWithProjection", "CLIPModel",
                                          "MetaClip2Model"])
def test_hf_clip_matches_transformers(tmp_path, architecture):
    """MetaCLIP 2's dual encoder (issue 91) is CLIP's architecture under its own name: CLIP's port, held to its own
    ``MetaClip2Model``."""
    if architecture == "CLIPModel":
        config = transformers.CLIPConfig(vision_config=CLIP_VISION, projection_dim=16, text_config=HF_TEXT)
    elif architecture == "MetaClip2Model":
        config = transformers.MetaClip2Config(vision_config=CLIP_VISION, projection_dim=16, text_config=HF_TEXT)
    else:
        config = transformers.CLIPVisionConfig(**CLIP_VISION)
    model = hf_random(getattr(transformers, architecture), config)
    model.save_pretrained(tmp_path / "clip")
    checkpoint = open_source(tmp_path / "clip")
    vision = getattr(model, "vision_model", model)  # CLIPVisionModel is the tower itself in transformers 5
    for label, size, interpolate in (("native", (32, 32), False), ("40x24", (40, 24), True)):
        images = torch.randn(2, 3, *size)
        with torch.no_grad():
            out = vision(pixel_values=images, output_attentions=True, interpolate_pos_encoding=interpolate)
            projection = getattr(model, "visual_projection", None)  # CLIPVisionModel: the normed CLS, unprojected
            expected = projection(out.pooler_output) if projection is not None else out.pooler_output
            ours = checkpoint.model.encode(images, output_attentions=True)
        assert_parity(f"CLIP | HF {architecture} | {label}", ours.embedding, expected, ours.attentions,
                      out.attentions)
