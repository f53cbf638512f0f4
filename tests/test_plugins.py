"""Plugins (issue 79, item 2): a package outside this repository adds a map method (entry-point group
``vit.methods``) and a model family (``vit.families``). A tiny plugin is built in a temporary folder — a module and
its ``vit_test_plugin-0.1.dist-info`` (METADATA, entry_points.txt), which importlib.metadata finds on sys.path as it
finds an installed package's — and its family opens through ``vit.load`` and the explorer's "Open a path", and its
method is offered and drawn by the API, the CLI and the explorer's picker. A broken plugin is skipped in one line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import save_file

import vit
from tests.test_app import dirs, overlay_caption, png_bytes, run_app, sidebar_widget, upload  # noqa: F401 (fixture)
from vit import registry
from vit.app import explorer_page as explorer
from vit.checkpoint import Checkpoint, Preprocessing
from vit.core.inference import ModelInput, preprocess
from vit.model import ViT, ViTConfig

ROOT = Path(__file__).resolve().parent.parent
CONFIG = dict(image_size=16, patch_size=4, num_classes=3, hidden_size=16, num_layers=2, num_heads=2, mlp_size=32)
CLASSES = ["cat", "dog", "fox"]
TITLE = "Pixel mean (a plugin's, class-specific)"

PLUGIN = '''"""A tiny vit plugin: a map method and a model family."""
import torch.nn.functional as F

from vit.registry import Family, Method


def draw(model, x, target, layer, query):
    """Each patch's mean pixel value (normalised), times the class from 1, plus the layer: what it was given."""
    return F.avg_pool2d(x.mean(1, keepdim=True), model.config.patch_size)[0, 0] * (target + 1) + layer


def open_folder(folder, config_json, map_location):
    from vit.checkpoint import Checkpoint, Preprocessing
    from vit.model import ViTConfig
    from vit.sources.open import build_model, read_hf_weights

    config = ViTConfig(**config_json["vit_config"])
    model = build_model(config, read_hf_weights(folder, map_location), str(folder), map_location)
    return Checkpoint(model=model, class_names=list(config_json["class_names"]),
                      preprocessing=Preprocessing.default_for(config), path=folder)


PIXEL_MEAN = Method("pixelmean", "TITLE", ("class", "end_layer"), "every model with one grid (a test's plugin)",
                    "attention", class_specific=True, draw=draw)
NO_DRAW = Method("nodraw", "No draw", (), "nothing", "attention")


def families():
    return [Family("tinyvit", "A plugin's tiny ViT", "image", "config.json model_type tinyvit-plugin", __name__,
                   ("tinyvit-plugin",), "every map", open=open_folder)]
'''.replace("TITLE", TITLE)
ENTRY_POINTS = """[vit.methods]
pixelmean = vit_test_plugin:PIXEL_MEAN
nodraw = vit_test_plugin:NO_DRAW
broken = vit_broken_plugin:METHOD

[vit.families]
tinyvit = vit_test_plugin:families
"""


def write_plugin(site: Path) -> Path:
    """The plugin as pip would leave it in site-packages: its module and its dist-info, plus a broken module."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "vit_test_plugin.py").write_text(PLUGIN)
    (site / "vit_broken_plugin.py").write_text("raise RuntimeError('this plugin is broken\\non two lines')\n")
    info = site / "vit_test_plugin-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vit-test-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return site


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The plugin on sys.path, the registry reading it afresh; forgotten again afterwards."""
    site = write_plugin(tmp_path / "site")
    monkeypatch.syspath_prepend(str(site))
    registry.reload_plugins()
    yield site
    registry.reload_plugins()
    for name in ("vit_test_plugin", "vit_broken_plugin"):
        sys.modules.pop(name, None)


def family_folder(folder: Path) -> tuple[Path, ViT]:
    """A folder of the plugin's family: its config.json (model_type tinyvit-plugin) and our ViT's weights."""
    torch.manual_seed(0)
    model = ViT(ViTConfig(**CONFIG)).eval()
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"model_type": "tinyvit-plugin", "vit_config": CONFIG,
                                                    "class_names": CLASSES}))
    return folder, model


def photo() -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8))


def expected_map(checkpoint: Checkpoint, image: Image.Image, target: int, layer: int) -> np.ndarray:
    """The plugin's map by hand: the mean of each patch's normalised pixels, times target + 1, plus the layer."""
    x = preprocess([image], checkpoint.preprocessing)  # (1, 3, 16, 16)
    return (F.avg_pool2d(x.mean(1, keepdim=True), 4)[0, 0] * (target + 1) + layer).numpy()


def test_import_vit_reads_no_plugin_until_the_registry_is_asked(tmp_path):
    site = write_plugin(tmp_path / "site")
    code = ("import sys, vit; print('vit_test_plugin' in sys.modules); import vit.registry; "
            "print('vit_test_plugin' in sys.modules); vit.registry.methods(); print('vit_test_plugin' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(site), str(ROOT)))}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False", "True"]


def test_a_broken_plugin_is_skipped_in_one_line_naming_it_and_the_others_load(plugin, capsys):
    assert registry.find_method("pixelmean").plugin == "vit-test-plugin"
    skipped = registry.skipped_plugins()
    assert len(skipped) == 2 and all("\n" not in line for line in skipped), skipped
    assert any("'broken'" in line and "RuntimeError: this plugin is broken" in line for line in skipped)
    assert any("'nodraw'" in line and "needs a draw callable" in line for line in skipped)
    assert capsys.readouterr().err.splitlines() == list(skipped)  # said once, on stderr; no traceback
    assert registry.find_method("broken") is None and registry.find_method("nodraw") is None


def test_the_api_offers_and_draws_a_plugins_method(plugin):
    torch.manual_seed(0)
    checkpoint = Checkpoint(model=ViT(ViTConfig(**CONFIG)).eval(), class_names=CLASSES,
                            preprocessing=Preprocessing.default_for(ViTConfig(**CONFIG)))
    assert vit.methods()["pixelmean"] == f"{TITLE} — every model with one grid (a test's plugin)"
    assert "pixelmean" in vit.methods(checkpoint)
    drawn = vit.explain(checkpoint, photo(), "pixelmean", target=2, layer=0)
    np.testing.assert_allclose(drawn.map, expected_map(checkpoint, photo(), 2, 0), rtol=0, atol=1e-6)
    assert drawn.target == "fox" and "for “fox”, from the plugin vit" in drawn.description  # Markdown-escaped
    predicted = vit.explain(checkpoint, photo(), "pixelmean")  # default: the predicted class, the last layer
    np.testing.assert_allclose(predicted.map, expected_map(checkpoint, photo(), drawn.prediction.class_index, 1),
                               rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="pixelmean does not read query; it reads layer, target"):
        vit.explain(checkpoint, photo(), "pixelmean", query=3)


def test_a_plugin_methods_failure_is_one_line_naming_it(plugin, monkeypatch):
    from dataclasses import replace

    from vit.explain.views import method_maps

    def broken(model, x, target, layer, query):
        raise KeyError("no such tensor")

    checkpoint = Checkpoint(model=ViT(ViTConfig(**CONFIG)).eval(), class_names=CLASSES,
                            preprocessing=Preprocessing.default_for(ViTConfig(**CONFIG)))
    method = replace(registry.find_method("pixelmean"), draw=broken)
    with pytest.raises(method_maps.PluginMethodError, match=r"^pixelmean \(plugin vit-test-plugin\) failed: "
                                                            r"KeyError: 'no such tensor'$"):
        method_maps.plugin_map(checkpoint, ModelInput.of(checkpoint, photo()), method, (4, 4), 0, 0, -1)
    wrong = replace(method, draw=lambda model, x, target, layer, query: torch.zeros(3, 3))
    with pytest.raises(method_maps.PluginMethodError, match=r"gave a map of shape \(3, 3\); the patch grid is 4x4"):
        method_maps.plugin_map(checkpoint, ModelInput.of(checkpoint, photo()), wrong, (4, 4), 0, 0, -1)


def test_a_plugins_family_opens_through_vit_load(plugin, tmp_path):
    folder, model = family_folder(tmp_path / "tiny")
    checkpoint = vit.load(folder, device="cpu")
    assert checkpoint.class_names == CLASSES
    x = preprocess([photo()], checkpoint.preprocessing)
    with torch.no_grad():
        torch.testing.assert_close(checkpoint.model(x)[0], model(x)[0], rtol=0, atol=0)
    assert "tinyvit-plugin" in registry.hf_model_types()
    assert [f.name for f in registry.families()][-1] == "tinyvit"
    assert registry.table("families")[-1]["plugin"] == "vit-test-plugin"


def test_a_plugins_family_is_not_opened_without_the_plugin(tmp_path):
    from vit.checkpoint import CheckpointError

    folder, _ = family_folder(tmp_path / "tiny")
    registry.reload_plugins()
    with pytest.raises(CheckpointError, match="HF model type 'tinyvit-plugin' .* is not supported"):
        vit.load(folder, device="cpu")


def test_the_cli_lists_a_plugins_method_and_scores_it(plugin, tmp_path, capsys):
    from tests.test_faithfulness_chefer import tiny_model_and_images
    from vit import faithfulness

    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(plugin), str(ROOT)))}
    done = subprocess.run([sys.executable, "-m", "vit.faithfulness", "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True)
    assert "pixelmean" in " ".join(done.stdout.split())
    checkpoint = tiny_model_and_images(tmp_path, labelled=True)
    code = faithfulness.main([str(checkpoint), "--benchmark", "road", "--data", str(tmp_path / "data"),
                              "--methods", "pixelmean,random", "--limit", "2", "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 0 and "pixelmean" in json.loads(out)["methods"], out
    code = faithfulness.main([str(checkpoint), "--benchmark", "road", "--data", str(tmp_path / "data"),
                              "--methods", "nothing"])
    assert code == 2 and "unknown method(s) nothing; choose from:" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.usefixtures("dirs")
def test_the_explorer_opens_a_plugins_family_by_path_and_offers_and_draws_its_method(plugin, tmp_path):
    folder, _ = family_folder(tmp_path / "tiny")
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(folder))
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    upload(at, "photo.png", png_bytes(40, 30))
    sidebar_widget(at, "radio", "Map").set_value(explorer.MORE_METHODS)
    at.run()
    picker = sidebar_widget(at, "selectbox", "Method")
    assert picker.options[-1] == TITLE  # after the built-ins, as the registry lists it
    picker.set_value("pixelmean")
    at.run()
    assert not at.exception and not at.error, [e.message for e in [*at.exception, *at.error]]
    assert "**Pixel mean" in overlay_caption(at) and "from the plugin vit" in overlay_caption(at)
    assert any(w.label == "Class" for w in at.sidebar.selectbox)  # it reads a class: the class picker is shown


def test_the_generated_docs_tables_show_a_plugins_method_and_family(plugin):
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)
    assert f'<a id="{site.method_anchor("pixelmean")}"></a>`pixelmean`' in site.methods_markdown()
    assert "| A plugin's tiny ViT |" in site.families_markdown("image")
    # "Which map should I use?": its row, class-specific and unsigned as registered, its cost said from its default
    row = "| [`pixelmean`](methods.md#method-pixelmean) | — | yes | no | a forward and a backward | — |"
    assert row in site.which_map_markdown().splitlines()
