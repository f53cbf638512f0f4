"""The data path: folder layouts, the uint8 cache, the stratified split and batched augmentation."""

from __future__ import annotations

import math
import re
import socket
import subprocess

import pytest
import torch
from helpers import make_image_folder
from torchvision.transforms import v2

import vit.training.data as data
from vit.training.data import (
    AUGMENTATIONS,
    BatchAugment,
    DataError,
    apply_ops,
    channel_stats,
    draw_ops,
    folder_layout,
    load_dataset,
    op_space,
    parse_dataset,
    random_crop_flip,
    random_resized_crop,
    stratified_split,
)

# -- datasets ---------------------------------------------------------------------------------


def test_parse_dataset_names_builtins_and_folders():
    assert parse_dataset("cifar10") == ("builtin", "cifar10")
    assert parse_dataset("fashion-mnist") == ("builtin", "fashion-mnist")
    assert parse_dataset("folder:some/path") == ("folder", "some/path")
    with pytest.raises(DataError, match="unknown dataset 'imagenet'"):
        parse_dataset("imagenet")
    with pytest.raises(DataError, match="needs a path"):
        parse_dataset("folder:")


def test_folder_layout_rejects_a_missing_folder_and_a_single_class(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        folder_layout(tmp_path / "nope")
    make_image_folder(tmp_path / "one", classes=["only"], per_class=2)
    with pytest.raises(DataError, match="at least two class subfolders"):
        folder_layout(tmp_path / "one")


def test_folder_layout_reads_train_and_val_subfolders(tmp_path):
    root = make_image_folder(tmp_path / "d", classes=["b", "a"], per_class=3, val_per_class=2)
    train_root, val_root, classes = folder_layout(root)
    assert (train_root, val_root, classes) == (root / "train", root / "val", ["a", "b"])


def test_a_val_folder_uses_it_instead_of_a_split(tmp_path):
    root = make_image_folder(tmp_path / "d", per_class=3, val_per_class=2)
    ds = load_dataset(f"folder:{root}", 8, 3, cache_dir=tmp_path / "cache")
    assert (len(ds.train), len(ds.val)) == (6, 4)
    assert ds.val.labels.tolist() == [0, 0, 1, 1]


def test_class_names_come_from_the_folders_in_sorted_order(tmp_path):
    root = make_image_folder(tmp_path / "d", classes=["zebra", "ant", "moth"], per_class=4)
    ds = load_dataset(f"folder:{root}", 8, 3, cache_dir=tmp_path / "cache")
    assert ds.class_names == ["ant", "moth", "zebra"]
    assert sorted(set(ds.train.labels.tolist() + ds.val.labels.tolist())) == [0, 1, 2]


def test_greyscale_folder_for_a_3_channel_model_is_expanded_and_resized(tmp_path):
    root = make_image_folder(tmp_path / "grey", per_class=4, size=6, mode="L")
    ds = load_dataset(f"folder:{root}", image_size=8, num_channels=3, cache_dir=tmp_path / "cache")
    images = torch.cat([ds.train.images, ds.val.images])
    assert images.dtype == torch.uint8 and images.shape == (8, 3, 8, 8)
    assert torch.equal(images[:, 0], images[:, 1]) and torch.equal(images[:, 0], images[:, 2])


def test_a_training_folder_never_reads_through_links_out_of_it(tmp_path):
    root = make_image_folder(tmp_path / "d", per_class=3)
    outside = make_image_folder(tmp_path / "elsewhere", per_class=4)
    (root / "cat" / "leak.png").symlink_to(outside / "cat" / "0.png")  # a file linked out of the folder
    (root / "dog" / "more").symlink_to(outside / "dog", target_is_directory=True)  # a folder linked out of it
    (root / "cat" / "again.png").symlink_to(root / "cat" / "0.png")  # a link inside it: kept
    ds = load_dataset(f"folder:{root}", 8, 3, cache_dir=tmp_path / "cache")
    assert len(ds.train) + len(ds.val) == 7


def test_a_folder_of_links_out_of_it_says_they_are_skipped_and_why_in_vit_train_and_on_the_train_page(tmp_path):
    from test_runs import tiny_params

    from vit.runs.launch import validate_params

    outside = make_image_folder(tmp_path / "elsewhere", per_class=1)
    root = tmp_path / "linked"
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        (root / name / "0.png").symlink_to(outside / name / "0.png")
    note = r"lay it out as .*<image>; 2 image link\(s\) in it point outside .* were skipped \(only files inside"
    with pytest.raises(data.DataError, match=note):
        data.folder_layout(root)
    errors = validate_params(tiny_params("r", root), tmp_path / "runs", tmp_path / "data", gpu_count=0,
                             data_roots=(tmp_path,))
    assert re.search(note, errors["dataset"])


def test_second_load_comes_from_the_cache_without_decoding(tmp_path, monkeypatch):
    root = make_image_folder(tmp_path / "d", per_class=5)
    first = load_dataset(f"folder:{root}", 8, 3, cache_dir=tmp_path / "cache")
    assert not first.from_cache
    assert len(list((tmp_path / "cache").glob("*.pt"))) == 1

    def no_decoding(*args, **kwargs):
        raise AssertionError("the cached dataset was decoded again")

    monkeypatch.setattr(data, "to_uint8", no_decoding)
    monkeypatch.setattr(data, "open_image", no_decoding)
    second = load_dataset(f"folder:{root}", 8, 3, cache_dir=tmp_path / "cache")
    assert second.from_cache
    assert torch.equal(second.train.images, first.train.images)
    assert torch.equal(second.val.labels, first.val.labels)
    assert second.class_names == first.class_names


@pytest.fixture
def decoded_by_processes(monkeypatch):
    """Folders of a few images decoded as large ones are: by two processes, a share each."""
    monkeypatch.setattr(data, "POOL_MIN_FILES", 4)
    monkeypatch.setattr(data, "SHARE_MIN_FILES", 2)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def test_many_images_are_decoded_by_processes_as_one_process_decodes_them(tmp_path, monkeypatch,
                                                                         decoded_by_processes, caplog):
    root = make_image_folder(tmp_path / "d", per_class=7, size=12)
    (root / "cat" / "broken.png").write_bytes(b"not an image")
    started = []
    popen = subprocess.Popen

    def counted(command, **kwargs):
        started.append(command)
        return popen(command, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", counted)
    scratch = tmp_path / "cache"
    caplog.set_level("WARNING", logger="vit.training.data")
    both = data._decode_folder(root, ["cat", "dog"], 8, 3, scratch)
    assert len(started) == 2 and started[0][1:3] == ["-m", "vit.training.decoding"]
    monkeypatch.setattr(data, "POOL_MIN_FILES", 10**9)
    one = data._decode_folder(root, ["cat", "dog"], 8, 3, scratch)
    assert len(started) == 2
    assert torch.equal(both.images, one.images) and torch.equal(both.labels, one.labels) and len(one.images) == 14
    assert caplog.text.count("skipped 1 unreadable image(s)") == 2 and "broken.png" in caplog.text
    assert list(scratch.iterdir()) == []  # the shares' folder is gone


def test_a_decoding_process_that_fails_leaves_its_share_to_this_one(tmp_path, monkeypatch, decoded_by_processes,
                                                                    caplog):
    root = make_image_folder(tmp_path / "d", per_class=4, size=12)
    monkeypatch.setattr(data, "DECODE_WORKER", "vit.training.no_such_module")
    caplog.set_level("WARNING", logger="vit.training.data")
    split = data._decode_folder(root, ["cat", "dog"], 8, 3, tmp_path / "cache")
    monkeypatch.setattr(data, "POOL_MIN_FILES", 10**9)
    assert torch.equal(split.images, data._decode_folder(root, ["cat", "dog"], 8, 3, tmp_path / "cache").images)
    assert caplog.text.count("a decoding process failed (exit status 1: ") == 2
    assert "No module named vit.training.no_such_module" in caplog.text


def test_cache_is_per_image_size_and_rebuilt_when_damaged(tmp_path):
    root = make_image_folder(tmp_path / "d", per_class=4)
    cache = tmp_path / "cache"
    load_dataset(f"folder:{root}", 8, 3, cache_dir=cache)
    assert not load_dataset(f"folder:{root}", 12, 3, cache_dir=cache).from_cache
    for file in cache.glob("*.pt"):
        file.write_bytes(b"not a cache")
    again = load_dataset(f"folder:{root}", 8, 3, cache_dir=cache)
    assert not again.from_cache and again.train.images.shape[1:] == (3, 8, 8)
    assert load_dataset(f"folder:{root}", 8, 3, cache_dir=cache).from_cache


def test_a_planted_cache_file_is_checked_like_every_torch_file_and_rebuilt(tmp_path, monkeypatch):
    """The data cache went straight to torch.load: a pickle of colliding keys (minutes to read) planted there would
    stall every training run on that folder. It passes check_archive first and is rebuilt when refused."""
    root = make_image_folder(tmp_path / "d", per_class=4)
    cache = tmp_path / "cache"
    load_dataset(f"folder:{root}", 8, 3, cache_dir=cache)
    [file] = cache.glob("*.pt")
    torch.save({k * (2**61 - 1): 0 for k in range(1, 2000)}, file)  # int keys that all share one hash

    loads = []
    monkeypatch.setattr(data.torch, "load", lambda *args, **kwargs: loads.append(args))  # (a failure is swallowed)
    again = load_dataset(f"folder:{root}", 8, 3, cache_dir=cache)
    assert not loads, "torch.load ran on a cache file check_archive refuses"
    assert not again.from_cache and again.train.images.shape[1:] == (3, 8, 8)


def test_offline_torchvision_dataset_fails_naming_the_folder(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise OSError("network is unreachable (test)")

    monkeypatch.setattr(socket, "create_connection", offline)
    monkeypatch.setattr(socket, "getaddrinfo", offline)
    with pytest.raises(DataError) as error:
        load_dataset("cifar10", 32, 3, data_dir=tmp_path / "data")
    message = str(error.value)
    assert "\n" not in message
    assert str(tmp_path / "data" / "cifar10") in message and "cifar-10-batches-py" in message


# -- the stratified split ---------------------------------------------------------------------


def test_stratified_split_holds_out_the_fraction_of_every_class():
    labels = torch.tensor([0] * 20 + [1] * 10 + [2] * 30)
    train, val = stratified_split(labels, 0.2, seed=0)
    assert torch.bincount(labels[val]).tolist() == [4, 2, 6]
    assert torch.bincount(labels[train]).tolist() == [16, 8, 24]
    assert sorted(torch.cat([train, val]).tolist()) == list(range(60))


def test_stratified_split_is_fixed_by_the_seed():
    labels = torch.arange(100) % 4
    assert all(torch.equal(a, b) for a, b in zip(stratified_split(labels, 0.25, 3), stratified_split(labels, 0.25, 3),
                                                  strict=True))
    assert not torch.equal(stratified_split(labels, 0.25, 3)[1], stratified_split(labels, 0.25, 4)[1])


def test_stratified_split_keeps_one_image_of_a_small_class_on_each_side():
    labels = torch.tensor([0, 0, 0, 1, 1, 2])
    train, val = stratified_split(labels, 0.1, seed=0)  # 0.1 * 3 rounds to 0
    assert torch.bincount(labels[val], minlength=3).tolist() == [1, 1, 0]
    assert torch.bincount(labels[train], minlength=3).tolist() == [2, 1, 1]


def test_channel_stats_by_hand():
    images = torch.tensor([[[[0, 255]], [[51, 51]]]], dtype=torch.uint8)  # (1, 2, 1, 2)
    mean, std = channel_stats(images)
    assert mean == (0.5, 0.2) and std == (0.5, 0.0)


# -- batched augmentation ---------------------------------------------------------------------

IMAGE = torch.arange(9, dtype=torch.uint8).view(1, 1, 3, 3)  # [[0 1 2] [3 4 5] [6 7 8]]


def _windows(padded: torch.Tensor, size: int) -> list[torch.Tensor]:
    side = padded.shape[-1]
    return [padded[..., y:y + size, x:x + size] for y in range(side - size + 1) for x in range(side - size + 1)]


def test_flip_only_gives_the_image_or_its_mirror_and_both_occur():
    torch.manual_seed(0)
    out = random_crop_flip(IMAGE.repeat(64, 1, 1, 1), padding=0, flip=True)
    mirror = torch.tensor([[2, 1, 0], [5, 4, 3], [8, 7, 6]], dtype=torch.uint8)
    same = (out[:, 0] == IMAGE[0, 0]).flatten(1).all(1)
    flipped = (out[:, 0] == mirror).flatten(1).all(1)
    assert bool((same | flipped).all()) and same.any() and flipped.any()


def test_crop_is_a_window_of_the_reflect_padded_image():
    # Reflect padding by 1 of the 3x3 image, by hand:
    padded = torch.tensor([[4, 3, 4, 5, 4], [1, 0, 1, 2, 1], [4, 3, 4, 5, 4], [7, 6, 7, 8, 7], [4, 3, 4, 5, 4]],
                          dtype=torch.uint8)
    windows = _windows(padded, 3)
    torch.manual_seed(0)
    out = random_crop_flip(IMAGE.repeat(200, 1, 1, 1), padding=1, flip=False)
    assert out.dtype == torch.uint8 and out.shape == (200, 1, 3, 3)
    seen = set()
    for image in out[:, 0]:
        matches = [i for i, w in enumerate(windows) if torch.equal(image, w)]
        assert matches, f"{image.tolist()} is not a window of the padded image"
        seen.add(matches[0])
    assert len(seen) == 9  # every offset gets drawn


def test_crop_and_flip_keep_channels_together():
    torch.manual_seed(1)
    rgb = torch.randint(0, 256, (16, 3, 6, 6), dtype=torch.uint8)
    rgb[:, 1] = rgb[:, 0]
    rgb[:, 2] = rgb[:, 0]
    out = random_crop_flip(rgb, padding=2, flip=True)
    assert out.shape == rgb.shape and out.dtype == torch.uint8
    assert torch.equal(out[:, 0], out[:, 1]) and torch.equal(out[:, 0], out[:, 2])


def test_padding_larger_than_a_tiny_image_is_capped():
    out = random_crop_flip(torch.zeros(2, 1, 2, 2, dtype=torch.uint8), padding=4, flip=True)
    assert out.shape == (2, 1, 2, 2)


def test_random_resized_crop_with_full_scale_and_square_ratio_is_the_identity():
    torch.manual_seed(0)
    images = torch.randint(0, 256, (8, 3, 7, 5), dtype=torch.uint8)
    out = random_resized_crop(images, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    assert out.dtype == torch.uint8 and torch.equal(out, images)
    square = torch.randint(0, 256, (8, 3, 6, 6), dtype=torch.uint8)
    assert torch.equal(random_resized_crop(square, scale=(1.0, 1.0), ratio=(1.0, 1.0)), square)


def test_random_resized_crop_keeps_shape_dtype_and_constant_images():
    torch.manual_seed(0)
    images = torch.full((4, 3, 8, 8), 77, dtype=torch.uint8)
    out = random_resized_crop(images, scale=(0.08, 1.0))
    assert out.shape == images.shape and out.dtype == torch.uint8 and bool((out == 77).all())


def test_random_resized_crop_matches_torchvisions_crop_then_resize():
    # Area 1/4 at ratio 1 is a 4x4 box of an 8x8 image; each output must be torchvision's
    # resized_crop of one of the 25 possible boxes (bilinear; upsampling, so antialias is moot).
    torch.manual_seed(0)
    images = torch.randint(0, 256, (6, 3, 8, 8), dtype=torch.uint8)
    out = random_resized_crop(images, scale=(0.25, 0.25), ratio=(1.0, 1.0))
    for image, result in zip(images, out, strict=True):
        candidates = [v2.functional.resized_crop(image, top, left, 4, 4, [8, 8], antialias=True)
                      for top in range(5) for left in range(5)]
        error = min((result.int() - c.int()).abs().max().item() for c in candidates)
        assert error <= 1


@pytest.mark.parametrize("policy", AUGMENTATIONS)
@pytest.mark.parametrize("channels", [1, 3])
def test_every_policy_keeps_dtype_and_shape(policy, channels):
    torch.manual_seed(0)
    images = torch.randint(0, 256, (10, channels, 8, 8), dtype=torch.uint8)
    out = BatchAugment(policy)(images)
    assert out.dtype == torch.uint8 and out.shape == images.shape


def test_policy_none_is_the_identity_and_bad_arguments_are_refused():
    images = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    assert torch.equal(BatchAugment("none")(images), images)
    with pytest.raises(ValueError, match="unknown augmentation"):
        BatchAugment("augmix")
    with pytest.raises(ValueError, match="magnitude"):
        BatchAugment("randaugment", magnitude=31)


# -- TrivialAugment and RandAugment, vectorised ------------------------------------------------


def _torchvision_op(image: torch.Tensor, name: str, magnitude: float) -> torch.Tensor:
    """One op on one image as torchvision's TrivialAugmentWide/RandAugment apply it
    (``_AutoAugmentBase._apply_image_or_video_transform``, nearest interpolation, no fill)."""
    f = v2.functional
    if name == "Identity":
        return image
    if name == "ShearX":
        return f.affine(image, angle=0.0, translate=[0, 0], scale=1.0, shear=[math.degrees(math.atan(magnitude)), 0.0],
                        center=[0, 0])
    if name == "ShearY":
        return f.affine(image, angle=0.0, translate=[0, 0], scale=1.0, shear=[0.0, math.degrees(math.atan(magnitude))],
                        center=[0, 0])
    if name == "TranslateX":
        return f.affine(image, angle=0.0, translate=[int(magnitude), 0], scale=1.0, shear=[0.0, 0.0])
    if name == "TranslateY":
        return f.affine(image, angle=0.0, translate=[0, int(magnitude)], scale=1.0, shear=[0.0, 0.0])
    if name == "Rotate":
        return f.rotate(image, angle=magnitude)
    if name == "Brightness":
        return f.adjust_brightness(image, 1.0 + magnitude)
    if name == "Color":
        return f.adjust_saturation(image, 1.0 + magnitude)
    if name == "Contrast":
        return f.adjust_contrast(image, 1.0 + magnitude)
    if name == "Sharpness":
        return f.adjust_sharpness(image, 1.0 + magnitude)
    if name == "Posterize":
        return f.posterize(image, int(magnitude))
    if name == "Solarize":
        return f.solarize(image, 255.0 * magnitude)
    if name == "AutoContrast":
        return f.autocontrast(image)
    assert name == "Equalize"
    return f.equalize(image)


def _test_images(channels: int, height: int = 10, width: int = 10) -> torch.Tensor:
    generator = torch.Generator().manual_seed(channels)
    images = torch.randint(0, 256, (4, channels, height, width), dtype=torch.uint8, generator=generator)
    images[1] = 90  # flat: autocontrast and equalize leave it alone
    images[2] = images[2] // 4 + 60  # low contrast
    return images


BLENDS = ("Color", "Contrast", "Sharpness")


def _assert_same_image(out: torch.Tensor, expected: torch.Tensor, name: str, what: str) -> None:
    """Equal, except that blends may be one grey level off on a few pixels.

    torchvision blends ``r * x + (1 - r) * y`` in float32 and truncates to uint8; ATen's
    vectorised loop fuses the multiply-add and its scalar tail does not, so torchvision itself
    gives a flat 90 image at contrast 1.099 as 89 except its last few pixels (90). Ours fuses
    everywhere.
    """
    if name not in BLENDS:
        assert torch.equal(out, expected), what
        return
    diff = (out.int() - expected.int()).abs()
    assert diff.max() <= 1 and (diff > 0).double().mean() <= 0.06, what


@pytest.mark.parametrize("policy", ["trivialaugment", "randaugment"])
def test_op_space_is_torchvisions(policy):
    space = op_space(policy, 32, 32)
    assert space.names == ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness",
                           "Color", "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize")
    assert space.magnitudes.shape == (14, 31)
    row = dict(zip(space.names, space.magnitudes.tolist(), strict=True))
    if policy == "trivialaugment":  # TrivialAugment Wide's ranges (Müller & Hutter 2021, Table 1)
        assert row["Rotate"][-1] == 135.0 and row["TranslateX"][-1] == 32.0
        assert row["ShearX"][-1] == pytest.approx(0.99) and row["Brightness"][-1] == pytest.approx(0.99)
        assert row["Posterize"][0] == 8 and row["Posterize"][-1] == 2
    else:
        assert row["Rotate"][-1] == 30.0 and row["TranslateX"][-1] == pytest.approx(150 / 331 * 32)
        assert row["Posterize"][-1] == 4
    assert row["Solarize"][0] == 1.0 and row["Solarize"][-1] == 0.0
    assert row["Identity"] == [0.0] * 31
    signed = dict(zip(space.names, space.signed.tolist(), strict=True))
    assert [n for n, s in signed.items() if s] == ["ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate",
                                                    "Brightness", "Color", "Contrast", "Sharpness"]


@pytest.mark.parametrize("name", ["Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness",
                                  "Color", "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast",
                                  "Equalize"])
@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("policy", ["trivialaugment", "randaugment"])
def test_each_op_on_a_batch_equals_torchvisions_functional_op_per_image(name, channels, policy):
    # Every magnitude bin of the policy, both signs where the op has them; a 10x7 image so that
    # rotation by 90 degrees is not torchvision's square-image transpose fast path.
    space = op_space(policy, 10, 7)
    images = _test_images(channels, 10, 7)
    k = space.names.index(name)
    for magnitude in space.magnitudes[k].tolist():
        for signed in ([magnitude, -magnitude] if space.signed[k] else [magnitude]):
            op = torch.full((len(images),), k)
            out = apply_ops(images, space, op, torch.full((len(images),), signed, dtype=torch.float64))
            expected = torch.stack([_torchvision_op(image, name, signed) for image in images])
            _assert_same_image(out, expected, name, f"{name} with magnitude {signed}")


def test_square_image_rotations_by_multiples_of_90_degrees_equal_torchvisions():
    # torchvision turns these into torch.rot90 on square images; the affine path must agree.
    space = op_space("trivialaugment", 8, 8)
    images = _test_images(3, 8, 8)
    k = space.names.index("Rotate")
    for angle in (90.0, -90.0, 0.0, 180.0, -180.0):
        out = apply_ops(images, space, torch.full((4,), k), torch.full((4,), angle, dtype=torch.float64))
        assert torch.equal(out, torch.stack([v2.functional.rotate(image, angle) for image in images])), angle


@pytest.mark.parametrize("by_subset", [True, False])
def test_every_image_gets_its_own_op_and_magnitude(by_subset):
    space = op_space("trivialaugment", 9, 9)
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (64, 3, 9, 9), dtype=torch.uint8, generator=generator)
    op, magnitude = draw_ops(space, len(images), "cpu", generator=generator)
    out = apply_ops(images, space, op, magnitude, by_subset=by_subset)
    for i in range(len(images)):
        expected = _torchvision_op(images[i], space.names[op[i]], magnitude[i].item())
        _assert_same_image(out[i], expected, space.names[op[i]], f"image {i}: {space.names[op[i]]} {magnitude[i]}")


def test_ops_are_drawn_uniformly_and_signs_with_even_odds():
    space = op_space("trivialaugment", 32, 32)
    n = 28_000
    op, magnitude = draw_ops(space, n, "cpu", generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(op, minlength=14).double()
    expected = n / 14
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 34.5  # the chi-square 0.999 quantile with 13 degrees of freedom
    rotate = magnitude[op == space.names.index("Rotate")]
    assert abs((rotate < 0).double().mean().item() - 0.5) < 0.06
    bins = torch.bucketize(rotate.abs(), space.magnitudes[space.names.index("Rotate")])
    assert torch.bincount(bins, minlength=31).min() > 0  # every bin drawn
    assert bool((magnitude[op == space.names.index("Solarize")] >= 0).all())  # unsigned ops keep their sign


def test_randaugment_uses_the_fixed_magnitude_bin():
    space = op_space("randaugment", 32, 32)
    op, magnitude = draw_ops(space, 500, "cpu", magnitude_bin=9, generator=torch.Generator().manual_seed(0))
    assert torch.equal(magnitude.abs(), space.magnitudes[op, 9])


def test_trivialaugment_changes_images_individually():
    torch.manual_seed(0)
    images = torch.randint(0, 256, (64, 3, 16, 16), dtype=torch.uint8)
    out = BatchAugment("trivialaugment", padding=0)(images)
    changed = (out != images).flatten(1).any(1)
    # Identity, and the mirror-free draws of identity-like ops, leave some images untouched; most change.
    assert 0 < changed.sum() < 64


def test_a_decoding_worker_writes_its_shares_images_as_decode_file_gives_them_and_each_files_error(tmp_path):
    """vit.training.decoding's request and answer, run in this process (the folder's processes run it by name): the
    images stacked in the files' order as ``decode_file`` gives each, and a one-line error where a file is not one;
    the JSON written last."""
    import json
    from pathlib import Path

    import numpy as np
    from PIL import Image

    from vit.training import decoding
    from vit.training.data import decode_file

    rng = np.random.default_rng(0)
    files = []
    for i, size in enumerate(((40, 30), (12, 20))):
        path = tmp_path / f"{i}.png"
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(path)
        files.append(str(path))
    (tmp_path / "bad.png").write_bytes(b"not an image")
    files.insert(1, str(tmp_path / "bad.png"))
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"files": files, "image_size": 16, "num_channels": 3, "out": str(tmp_path / "s")}))
    assert decoding.main([str(request)]) == 0
    images, errors = np.load(tmp_path / "s.npy"), json.loads((tmp_path / "s.json").read_text())["errors"]
    expected = [decode_file(Path(f), 16, 3) for f in files]
    assert images.shape == (2, 3, 16, 16) and images.dtype == np.uint8
    np.testing.assert_array_equal(images, np.stack([expected[0].numpy(), expected[2].numpy()]))
    assert errors[0] is None and errors[2] is None and isinstance(errors[1], str) and "\n" not in errors[1]
