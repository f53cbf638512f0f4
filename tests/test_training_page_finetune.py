"""The Train page starts a run from an imported model (issue 19, item 10): the explorer's list of models (or a
path), full fine-tuning or a linear probe, layer-wise lr decay; the launch carries --init / --finetune /
--layer-decay to ``vit.train``, and a model that cannot be opened is a one-line error under the picker."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from test_runs import make_image_folder
from test_training_page import errors, networked, submit  # noqa: F401 - networked is a fixture

from vit.core.runfiles import now_iso
from vit.runs import access, launch
from vit.runs.launch import RunParams, cli_args, validate_params
from vit.runs.manager import RunManager

ROOT = Path(__file__).resolve().parent.parent
PAGE = str(ROOT / "app_pages" / "training.py")
SHIPPED = ROOT / "checkpoints" / "cifar10-cifar-s.pt"
TIMEOUT = 300


@pytest.fixture
def folders(tmp_path, monkeypatch):
    monkeypatch.setenv("VIT_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("VIT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("VIT_DATA_ROOTS", str(tmp_path))  # the generated image folder lives here
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))  # the list: the shipped checkpoints and our runs
    monkeypatch.delenv("VIT_CHECKPOINTS_DIR", raising=False)
    monkeypatch.delenv("VIT_TRAIN_TOKEN", raising=False)  # a developer's token would lock the page
    return make_image_folder(tmp_path / "images"), tmp_path / "runs"


def fill_tiny_fine_tune(at: AppTest, images: Path, name: str) -> None:
    """Start from an imported model: the shipped CIFAR-10 checkpoint, on a 2-class folder, 1 short epoch."""
    at.radio(key="train_start").set_value("import")
    at.selectbox(key="train_init").set_value(str(SHIPPED))
    at.selectbox(key="train_dataset").set_value("folder")
    at.text_input(key="train_folder").set_value(str(images))
    at.number_input(key="train_epochs").set_value(1)
    at.number_input(key="train_batch_size").set_value(4)
    at.number_input(key="train_warmup_epochs").set_value(0.0)
    at.number_input(key="train_attention_every").set_value(0)
    at.text_input(key="train_name").set_value(name)


def wait_until(condition, timeout: float = TIMEOUT) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, "timed out"
        time.sleep(0.5)


def test_the_model_list_is_the_explorers_shipped_checkpoints_and_completed_runs(folders):
    _, runs_dir = folders
    done = runs_dir / "done"
    done.mkdir(parents=True)
    shutil.copy(SHIPPED, done / "best.pt")
    (done / "status.json").write_text(json.dumps({"state": "completed", "updated_time": now_iso()}))
    at = AppTest.from_file(PAGE).run(timeout=TIMEOUT)
    assert not at.exception
    assert at.radio(key="train_start").value == "preset"  # today's start stays the default
    picker = at.selectbox(key="train_init")
    labels = picker.options
    assert any(label.startswith("cifar10-cifar-s.pt · cifar10 · 10 classes") for label in labels), labels
    assert any(label.startswith("mnist-p4.pt") for label in labels)
    assert any(label.startswith("run done · cifar10") for label in labels)
    assert at.text_input(key="train_init_path") is not None  # a path, for a visitor on this machine
    assert [o for o in at.radio(key="train_finetune").options] == ["full: every weight trains",
                                                                  "linear probe: the classifier alone"]
    help_text = at.number_input(key="train_layer_decay").help
    assert "0.65 for ViT-B" in help_text and "MAE's FINETUNE.md" in help_text and "Empty: off" in help_text


def test_a_linear_probe_of_a_shipped_checkpoint_launches_with_init_and_finetune(folders):
    images, runs_dir = folders
    at = AppTest.from_file(PAGE).run(timeout=TIMEOUT)
    fill_tiny_fine_tune(at, images, "probe-from-page")
    at.radio(key="train_finetune").set_value("linear-probe")
    at = submit(at)
    assert not at.exception
    assert errors(at) == [], errors(at)
    manager = RunManager(runs_dir)
    record = json.loads((runs_dir / ".launch" / "probe-from-page" / "launch.json").read_text())
    command = record["sessions"][0]["command"]
    assert command[command.index("--init") + 1] == str(SHIPPED)
    assert command[command.index("--finetune") + 1] == "linear-probe"
    assert "--preset" not in command and "--layer-decay" not in command
    assert list(at.dataframe[0].value["Name"]) == ["probe-from-page"]  # listed like any other run
    config = runs_dir / "probe-from-page" / "config.json"
    wait_until(lambda: config.is_file() or not manager.get("probe-from-page").active)
    args = json.loads(config.read_text())["args"]
    assert (args["init"], args["finetune"], args["layer_decay"]) == (str(SHIPPED), "linear-probe", 1.0)
    assert args["preset"] == "init:cifar10-cifar-s.pt"
    if manager.get("probe-from-page").state == "running":
        manager.stop("probe-from-page")
    wait_until(lambda: not manager.get("probe-from-page").active)
    assert manager.get("probe-from-page").state in ("completed", "cancelled")


def test_a_path_that_cannot_be_opened_is_a_one_line_error_and_launches_nothing(folders, tmp_path):
    images, runs_dir = folders
    at = AppTest.from_file(PAGE).run(timeout=TIMEOUT)
    fill_tiny_fine_tune(at, images, "bad-start")
    at.text_input(key="train_init_path").set_value(str(tmp_path / "missing.pt"))
    at = submit(at)
    assert not at.exception
    shown = [e for e in errors(at) if "missing.pt" in e]
    assert shown == [f"--init {tmp_path / 'missing.pt'}: checkpoint not found: {tmp_path / 'missing.pt'}"]
    assert "Traceback" not in "".join(errors(at))
    assert any("not launched" in e for e in errors(at))
    assert RunManager(runs_dir).names() == []


def test_layer_decay_with_a_linear_probe_is_refused_under_its_field(folders):
    images, runs_dir = folders
    at = AppTest.from_file(PAGE).run(timeout=TIMEOUT)
    fill_tiny_fine_tune(at, images, "probe-lrd")
    at.radio(key="train_finetune").set_value("linear-probe")
    at.number_input(key="train_layer_decay").set_value(0.65)
    at = submit(at)
    assert any("--layer-decay has no effect with --finetune linear-probe" in e for e in errors(at)), errors(at)
    assert RunManager(runs_dir).names() == []


def test_on_a_network_the_token_lets_a_visitor_give_a_path_as_on_every_page(folders, networked,  # noqa: F811
                                                                            monkeypatch):
    """vit.runs.access's one rule: a session that entered the token may read the server's files by path."""
    monkeypatch.setenv("VIT_TRAIN_TOKEN", "correct-horse-battery-staple")
    at = AppTest.from_file(PAGE)
    at.session_state[access.UNLOCKED] = True
    at = at.run(timeout=TIMEOUT)
    assert not at.exception
    assert at.selectbox(key="train_init").options
    assert at.text_input(key="train_init_path") is not None


# -- the launch parameters behind the form --------------------------------------------------------


def test_an_imported_start_passes_init_finetune_and_layer_decay_and_no_preset(tmp_path):
    params = RunParams(name="ft", dataset="cifar10", init="checkpoints/cifar10-cifar-s.pt", finetune="full",
                       layer_decay=0.65)
    argv = cli_args(params, tmp_path / "ft", tmp_path / "data")
    assert argv[argv.index("--init") + 1] == str(SHIPPED)  # relative to the repository, as datasets are
    assert argv[argv.index("--finetune") + 1] == "full" and argv[argv.index("--layer-decay") + 1] == "0.65"
    assert "--preset" not in argv
    assert "--init" not in cli_args(RunParams(name="p", dataset="cifar10"), tmp_path / "p", tmp_path / "data")


@pytest.mark.parametrize("changes, field, message", [
    (dict(init=""), "init", "choose a model to start from"),
    (dict(init="checkpoints/cifar10-cifar-s.pt", layer_decay=1.5), "layer_decay", "a number in (0, 1]"),
    (dict(init="checkpoints/cifar10-cifar-s.pt", patch_size=8), "patch_size", "cannot be given with --init"),
    (dict(finetune="linear-probe"), "finetune", "--finetune linear-probe needs --init"),
    (dict(layer_decay=0.65), "layer_decay", "--layer-decay needs --init"),
])
def test_fine_tuning_fields_are_validated_with_the_clis_messages(tmp_path, changes, field, message):
    images = make_image_folder(tmp_path / "images")
    params = RunParams(name="ft", dataset=f"folder:{images}", epochs=1, **changes)
    found = validate_params(params, tmp_path / "runs", tmp_path / "data", gpu_count=0, data_roots=(tmp_path,))
    assert message in found.get(field, ""), found


def test_an_imported_model_is_held_to_the_pages_bounds(tmp_path, monkeypatch):
    images = make_image_folder(tmp_path / "images")
    monkeypatch.setattr(launch, "MAX_PARAMETERS", 1000)
    params = RunParams(name="ft", dataset=f"folder:{images}", init=str(SHIPPED), epochs=1)
    found = validate_params(params, tmp_path / "runs", tmp_path / "data", gpu_count=0, data_roots=(tmp_path,))
    assert "at most 0 M from this page" in found["form"] and "this model has" in found["form"]
