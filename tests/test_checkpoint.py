"""Checkpoints: what is saved comes back, and every bad file gives one clear CheckpointError."""

import os
import re
import shlex

import pytest
import torch
from PIL import Image

from vit.checkpoint import (
    FORMAT_VERSION,
    CheckpointError,
    Preprocessing,
    atomic_torch_save,
    load_checkpoint,
    read_checkpoint_payload,
    save_checkpoint,
)
from vit.core.runfiles import resume_hint
from vit.model import ViT, ViTConfig

CONFIG = ViTConfig(image_size=16, patch_size=4, hidden_size=16, num_layers=2, num_heads=2, mlp_size=32,
                   num_classes=3)
CLASSES = ["cat", "dog", "ship"]


@pytest.fixture
def model() -> ViT:
    torch.manual_seed(0)
    return ViT(CONFIG).eval()


@pytest.fixture
def saved(tmp_path, model):
    path = tmp_path / "model.pt"
    save_checkpoint(path, model, CLASSES, Preprocessing(16, 3, (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)),
                    metadata={"val_acc": 0.75, "epoch": 3})
    return path


def load_error(path) -> str:
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert "\n" not in message, "errors are one line"
    return message


def edited(path, **changes):
    """Re-save the payload of ``path`` with some top-level entries changed (None removes one)."""
    payload = read_checkpoint_payload(path)
    for key, value in changes.items():
        if value is None:
            del payload[key]
        else:
            payload[key] = value
    atomic_torch_save(payload, path)
    return path


# ---------------------------------------------------------------------------------------------
# Round trip


def test_round_trip_restores_config_class_names_preprocessing_and_metadata(saved):
    checkpoint = load_checkpoint(saved)
    assert checkpoint.config == CONFIG
    assert checkpoint.class_names == CLASSES
    assert checkpoint.preprocessing == Preprocessing(16, 3, (0.4, 0.5, 0.6), (0.2, 0.25, 0.3))
    assert checkpoint.metadata == {"val_acc": 0.75, "epoch": 3}
    assert checkpoint.training_state is None
    assert checkpoint.path == saved


def test_round_trip_restores_every_weight_exactly(saved, model):
    loaded = load_checkpoint(saved).model.state_dict()
    original = model.state_dict()
    assert loaded.keys() == original.keys()
    for key in original:
        assert torch.equal(loaded[key], original[key]), key


def test_loaded_model_is_in_eval_mode_and_gives_the_same_logits(saved, model):
    loaded = load_checkpoint(saved).model
    assert not loaded.training
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(loaded(images)[0], model(images)[0])


def test_preprocessing_defaults_to_half_mean_and_std(tmp_path, model):
    save_checkpoint(tmp_path / "m.pt", model, CLASSES)
    assert load_checkpoint(tmp_path / "m.pt").preprocessing == Preprocessing(16, 3, (0.5,) * 3, (0.5,) * 3)


def test_training_state_round_trips(tmp_path, model):
    state = {"progress": {"epoch": 2}, "optimizer": {"lr": torch.tensor(0.1)}}
    save_checkpoint(tmp_path / "m.pt", model, CLASSES, training_state=state)
    loaded = load_checkpoint(tmp_path / "m.pt").training_state
    assert loaded["progress"] == {"epoch": 2}
    assert torch.equal(loaded["optimizer"]["lr"], torch.tensor(0.1))


@pytest.mark.parametrize("prefix", ["module.", "_orig_mod.", "module._orig_mod."])
def test_wrapper_prefixes_in_weight_names_are_removed(saved, model, prefix):
    payload = read_checkpoint_payload(saved)
    edited(saved, state_dict={prefix + key: value for key, value in payload["state_dict"].items()})
    loaded = load_checkpoint(saved).model.state_dict()
    assert all(torch.equal(loaded[key], value) for key, value in model.state_dict().items())


def test_save_refuses_a_wrong_number_of_class_names(tmp_path, model):
    with pytest.raises(ValueError, match="2 class names given for a model with 3 classes"):
        save_checkpoint(tmp_path / "m.pt", model, ["a", "b"])


def test_save_refuses_preprocessing_for_another_channel_count(tmp_path, model):
    with pytest.raises(ValueError, match="1 image channel"):
        save_checkpoint(tmp_path / "m.pt", model, CLASSES, Preprocessing(16, 1, (0.5,), (0.5,)))


# ---------------------------------------------------------------------------------------------
# Files that are not (usable) checkpoints


def test_missing_file(tmp_path):
    assert "checkpoint not found" in load_error(tmp_path / "nope.pt")


def test_a_folder_is_not_a_checkpoint(tmp_path):
    assert "is not a file" in load_error(tmp_path)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.pt"
    path.write_bytes(b"")
    assert "is empty" in load_error(path)


def test_text_file_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "notes.pt"
    path.write_text("hello world\nthis is not a model\n")
    assert "is not a checkpoint" in load_error(path)


def test_png_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "picture.pt"
    Image.new("RGB", (8, 8), "red").save(path, format="PNG")
    assert "is not a checkpoint" in load_error(path)


def test_random_bytes_are_not_a_checkpoint(tmp_path):
    path = tmp_path / "noise.pt"
    path.write_bytes(bytes(range(256)) * 8)
    assert "is not a checkpoint" in load_error(path)


def test_truncated_checkpoint(saved):
    data = saved.read_bytes()
    saved.write_bytes(data[: len(data) // 2])
    message = load_error(saved)
    assert "truncated or corrupt" in message
    assert len(message) < 400


def test_torch_file_that_is_not_ours(tmp_path):
    path = tmp_path / "other.pt"
    torch.save({"a": 1}, path)
    assert "not a ViT Attention Explorer checkpoint" in load_error(path)


def test_unknown_format_version(saved):
    edited(saved, format_version=FORMAT_VERSION + 1)
    message = load_error(saved)
    assert f"format version {FORMAT_VERSION + 1}" in message
    assert f"reads version {FORMAT_VERSION}" in message


def test_missing_entry(saved):
    edited(saved, state_dict=None)
    assert "lacks its 'state_dict' entry" in load_error(saved)


def test_weights_that_do_not_fit_the_stored_config(saved):
    payload = read_checkpoint_payload(saved)
    edited(saved, config={**payload["config"], "hidden_size": 32, "mlp_size": 64})
    message = load_error(saved)
    assert "do not fit its stored config" in message
    assert "size mismatch" in message


def test_weights_missing_a_layer_of_the_stored_config(saved):
    payload = read_checkpoint_payload(saved)
    edited(saved, config={**payload["config"], "num_layers": 3})
    message = load_error(saved)
    assert "do not fit its stored config" in message
    assert "blocks.2" in message


def test_invalid_config_value(saved):
    payload = read_checkpoint_payload(saved)
    edited(saved, config={**payload["config"], "patch_size": 5})
    assert "invalid config" in load_error(saved)


def test_unknown_config_field(saved):
    payload = read_checkpoint_payload(saved)
    edited(saved, config={**payload["config"], "rotary": True})
    assert "unknown ViTConfig field(s): rotary" in load_error(saved)


def test_class_names_that_do_not_match_the_model(saved):
    edited(saved, class_names=["a", "b"])
    assert "names 2 classes but its model has 3" in load_error(saved)


def test_preprocessing_for_another_channel_count(saved):
    edited(saved, preprocessing={"image_size": 16, "num_channels": 1, "mean": [0.5], "std": [0.5]})
    assert "invalid preprocessing" in load_error(saved)


def test_preprocessing_with_zero_std(saved):
    edited(saved, preprocessing={"image_size": 16, "num_channels": 3, "mean": [0.5] * 3, "std": [0.5, 0, 0.5]})
    assert "std must be positive" in load_error(saved)


@pytest.mark.parametrize("mean, std", [([0.5, float("nan"), 0.5], [0.5] * 3), ([0.5] * 3, [0.5, float("inf"), 0.5])])
def test_preprocessing_with_a_nan_mean_or_an_infinite_std(saved, mean, std):
    """Issue 77, item 7: a NaN mean made every input, and so every map, NaN; an infinite std every input 0."""
    edited(saved, preprocessing={"image_size": 16, "num_channels": 3, "mean": mean, "std": std})
    assert "mean and std must be finite numbers" in load_error(saved)


@pytest.mark.parametrize("fill", [[300], [0, 0], ["0"], [True], 7])
def test_a_padding_colour_that_is_not_one_or_three_bytes_is_refused(saved, fill):
    edited(saved, preprocessing={"image_size": 16, "num_channels": 3, "mean": [0.5] * 3, "std": [0.5] * 3,
                                 "resize_size": 16, "resize_mode": "border", "pad_fill": fill})
    assert "padding colour" in load_error(saved)


def test_a_padding_colour_round_trips_and_pads(tmp_path, model):
    """open_clip's resize_mode "longest" pads in its fill_color, not the mean's colour: kept in the checkpoint."""
    from PIL import Image

    from vit.core.inference import evaluation_uint8

    pre = Preprocessing(16, 3, (0.5,) * 3, (0.5,) * 3, resize_size=16, resize_mode="border", pad_fill=(200,))
    save_checkpoint(tmp_path / "m.pt", model, CLASSES, preprocessing=pre)
    loaded = load_checkpoint(tmp_path / "m.pt").preprocessing
    assert loaded == pre and loaded.fill_colour == (200, 200, 200)
    pixels = evaluation_uint8(Image.new("RGB", (32, 16), (10, 20, 30)), loaded)  # 16 x 8: 4 rows padded each side
    assert pixels[:, :4].eq(200).all() and pixels[:, 4:12].eq(torch.tensor([10, 20, 30]).view(3, 1, 1)).all()
    assert Preprocessing(16, 3, (0.5,) * 3, (0.5,) * 3).fill_colour == (128, 128, 128)  # the mean's, as timm's


# ---------------------------------------------------------------------------------------------
# Safety: a checkpoint is data, never code


class RunsACommand:
    """Unpickling this calls ``os.system`` (what a malicious checkpoint would do)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path, model, zip_format):
    path = tmp_path / "evil.pt"
    marker = tmp_path / "pwned"
    save_checkpoint(path, model, CLASSES)
    payload = read_checkpoint_payload(path)
    payload["metadata"] = {"note": RunsACommand(f"touch {shlex.quote(str(marker))}")}
    torch.save(payload, path, _use_new_zipfile_serialization=zip_format)

    message = load_error(path)
    assert "refused to load" in message
    assert "could run code" in message
    assert not marker.exists()


def test_numpy_arrays_are_refused_too(tmp_path):
    np = pytest.importorskip("numpy")
    path = tmp_path / "np.pt"
    torch.save({"format": "x", "weights": np.zeros(3)}, path)
    assert "refused to load" in load_error(path)


# ---------------------------------------------------------------------------------------------
# Atomic writes


def test_crash_during_save_keeps_the_previous_checkpoint_and_leaves_no_temp_file(saved, model, monkeypatch):
    before = saved.read_bytes()

    def crash_halfway(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", crash_halfway)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(saved, model, ["x", "y", "z"])
    monkeypatch.undo()

    assert saved.read_bytes() == before
    assert load_checkpoint(saved).class_names == CLASSES
    assert sorted(p.name for p in saved.parent.iterdir()) == ["model.pt"]


def test_interrupt_during_save_leaves_no_temp_file(tmp_path, model, monkeypatch):
    def interrupted(obj, f, *args, **kwargs):
        f.write(b"PK")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path / "new.pt", model, CLASSES)
    assert list(tmp_path.iterdir()) == []


def test_save_creates_missing_folders(tmp_path, model):
    path = save_checkpoint(tmp_path / "runs" / "a" / "best.pt", model, CLASSES)
    assert load_checkpoint(path).class_names == CLASSES


def test_saved_checkpoint_is_readable_by_others_as_the_umask_allows(saved):
    # mkstemp creates 0600 files; a checkpoint is an ordinary file (the app may run as another user).
    umask = os.umask(0)
    os.umask(umask)
    assert saved.stat().st_mode & 0o777 == 0o666 & ~umask


# ---------------------------------------------------------------------------------------------
# Hostile files cost milliseconds: shapes are checked before anything is allocated, pickles are
# sized before anything is unpickled


@pytest.fixture
def built_only_on_meta(monkeypatch):
    """Fails the test if a real (allocating) model is built before the weights were checked."""
    import vit.checkpoint.file_format as module  # where the model is built

    real = module.ViT

    def only_on_meta(config):
        if torch.get_default_device().type != "meta":
            assert config.num_layers == CONFIG.num_layers and config.hidden_size == CONFIG.hidden_size, \
                "a model of the stored config was built before its weights were checked"
        return real(config)

    monkeypatch.setattr(module, "ViT", only_on_meta)


@pytest.mark.parametrize("field, value", [("hidden_size", 10**6), ("num_layers", 10**5), ("mlp_size", 10**9),
                                          ("image_size", 10**6)])
def test_absurd_config_sizes_are_refused_before_anything_is_allocated(saved, built_only_on_meta, field, value):
    payload = read_checkpoint_payload(saved)
    edited(saved, config={**payload["config"], field: value})
    message = load_error(saved)
    assert "far beyond any published ViT" in message  # refused from the config itself (ViTConfig bounds)
    assert len(message) < 400


def test_absurd_layer_count_names_the_limit(saved, built_only_on_meta):
    payload = read_checkpoint_payload(saved)
    edited(saved, config={**payload["config"], "num_layers": 10**5})
    assert "num_layers is 100,000; at most 256" in load_error(saved)


def test_weights_of_the_wrong_shape_are_named_with_both_shapes(saved, built_only_on_meta):
    payload = read_checkpoint_payload(saved)
    edited(saved, config={**payload["config"], "mlp_size": 64})
    assert "size mismatch for blocks.0.mlp.fc1.weight: (32, 16) stored, (64, 16) in the config" in load_error(saved)


def test_the_kept_shapes_of_a_config_judge_every_later_file_of_it_and_no_other_config(saved, monkeypatch):
    """``weights_problem`` keeps the shapes of the last configs checked (a file is checked each time it is listed or
    opened): the model is built once per config, a file of the same config with a wrong shape is still named, and a
    config that differs in one field is judged by its own shapes, not the kept ones."""
    import vit.checkpoint.file_format as module
    from vit.checkpoint.file_format import weights_problem

    module._shapes_of.cache_clear()
    built = []
    real = module.ViT
    monkeypatch.setattr(module, "ViT", lambda config: built.append(config) or real(config))
    payload = read_checkpoint_payload(saved)
    state = payload["state_dict"]
    assert weights_problem(CONFIG, state) is None
    narrow = {**state, "blocks.0.mlp.fc1.weight": state["blocks.0.mlp.fc1.weight"][:16]}
    assert "size mismatch for blocks.0.mlp.fc1.weight: (16, 16) stored, (32, 16) in the config" in \
        weights_problem(CONFIG, narrow)
    wider = ViTConfig(**{**CONFIG.__dict__, "mlp_size": 64})
    assert "size mismatch for blocks.0.mlp.fc1.weight: (32, 16) stored, (64, 16) in the config" in \
        weights_problem(wider, state)
    assert weights_problem(CONFIG, state) is None
    assert built == [CONFIG, wider]

    def listed():  # a tuple field given as a list, as a JSON file reads back: the config turns it into a key
        return ViTConfig.from_dict({**CONFIG.to_dict(), "mimetic_init": [0.5, 0.5, 0.5, 0.5]})

    assert weights_problem(listed(), state) is None and weights_problem(listed(), state) is None
    assert built == [CONFIG, wider, listed()]


def test_a_weight_that_is_not_a_tensor_is_refused(saved):
    payload = read_checkpoint_payload(saved)
    edited(saved, state_dict={**payload["state_dict"], "head.bias": [0.0, 0.0, 0.0]})
    assert "'head.bias' is a list, not a tensor" in load_error(saved)


@pytest.mark.parametrize("entry, value", [("metadata", [1, 2]), ("training_state", "resume me")])
def test_malformed_metadata_or_training_state_is_a_checkpoint_error(saved, entry, value):
    edited(saved, **{entry: value})
    assert "malformed metadata or training state" in load_error(saved)


def test_preprocessing_larger_than_the_model_is_refused(saved):
    # 512 px on a 16-px model with 4-px patches would be 16,385 tokens per image.
    edited(saved, preprocessing={"image_size": 512, "num_channels": 3, "mean": [0.5] * 3, "std": [0.5] * 3})
    message = load_error(saved)
    assert "invalid preprocessing" in message
    assert "larger than the model's own 16 px and gives 16,385 tokens per image (at most 4,096 patches)" in message


def test_preprocessing_somewhat_larger_than_the_model_is_accepted(saved):
    # A tiny imported model with its family's default 224-px preprocessing: 56 x 56 = 3,136 patches.
    edited(saved, preprocessing={"image_size": 224, "num_channels": 3, "mean": [0.5] * 3, "std": [0.5] * 3})
    assert load_checkpoint(saved).preprocessing.image_size == 224


def test_preprocessing_smaller_than_the_model_is_accepted(saved):
    # DINOv2 is built for 518 px and documented with 224-px inputs: fewer tokens are always safe.
    edited(saved, preprocessing={"image_size": 8, "num_channels": 3, "mean": [0.5] * 3, "std": [0.5] * 3})
    assert load_checkpoint(saved).preprocessing.image_size == 8


def test_a_rectangular_model_round_trips_with_its_sides_as_height_width_pairs(tmp_path):
    config = ViTConfig(image_size=(16, 64), patch_size=(2, 8), num_classes=3, hidden_size=16, num_layers=1,
                       num_heads=2, mlp_size=16)
    model = ViT(config).eval()
    path = save_checkpoint(tmp_path / "rect.pt", model, ["a", "b", "c"])
    payload = read_checkpoint_payload(path)
    assert (payload["config"]["patch_size"], payload["preprocessing"]["image_size"]) == ((2, 8), [16, 64])
    loaded = load_checkpoint(path)
    assert loaded.config == config and loaded.preprocessing.image_hw == (16, 64)
    images = torch.randn(2, 3, 16, 64)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(images)[0], model(images)[0], rtol=0, atol=0)


@pytest.mark.parametrize(("size", "message"), [
    ([16, 62], r"invalid preprocessing: image size \(16, 62\) is not a positive multiple of the patch size 4"),
    ([16, 64, 1], "invalid config"),
])
def test_rectangular_preprocessing_that_does_not_tile_is_refused(saved, size, message):
    edited(saved, preprocessing={"image_size": size, "num_channels": 3, "mean": [0.5] * 3, "std": [0.5] * 3})
    assert re.search(message, load_error(saved))


def test_a_rectangle_cannot_be_cropped_from_a_resize_of_one_side():
    from vit.checkpoint import preprocessing_problem

    config = ViTConfig(image_size=(16, 64), patch_size=(2, 8))
    pre = Preprocessing((16, 64), 3, (0.5,) * 3, (0.5,) * 3, resize_size=64)
    assert "a crop from one resize side must be square" in preprocessing_problem(pre, config)


def pickle_bomb(path, opcodes: int, compression: int) -> None:
    """A torch-style zip whose data.pkl is ``opcodes`` (NONE, APPEND) pairs: slow to unpickle, tiny zipped."""
    import zipfile

    body = b"\x80\x02]" + b"Na" * opcodes + b"."  # PROTO 2, EMPTY_LIST, opcodes x (NONE, APPEND), STOP
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        archive.writestr("archive/data.pkl", body)
        archive.writestr("archive/byteorder", "little")
        archive.writestr("archive/version", "3\n")


@pytest.fixture
def never_unpickled(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("torch.load was called on a file that should have been refused before it")

    monkeypatch.setattr(torch, "load", refuse)


def test_compressed_pickle_bomb_is_refused_before_unpickling(tmp_path, never_unpickled):
    import zipfile

    path = tmp_path / "bomb.pt"
    pickle_bomb(path, 4_000_000, zipfile.ZIP_DEFLATED)  # 8 MB of opcodes in ~16 KB
    assert path.stat().st_size < 40_000
    message = load_error(path)
    assert "refused to load" in message
    assert "'archive/data.pkl' is compressed" in message


def test_oversized_pickle_is_refused_before_unpickling(tmp_path, never_unpickled):
    import zipfile

    path = tmp_path / "bomb.pt"
    pickle_bomb(path, 1_700_000, zipfile.ZIP_STORED)  # 3.4 MB of pickle and not one tensor
    message = load_error(path)
    assert "refused to load" in message
    assert "its pickle is 3,400,004 bytes for 0 tensors" in message


def test_legacy_torch_files_are_refused_without_unpickling(tmp_path, model, never_unpickled):
    path = tmp_path / "old.pt"
    with open(path, "wb") as f:
        torch.serialization.save({"a": 1}, f, _use_new_zipfile_serialization=False)
    assert "legacy (pre-1.6) format" in load_error(path)


def test_a_thousand_classes_and_a_long_history_are_not_mistaken_for_a_bomb(tmp_path):
    config = ViTConfig(image_size=16, patch_size=4, hidden_size=16, num_layers=2, num_heads=2, mlp_size=32,
                       num_classes=1000)
    names = [f"a fairly long ImageNet-style class name number {i}" for i in range(1000)]
    history = [{"epoch": i, "train_loss": 1.0 / (i + 1), "val_acc": 0.5, "lr": 1e-3, "seconds": 1.5}
               for i in range(1000)]
    path = save_checkpoint(tmp_path / "big.pt", ViT(config), names, metadata={"history": history},
                           training_state={"metrics": history})
    assert load_checkpoint(path).class_names == names


# ---------------------------------------------------------------------------------------------
# A full disk is named as such


def test_a_full_disk_is_reported_as_no_space_left_not_as_torchs_write_check(tmp_path, model, monkeypatch):
    import errno

    real_fdopen = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda fd, mode="r", *a, **k: (os.close(fd), real_fdopen(
        os.open("/dev/full", os.O_WRONLY), mode))[1])  # every write fails with ENOSPC, as on a full disk
    with pytest.raises(OSError) as info:
        save_checkpoint(tmp_path / "best.pt", model, CLASSES)
    assert info.value.errno == errno.ENOSPC
    assert str(info.value).startswith(f"[Errno 28] No space left on the disk to write {tmp_path / 'best.pt'} (")
    assert "unexpected pos" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("existing, saved, hint", [
    ((), "best.pt", ""),  # a first save: there is no last.pt to resume from
    ((), "last.pt", ""),
    (("last.pt",), "best.pt", " (the run resumes from its last.pt)"),
    (("last.pt",), "checkpoints/epoch_3.pt", " (the run resumes from its last.pt)"),
    (("last.pt",), "last.pt", " (the run's previous last.pt is intact: it resumes from there)"),
])
def test_a_runs_full_disk_message_promises_a_last_pt_only_when_there_is_one(tmp_path, model, existing, saved, hint):
    """Issue 20, item 9: 'a training run resumes from its last.pt' was said of runs that had none yet. (The run adds
    it to the checkpoint's message: ``test_train``'s full-disk test.)"""
    for name in existing:
        save_checkpoint(tmp_path / name, model, CLASSES)
    (tmp_path / "checkpoints").mkdir()
    assert resume_hint(tmp_path / saved) == hint


def test_torchs_cut_short_write_on_a_nearly_full_disk_is_no_space_left(tmp_path, model, monkeypatch):
    import shutil
    from collections import namedtuple

    def cut_short(obj, f, *args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 51840 vs 51728")

    monkeypatch.setattr(torch, "save", cut_short)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 4096, 4096))
    with pytest.raises(OSError, match="No space left on the disk to write .* \\(0 MiB free\\)"):
        save_checkpoint(tmp_path / "last.pt", model, CLASSES)


def test_other_save_errors_pass_through_unchanged(tmp_path, model, monkeypatch):
    def broken(obj, f, *args, **kwargs):
        raise RuntimeError("cannot pickle this tensor subclass")

    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(RuntimeError, match="cannot pickle this tensor subclass"):
        save_checkpoint(tmp_path / "x.pt", model, CLASSES)


@pytest.mark.parametrize("field, value", [("image_size", 4 * 10**12), ("hidden_size", 2**62), ("mlp_size", 2**63 - 1)])
def test_sizes_past_what_torch_can_count_are_a_checkpoint_error(saved, field, value):
    payload = read_checkpoint_payload(saved)
    edited(saved, config={**payload["config"], field: value})
    assert "far beyond any published ViT" in load_error(saved)


def test_self_referencing_class_names_are_refused_without_expanding_them(saved):
    """L(i+1) = [L(i), L(i)]: str() of depth 60 never ends; the check looks at types only."""
    nested: list = ["x"]
    for _ in range(60):
        nested = [nested, nested]
    names = [nested] + list(CLASSES[1:])
    edited(saved, class_names=names)
    message = load_error(saved)
    assert "class name 0 is a list, not text" in message


@pytest.mark.parametrize("names, expected", [
    (["a" * 201, "b", "c"], "class name 0 is 201 characters long; at most 200"),
    ([1, "b", "c"], "class name 0 is a int, not text"),
])
def test_class_names_are_flat_strings_of_bounded_length(saved, names, expected):
    edited(saved, class_names=names[:len(CLASSES)] + list(CLASSES[len(names):]))
    assert expected in load_error(saved)


def test_every_format_checks_class_names_as_a_checkpoint_is_made(model):
    from vit.checkpoint import Checkpoint

    with pytest.raises(CheckpointError, match="at most 200"):
        Checkpoint(model=model, class_names=["x" * 1000] * model.config.num_classes,
                   preprocessing=Preprocessing(16, 3, (0.5,) * 3, (0.5,) * 3))


def test_sams_longest_edge_then_padding_round_trips_and_is_checked():
    from vit.checkpoint import preprocessing_problem

    config = ViTConfig(image_size=64, patch_size=8)
    pre = Preprocessing(64, 3, (0.5,) * 3, (0.5,) * 3, resize_size=48, resize_mode="longest_edge_pad")
    assert Preprocessing.from_dict(pre.to_dict()) == pre and preprocessing_problem(pre, config) is None
    too_long = Preprocessing(64, 3, (0.5,) * 3, (0.5,) * 3, resize_size=80, resize_mode="longest_edge_pad")
    assert preprocessing_problem(too_long, config) == (
        "the longest edge 80 must be a whole number of pixels from 1 to the padded size 64")
    unsized = Preprocessing(64, 3, (0.5,) * 3, (0.5,) * 3, resize_mode="longest_edge_pad")
    assert "the longest edge None" in preprocessing_problem(unsized, config)


def test_preprocessing_written_before_sams_mode_reads_as_before():
    old = {"image_size": 224, "num_channels": 3, "mean": [0.5] * 3, "std": [0.5] * 3, "resize_size": 256}
    pre = Preprocessing.from_dict(old)
    assert (pre.resize_size, pre.resize_mode, pre.resample, pre.crop_rule) == (256, "square", "bicubic", "torchvision")
