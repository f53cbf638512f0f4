"""Attention snapshots: the probe set, what a snapshot holds, its files, readers and the GIF export."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from vit.explain.methods.attention import mean_attention_distance, rollout
from vit.model import ViT, ViTConfig
from vit.training import snapshots
from vit.training.snapshots import (
    Probe,
    SnapshotError,
    choose_probe,
    choose_sample,
    load_probe,
    load_snapshot,
    probe_map,
    save_probe,
    snapshot_epochs,
    statistics_over_epochs,
    take_snapshot,
    write_snapshot,
)


class FixedAttention(nn.Module):
    """A stand-in for an imported model: ``prefix`` prefix tokens, any (non-square) grid, and per layer
    the attention given, the same for every image; logits are each image's channel means."""

    def __init__(self, attentions: list[torch.Tensor], prefix: int, patch_size: int) -> None:
        super().__init__()
        self.attentions, self.num_prefix_tokens, self.patch_size = attentions, prefix, patch_size

    def forward(self, x, output_attentions=False):
        B = x.shape[0]
        gh, gw = x.shape[2] // self.patch_size, x.shape[3] // self.patch_size
        assert self.attentions[0].shape[-1] == self.num_prefix_tokens + gh * gw
        logits = x.mean(dim=(2, 3))  # (B, C)
        attn = tuple(a.expand(B, *a.shape[1:]) for a in self.attentions)
        return logits, attn if output_attentions else None


def softmax_attention(H: int, T: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, H, T, T, generator=g).softmax(dim=-1)


# -- the probe set ------------------------------------------------------------------------------------------------

def test_probe_takes_classes_in_turn_so_every_class_is_represented():
    labels = [0] * 10 + [1] * 10 + [2] * 3 + [3] * 1
    chosen = choose_probe(labels, count=8, seed=0)
    assert len(chosen) == len(set(chosen)) == 8
    counts = np.bincount([labels[i] for i in chosen], minlength=4)
    assert counts[3] == 1 and counts[2] == 2  # the small classes are not crowded out
    assert sorted(counts[:2]) == [2, 3]


def test_probe_is_fixed_by_the_seed_and_changes_with_it():
    labels = [i % 5 for i in range(100)]
    assert choose_probe(labels, 8, seed=3) == choose_probe(torch.tensor(labels), 8, seed=3)
    assert choose_probe(labels, 8, seed=3) != choose_probe(labels, 8, seed=4)


def test_probe_of_a_split_smaller_than_the_count_takes_every_image():
    assert sorted(choose_probe([0, 1, 1], count=8)) == [0, 1, 2]


def test_sample_is_distinct_sorted_and_capped_by_the_split():
    sample = choose_sample(1000, 256, seed=1)
    assert len(sample) == 256 and sample == sorted(set(sample)) and max(sample) < 1000
    assert choose_sample(10, 256) == list(range(10))


def test_probe_round_trips_through_the_run_folder_as_lossless_pngs(tmp_path):
    g = torch.Generator().manual_seed(0)
    for channels in (3, 1):
        images = torch.randint(0, 256, (20, channels, 6, 10), generator=g, dtype=torch.uint8)  # non-square
        labels = torch.arange(20) % 4
        probe = snapshots.make_probe(images, labels, ["a", "b", "c", "d"], seed=0)
        run = tmp_path / f"run{channels}"
        save_probe(run, probe)
        assert sorted(p.name for p in (run / "probe").iterdir()) == [*(f"{i:02d}.png" for i in range(8)), "probe.json"]
        back = load_probe(run)
        assert torch.equal(back.images, images[probe.indices])
        assert back.labels == [int(labels[i]) for i in probe.indices]
        assert back.class_names == ["a", "b", "c", "d"] and back.sample_indices == list(range(20))


def test_a_missing_probe_set_is_a_one_line_error(tmp_path):
    with pytest.raises(SnapshotError, match="no probe set"):
        load_probe(tmp_path)


# -- taking a snapshot --------------------------------------------------------------------------------------------

def test_snapshot_of_a_model_with_two_prefix_tokens_on_a_non_square_grid():
    prefix, patch, grid, H, L = 2, 2, (2, 3), 3, 2
    T = prefix + grid[0] * grid[1]
    attentions = [softmax_attention(H, T, seed) for seed in range(L)]
    model = FixedAttention(attentions, prefix, patch)
    probe = torch.randn(4, 3, grid[0] * patch, grid[1] * patch)
    arrays = take_snapshot(model, probe, probe[:2], patch_size=patch, num_prefix_tokens=prefix)
    assert arrays["cls_attention"].shape == (L, 4, H, 2, 3)
    for layer in range(L):  # the CLS row with the prefix keys dropped, row-major (DINO's attn[:, :, 0, p:])
        expected = attentions[layer][0, :, 0, prefix:].reshape(H, 2, 3).numpy()
        np.testing.assert_allclose(arrays["cls_attention"][layer, 3], expected, rtol=0, atol=1e-7)
    expected_rollout = rollout(attentions, num_prefix_tokens=prefix)[0, 0, prefix:].reshape(2, 3).numpy()
    np.testing.assert_allclose(arrays["rollout"][1], expected_rollout, rtol=0, atol=1e-7)
    np.testing.assert_allclose(arrays["logits"], probe.mean(dim=(2, 3)).numpy(), rtol=0, atol=1e-7)
    assert arrays["distance"].shape == arrays["entropy"].shape == (L, H)
    assert int(arrays["num_prefix_tokens"]) == prefix and int(arrays["patch_size"]) == patch


def test_statistics_of_uniform_attention_by_hand():
    # 1x2 grid, 4-px patches: each patch query gives half its weight to the other patch, 4 px away -> 2 px.
    prefix, T = 1, 3
    model = FixedAttention([torch.full((1, 2, T, T), 1 / T)], prefix, patch_size=4)
    arrays = take_snapshot(model, torch.zeros(1, 1, 4, 8), torch.zeros(5, 1, 4, 8), patch_size=4, batch_size=2)
    np.testing.assert_allclose(arrays["distance"], [[2.0, 2.0]], rtol=1e-6)
    np.testing.assert_allclose(arrays["entropy"], [[math.log(3), math.log(3)]], rtol=1e-6)
    assert int(arrays["sample_size"]) == 5


def test_statistics_are_the_mean_over_the_sample_images_whatever_the_batch_size():
    torch.manual_seed(0)
    model = ViT(ViTConfig(image_size=8, patch_size=4, num_channels=3, num_classes=3, hidden_size=8, num_layers=2,
                          num_heads=2, mlp_size=16)).eval()
    sample = torch.randn(7, 3, 8, 8)
    with torch.no_grad():
        _, attentions = model(sample, output_attentions=True)
    expected = torch.stack([mean_attention_distance(a, (2, 2), 4).mean(dim=0) for a in attentions]).numpy()
    for batch_size in (1, 3, 64):
        arrays = take_snapshot(model, sample[:2], sample, patch_size=4, batch_size=batch_size)
        np.testing.assert_allclose(arrays["distance"], expected, rtol=1e-5, atol=1e-6)


def test_snapshot_restores_the_training_mode():
    model = ViT(ViTConfig(image_size=8, patch_size=4, hidden_size=8, num_layers=1, num_heads=2, mlp_size=16))
    model.train()
    take_snapshot(model, torch.randn(1, 3, 8, 8), torch.randn(1, 3, 8, 8), patch_size=4)
    assert model.training


# -- files and readers --------------------------------------------------------------------------------------------

def fake_arrays(L=2, P=3, H=2, grid=(2, 3), seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"logits": rng.normal(size=(P, 4)).astype(np.float32),
            "cls_attention": rng.random((L, P, H, *grid), dtype=np.float32),
            "rollout": rng.random((P, *grid), dtype=np.float32),
            "distance": rng.random((L, H), dtype=np.float32), "entropy": rng.random((L, H), dtype=np.float32),
            "sample_size": np.int64(9), "patch_size": np.int64(4), "num_prefix_tokens": np.int64(1)}


def test_snapshots_are_appended_one_file_per_epoch_and_read_back(tmp_path):
    written = {epoch: fake_arrays(seed=epoch) for epoch in (0, 1, 2, 10)}
    for epoch, arrays in written.items():
        write_snapshot(tmp_path, epoch, arrays, seconds=0.25)
    (tmp_path / "attention" / ".epoch_0011.npz.abc.tmp").write_bytes(b"half a file")  # a write in flight
    assert snapshot_epochs(tmp_path) == [0, 1, 2, 10]
    snap = load_snapshot(tmp_path, 2)
    assert snap.epoch == 2 and snap.seconds == 0.25 and snap.grid == (2, 3)
    assert snap.num_layers == 2 and snap.num_heads == 2
    for key in ("logits", "cls_attention", "rollout", "distance", "entropy"):
        np.testing.assert_array_equal(getattr(snap, key), written[2][key])
    np.testing.assert_allclose(snap.probabilities.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(snap.predictions, written[2]["logits"].argmax(axis=1))


def test_statistics_over_epochs_is_layers_by_epochs_per_head_or_averaged(tmp_path):
    written = {epoch: fake_arrays(seed=epoch) for epoch in (0, 1, 3)}
    for epoch, arrays in written.items():
        write_snapshot(tmp_path, epoch, arrays)
    epochs, values = statistics_over_epochs(tmp_path, "entropy", head=1)
    assert epochs == [0, 1, 3] and values.shape == (2, 3)
    np.testing.assert_array_equal(values[:, 2], written[3]["entropy"][:, 1])
    _, mean = statistics_over_epochs(tmp_path, "distance")
    np.testing.assert_allclose(mean[:, 0], written[0]["distance"].mean(axis=1), rtol=1e-6)
    assert statistics_over_epochs(tmp_path / "nothing", "distance")[0] == []
    with pytest.raises(ValueError, match="distance, entropy"):
        statistics_over_epochs(tmp_path, "gini")


def test_statistics_over_epochs_reads_each_file_once_until_it_is_rewritten(tmp_path, monkeypatch):
    write_snapshot(tmp_path, 0, fake_arrays(seed=0))
    first = statistics_over_epochs(tmp_path, "distance", head=0)[1]

    def no_reading(*args, **kwargs):
        raise AssertionError("an unchanged snapshot file was read again")

    monkeypatch.setattr(np, "load", no_reading)
    np.testing.assert_array_equal(statistics_over_epochs(tmp_path, "distance", head=0)[1], first)
    monkeypatch.undo()
    rewritten = fake_arrays(seed=7)
    write_snapshot(tmp_path, 0, rewritten)  # as a resumed run rewrites an epoch a kill cut off
    np.testing.assert_array_equal(statistics_over_epochs(tmp_path, "distance", head=0)[1][:, 0],
                                  rewritten["distance"][:, 0])


def test_load_snapshot_decompresses_a_file_once_until_it_is_rewritten(tmp_path, monkeypatch):
    write_snapshot(tmp_path, 2, fake_arrays(seed=0))
    first = load_snapshot(tmp_path, 2)
    monkeypatch.setattr(np, "load", lambda *args, **kwargs: pytest.fail("an unchanged snapshot was read again"))
    np.testing.assert_array_equal(load_snapshot(tmp_path, 2).cls_attention, first.cls_attention)
    monkeypatch.undo()
    rewritten = fake_arrays(seed=7)
    write_snapshot(tmp_path, 2, rewritten)
    np.testing.assert_array_equal(load_snapshot(tmp_path, 2).cls_attention, rewritten["cls_attention"])


def test_a_missing_or_damaged_snapshot_is_a_one_line_error(tmp_path):
    write_snapshot(tmp_path, 1, fake_arrays())
    with pytest.raises(SnapshotError, match="epochs with one: 1"):
        load_snapshot(tmp_path, 2)
    snapshots.snapshot_path(tmp_path, 3).write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(SnapshotError, match="not a readable attention snapshot"):
        load_snapshot(tmp_path, 3)


def test_a_snapshot_with_a_pickled_object_is_refused(tmp_path):
    path = snapshots.snapshot_path(tmp_path, 4)
    path.parent.mkdir(parents=True)
    np.savez(path, epoch=np.int64(4), logits=np.array([object()], dtype=object))
    with pytest.raises(SnapshotError):
        load_snapshot(tmp_path, 4)


def test_a_writer_killed_mid_write_leaves_the_earlier_snapshots_intact(tmp_path):
    write_snapshot(tmp_path, 0, fake_arrays())
    # A child process starts writing a large snapshot of epoch 1 and is SIGKILLed while it writes.
    script = textwrap.dedent(f"""
        import os, signal, numpy as np
        from vit.training import snapshots
        def dying(path, data):
            fd = os.open(str(path.parent / ('.' + path.name + '.x.tmp')), os.O_WRONLY | os.O_CREAT)
            os.write(fd, data[: len(data) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        snapshots.atomic_write_bytes = dying
        arrays = {{k: np.zeros((2, 3, 2, 40, 40), np.float32) for k in ["cls_attention"]}}
        snapshots.write_snapshot({str(tmp_path)!r}, 1, arrays)
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=os.path.dirname(os.path.dirname(__file__)))
    assert result.returncode == -9
    assert snapshot_epochs(tmp_path) == [0]
    assert load_snapshot(tmp_path, 0).epoch == 0


# -- maps and the GIF ---------------------------------------------------------------------------------------------

def test_probe_map_picks_a_head_fuses_heads_or_gives_the_rollout(tmp_path):
    arrays = fake_arrays()
    write_snapshot(tmp_path, 1, arrays)
    snap = load_snapshot(tmp_path, 1)
    np.testing.assert_array_equal(probe_map(snap, 2, "attention", layer=1, head=0), arrays["cls_attention"][1, 2, 0])
    np.testing.assert_allclose(probe_map(snap, 2, layer=-1, fusion="mean"), arrays["cls_attention"][1, 2].mean(0))
    np.testing.assert_array_equal(probe_map(snap, 2, layer=0, fusion="max"), arrays["cls_attention"][0, 2].max(0))
    np.testing.assert_array_equal(probe_map(snap, 1, layer=0, fusion="min"), arrays["cls_attention"][0, 1].min(0))
    np.testing.assert_array_equal(probe_map(snap, 0, "rollout"), arrays["rollout"][0])
    with pytest.raises(ValueError, match="unknown head fusion"):
        probe_map(snap, 0, fusion="median")
    with pytest.raises(ValueError, match="out of range"):
        probe_map(snap, 3)
    with pytest.raises(ValueError, match="head 5"):
        probe_map(snap, 0, head=5)


def test_fusing_cls_maps_equals_the_cls_row_of_fused_heads():
    from vit.explain.methods.attention import fuse_heads, token_map

    attn = softmax_attention(3, 1 + 6, seed=1)
    maps = token_map(attn, 0, (2, 3))[0]  # (H, 2, 3)
    for how, reduce in (("mean", maps.mean(0)), ("max", maps.amax(0)), ("min", maps.amin(0))):
        torch.testing.assert_close(reduce, token_map(fuse_heads(attn, how), 0, (2, 3))[0])


def test_gif_has_one_frame_per_epoch(tmp_path):
    probe = Probe(images=torch.randint(0, 256, (3, 3, 8, 12), dtype=torch.uint8), labels=[0, 1, 2], indices=[0, 1, 2],
                  class_names=["a", "b", "c", "d"], sample_indices=[0, 1, 2])
    save_probe(tmp_path, probe)
    for epoch in (0, 1, 2):
        write_snapshot(tmp_path, epoch, fake_arrays(seed=epoch))
    frames = snapshots.animation_frames(tmp_path, 1, kind="rollout", size=64)
    assert len(frames) == 3 and frames[0].size == (64, 64)
    data = snapshots.gif_bytes(frames, seconds_per_frame=0.2)
    with Image.open(__import__("io").BytesIO(data)) as gif:
        assert gif.format == "GIF" and gif.n_frames == 3 and gif.info["duration"] == 200


def test_probe_overlays_show_each_probe_image_with_its_prediction(tmp_path):
    probe = Probe(images=torch.zeros((3, 1, 8, 8), dtype=torch.uint8), labels=[0, 1, 2], indices=[0, 1, 2],
                  class_names=["a", "b", "c", "d"], sample_indices=[0])
    save_probe(tmp_path, probe)
    arrays = fake_arrays(grid=(2, 2))
    arrays["logits"] = np.log(np.array([[0.7, 0.1, 0.1, 0.1], [0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.8, 0.0001]],
                                       dtype=np.float32))
    write_snapshot(tmp_path, 5, arrays)
    shown = snapshots.probe_overlays(tmp_path, 5, "attention", layer=0, head=1, size=32)
    assert [caption for _, caption in shown] == ["a → a 70% ✓", "b → a 70% ✗", "c → c 80% ✓"]
    assert all(image.size == (32, 32) and image.mode == "RGB" for image, _ in shown)


# --- issue 20, item 6: a run folder's snapshots and probe images are bounded before they are read ---------------

def npz_declaring(path, arrays: dict[str, np.ndarray], declared: dict[str, tuple[int, ...]]) -> None:
    """An .npz whose members ``declared`` only claim their shape in the header (their data is a few bytes):
    a reader that decompressed before checking would allocate what they claim."""
    import io
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for key, value in arrays.items():
            buffer = io.BytesIO()
            if key in declared:
                np.lib.format.write_array_header_1_0(buffer, {"descr": "<f4", "fortran_order": False,
                                                              "shape": declared[key]})
                buffer.write(b"\0" * 64)
            else:
                np.lib.format.write_array(buffer, np.asarray(value))
            z.writestr(f"{key}.npy", buffer.getvalue())


def test_a_snapshot_declaring_a_gigabyte_is_refused_from_its_header(tmp_path, monkeypatch):
    arrays = {**fake_arrays(), "epoch": np.int64(0)}
    (tmp_path / "attention").mkdir()
    npz_declaring(snapshots.snapshot_path(tmp_path, 0), arrays, {"cls_attention": (24, 8, 16, 1024, 1024)})
    with monkeypatch.context() as m:
        m.setattr(np.lib.format, "read_array", lambda *a, **k: pytest.fail("data read before the check"))
        with pytest.raises(snapshots.SnapshotError, match="not a readable attention snapshot") as error:
            load_snapshot(tmp_path, 0)
    assert "\n" not in str(error.value)
    npz_declaring(snapshots.snapshot_path(tmp_path, 1), {**arrays, "epoch": np.int64(1)},
                  {"distance": (10**6, 10**3)})  # the statistics curve reads this one array
    assert statistics_over_epochs(tmp_path, "distance")[0] == [0]  # epoch 1 skipped, as an unreadable file


def test_snapshot_arrays_must_fit_each_other(tmp_path):
    arrays = fake_arrays()
    arrays["distance"] = np.zeros((3, 2), dtype=np.float32)  # 3 layers where cls_attention has 2
    write_snapshot(tmp_path, 0, arrays)
    with pytest.raises(snapshots.SnapshotError):
        load_snapshot(tmp_path, 0)


def test_probe_images_are_decoded_with_the_upload_bounds(tmp_path):
    probe = snapshots.make_probe(torch.zeros(4, 3, 8, 8, dtype=torch.uint8), torch.arange(4) % 2, ["a", "b"], seed=0)
    save_probe(tmp_path, probe)
    Image.new("L", (4000, 4000)).save(tmp_path / "probe" / "00.png")  # ~50 kB on disk, 16 MP decoded
    with pytest.raises(snapshots.SnapshotError, match="damaged") as error:
        load_probe(tmp_path)
    assert "\n" not in str(error.value)


def test_read_snapshots_are_kept_by_the_bytes_their_arrays_hold_not_by_their_count(tmp_path, monkeypatch):
    """Issue 39, item 5a: float64 arrays doubled what a count of 16 files allowed; 16 small files held 2.5 GB."""
    from vit.core.cache import ByteCache

    cache = ByteCache(3 * 2**20)
    monkeypatch.setattr(snapshots, "_SNAPSHOTS", cache)
    arrays = {**fake_arrays(L=8, P=8, H=8, grid=(16, 16)), "cls_attention": np.zeros((8, 8, 8, 16, 16))}  # 1 MB f64
    for epoch in range(8):
        write_snapshot(tmp_path, epoch, arrays)
        assert load_snapshot(tmp_path, epoch).cls_attention.dtype == np.float64
        assert cache.bytes <= 3 * 2**20
    assert len(cache) == 2, "two 1-MB-and-a-bit snapshots fit in 3 MB, not 16"
