"""Each library's own evaluation transform, against that library (issue 69, items 3 and 4).

timm: a folder built at a non-square ``img_size`` and saved natively is prepared as timm's ``resolve_data_config`` +
``create_transform`` prepare it for the model timm loads from that folder (``ResizeKeepRatio`` to cover
``(h, w) / crop_pct``, then the centre crop, or both sides stretched for crop_mode "squash"), and the maps are drawn
over that crop. transformers 5: an HF folder is prepared as ``AutoImageProcessor`` resolves the class its
``preprocessor_config.json`` names (the torchvision backend, ``*ImageProcessor``), and ``VIT_HF_IMAGE_BACKEND=pil``
gives the PIL one (``*ImageProcessorPil``); each is matched to float32 rounding, and the two differ by grey levels.
"""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from parity_helpers import randomize
from PIL import Image
from test_input_box import ramp_image, span_from_output

from vit.checkpoint import Preprocessing
from vit.core.images import resized_size
from vit.core.inference import input_box, preprocess, seen_region
from vit.sources.hf_preprocessing import HF_BACKEND_ENV
from vit.sources.open import SourceError, open_source

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing transformers and timm takes seconds

# (width, height): landscape, portrait, square, and strips far wider or taller than the inputs
IMAGE_SIZES = [(640, 480), (300, 500), (400, 400), (1000, 200), (150, 700)]


def noise_image(width: int, height: int) -> Image.Image:
    rng = np.random.default_rng(width * 7 + height)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


# -- timm at a non-square img_size ------------------------------------------------------------------------------------

TIMM_MODELS = {  # tiny random models that timm builds at any (height, width)
    "beit": ("beit_base_patch16_224", dict(patch_size=16, embed_dim=16, depth=1, num_heads=2)),
    "swin": ("swin_tiny_patch4_window7_224", dict(embed_dim=16, depths=(1, 1), num_heads=(2, 2), window_size=8)),
    "vit": ("vit_base_patch16_224", dict(patch_size=16, embed_dim=16, depth=1, num_heads=2)),
}


def timm_folder(folder, name: str, img_size: tuple[int, int], pretrained_cfg: dict | None = None, **args):
    """A random timm ``name`` built at ``img_size`` and saved natively (``save_for_hf``), ``pretrained_cfg``'s
    entries written over the ones timm saves; returns timm's own model loaded back from the folder (eval)."""
    torch.manual_seed(0)
    model = randomize(timm.create_model(name, pretrained=False, img_size=img_size, num_classes=5, **args))
    timm.models.save_for_hf(model, folder, model_args=dict(img_size=img_size, **args), safe_serialization=True)
    if pretrained_cfg:
        config = json.loads((folder / "config.json").read_text())
        config["pretrained_cfg"].update(pretrained_cfg)
        (folder / "config.json").write_text(json.dumps(config))
    return timm.create_model(f"local-dir:{folder}", pretrained=True).eval()


def timm_transform(model, **overrides):
    """timm's evaluation transform for ``model``: ``create_transform(**resolve_data_config(model=model))``."""
    return timm.data.create_transform(**{**timm.data.resolve_data_config({}, model=model), **overrides})


@pytest.mark.parametrize("img_size", [(224, 320), (320, 224)])
@pytest.mark.parametrize("family", list(TIMM_MODELS))
def test_a_non_square_timm_folder_gets_timms_own_input(tmp_path, family, img_size):
    name, args = TIMM_MODELS[family]
    reference = timm_folder(tmp_path, name, img_size, **args)
    transform = timm_transform(reference)
    checkpoint = open_source(tmp_path)
    assert checkpoint.preprocessing.image_hw == img_size
    for size in IMAGE_SIZES:
        image = noise_image(*size)
        expected = transform(image)[None]  # (1, 3, h, w)
        ours = preprocess([image], checkpoint.preprocessing)
        torch.testing.assert_close(ours, expected, rtol=0, atol=1e-6)
        if family != "swin":  # Swin's logits at other grids are tests/test_swin_*.py's
            with torch.no_grad():
                torch.testing.assert_close(checkpoint.model(ours)[0], reference(expected), rtol=0, atol=1e-5)


@pytest.mark.parametrize("crop", [dict(crop_pct=1.0), dict(crop_pct=0.95, crop_mode="squash"),
                                  dict(crop_pct=0.875, interpolation="bilinear")])
def test_a_non_square_timm_folder_follows_its_crop_pct_crop_mode_and_filter(tmp_path, crop):
    name, args = TIMM_MODELS["beit"]
    reference = timm_folder(tmp_path, name, (224, 320), crop, **args)
    transform = timm_transform(reference)
    preprocessing = open_source(tmp_path).preprocessing
    for size in IMAGE_SIZES:
        image = noise_image(*size)
        torch.testing.assert_close(preprocess([image], preprocessing), transform(image)[None], rtol=0, atol=1e-6)


@pytest.mark.parametrize("img_size", [(224, 320), (320, 224)])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("size", [(640, 480), (300, 500)])
def test_the_maps_of_a_non_square_timm_folder_lie_over_timms_crop(tmp_path, img_size, axis, size):
    """The box every map is drawn over is where timm's transform takes its first and last pixels (a ramp's
    straight-line fit, as tests/test_input_box.py), and what the explorer shows under the maps is that crop."""
    from vit.app import drawing

    name, args = TIMM_MODELS["beit"]
    reference = timm_folder(tmp_path, name, img_size, **args)
    checkpoint = open_source(tmp_path)
    p = checkpoint.preprocessing
    image = ramp_image(*size, axis)
    unnormalised = timm_transform(reference, mean=(0, 0, 0), std=(1, 1, 1))(image)[0].numpy() * 255
    start, end = span_from_output(unnormalised, size[axis], axis)
    x0, y0, x1, y1 = input_box(image.size, p)
    assert ((x0, x1) if axis == 0 else (y0, y1)) == pytest.approx((start, end), abs=0.6)
    assert (x0, y0, x1, y1) != (0, 0, *size)  # a crop: not the whole image
    region = seen_region(image, p)
    assert region.size == (round(x1) - round(x0), round(y1) - round(y0))
    assert abs(region.width / region.height - img_size[1] / img_size[0]) < 0.02  # the input's aspect, not stretched
    shown = np.asarray(drawing.model_input_image(noise_image(*size), checkpoint))  # (h, w, 3): what the maps cover
    seen = timm_transform(reference, mean=(0, 0, 0), std=(1, 1, 1))(noise_image(*size)).permute(1, 2, 0).numpy()
    assert (shown == np.round(seen * 255).astype(np.uint8)).all()


# (64, 96): a 4 x 6 grid, whose 25-entry table (with the CLS) was once read as a 5 x 5 grid without the CLS
@pytest.mark.parametrize("img_size", [(224, 224), (224, 320), (64, 96)])
@pytest.mark.parametrize("crop_mode", ["center", "squash", "border"])
def test_a_timm_vit_is_prepared_by_every_crop_mode_timm_has(tmp_path, crop_mode, img_size):
    """timm's three crop modes (issue 76): "center" crops the centre of the covering resize, "squash" stretches,
    "border" fits the image inside and pads it in the mean's colour; the input and logits are timm's."""
    name, args = TIMM_MODELS["vit"]
    reference = timm_folder(tmp_path, name, img_size, dict(crop_mode=crop_mode, crop_pct=0.8), **args)
    transform = timm_transform(reference)
    checkpoint = open_source(tmp_path)
    for size in IMAGE_SIZES:
        image = noise_image(*size)
        expected = transform(image)[None]  # (1, 3, h, w)
        ours = preprocess([image], checkpoint.preprocessing)
        torch.testing.assert_close(ours, expected, rtol=0, atol=1e-6)
        with torch.no_grad():
            torch.testing.assert_close(checkpoint.model(ours)[0], reference(expected), rtol=0, atol=1e-5)


@pytest.mark.parametrize("img_size", [(224, 224), (224, 320)])
@pytest.mark.parametrize("size", [(640, 480), (300, 500)])
def test_the_maps_of_a_border_crop_lie_over_the_image_and_its_padding(tmp_path, img_size, size):
    """crop_mode "border" at crop_pct 1 fits the whole image inside the input and pads the rest: the box the maps are
    drawn over reaches past the image by the padding on both sides, and the picture under them is timm's input."""
    from vit.app import drawing

    name, args = TIMM_MODELS["vit"]
    reference = timm_folder(tmp_path, name, img_size, dict(crop_mode="border", crop_pct=1.0), **args)
    checkpoint = open_source(tmp_path)
    p = checkpoint.preprocessing
    image = Image.new("RGB", size, (255, 255, 255))
    unnormalised = timm_transform(reference, mean=(0, 0, 0), std=(1, 1, 1))(image)[0].numpy()  # (h, w): pads 0
    rows, cols = np.nonzero(unnormalised > 0.5)[0], np.nonzero(unnormalised.T > 0.5)[0]
    top, left = rows.min(), cols.min()  # where the image starts in timm's input
    scale_x, scale_y = size[0] / (cols.max() + 1 - left), size[1] / (rows.max() + 1 - top)
    expected = (-left * scale_x, -top * scale_y, (img_size[1] - left) * scale_x, (img_size[0] - top) * scale_y)
    assert input_box(size, p) == pytest.approx(expected, abs=1e-6)
    assert min(expected[:2]) < 0  # padded before the image, not only after it
    photo = noise_image(*size)
    region = np.asarray(seen_region(photo, p))
    x0, y0 = round(-expected[0]), round(-expected[1])
    np.testing.assert_array_equal(region[y0:y0 + size[1], x0:x0 + size[0]], np.asarray(photo))  # the image in place
    assert tuple(region[0, 0]) == tuple(round(255 * m) for m in p.mean)  # the padding's colour
    shown = np.asarray(drawing.model_input_image(photo, checkpoint))  # (h, w, 3)
    normalised = timm_transform(reference)(photo)  # (3, h, w), padded in the mean's colour
    mean, std = torch.tensor(p.mean).view(3, 1, 1), torch.tensor(p.std).view(3, 1, 1)
    seen = ((normalised * std + mean) * 255).round().permute(1, 2, 0).numpy().astype(np.uint8)
    assert (shown == seen).all()
    analysis = SimpleNamespace(input_size=img_size, grid=(img_size[0] // 16, img_size[1] // 16), patch_size=16,
                               num_tokens=1, at_training_size=True, max_num_patches=0, max_pixels=0)
    text = drawing.describe_input(analysis, size, input_box(size, p))
    assert "pads around it in the mean colour" in text and "top left" not in text and "stretched" not in text


def test_a_keep_ratio_resize_rounds_as_timms_resize_keep_ratio():
    from timm.data.transforms import ResizeKeepRatio

    for target in [(256, 365), (365, 256), (35, 53)]:
        for width, height in [(640, 480), (480, 640), (1000, 17), (17, 1000), (333, 500), (53, 35)]:
            image = Image.new("RGB", (width, height))
            h, w = ResizeKeepRatio.get_params(image, target, 0.0)
            assert resized_size((width, height), target, "keep_ratio") == (w, h)


def test_a_rectangular_timm_preprocessing_survives_our_checkpoint_file(tmp_path):
    from vit.checkpoint import load_checkpoint, save_checkpoint

    name, args = TIMM_MODELS["beit"]
    timm_folder(tmp_path / "timm", name, (224, 320), **args)
    opened = open_source(tmp_path / "timm")
    save_checkpoint(tmp_path / "beit.pt", opened.model, opened.class_names, opened.preprocessing)
    assert load_checkpoint(tmp_path / "beit.pt").preprocessing == opened.preprocessing
    assert opened.preprocessing.resize_size == (248, 355)  # floor((224, 320) / 0.9), timm's crop_pct for BEiT


# -- transformers 5: the processor AutoImageProcessor resolves, or the PIL one -----------------------------------------

TINY = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
HF_FOLDERS = {  # model class, its config, the processor class saved (PIL, as the project matched before) and settings
    "siglip2-naflex": ("Siglip2VisionModel", dict(patch_size=8, num_patches=16), "Siglip2ImageProcessorPil",
                       dict(patch_size=8, max_num_patches=16)),
    "siglip2-naflex-torchvision": ("Siglip2VisionModel", dict(patch_size=8, num_patches=16), "Siglip2ImageProcessor",
                                   dict(patch_size=8, max_num_patches=24)),
    "vit": ("ViTModel", dict(image_size=32, patch_size=8), "ViTImageProcessor", dict(size={"height": 32, "width": 32})),
    "dinov2": ("Dinov2Model", dict(image_size=112, patch_size=14), "BitImageProcessorPil",
               dict(size={"shortest_edge": 128}, crop_size={"height": 112, "width": 112}, resample=3,
                    do_center_crop=True)),
    "clip": ("CLIPVisionModel", dict(image_size=64, patch_size=16), "CLIPImageProcessorPil",
             dict(size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64})),
    "sam": ("SamVisionModel", dict(image_size=64, patch_size=16, mlp_dim=32, output_channels=8, window_size=2,
                                   global_attn_indexes=[0]), "SamImageProcessorPil",
            dict(size={"longest_edge": 48}, pad_size={"height": 64, "width": 64})),
}


def hf_folder(folder, case: str):
    model_class, config, processor_class, settings = HF_FOLDERS[case]
    cls = getattr(transformers, model_class)
    torch.manual_seed(0)
    cls(cls.config_class(**{**TINY, **config})).save_pretrained(folder)
    getattr(transformers, processor_class)(**settings).save_pretrained(folder)
    return folder


def hf_pixels(folder, image: Image.Image, backend: str | None, **settings) -> torch.Tensor:
    """The processor's ``pixel_values`` as an image ``(1, C, H, W)`` (NaFlex's rows of real patches put back)."""
    processor = transformers.AutoImageProcessor.from_pretrained(folder, backend=backend, **settings)
    out = processor(image, return_tensors="pt")
    if "spatial_shapes" not in out:
        return out["pixel_values"]
    (gh, gw), patch = out["spatial_shapes"][0].tolist(), processor.patch_size
    rows = out["pixel_values"][0, : gh * gw]  # (gh*gw, p*p*C), HF's convert_image_to_patches
    return rows.reshape(gh, gw, patch, patch, -1).permute(4, 0, 2, 1, 3).reshape(1, -1, gh * patch, gw * patch)


@pytest.mark.parametrize("case", list(HF_FOLDERS))
def test_an_hf_folder_is_prepared_by_the_processor_transformers_resolves_it_to(tmp_path, case, monkeypatch):
    from vit.app import drawing

    monkeypatch.delenv(HF_BACKEND_ENV, raising=False)
    folder = hf_folder(tmp_path, case)
    resolved = transformers.AutoImageProcessor.from_pretrained(folder)
    assert resolved.backend == "torchvision" and not type(resolved).__name__.endswith("Pil")
    checkpoint = open_source(folder)
    preprocessing = checkpoint.preprocessing
    assert preprocessing.backend == "torchvision"
    apart = 0.0
    for size in IMAGE_SIZES[:4]:
        image = noise_image(*size)
        ours = preprocess([image], preprocessing)
        torch.testing.assert_close(ours, hf_pixels(folder, image, None), rtol=0, atol=1e-6)
        apart = max(apart, float((ours - hf_pixels(folder, image, "pil")).abs().max()))
        if case != "sam":  # what the explorer shows under the maps is the processor's image (SAM's padding aside)
            shown = torch.from_numpy(np.asarray(drawing.model_input_image(image, checkpoint))).permute(2, 0, 1)
            unscaled = hf_pixels(folder, image, None, do_rescale=False, do_normalize=False)[0]
            assert torch.equal(shown.float(), unscaled)
    assert apart > 1e-3  # the other backend is another input: a grey level or two off here and there


@pytest.mark.parametrize("case", list(HF_FOLDERS))
def test_the_pil_processor_is_one_setting_away(tmp_path, case, monkeypatch):
    monkeypatch.setenv(HF_BACKEND_ENV, "pil")
    folder = hf_folder(tmp_path, case)
    preprocessing = open_source(folder).preprocessing
    assert preprocessing.backend == "pil"
    for size in IMAGE_SIZES[:4]:
        image = noise_image(*size)
        torch.testing.assert_close(preprocess([image], preprocessing), hf_pixels(folder, image, "pil"),
                                   rtol=0, atol=1e-6)


def test_a_naflex_layer_sees_the_attention_of_the_resolved_processor(tmp_path, monkeypatch):
    """What item 4 measured: a SigLIP 2 NaFlex layer's attention on the PIL backend's input is ~1e-3 off the
    attention on the torchvision backend's, which transformers uses; by default it is now the latter to 1e-5."""
    folder = hf_folder(tmp_path, "siglip2-naflex")
    config = transformers.Siglip2VisionConfig(**{**TINY, **HF_FOLDERS["siglip2-naflex"][1]})
    config._attn_implementation = "eager"
    model = transformers.Siglip2VisionModel.from_pretrained(folder, config=config).eval()
    processor = transformers.AutoImageProcessor.from_pretrained(folder)
    image = noise_image(50, 30)
    inputs = processor(image, return_tensors="pt")
    n = int(inputs["pixel_attention_mask"][0].sum())
    with torch.no_grad():
        expected = model(**inputs, output_attentions=True).attentions[-1][:, :, :n, :n]
    monkeypatch.delenv(HF_BACKEND_ENV, raising=False)
    checkpoint = open_source(folder)
    with torch.no_grad():
        ours = checkpoint.model.encode(preprocess([image], checkpoint.preprocessing), output_attentions=True)
    torch.testing.assert_close(ours.attentions[-1], expected, rtol=0, atol=1e-5)


def test_an_unknown_backend_setting_is_refused_in_one_line(tmp_path, monkeypatch):
    folder = hf_folder(tmp_path, "vit")
    monkeypatch.setenv(HF_BACKEND_ENV, "opencv")
    with pytest.raises(SourceError, match=r"VIT_HF_IMAGE_BACKEND='opencv' is not a resize backend; set it to pil"):
        open_source(folder)


def test_the_backend_is_kept_in_our_checkpoint_file_and_older_files_read_as_pil():
    p = Preprocessing(224, 3, (0.5,) * 3, (0.5,) * 3, resize_size=256, resize_mode="shortest_edge",
                      backend="torchvision")
    assert Preprocessing.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    older = {k: v for k, v in p.to_dict().items() if k != "backend"}
    assert Preprocessing.from_dict(older).backend == "pil"  # every file written before the field was resized by PIL
