"""gtsegs_ijcv.mat, the file of Chefer et al.'s ImageNet-segmentation test, against their own reader
(``Imagenet_Segmentation``, tests/reference/chefer_eval/Imagenet.py, verbatim) on small files built here in the
file's layout: MATLAB v7.3 (HDF5), references to each image and to a cell holding each mask."""

import json

import numpy as np
import pytest
import torch
from lazy_modules import lazy

h5py = lazy("h5py")  # imported by the first test that reads it (tests/lazy_modules.py)

from vit.explain.benchmarks.gtsegs import MAX_ITEMS, GtSegs, GtSegsError  # noqa: E402


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

    from tests.reference.chefer_eval.Imagenet import Imagenet_Segmentation  # imports h5py: here, not at collection
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



def finishes(call, fifo=None, seconds: float = 20.0):
    """``call()``'s error or result, from a thread given ``seconds``; past them, ``fifo`` (a FIFO ``call`` may be
    stuck opening) is opened for writing to set the thread free, and the test fails: the call had blocked. For calls
    that release the GIL while they wait (Python's own open); HDF5's do not: ``read_in_a_process``."""
    import os
    import threading

    outcome = {}

    def run():
        try:
            outcome["value"] = call()
        except Exception as e:  # noqa: BLE001 - handed to the test
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        if fifo is not None:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # its reader gets EOF and returns
        thread.join(10)
        pytest.fail(f"blocked for {seconds:.0f} s")
    if "error" in outcome:
        return outcome["error"]
    return outcome["value"]


READ_ITEM = """
import sys
from vit.explain.benchmarks.gtsegs import GtSegs, GtSegsError
try:
    with GtSegs(sys.argv[1]) as file:
        file.item(int(sys.argv[2]))
    print("read")
except GtSegsError as e:
    print(e)
"""


def read_in_a_process(path, index: int = 0, seconds: float = 60.0) -> str:
    """What ``GtSegs(path).item(index)`` says, run in its own process: its GtSegsError's line, or 'read'. The test
    fails when it blocks past ``seconds``: HDF5 holds the GIL while it waits on a FIFO, so nothing in this process
    could set it free."""
    import subprocess

    from peak_memory import run_forked

    try:  # forked from the measuring server, which imported torch once (a fresh interpreter: ~2 s of CPU a read)
        done = run_forked(READ_ITEM, [str(path), str(index)], timeout=seconds)
    except subprocess.TimeoutExpired:
        pytest.fail(f"blocked for {seconds:.0f} s")
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()

@pytest.mark.parametrize("outside", ["a file", "a fifo"])
def test_a_dataset_stored_in_another_file_is_refused_before_it_is_read(tmp_path, outside):
    """HDF5 external storage: the image's bytes in a file outside (here one holding a secret, or a FIFO that never
    answers), which HDF5 would open and read as the image."""
    import os

    secret = tmp_path / "elsewhere" / "secret"
    secret.parent.mkdir()
    if outside == "a fifo":
        os.mkfifo(secret)
    else:
        secret.write_bytes(b"s3cret" * 1000)
    path = write_gtsegs(tmp_path / "gtsegs.mat", *pictures(2))
    with h5py.File(path, "a") as f:
        f["value/img"][1, 0] = f["#refs#"].create_dataset("ext", shape=(3, 10, 10), dtype=np.uint8,
                                                          external=[(str(secret), 0, 300)]).ref

    said = read_in_a_process(path, 1)
    assert "keeps its data in other files (external storage)" in said, said


def test_a_virtual_dataset_is_refused_before_it_is_read(tmp_path):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f.create_dataset("x", data=np.full((3, 10, 10), 7, dtype=np.uint8))
    path = write_gtsegs(tmp_path / "gtsegs.mat", *pictures(2))
    with h5py.File(path, "a") as f:
        layout = h5py.VirtualLayout(shape=(3, 10, 10), dtype=np.uint8)
        layout[:] = h5py.VirtualSource(str(other), "x", shape=(3, 10, 10))
        f["value/img"][0, 0] = f["#refs#"].create_virtual_dataset("virtual", layout).ref
    with GtSegs(path) as file, pytest.raises(GtSegsError, match=r"other files \(a virtual dataset\)"):
        file.check()


def test_a_link_into_another_file_is_refused_before_it_is_followed(tmp_path):
    other = write_gtsegs(tmp_path / "other.mat", *pictures(2))
    path = write_gtsegs(tmp_path / "gtsegs.mat", *pictures(2))
    with h5py.File(path, "a") as f:
        del f["value"]
        f["value"] = h5py.ExternalLink(str(other), "/value")
    with pytest.raises(GtSegsError, match="/value is a link into another file"):
        GtSegs(path)


def test_a_fifo_named_as_the_file_is_refused_without_waiting_on_it(tmp_path):
    import os

    fifo = tmp_path / "gtsegs_ijcv.mat"
    os.mkfifo(fifo)
    said = read_in_a_process(fifo)
    assert "not a regular file" in said, said


def test_an_image_past_the_decoded_side_is_reduced_as_an_upload_is(tmp_path):
    """A 3,000 x 2,100 picture (the file's images may declare up to 40 M pixels each: 16 of 6,000² held 2.9 GB in a
    batch) comes out as ``open_image`` gives the same picture from a PNG: its long side at ``MAX_SIDE``; the mask
    nearest to the same size."""
    from PIL import Image

    from vit.core.images import MAX_SIDE, open_image

    ys, xs = np.mgrid[0:2100, 0:3000]
    picture = np.stack([xs % 256, ys % 256, (xs + ys) // 24 % 256], axis=-1).astype(np.uint8)  # (H, W, 3)
    mask = ((ys - 1000) ** 2 + (xs - 1500) ** 2 < 700**2).astype(np.uint8)
    path = write_gtsegs(tmp_path / "gtsegs.mat", [picture], [mask])
    Image.fromarray(picture).save(tmp_path / "picture.png")
    with GtSegs(path) as file:
        image, reduced = file.item(0)
    upload = open_image(tmp_path / "picture.png")
    assert image.size == upload.size == (MAX_SIDE, 1434)
    assert np.array_equal(np.asarray(image), np.asarray(upload))
    assert reduced.shape == (1434, MAX_SIDE) and set(np.unique(reduced)) == {0, 1}
    nearest = np.asarray(Image.fromarray(mask).resize((MAX_SIDE, 1434), Image.NEAREST))
    assert np.array_equal(reduced, nearest)
