"""Pickles whose keys share one hash are refused before unpickling; every real checkpoint and weights file reads.

Python hashes ints deterministically (``hash(k * (2**61 - 1)) == 0`` for every int k), and floats and tuples of
them too, so a dictionary of such keys takes quadratic time to fill. Measured with torch 2.14's weights-only
unpickler: 8,000 colliding int keys (110 KB) take 0.5 s, 50,000 (650 KB, under the 1 MB pickle cap) take 17 s.
"""

import pickle
import time
import zipfile
from pathlib import Path

import pytest
import torch
from helpers import make_image_folder

from vit.checkpoint import CheckpointError, load_checkpoint, read_checkpoint_payload, save_checkpoint
from vit.model import ViT, ViTConfig
from vit.sources.open import read_weights

P = 2**61 - 1  # hash(k * P) == 0: all these keys share one hash
WHY = "; weights and checkpoints key their data by names (and small numbers)"


def torch_archive(path: Path, body: bytes) -> Path:
    """A torch.save-style zip, as torch.load reads it, whose data.pkl is the protocol-2 pickle ``body``."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", body)
        archive.writestr("archive/byteorder", "little")
        archive.writestr("archive/version", "3\n")
    return path


def long1(n: int) -> bytes:
    """The LONG1 opcode pushing ``n``."""
    encoded = pickle.encode_long(n)
    return b"\x8a" + bytes([len(encoded)]) + encoded


def float8(x: float) -> bytes:
    return pickle.dumps(x, protocol=2)[2:-1]  # BINFLOAT, without PROTO and STOP


def dict_of(keys: list[bytes]) -> bytes:
    """PROTO 2, EMPTY_DICT, MARK, each key with the value None, SETITEMS, STOP."""
    return b"\x80\x02}(" + b"".join(key + b"N" for key in keys) + b"u."


def call(global_name: bytes, args: bytes) -> bytes:
    """GLOBAL 'module name', ``args`` (pushing one tuple), REDUCE."""
    return b"c" + global_name.replace(b" ", b"\n") + b"\n" + args + b"R"


def int_list(count: int) -> bytes:
    """EMPTY_LIST, MARK, ``count`` colliding ints, APPENDS."""
    return b"](" + b"".join(long1(k * P) for k in range(1, count + 1)) + b"e"


def refusal(path: Path, read) -> tuple[str, float]:
    start = time.perf_counter()
    with pytest.raises(CheckpointError) as info:
        read(path)
    message = str(info.value)
    assert "\n" not in message, "errors are one line"
    return message, time.perf_counter() - start


@pytest.fixture
def never_unpickled(monkeypatch):
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load was called on a refused file"))


# ---------------------------------------------------------------------------------------------
# Keys that can share one hash are refused before unpickling, in milliseconds


@pytest.mark.parametrize("read", [read_checkpoint_payload, read_weights], ids=["checkpoint", "weights"])
def test_fifty_thousand_colliding_int_keys_are_refused_at_once(tmp_path, read, never_unpickled):
    path = torch_archive(tmp_path / "keys.pt", dict_of([long1(k * P) for k in range(1, 50_001)]))
    assert path.stat().st_size < 1024 * 1024  # under the pickle size cap: that check alone lets it through
    message, seconds = refusal(path, read)
    assert message == (f"refused to load {path}: its pickle has a dictionary key of type int of 2**31 or more in "
                       f"size{WHY}, and other keys can be chosen to share one hash, which stalls the reader for "
                       "minutes")
    assert seconds < 1.0  # torch.load took 17 s


@pytest.mark.parametrize("key, kind", [
    (lambda k: long1(k * P) + b"\x85", "tuple"),  # (k * P,): a tuple's hash is built from its items' hashes
    (lambda k: float8(k + 0.5), "float"),  # a float's hash is its value modulo 2**61 - 1, as an int's
    (lambda k: b"N", "None"),
], ids=["colliding tuples", "floats", "None"])
@pytest.mark.parametrize("read", [read_checkpoint_payload, read_weights], ids=["checkpoint", "weights"])
def test_keys_that_are_not_names_or_small_numbers_are_refused(tmp_path, read, key, kind, never_unpickled):
    path = torch_archive(tmp_path / "keys.pt", dict_of([key(k) for k in range(1, 2_001)]))
    message, seconds = refusal(path, read)
    assert f"its pickle has a dictionary key of type {kind}{WHY}" in message
    assert seconds < 1.0


def test_int_keys_below_two_to_the_31_are_an_optimizers_parameter_indices_and_read(tmp_path):
    small = torch_archive(tmp_path / "small.pt", dict_of([long1(k) for k in (0, 1, -5, 2**31 - 1)]))
    assert torch.load(small, weights_only=True) == {0: None, 1: None, -5: None, 2**31 - 1: None}
    with pytest.raises(CheckpointError, match="dictionary key of type int of 2"):
        read_checkpoint_payload(torch_archive(tmp_path / "large.pt", dict_of([long1(2**31)])))


@pytest.mark.parametrize("body, refused", [
    (call(b"builtins set", int_list(2_000) + b"\x85"), "has a set element of type int of 2**31"),
    (call(b"collections Counter", int_list(2_000) + b"\x85"), "has a dictionary key of type int of 2**31"),
    (call(b"collections OrderedDict", b"](" + b"".join(long1(k * P) + b"N\x86" for k in range(1, 2_001)) + b"e\x85"),
     "has a dictionary key of type int of 2**31"),
    # BUILD on an OrderedDict updates its __dict__ from the state: here a list of (key, value) pairs
    (call(b"collections OrderedDict", b")") + b"](" + b"".join(long1(k * P) + b"N\x86" for k in range(1, 2_001))
     + b"eb", "has a dictionary key of type int of 2**31"),
    # torch's _rebuild_from_type_v2(func, type, args, state) calls func(*args): here set(colliding ints)
    (call(b"torch._tensor _rebuild_from_type_v2", b"(cbuiltins\nset\ncbuiltins\nset\n" + int_list(2_000)
                                                  + b"\x85}t"), "has a set element of type int of 2**31"),
    (call(b"builtins bytearray", long1(2**33) + b"\x85"), "asks for a bytearray of 8,589,934,592 bytes"),  # 45 s, 8 GB
    (call(b"_codecs encode", b"X\x03\x00\x00\x00abcX\x08\x00\x00\x00punycode\x86"),  # 20,000 characters: 134 s
     "encodes text with the codec 'punycode', which can take minutes"),
    (call(b"builtins bytearray", b"X\x03\x00\x00\x00abcX\x08\x00\x00\x00PunyCode\x86"),  # bytearray encodes too
     "encodes text with the codec 'PunyCode', which can take minutes"),
], ids=["set", "Counter", "OrderedDict", "BUILD", "rebuild_from_type", "bytearray", "punycode", "bytearray codec"])
def test_the_allowed_calls_that_hash_or_allocate_from_a_few_bytes_are_refused(tmp_path, body, refused,
                                                                               never_unpickled):
    path = torch_archive(tmp_path / "call.pt", b"\x80\x02" + body + b".")
    message, seconds = refusal(path, read_checkpoint_payload)
    assert message.startswith(f"refused to load {path}: its pickle {refused}")
    assert seconds < 1.0


@pytest.mark.parametrize("body", [
    b"\x80\x02}(X\x01\x00\x00\x00aq\x00N" + b"h\x00N" * 1_000_000 + b"u.",  # one memoised name set to None: 3 B each
    b"\x80\x02" + b"]" * 1_000_000 + b".",  # a million empty lists: 4.8 s and 300 MB for torch.load at 4 MB
], ids=["entries", "containers"])
def test_a_pickle_building_more_than_a_quarter_item_a_byte_is_refused(tmp_path, body, never_unpickled):
    # Real pickles spend 9 bytes or more on each dict entry or container; the cap for no tensors is 3 MiB.
    from vit.checkpoint import PICKLE_BASE_BYTES

    message, _ = refusal(torch_archive(tmp_path / "many.pt", body), read_checkpoint_payload)
    assert (f"its pickle builds over {PICKLE_BASE_BYTES // 4:,} dictionary entries and containers, more than weights "
            "and checkpoints of its size hold") in message


@pytest.mark.parametrize("body", [
    b"\x80\x02}(X\x05\x00\x00\x00ab",  # cut inside a string
    b"\x80\x02}\xff.",  # an opcode pickle does not have
    b"\x80\x02u.",  # SETITEMS with nothing on the stack
    b"\x80\x02h\x07.",  # a memo entry never stored
], ids=["truncated", "unknown opcode", "empty stack", "unknown memo"])
@pytest.mark.parametrize("read", [read_checkpoint_payload, read_weights], ids=["checkpoint", "weights"])
def test_a_garbage_pickle_in_a_valid_zip_is_truncated_or_corrupt(tmp_path, body, read, never_unpickled):
    path = torch_archive(tmp_path / "garbage.pt", body)
    message, _ = refusal(path, read)
    assert message.startswith(f"{path} is truncated or corrupt (")
    assert message.endswith("); re-copy or re-create it")


# ---------------------------------------------------------------------------------------------
# Every real file still reads


def test_a_checkpoint_of_this_program_loads(tmp_path):
    config = ViTConfig(image_size=16, patch_size=4, hidden_size=16, num_layers=2, num_heads=2, mlp_size=32,
                       num_classes=2)
    path = save_checkpoint(tmp_path / "model.pt", ViT(config), ["cat", "dog"], metadata={"history": [
        {"epoch": 1, "val_acc": 0.5, "lr": 1e-3}]})
    assert load_checkpoint(path).class_names == ["cat", "dog"]


def test_a_training_runs_last_pt_with_optimizer_ema_and_rng_state_loads(tmp_path):
    from vit.train import main

    images = make_image_folder(tmp_path / "images", per_class=6)
    run = tmp_path / "run"
    assert main(["--dataset", f"folder:{images}", "--out", str(run), "--cache-dir", str(tmp_path / "cache"),
                 "--epochs", "1", "--batch-size", "4", "--ema", "0.9", "--image-size", "8", "--patch-size", "4",
                 "--hidden-size", "8", "--num-layers", "1", "--num-heads", "2", "--mlp-size", "16",
                 "--threads", "1"]) == 0
    state = read_checkpoint_payload(run / "last.pt")["training_state"]
    assert sorted(state["optimizer"]["state"])[:2] == [0, 1]  # int keys: the parameters' indices
    assert state["ema"] and state["rng"] and state["steps"]


def test_timm_torchvision_open_clip_and_hf_state_dicts_read(tmp_path):
    timm = pytest.importorskip("timm")
    torchvision = pytest.importorskip("torchvision")
    open_clip = pytest.importorskip("open_clip")
    transformers = pytest.importorskip("transformers")
    models = {
        "timm": timm.create_model("vit_base_patch16_224", pretrained=False, img_size=32, embed_dim=16, depth=2,
                                  num_heads=2),
        "torchvision": torchvision.models.VisionTransformer(image_size=32, patch_size=16, num_layers=2, num_heads=2,
                                                            hidden_dim=16, mlp_dim=32),
        "open_clip": open_clip.model.CLIP(embed_dim=8, vision_cfg=dict(image_size=16, patch_size=4, width=16, layers=2,
                                                                      head_width=8),
                                          text_cfg=dict(context_length=8, vocab_size=32, width=16, heads=2, layers=1)),
        "hf": transformers.ViTForImageClassification(transformers.ViTConfig(
            hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, image_size=32)),
    }
    for name, model in models.items():
        path = tmp_path / f"{name}.pt"
        torch.save(model.state_dict(), path)
        assert read_weights(path).keys() == model.state_dict().keys(), name


def test_the_last_pt_of_a_long_run_still_loads(tmp_path):
    """A run keeps at most MAX_STEP_ROWS rows of its loss curve in last.pt (and 1,000 epochs of metrics): that
    file must pass the pickle bounds, or a long run could never be resumed (20,000 rows were 1.75 MB against a
    1.19 MB cap)."""
    from vit.checkpoint import load_checkpoint, save_checkpoint
    from vit.model import ViT, ViTConfig
    from vit.training.trainer import MAX_STEP_ROWS

    config = ViTConfig(image_size=16, patch_size=4, num_channels=3, num_classes=3, hidden_size=16, num_layers=2,
                       num_heads=2, mlp_size=32)
    steps = [{"step": i * 7, "epoch": round(i / 97.0, 5), "train_loss": 2.302585 - i * 1e-5,
              "train_acc": 0.1234567 + i * 1e-6, "images": 128, "lr": 0.000987654321, "elapsed_seconds": i * 2.013}
             for i in range(MAX_STEP_ROWS)]
    metrics = [{"epoch": e, "train_loss": 1.2345678, "train_acc": 0.5432109, "val_loss": 1.3456789,
                "val_acc": 0.5123456, "lr": 0.00091234, "epoch_seconds": 12.345678, "images_per_second": 4321.1234}
               for e in range(1, 1001)]
    path = save_checkpoint(tmp_path / "last.pt", ViT(config), ["a", "b", "c"],
                           training_state={"steps": steps, "metrics": metrics, "progress": {"epoch": 1000}})
    assert load_checkpoint(path).training_state["steps"][-1]["step"] == (MAX_STEP_ROWS - 1) * 7
