"""Inference: the checkpoint's own preprocessing, batched predictions equal to a direct model call."""

import numpy as np
import pytest
import torch
from PIL import Image

from vit.checkpoint import Checkpoint, Preprocessing
from vit.core.images import normalize, to_uint8
from vit.core.inference import InputSize, classify_files, predict, predict_files, preprocess
from vit.model import ViT, ViTConfig

CLASSES = ["cat", "dog", "ship"]


def make_checkpoint(num_channels: int = 3) -> Checkpoint:
    torch.manual_seed(0)
    config = ViTConfig(image_size=16, patch_size=4, hidden_size=16, num_layers=2, num_heads=2, mlp_size=32,
                       num_classes=3, num_channels=num_channels)
    model = ViT(config).eval()
    with torch.no_grad():
        model.head.weight.mul_(100)  # a random head gives near-uniform probabilities; spread them apart
    mean = (0.4, 0.5, 0.6)[:num_channels]
    std = (0.2, 0.25, 0.3)[:num_channels]
    return Checkpoint(model=model, class_names=list(CLASSES), preprocessing=Preprocessing(16, num_channels, mean, std))


@pytest.fixture
def checkpoint() -> Checkpoint:
    return make_checkpoint()


def random_image(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "LA": 2, "CMYK": 4}.get(mode, 1)
    array = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    if mode in ("L", "P"):
        return Image.fromarray(array[:, :, 0], "L").convert(mode)
    return Image.fromarray(array, mode)


def reference(checkpoint: Checkpoint, image: Image.Image):
    """The model called by hand on the shared evaluation transform."""
    p = checkpoint.preprocessing
    x = normalize(to_uint8(image, p.image_size, p.num_channels)[None], p.mean, p.std)
    with torch.no_grad():
        logits, attentions = checkpoint.model(x, output_attentions=True)
    return logits[0], [a[0] for a in attentions]


MIXED = [random_image(16, 16, "RGB", 1), random_image(40, 24, "RGBA", 2), random_image(7, 30, "L", 3),
         random_image(33, 33, "P", 4), random_image(20, 10, "LA", 5)]


def test_preprocess_equals_to_uint8_then_normalize(checkpoint):
    images = [random_image(16, 16), random_image(50, 20, "RGBA", 1)]
    p = checkpoint.preprocessing
    expected = normalize(torch.stack([to_uint8(im, 16, 3) for im in images]), p.mean, p.std)
    out = preprocess(images, p)
    assert out.dtype == torch.float32 and out.shape == (2, 3, 16, 16)
    assert torch.equal(out, expected)


def test_preprocess_of_no_images_is_an_empty_batch(checkpoint):
    assert preprocess([], checkpoint.preprocessing).shape == (0, 3, 16, 16)


def test_prediction_equals_the_model_called_by_hand(checkpoint):
    image = random_image(24, 24, seed=7)
    [prediction] = predict(checkpoint, [image])
    logits, attentions = reference(checkpoint, image)
    np.testing.assert_allclose(prediction.logits, logits.numpy(), atol=1e-5)
    np.testing.assert_allclose(prediction.probabilities, logits.softmax(-1).numpy(), atol=1e-6)
    for ours, theirs in zip(prediction.attentions, attentions, strict=True):
        np.testing.assert_allclose(ours, theirs.numpy(), atol=1e-6)


def test_probabilities_sum_to_one(checkpoint):
    for prediction in predict(checkpoint, MIXED):
        assert prediction.probabilities.shape == (3,)
        assert prediction.probabilities.sum() == pytest.approx(1.0, abs=1e-5)


def test_top_k_is_most_probable_first_and_names_the_classes(checkpoint):
    for prediction in predict(checkpoint, MIXED, top_k=3):
        probabilities = [p for _, p in prediction.top_k]
        assert probabilities == sorted(probabilities, reverse=True)
        assert sorted(label for label, _ in prediction.top_k) == sorted(CLASSES)
        for label, p in prediction.top_k:
            assert p == pytest.approx(float(prediction.probabilities[CLASSES.index(label)]))
        assert prediction.class_index == int(np.argmax(prediction.probabilities))
        assert prediction.top_k[0][0] == CLASSES[prediction.class_index]


def test_top_k_is_clamped_to_the_number_of_classes(checkpoint):
    [prediction] = predict(checkpoint, [random_image(16, 16)], top_k=10)
    assert len(prediction.top_k) == 3


def test_top_k_one_gives_only_the_best(checkpoint):
    [prediction] = predict(checkpoint, [random_image(16, 16)], top_k=1)
    assert [label for label, _ in prediction.top_k] == [CLASSES[prediction.class_index]]


@pytest.mark.parametrize("top_k", [0, -1, 1.5, True])
def test_top_k_below_one_or_not_whole_is_refused(checkpoint, top_k):
    with pytest.raises(ValueError, match="top_k must be"):
        predict(checkpoint, [random_image(16, 16)], top_k=top_k)


def test_batch_of_mixed_sizes_and_modes_equals_one_by_one(checkpoint):
    batched = predict(checkpoint, MIXED, batch_size=2)
    singles = [predict(checkpoint, [image])[0] for image in MIXED]
    assert len(batched) == len(MIXED)
    for b, s in zip(batched, singles, strict=True):
        np.testing.assert_allclose(b.logits, s.logits, atol=1e-5)
        assert [label for label, _ in b.top_k] == [label for label, _ in s.top_k]
        for layer_b, layer_s in zip(b.attentions, s.attentions, strict=True):
            np.testing.assert_allclose(layer_b, layer_s, atol=1e-6)


def test_attentions_are_per_layer_heads_by_tokens_by_tokens(checkpoint):
    [prediction] = predict(checkpoint, [random_image(30, 20)])
    tokens = 1 + 4 * 4
    assert len(prediction.attentions) == 2
    for layer in prediction.attentions:
        assert layer.shape == (2, tokens, tokens) and layer.dtype == np.float32
        np.testing.assert_allclose(layer.sum(-1), 1.0, atol=1e-5)  # post-softmax rows


def test_attentions_are_left_out_when_not_asked_for(checkpoint):
    [prediction] = predict(checkpoint, [random_image(16, 16)], output_attentions=False)
    assert prediction.attentions is None
    assert prediction.probabilities.sum() == pytest.approx(1.0, abs=1e-5)


def test_no_images_give_no_predictions(checkpoint):
    assert predict(checkpoint, []) == []


def test_greyscale_checkpoint_accepts_a_colour_image():
    grey = make_checkpoint(num_channels=1)
    image = random_image(24, 24, "RGB", 9)
    [prediction] = predict(grey, [image])
    logits, _ = reference(grey, image)
    np.testing.assert_allclose(prediction.logits, logits.numpy(), atol=1e-5)
    assert grey.preprocessing.num_channels == 1


@pytest.mark.parametrize("size", [(64, 16), (5, 80), (17, 3)])
def test_non_square_images_work(checkpoint, size):
    image = random_image(*size)
    [prediction] = predict(checkpoint, [image])
    logits, _ = reference(checkpoint, image)
    np.testing.assert_allclose(prediction.logits, logits.numpy(), atol=1e-5)


def test_classify_files_reports_unreadable_files_and_classifies_the_rest(checkpoint, tmp_path):
    good = tmp_path / "good.png"
    random_image(20, 20).save(good)
    bad = tmp_path / "bad.png"
    bad.write_text("not an image")
    records = classify_files(checkpoint, [good, bad, tmp_path / "missing.jpg"], top_k=2)
    assert [r["image"] for r in records] == [str(good), str(bad), str(tmp_path / "missing.jpg")]
    assert [p["label"] for p in records[0]["predictions"]] == [label for label, _ in
                                                               predict(checkpoint, [Image.open(good)], 2)[0].top_k]
    assert set(records[0]["predictions"][0]) == {"label", "probability"}
    assert "bad.png" in records[1]["error"] and "predictions" not in records[1]
    assert "no such file" in records[2]["error"]


def test_predict_files_keeps_the_decoded_image_and_batches_in_order(checkpoint, tmp_path):
    paths = []
    for i in range(5):
        paths.append(tmp_path / f"{i}.png")
        random_image(10 + i, 12, seed=i).save(paths[-1])
    results = list(predict_files(checkpoint, paths, output_attentions=True, batch_size=2))
    assert [r.path for r in results] == paths
    assert [r.image.size for r in results] == [(10 + i, 12) for i in range(5)]
    assert all(len(r.prediction.attentions) == 2 for r in results)


# -- input sizes other than the training size ---------------------------------------------------------------------

@pytest.mark.parametrize(("size", "image", "shape"), [
    (InputSize(), (100, 50), (16, 16)),  # the checkpoint's own square
    (InputSize(32), (100, 50), (32, 32)),
    (InputSize(30), (100, 50), (32, 32)),  # 7.5 patches of 4 px round to 8
    (InputSize(33), (100, 50), (32, 32)),
    (InputSize(32, keep_aspect=True), (100, 50), (16, 32)),  # (height, width): the long side is the width
    (InputSize(32, keep_aspect=True), (50, 100), (32, 16)),
    (InputSize(40, keep_aspect=True), (640, 480), (32, 40)),  # 30 px round to 32
    (InputSize(None, keep_aspect=True), (30, 10), (4, 16)),  # the training size as the long side
    (InputSize(8, keep_aspect=True), (1000, 10), (4, 8)),  # at least one patch
])
def test_input_size_rounds_to_whole_patches(size, image, shape, checkpoint):
    assert size.shape(image, checkpoint.preprocessing, patch_size=4) == shape
    x = preprocess([Image.new("RGB", image)], checkpoint.preprocessing, size, patch_size=4)
    assert x.shape == (1, 3, *shape)


@pytest.mark.parametrize(("size", "image", "shape"), [
    (InputSize(), (100, 50), (16, 64)),  # the checkpoint's own rectangle
    (InputSize(64), (100, 50), (64, 64)),  # a square of whole 2x8 patches: a 32x8 grid
    (InputSize(60), (100, 50), (60, 64)),  # 30 patch rows of 2 px, 7.5 columns of 8 px round to 8
    (InputSize(64, keep_aspect=True), (100, 50), (32, 64)),  # (height, width): the long side is the width
    (InputSize(64, keep_aspect=True), (50, 100), (64, 32)),
    (InputSize(None, keep_aspect=True), (100, 50), (32, 64)),  # the training rectangle's long side
])
def test_input_size_rounds_each_side_to_rectangular_patches(size, image, shape):
    pre = Preprocessing((16, 64), 3, (0.5,) * 3, (0.5,) * 3)
    assert size.shape(image, pre, patch_size=(2, 8)) == shape
    assert preprocess([Image.new("RGB", image)], pre, size, patch_size=(2, 8)).shape == (1, 3, *shape)


def test_largest_square_side_holds_at_most_that_many_patches():
    from vit.costs.plan import largest_square_side

    assert largest_square_side(16, 5) == 32  # isqrt(5) = 2 patches a side
    assert largest_square_side((2, 8), 64) == 32  # 16 x 4 patches of 2 x 8 px
    assert largest_square_side((2, 8), 63) == 24  # 12 x 3 = 36: the next multiple of 8, 32 px, would make 64
    assert largest_square_side((2, 8), 1) == 8  # at least one whole patch both ways


def test_input_size_is_bounded():
    # 4,096 px: maps past 1,024 px are computed in chunks (vit.explain.methods.chunked), so the bound is the CLI's, not
    # memory's
    assert InputSize(4096).side == 4096
    with pytest.raises(ValueError, match="1 to 4096"):
        InputSize(5000)
    with pytest.raises(ValueError, match="1 to 4096"):
        InputSize(0)


def test_preprocess_at_another_size_is_the_bicubic_resize_then_normalisation(checkpoint):
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (30, 50, 3), dtype=np.uint8))
    x = preprocess([image], checkpoint.preprocessing, InputSize(24, keep_aspect=True), patch_size=4)
    expected = np.asarray(image.resize((24, 16), Image.Resampling.BICUBIC), dtype=np.float32) / 255.0
    mean, std = np.array(checkpoint.preprocessing.mean), np.array(checkpoint.preprocessing.std)
    np.testing.assert_allclose(x[0].permute(1, 2, 0).numpy(), (expected - mean) / std, rtol=1e-5, atol=1e-6)


def test_predict_at_keep_aspect_sizes_batches_images_of_each_shape_apart(checkpoint):
    rng = np.random.default_rng(1)
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in
              [(40, 20), (20, 40), (40, 20)]]
    size = InputSize(32, keep_aspect=True)
    together = predict(checkpoint, images, size=size, output_attentions=True)
    assert [p.attentions[0].shape[-1] for p in together] == [1 + 4 * 8, 1 + 8 * 4, 1 + 4 * 8]
    for image, prediction in zip(images, together, strict=True):
        with torch.no_grad():
            logits, _ = checkpoint.model(preprocess([image], checkpoint.preprocessing, size, patch_size=4))
        np.testing.assert_allclose(prediction.logits, logits[0].numpy(), rtol=1e-5, atol=1e-5)
