"""gtsegs_ijcv.mat, the file of Chefer et al.'s ImageNet-segmentation test, against their own reader
(``Imagenet_Segmentation``, tests/reference/chefer_eval/Imagenet.py, verbatim) on small files built here in the
file's layout: MATLAB v7.3 (HDF5), references to each image and to a cell holding each mask."""

import json

import numpy as np
import pytest
import torch

h5py = pytest.importorskip("h5py")

from tests.reference.chefer_eval.Imagenet import Imagenet_Segmentation  # noqa: E402
from vit.explain.gtsegs import MAX_ITEMS, GtSegs, GtSegsError  # noqa: E402


def write_gtsegs(path, images, masks):
    """A .mat as MATLAB writes gtsegs_ijcv.mat: ``(H, W, 3)`` images and ``(H, W)`` masks stored column-major."""
    with h5py.File(path, "w") as f:
        refs = f.create_group("#refs#")
        image_refs, cell_refs = [], []
        for i, (image, mask) in enumerate(zip(images, masks, strict=True)):
            image_refs.append(refs.create_dataset(f"i{i}", data=image.transpose(2, 1, 0)).ref)
            mask_ref = refs.create_dataset(f"m{i}", data=mask.transpose(1, 0)).ref
            cell_refs.append(refs.create_dataset(f"c{i}", data=np.array([[mask_ref]], dtype=h5py.ref_dtype)).ref)
        value = f.create_group("value")
        value.create_dataset("img", data=np.array(image_refs, dtype=h5py.ref_dtype).reshape(-1, 1))
        value.create_dataset("gt", data=np.array(cell_refs, dtype=h5py.ref_dtype).reshape(-1, 1))
    return path


def pictures(count=3, seed=0):
    rng = np.random.default_rng(seed)
    images = [rng.integers(0, 256, (20 + i, 24 - i, 3), dtype=np.uint8) for i in range(count)]  # not square
    masks = []
    for image in images:
        mask = np.zeros(image.shape[:2], dtype=np.uint8)
        mask[3:12, 5:15] = 1
        masks.append(mask)
    return images, masks


def test_reads_what_their_imagenet_segmentation_reads(tmp_path):
    import torchvision.transforms as transforms
    from PIL import Image

    from vit.faithfulness import open_mask

    path = write_gtsegs(tmp_path / "gtsegs.mat", *pictures())
    theirs = Imagenet_Segmentation(str(path))
    resized = Imagenet_Segmentation(str(path), target_transform=transforms.Resize((16, 16), Image.NEAREST))
    with GtSegs(path) as ours:
        assert len(ours) == len(theirs) == 3
        for i in range(3):
            image, mask = ours.item(i)
            their_image, their_mask = theirs[i]
            assert image.mode == "RGB" and np.array_equal(np.asarray(image), np.asarray(their_image))
            assert np.array_equal(mask, np.asarray(their_mask))
            # what the benchmark compares with: their test's Resize((224, 224), NEAREST), here to 16 x 16
            assert torch.equal(open_mask(Image.fromarray(mask), (16, 16)), resized[i][1])


def test_a_declared_size_past_the_limit_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "huge.mat"
    images, masks = pictures(1)
    write_gtsegs(path, images, masks)
    with h5py.File(path, "a") as f:  # 10^10 pixels declared, none written: the file stays small
        huge = f["#refs#"].create_dataset("huge", shape=(3, 100_000, 100_000), dtype=np.uint8, chunks=(3, 64, 64))
        f["value/img"][0, 0] = huge.ref
    assert path.stat().st_size < 1_000_000
    with GtSegs(path) as file, pytest.raises(GtSegsError, match="declares 100000 x 100000 pixels"):
        file.item(0)


@pytest.mark.parametrize("change, message", [
    ("not hdf5", "is not an HDF5 file"),
    ("no gt", "has no /value/gt dataset of references"),
    ("too many", f"expected (N, 1) with N at most {MAX_ITEMS}"),
    ("float image", "expected (3, width, height) uint8"),
    ("mask group", "points at a group, not a dataset"),
])
def test_files_not_laid_out_as_gtsegs_are_refused_in_one_line(tmp_path, change, message):
    path = write_gtsegs(tmp_path / "bad.mat", *pictures(2))
    if change == "not hdf5":
        path.write_bytes(b"MATLAB 5.0 MAT-file, not HDF5")
    else:
        with h5py.File(path, "a") as f:
            if change == "no gt":
                del f["value/gt"]
            elif change == "too many":
                del f["value/img"]
                f["value"].create_dataset("img", shape=(MAX_ITEMS + 1, 1), dtype=h5py.ref_dtype)
            elif change == "float image":
                f["value/img"][1, 0] = f["#refs#"].create_dataset("f", data=np.zeros((3, 4, 4))).ref
            else:
                f["#refs#/c1"][0, 0] = f["#refs#"].create_group("g").ref
    with pytest.raises(GtSegsError) as error:
        with GtSegs(path) as file:
            file.item(1)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_cli_segmentation_of_the_mat_equals_that_of_the_same_pngs(tmp_path, capsys):
    from PIL import Image

    from tests.test_faithfulness_chefer import tiny_model_and_images
    from vit import faithfulness

    checkpoint = tiny_model_and_images(tmp_path, labelled=False)
    stems = sorted(p.stem for p in (tmp_path / "data").glob("*.jpg"))
    images = [np.asarray(Image.open(tmp_path / "data" / f"{s}.jpg").convert("RGB")) for s in stems]
    masks = [(np.asarray(Image.open(tmp_path / "masks" / f"{s}.png")) > 0).astype(np.uint8) for s in stems]
    mat = write_gtsegs(tmp_path / "gtsegs_ijcv.mat", images, masks)
    results = []
    for data in (["--data", str(tmp_path / "data"), "--masks", str(tmp_path / "masks")], ["--data", str(mat)]):
        code = faithfulness.main([str(checkpoint), "--benchmark", "segmentation", *data, "--methods", "rollout,class",
                                  "--batch-size", "4"])
        out = capsys.readouterr()
        assert code == 0, out.err
        results.append(json.loads(out.out)["methods"])
    for method in ("rollout", "class"):
        for metric in ("pixel_accuracy", "mIoU", "mAP"):
            assert results[1][method][metric] == pytest.approx(results[0][method][metric], abs=1e-6)


def test_cli_refuses_a_hostile_mat_and_masks_beside_one_in_one_line(tmp_path, capsys):
    from tests.test_faithfulness_chefer import tiny_model_and_images
    from vit import faithfulness

    checkpoint = tiny_model_and_images(tmp_path, labelled=False)
    mat = write_gtsegs(tmp_path / "gtsegs_ijcv.mat", *pictures(2))
    with h5py.File(mat, "a") as f:
        f["value/img"][1, 0] = f["#refs#"].create_dataset("huge", shape=(3, 50_000, 50_000), dtype=np.uint8,
                                                           chunks=(3, 64, 64)).ref
    for extra, message in ((["--masks", str(tmp_path / "masks")], "leave --masks out"),
                           ([], "declares 50000 x 50000 pixels")):
        code = faithfulness.main([str(checkpoint), "--benchmark", "segmentation", "--data", str(mat), *extra,
                                  "--methods", "rollout"])
        err = capsys.readouterr().err
        assert code == 2 and message in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err  # refused before the work (and its progress bar) starts
