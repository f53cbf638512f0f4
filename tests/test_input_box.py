"""Maps belong over the pixels the model saw: ``input_box`` against the reference libraries' own transforms.

Each image is a horizontal (or vertical) ramp, value = k * (pixel index); resampling keeps a
linear function linear, so a straight-line fit across the middle of the reference library's
output tells which original coordinates its first and last columns came from.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vit.checkpoint import IMAGENET_MEAN, IMAGENET_STD, Preprocessing
from vit.core.inference import TRAINING_SIZE, InputSize, input_box, preprocess, seen_region
from vit.model import ViTConfig
from vit.sources.ports.libraries.import_timm import preprocessing_from_timm


def ramp_image(width: int, height: int, axis: int) -> Image.Image:
    """RGB ramp along ``axis`` (0: x, 1: y), 0 at the first pixel centre, 250 at the last."""
    n = width if axis == 0 else height
    line = np.linspace(0, 250, n)
    values = np.tile(line, (height, 1)) if axis == 0 else np.tile(line[:, None], (1, width))
    return Image.fromarray(np.repeat(values[:, :, None], 3, axis=2).round().astype(np.uint8))


def span_from_output(output: np.ndarray, n: int, axis: int) -> tuple[float, float]:
    """``(start, end)`` in original pixel coordinates of an ``(S, S)`` reference output of a ramp over ``n``."""
    profile = output.mean(axis=0) if axis == 0 else output.mean(axis=1)  # (S,)
    S = profile.shape[0]
    i = np.arange(S)[S // 8: -S // 8]  # away from the borders, where resampling sees the edge
    slope, intercept = np.polyfit(i + 0.5, profile[S // 8: -S // 8], 1)
    k = 250 / (n - 1)  # value per original pixel; value = k * (u - 0.5) at continuous coordinate u
    start = intercept / k + 0.5
    return start, start + S * slope / k


def hf_reference(image: Image.Image) -> np.ndarray:
    """HF DINOv2's processor (BitImageProcessor: shortest edge 256, centre crop 224), unnormalised."""
    from transformers import BitImageProcessor

    processor = BitImageProcessor(size={"shortest_edge": 256}, crop_size={"height": 224, "width": 224},
                                  do_center_crop=True, do_rescale=False, do_normalize=False,
                                  do_convert_rgb=True, resample=3)
    return np.asarray(processor(image, return_tensors="np")["pixel_values"][0, 0], dtype=np.float64)


def timm_reference(image: Image.Image, crop_pct: float) -> np.ndarray:
    timm_data = pytest.importorskip("timm.data")
    transform = timm_data.create_transform(input_size=(3, 224, 224), crop_pct=crop_pct, interpolation="bicubic",
                                           mean=(0, 0, 0), std=(1, 1, 1))
    return transform(image)[0].numpy().astype(np.float64) * 255


@pytest.mark.parametrize("width, height", [(640, 480), (480, 640), (300, 300)])
@pytest.mark.parametrize("axis", [0, 1])
def test_the_box_of_an_hf_dinov2_crop_is_where_the_hf_processor_takes_its_pixels(width, height, axis):
    pre = Preprocessing(224, 3, IMAGENET_MEAN, IMAGENET_STD, resize_size=256, resize_mode="shortest_edge")
    image = ramp_image(width, height, axis)
    start, end = span_from_output(hf_reference(image), width if axis == 0 else height, axis)
    x0, y0, x1, y1 = input_box(image.size, pre)
    ours = (x0, x1) if axis == 0 else (y0, y1)
    assert ours == pytest.approx((start, end), abs=0.6)


@pytest.mark.parametrize("crop_pct", [0.875, 0.9, 1.0])
@pytest.mark.parametrize("axis", [0, 1])
def test_the_box_of_a_timm_crop_pct_is_where_the_timm_transform_takes_its_pixels(crop_pct, axis):
    pre = preprocessing_from_timm("vit_tiny_patch16_224", ViTConfig(image_size=224, patch_size=16),
                                  {"crop_pct": crop_pct, "input_size": (3, 224, 224)})
    image = ramp_image(640, 480, axis)
    start, end = span_from_output(timm_reference(image, crop_pct), 640 if axis == 0 else 480, axis)
    x0, y0, x1, y1 = input_box(image.size, pre)
    ours = (x0, x1) if axis == 0 else (y0, y1)
    assert ours == pytest.approx((start, end), abs=0.6)


def test_a_640x480_image_under_dinov2_preprocessing_is_seen_from_x_110_to_530():
    pre = Preprocessing(224, 3, IMAGENET_MEAN, IMAGENET_STD, resize_size=256, resize_mode="shortest_edge")
    x0, y0, x1, y1 = input_box((640, 480), pre)
    # resized to 341 x 256, the crop starts at round(58.5) = 58 (Python rounds half to even): x 108.9 .. 529.3
    assert (x0, y0, x1, y1) == pytest.approx((58 * 640 / 341, 16 * 480 / 256, 282 * 640 / 341, 240 * 480 / 256))
    assert seen_region(Image.new("RGB", (640, 480)), pre).size == (round(x1) - round(x0), round(y1) - round(y0))


def test_models_that_only_resize_and_other_input_sizes_see_the_whole_image():
    cropping = Preprocessing(224, 3, IMAGENET_MEAN, IMAGENET_STD, resize_size=256, resize_mode="shortest_edge")
    plain = Preprocessing(32, 3, (0.5,) * 3, (0.5,) * 3)
    assert input_box((640, 480), plain) == (0, 0, 640, 480)
    assert input_box((640, 480), cropping, InputSize(224, keep_aspect=True)) == (0, 0, 640, 480)
    image = Image.new("RGB", (640, 480))
    assert seen_region(image, plain) is image


def test_the_seen_region_resized_is_the_model_input_up_to_resampling():
    """Cropping the box and resizing it gives the model's input back (what the explorer draws under a map)."""
    pre = Preprocessing(224, 3, (0.0,) * 3, (1.0,) * 3, resize_size=256, resize_mode="shortest_edge")
    rng = np.random.default_rng(0)
    smooth = torch.nn.functional.interpolate(torch.from_numpy(rng.random((1, 3, 12, 16))), size=(480, 640),
                                             mode="bilinear", align_corners=False)[0]
    image = Image.fromarray((smooth.permute(1, 2, 0).numpy() * 255).astype(np.uint8))
    model_input = preprocess([image], pre, TRAINING_SIZE)[0]  # (3, 224, 224) in [0, 1]
    redrawn = preprocess([seen_region(image, pre)], Preprocessing(224, 3, (0.0,) * 3, (1.0,) * 3))[0]
    assert (model_input - redrawn).abs().mean() < 0.01


def test_predict_save_maps_draws_over_the_crop_and_records_the_geometry(tmp_path, capsys):
    """``vit.predict --save-maps`` on HF DINOv2 (resize 256, crop 224): overlays of the seen region, and the
    .npz says where it lies in the original image."""
    transformers = pytest.importorskip("transformers")
    from vit import predict

    config = transformers.Dinov2Config(image_size=224, patch_size=56, hidden_size=8, intermediate_size=16,
                                       num_hidden_layers=1, num_attention_heads=2)
    folder = tmp_path / "dinov2"
    torch.manual_seed(0)
    transformers.Dinov2Model(config).save_pretrained(folder)
    transformers.BitImageProcessor(size={"shortest_edge": 256}, crop_size={"height": 224, "width": 224},
                                   do_center_crop=True).save_pretrained(folder)
    photo = tmp_path / "photo.png"
    ramp_image(640, 480, 0).save(photo)
    assert predict.main([str(folder), str(photo), "--save-maps", str(tmp_path / "maps"), "--device", "cpu"]) == 0
    capsys.readouterr()
    maps = np.load(tmp_path / "maps" / "photo.npz")
    assert maps["grid"].tolist() == [4, 4] and int(maps["patch_size"]) == 56 and int(maps["prefix_tokens"]) == 1
    assert maps["input_size"].tolist() == [224, 224]
    start, end = span_from_output(hf_reference(ramp_image(640, 480, 0)), 640, 0)
    assert maps["input_box"][[0, 2]] == pytest.approx([start, end], abs=0.6)
    assert Image.open(tmp_path / "maps" / "photo_cls.png").size == (420, 420)  # x 109-529, y 30-450 of 640x480


def noise_image(width: int, height: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8))


HF_CROPS = {  # (model, its config, processor settings, image size, the crop's left and top in the resized image)
    # DINOv2's BitImageProcessor: 255x200 -> 163x128, a 112 crop starts at int(51 / 2) = 25 (torchvision: 26)
    "dinov2": ("Dinov2Model", dict(image_size=112, patch_size=14, hidden_size=16, num_hidden_layers=1,
                                   num_attention_heads=2, intermediate_size=32),
               dict(size={"shortest_edge": 128}, crop_size={"height": 112, "width": 112}, resample=3,
                    image_mean=list(IMAGENET_MEAN), image_std=list(IMAGENET_STD)), (255, 200), (25, 8)),
    # CLIP's CLIPImageProcessor: 321x240 -> 299x224, a 224 crop starts at int(75 / 2) = 37 (torchvision: 38)
    "clip": ("CLIPVisionModel", dict(image_size=224, patch_size=32, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32),
             dict(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224}, resample=3), (321, 240),
             (37, 0)),
}


@pytest.mark.parametrize("case", list(HF_CROPS))
def test_an_hf_folder_sees_the_window_of_transformers_own_pil_processor(tmp_path, case, monkeypatch):
    """Issue 33, item 3: transformers crops at int((size - crop) / 2), torchvision rounds; with an odd margin the
    model saw a window one resized pixel off. The PIL backend's output (``VIT_HF_IMAGE_BACKEND=pil``; the default,
    its torchvision one, is tests/test_library_transforms.py's) is matched bit for bit (up to float32)."""
    monkeypatch.setenv("VIT_HF_IMAGE_BACKEND", "pil")
    transformers = pytest.importorskip("transformers")
    from vit.sources.open import open_source

    architecture, config, processor_settings, (width, height), (left, top) = HF_CROPS[case]
    model_class = getattr(transformers, architecture)
    model_class(model_class.config_class(**config)).save_pretrained(tmp_path / case)
    pil_processor = {"dinov2": transformers.BitImageProcessorPil, "clip": transformers.CLIPImageProcessorPil}[case]
    pil_processor(**processor_settings).save_pretrained(tmp_path / case)
    reference = transformers.AutoImageProcessor.from_pretrained(tmp_path / case, backend="pil")
    assert "Pil" in type(reference).__name__
    image = noise_image(width, height)
    expected = torch.as_tensor(reference(image, return_tensors="np")["pixel_values"])
    checkpoint = open_source(tmp_path / case)
    ours = preprocess([image], checkpoint.preprocessing)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-6)
    short = min(width, height)
    resized = (width * processor_settings["size"]["shortest_edge"] // short,
               height * processor_settings["size"]["shortest_edge"] // short)
    crop = processor_settings["crop_size"]["width"]
    sx, sy = width / resized[0], height / resized[1]
    assert input_box(image.size, checkpoint.preprocessing) == pytest.approx(
        (left * sx, top * sy, (left + crop) * sx, (top + crop) * sy))


# SAM (v1): SamImageProcessor resizes the longer side, normalises, then pads with 0 below and to the right. At 64 px
# (padded to 64, or a 48-px longest edge padded to 64) both ways round, square, and a narrow strip.
SAM_CASES = [((100, 60), 64), ((60, 100), 64), ((80, 80), 64), ((37, 91), 64), ((100, 60), 48), ((30, 50), 48)]


def sam_preprocessing(longest: int) -> Preprocessing:
    return Preprocessing(64, 3, IMAGENET_MEAN, IMAGENET_STD, resize_size=longest, resize_mode="longest_edge_pad",
                         resample="bilinear")


def sam_processor(longest: int, backend: str = "pil"):
    transformers = pytest.importorskip("transformers")
    cls = transformers.SamImageProcessorPil if backend == "pil" else transformers.SamImageProcessor
    return cls(size={"longest_edge": longest}, pad_size={"height": 64, "width": 64})


@pytest.mark.parametrize("size, longest", SAM_CASES)
def test_sam_input_is_sam_image_processors_pixel_values(size, longest):
    """Bit for bit (up to float32) the PIL backend's; its torchvision backend resizes within 2 grey levels of it
    and pads the same."""
    image = noise_image(*size)
    ours = preprocess([image], sam_preprocessing(longest))
    torch.testing.assert_close(ours, sam_processor(longest)(image, return_tensors="pt")["pixel_values"],
                               rtol=0, atol=1e-6)
    fast = sam_processor(longest, "torchvision")(image, return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(ours, fast, rtol=0, atol=2 / 255 / min(IMAGENET_STD))
    assert torch.equal(ours == 0, fast == 0)  # the padding in the same place, zeros after normalisation


@pytest.mark.parametrize("size, longest", SAM_CASES)
def test_the_box_of_a_sam_input_is_the_padded_canvas_the_processor_puts_the_image_in(size, longest):
    """The image at the top left, scaled as the processor scaled it (its reshaped_input_sizes): the box reaches
    past the image's right or bottom by the padding, in the image's own pixels."""
    image = noise_image(*size)
    height, width = (int(v) for v in sam_processor(longest)(image)["reshaped_input_sizes"][0])
    assert input_box(size, sam_preprocessing(longest)) == pytest.approx(
        (0, 0, 64 * size[0] / width, 64 * size[1] / height))


def test_a_640x480_image_under_sam_is_seen_as_640x640_with_the_mean_colour_below():
    pre = Preprocessing(1024, 3, IMAGENET_MEAN, IMAGENET_STD, resize_size=1024, resize_mode="longest_edge_pad",
                        resample="bilinear")
    assert input_box((640, 480), pre) == (0, 0, 640, 640)  # 1024 x 768 at the top of a 1024 square
    seen = np.asarray(seen_region(noise_image(640, 480), pre))
    assert seen.shape == (640, 640, 3)
    assert (seen[480:] == [124, 116, 104]).all()  # round(255 * ImageNet's mean): what SAM's zeros stand for
    assert (seen[:480] == np.asarray(noise_image(640, 480))).all()


@pytest.mark.parametrize("size, longest", SAM_CASES)
def test_the_seen_sam_canvas_resized_is_the_model_input_up_to_resampling(size, longest):
    """What the explorer draws under a map is what SAM saw, padding included: the seen region resized to the
    input is the model input unnormalised."""
    pre = sam_preprocessing(longest)
    rng = np.random.default_rng(0)
    smooth = torch.nn.functional.interpolate(torch.from_numpy(rng.random((1, 3, 6, 6))), size=size[::-1],
                                             mode="bilinear", align_corners=False)[0]
    image = Image.fromarray((smooth.permute(1, 2, 0).numpy() * 255).astype(np.uint8))
    mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
    seen_by_model = preprocess([image], pre)[0] * std + mean  # (3, 64, 64) in [0, 1]
    redrawn = preprocess([seen_region(image, pre)], Preprocessing(64, 3, (0.0,) * 3, (1.0,) * 3))[0]
    assert (seen_by_model - redrawn).abs().mean() < 0.02


def test_sam_model_input_image_is_the_resized_image_on_the_mean_colour():
    from types import SimpleNamespace

    from vit.app import drawing

    image = noise_image(100, 60)
    shown = np.asarray(drawing.model_input_image(image, SimpleNamespace(preprocessing=sam_preprocessing(64))))
    assert shown.shape == (64, 64, 3)
    expected = np.asarray(image.resize((64, 38), Image.Resampling.BILINEAR))  # SAM's 64 x round(37.8)
    assert (shown[:38] == expected).all() and (shown[38:] == [124, 116, 104]).all()


def test_another_input_size_resizes_the_whole_sam_image_without_padding():
    pre = sam_preprocessing(64)
    image = noise_image(100, 60)
    assert input_box(image.size, pre, InputSize(32)) == (0, 0, 100, 60)
    ours = preprocess([image], pre, InputSize(32), patch_size=8)
    plain = Preprocessing(32, 3, IMAGENET_MEAN, IMAGENET_STD, resample="bilinear")
    torch.testing.assert_close(ours, preprocess([image], plain), rtol=0, atol=0)


def test_the_explorer_says_sam_pads_rather_than_crops():
    from types import SimpleNamespace

    from vit.app import drawing

    analysis = SimpleNamespace(input_size=(64, 64), grid=(4, 4), patch_size=16, num_tokens=16, at_training_size=True)
    text = drawing.describe_input(analysis, (640, 480), input_box((640, 480), sam_preprocessing(64)))
    assert "pads the rest with zeros" in text and "640×640 canvas" in text
    assert "crops" not in text and "stretched" not in text
