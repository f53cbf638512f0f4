"""What the benchmark command (``python -m vit.faithfulness --benchmark ...``) reads and writes: its ``--out`` report
replaced atomically and checked before the work, and the files and sizes it refuses before they cost anything."""

import json
import signal
from pathlib import Path

import numpy as np
import pytest
from peak_memory import run_forked

from tests.test_faithfulness_chefer import tiny_model_and_images
from vit import faithfulness

# vit.faithfulness in its own process, SIGKILLed the moment it opens a file whose name holds argv[1] for writing
# (in place: the file itself; atomically: its temporary file beside it): what survives is what was on disk.
KILL_AS_IT_OPENS = """
import builtins, io, os, signal, sys
from vit.faithfulness import main

real, name = builtins.open, sys.argv[1]

def open_then_die(file, mode="r", *args, **kwargs):
    opened = real(file, mode, *args, **kwargs)
    if isinstance(file, (str, os.PathLike)) and name in os.fspath(file) and ("w" in mode or "+" in mode):
        os.kill(os.getpid(), signal.SIGKILL)
    return opened

builtins.open = io.open = open_then_die
sys.exit(main(sys.argv[2:]))
"""


def road(checkpoint: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [str(checkpoint), "--benchmark", "road", "--data", str(data), "--out", str(out), *extra]


@pytest.mark.parametrize("killed_in", ["faithfulness.json", "faithfulness.png"])
def test_a_rerun_killed_as_it_writes_its_report_leaves_the_previous_report_whole(tmp_path, capsys, killed_in):
    """Each file whole, and all three the previous run's (issue 95, item 6: the plot and table of the killed rerun
    stood beside the JSON of the run before); the next rerun removes the killed one's temporary files, not a live
    writer's, and writes its own report whole."""
    checkpoint = tiny_model_and_images(tmp_path, labelled=False)
    out = tmp_path / "out"
    assert faithfulness.main(road(checkpoint, tmp_path / "data", out, "--methods", "random")) == 0
    capsys.readouterr()
    before = {name: (out / name).read_bytes() for name in faithfulness.REPORT_FILES}
    assert json.loads(before["faithfulness.json"])["methods"].keys() == {"random"}

    rerun = run_forked(KILL_AS_IT_OPENS, [killed_in, *road(checkpoint, tmp_path / "data", out, "--methods", "random",
                                                          "attention")], timeout=300)  # the measuring server's fork
    assert rerun.returncode == -signal.SIGKILL, rerun.stderr[-2000:]  # killed in the write, not done before it
    assert {name: (out / name).read_bytes() for name in faithfulness.REPORT_FILES} == before
    assert list(out.glob(".faithfulness.*.tmp"))  # SIGKILL cleans nothing up: the killed rerun's files stay
    live = out / ".faithfulness.md.1.1.tmp"  # pid 1 is alive: a writer about to rename its file
    live.write_bytes(b"")

    assert faithfulness.main(road(checkpoint, tmp_path / "data", out, "--methods", "random", "attention")) == 0
    assert sorted(p.name for p in out.iterdir()) == [live.name, *sorted(faithfulness.REPORT_FILES)]
    assert json.loads((out / "faithfulness.json").read_text())["methods"].keys() == {"random", "attention"}
    assert "| attention |" in (out / "faithfulness.md").read_text()


def test_a_deletion_report_after_another_benchmarks_leaves_no_plot_of_that_run(tmp_path, capsys):
    """Deletion draws no plot: the one of the run before is removed with the rest of its report."""
    checkpoint = tiny_model_and_images(tmp_path, labelled=True)
    out = tmp_path / "out"
    assert faithfulness.main([str(checkpoint), "--benchmark", "perturbation", "--data", str(tmp_path / "data"),
                              "--methods", "random", "--out", str(out)]) == 0
    assert (out / "faithfulness.png").is_file()
    assert faithfulness.main([str(checkpoint), "--data", str(tmp_path / "data"), "--methods", "random", "--out",
                              str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["faithfulness.json", "faithfulness.md"]
    assert "deletion_auc" in json.loads((out / "faithfulness.json").read_text())["methods"]["random"]


def test_the_report_files_named_before_torch_loads_are_the_ones_written():
    from vit.explain.benchmarks import benchmark_run

    assert faithfulness.REPORT_FILES == benchmark_run.REPORT_FILES


@pytest.mark.parametrize("out, message", [
    ("/dev/null", "--out /dev/null is not a folder"),
    ("FILE", "is not a folder"),
    ("/proc/vit-benchmark", "--out /proc/vit-benchmark cannot be written"),
    ("HOLDS_A_FOLDER", "holds a folder named faithfulness.json"),
])
def test_an_out_that_cannot_take_the_report_is_refused_before_the_work(tmp_path, capsys, out, message):
    checkpoint = tiny_model_and_images(tmp_path, labelled=False)
    if out == "FILE":
        out = str(checkpoint)
    elif out == "HOLDS_A_FOLDER":
        out = str(tmp_path / "out")
        (tmp_path / "out" / "faithfulness.json").mkdir(parents=True)
    code = faithfulness.main(road(checkpoint, tmp_path / "data", Path(out), "--methods", "random"))
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err  # refused before the work: no progress bar, no table


@pytest.mark.parametrize("mask", ["a link out of the folder", "a fifo"])
def test_a_mask_that_is_no_file_of_the_masks_folder_is_refused_before_the_work(tmp_path, capsys, mask):
    import os

    from tests.test_gtsegs import finishes

    checkpoint = tiny_model_and_images(tmp_path, labelled=False)
    im0 = tmp_path / "masks" / "im0.png"
    if mask == "a fifo":
        im0.unlink()
        os.mkfifo(im0)
    else:  # a PNG elsewhere on the machine: read as this image's mask
        outside = tmp_path / "elsewhere" / "private.png"
        outside.parent.mkdir()
        im0.rename(outside)
        im0.symlink_to(outside)
    code = finishes(lambda: faithfulness.main([str(checkpoint), "--benchmark", "segmentation", "--data",
                                               str(tmp_path / "data"), "--masks", str(tmp_path / "masks"),
                                               "--methods", "random"]), im0 if mask == "a fifo" else None)
    err = capsys.readouterr().err
    message = "links to a file outside" if mask != "a fifo" else "is not a regular file"
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_mask_swapped_for_a_fifo_after_the_listing_is_refused_without_waiting_on_it(tmp_path):
    import os

    from tests.test_gtsegs import finishes
    from vit.explain.benchmarks.benchmark_run import BenchmarkError, open_mask

    fifo = tmp_path / "im0.png"
    os.mkfifo(fifo)
    error = finishes(lambda: open_mask(fifo, (16, 16)), fifo)
    assert isinstance(error, BenchmarkError) and "not a regular file" in str(error)


def test_a_batch_past_the_memory_limit_is_refused_before_the_work(tmp_path, capsys, monkeypatch):
    """What a batch holds (the item being read, reduced as any decode is; every image's input and forward) is
    counted before the first image is read: over VIT_ANALYSIS_MEMORY_MB the run is a usage error in one line."""
    checkpoint = tiny_model_and_images(tmp_path, labelled=False)
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "16")
    code = faithfulness.main([str(checkpoint), "--benchmark", "saco", "--data", str(tmp_path / "data"),
                              "--methods", "random", "--batch-size", "4"])
    err = capsys.readouterr().err
    assert code == 2 and "A batch of 4 images holds about 20 MB at once" in err, err
    assert "over the 16 MB limit (VIT_ANALYSIS_MEMORY_MB)" in err and len(err.strip().splitlines()) == 1, err
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "64")
    assert faithfulness.main([str(checkpoint), "--benchmark", "saco", "--data", str(tmp_path / "data"),
                              "--methods", "random", "--batch-size", "4"]) == 0


@pytest.mark.parametrize("extra, message", [
    (["--steps", "1000000000"], "argument --steps: expected a whole number from 1 to 16,384, got '1000000000'"),
    (["--steps", "1e9"], "argument --steps: expected a whole number from 1 to 16,384, got '1e9'"),
    (["--benchmark", "saco", "--groups", "1000000000"], "argument --groups: expected a whole number from 2 to 100"),
    (["--benchmark", "saco", "--groups", "1"], "argument --groups: expected a whole number from 2 to 100, got '1'"),
])
def test_counts_that_size_the_work_are_bounded_as_the_command_line_is_read(tmp_path, capsys, extra, message):
    checkpoint = tiny_model_and_images(tmp_path, labelled=True)
    code = faithfulness.main([str(checkpoint), "--data", str(tmp_path / "data"), "--methods", "random", *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_batch_whose_gradient_maps_are_past_the_limit_is_refused_naming_the_batch_that_fits(tmp_path, capsys,
                                                                                               monkeypatch):
    """A gradient method's maps are formed for the whole batch in one backward (``faithfulness.method_maps``): every
    image's attention and gradient held together. The count before the work includes them, so a batch that fits for
    the random maps is refused for the class-specific map, in one line naming the batch that fits, which then runs."""
    import torch
    from PIL import Image

    from vit.checkpoint import save_checkpoint
    from vit.model import ViT, ViTConfig

    torch.manual_seed(0)
    # 257 tokens, 8 heads, 4 layers: every layer's attention and gradient ~34 MB an image (plan.gradient), against
    # ~21 MB for the item being read and a few KB of inputs and forward
    config = ViTConfig(image_size=64, patch_size=4, hidden_size=16, num_layers=4, num_heads=8, mlp_size=32,
                       num_classes=2)
    save_checkpoint(tmp_path / "m.pt", ViT(config).eval(), ["cat", "dog"])
    rng = np.random.default_rng(0)
    (tmp_path / "data").mkdir()
    for i in range(4):
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(tmp_path / "data" / f"im{i}.png")
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "64")

    def run(method: str, batch: int) -> tuple[int, str]:
        code = faithfulness.main([str(tmp_path / "m.pt"), "--benchmark", "saco", "--data", str(tmp_path / "data"),
                                  "--methods", method, "--batch-size", str(batch), "--out", str(tmp_path / "out")])
        return code, capsys.readouterr().err

    assert run("random", 4)[0] == 0
    code, err = run("class", 4)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "A batch of 4 images holds about" in err and "class's maps" in err, err
    assert "choose at most 1 images per batch" in err, err
    assert run("class", 1)[0] == 0
