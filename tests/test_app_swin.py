"""The explorer draws a Swin (an HF folder opened by path): a clicked patch's window attention in a later stage's
layer, on that layer's grid over the image, with that layer's heads; and the rollout through the stages. The drawn
maps are checked against ``vit.explain.methods.stage_maps`` on HF's own attentions, placed by HF's own window sizes and
shifts; LeGrad's drawn map is ``vit.explain.methods.relevance.legrad``'s (checked against HF in
``test_stage_legrad``)."""

import io
import json

import numpy as np
import pytest
import torch
from parity_helpers import randomize
from PIL import Image
from test_app import dirs, run_app, sidebar_widget, upload  # noqa: F401 (a fixture)

from vit.app import drawing
from vit.app import explorer_page as explorer
from vit.core.inference import preprocess
from vit.explain.methods.relevance import legrad
from vit.explain.methods.stage_maps import layer_row, on_patch_grid, rollout_row
from vit.explain.views import attention_maps
from vit.model.stages import LayerLayout, covering_token
from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("dirs")]  # the app's own empty world

SIZE = 40  # a 10x10 patch grid, then 5x5: both padded to whole windows of 4 and shifted by 2
IMAGE = Image.fromarray(np.random.default_rng(0).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8))


def swin_folder(folder):
    config = transformers.SwinConfig(image_size=SIZE, patch_size=4, embed_dim=24, depths=[2, 2], num_heads=[2, 4],
                                     window_size=4, num_labels=3)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = randomize(transformers.SwinForImageClassification(config))
    model.save_pretrained(folder)
    return model


def hf_attentions(model, images):
    """HF's per-window attention of every layer, read at each attention module's output, and each layer's layout
    as HF holds it (its input dimensions, window size and shift)."""
    layers = [block for stage in model.swin.encoder.layers for block in stage.blocks]
    captured = []
    hooks = [b.attention.register_forward_hook(lambda m, i, o: captured.append(o[1])) for b in layers]
    with torch.no_grad():
        model(pixel_values=images)
    for hook in hooks:
        hook.remove()
    layouts = [LayerLayout(tuple(b.input_resolution), b.window_size, b.shift_size) for b in layers]
    return captured, layouts


@pytest.fixture
def drawn(monkeypatch):
    """Every map the main view blends over the image, as it is drawn."""
    maps = []

    def recording(image, map2d, *args, **kwargs):
        maps.append(np.asarray(map2d))
        return overlay(image, map2d, *args, **kwargs)

    overlay = drawing.overlay_image  # what the main view draws with (the page, its PNG and its export)
    monkeypatch.setattr(drawing, "overlay_image", recording)
    return maps


def test_a_swin_layers_window_attention_for_a_clicked_patch_its_rollout_and_legrad_are_drawn_on_the_image(tmp_path,
                                                                                                         drawn):
    model = swin_folder(tmp_path / "swin")
    checkpoint = open_source(tmp_path / "swin")
    attentions, layouts = hf_attentions(model, preprocess([IMAGE], checkpoint.preprocessing))
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(tmp_path / "swin"))
    at.run()
    buffer = io.BytesIO()
    IMAGE.save(buffer, format="PNG")
    upload(at, "photo.png", buffer.getvalue())
    patch = 3 * 10 + 7  # row 4, column 8 of the image's 10x10 patches: cell (1, 3) of stage 1's 5x5 grid
    sidebar_widget(at, "selectbox", "Query token").set_value(patch)
    sidebar_widget(at, "select_slider", "Layer").set_value(4)  # stage 1's second block: shifted windows
    at.run()
    head = sidebar_widget(at, "selectbox", "Head")
    assert len(head.options) == 1 + 4  # fused, then stage 1's four heads
    head.set_value(2)
    at.run()
    assert not at.exception and not at.main.error, [e.message for e in at.exception] + [e.value for e in at.main.error]
    token = covering_token(patch, (10, 10), (5, 5))
    expected = layer_row(attentions, layouts, 3, token)[0, 2].numpy()  # (5, 5)
    np.testing.assert_allclose(drawn[-1], on_patch_grid(expected, (10, 10)), atol=1e-5)
    assert drawn[-1][0, 0] == 0  # outside the shifted window of cell (1, 3)
    assert any("5×5 grid" in c.value and "shifted by 2" in c.value for c in at.main.caption)
    heads = [c for c in at.get("plotly_chart") if c.proto.id.endswith("heads_grid")]
    assert heads and len(json.loads(heads[0].proto.spec)["layout"]["xaxis"]["ticktext"]) == 4  # the layer's heads
    sidebar_widget(at, "radio", "Map").set_value("rollout")
    at.run()
    assert sidebar_widget(at, "select_slider", "Up to layer").value == 4  # the last layer by default
    assert not [w for w in at.sidebar.slider if w.label == "Discard ratio"]  # it keeps every attention
    assert not at.exception and not at.main.error, [e.value for e in at.main.error]
    expected = rollout_row(attentions, layouts, 3, token)[0].numpy()  # (10, 10): on the image's patches
    np.testing.assert_allclose(drawn[-1], expected, atol=1e-5)
    # LeGrad in the same session (one app run): the explorer draws vit.explain.methods.relevance.legrad's map, which
    # test_stage_legrad checks against autograd on HF's own windows.
    sidebar_widget(at, "radio", "Map").set_value(explorer.MORE_METHODS)
    at.run()
    method = sidebar_widget(at, "selectbox", "Method")
    # LRP and flow need one grid; the CAMs read one block's tokens on its stage's grid.
    assert method.options == [attention_maps.MAP_KINDS[k] for k in ("legrad", "attnlrp", *attention_maps.CAM_KINDS)]
    method.set_value("legrad")
    sidebar_widget(at, "selectbox", "Class").set_value(2)
    at.run()
    assert not at.exception and not at.main.error, [e.message for e in at.exception] + [e.value for e in at.main.error]
    expected = legrad(checkpoint.model, preprocess([IMAGE], checkpoint.preprocessing), 2)[0].numpy()  # (10, 10)
    np.testing.assert_allclose(drawn[-1], expected, atol=1e-7)
    assert any("LeGrad for" in c.value and "average pooling" in c.value for c in at.main.caption)


def test_the_dense_views_and_distance_and_entropy_draw_for_a_swin(tmp_path):
    swin_folder(tmp_path / "swin")
    at = run_app(analysis_tab="Distance & entropy")
    sidebar_widget(at, "text_input", "Open a path").set_value(str(tmp_path / "swin"))
    at.run()
    buffer = io.BytesIO()
    IMAGE.save(buffer, format="PNG")
    upload(at, "photo.png", buffer.getvalue())
    for label in ("What the patches represent",):  # Mechanism works per layer's grid (test_app_stage_mechanism)
        [toggle] = [t for t in at.toggle if t.label.startswith(label)]
        toggle.set_value(True)
        at.run()
        assert not at.exception, [e.message for e in at.exception]
    assert not at.main.error, [e.value for e in at.main.error]
    stats = [json.loads(c.proto.spec) for c in at.get("plotly_chart") if "Mean attention distance" in c.proto.spec]
    assert stats and [t["name"] for t in stats[0]["data"]][-1] == "mean over heads"
    heads = [t for t in stats[0]["data"] if t["name"].startswith("head")]
    assert len(heads) == 4  # the widest stage's heads (stage 1), stage 0's 2 with gaps past them
    assert any("each stage has its own grid and heads" in c.value for c in at.main.caption)
    assert any("on its own 5×5 grid" in c.value for c in at.main.caption)  # the dense views: the last layer's grid



def test_the_heads_tab_shows_every_layer_of_a_swin_stage_by_stage(tmp_path, monkeypatch):
    """Issue 69, item 10: a plain ViT's Heads tab has an "Every layer" grid; a Swin's showed one layer only. On, it
    shows one grid per stage, each that stage's layers by its own heads (2 layers x 2 heads, then 2 x 4), each
    thumbnail that head's window attention for the clicked patch (HF's own, placed by HF's windows) over the image."""
    model = swin_folder(tmp_path / "swin")
    checkpoint = open_source(tmp_path / "swin")
    attentions, layouts = hf_attentions(model, preprocess([IMAGE], checkpoint.preprocessing))
    thumbnails, small_multiples = [], drawing.small_multiples
    monkeypatch.setattr(drawing, "small_multiples", lambda image, maps, *a, **k: thumbnails.append(maps) or
                        small_multiples(image, maps, *a, **k))
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(tmp_path / "swin"))
    at.run()
    buffer = io.BytesIO()
    IMAGE.save(buffer, format="PNG")
    upload(at, "photo.png", buffer.getvalue())
    patch = 3 * 10 + 7
    sidebar_widget(at, "selectbox", "Query token").set_value(patch)
    [toggle] = [t for t in at.toggle if t.label.startswith("Every layer")]
    assert toggle.label == "Every layer (4 layers in 2 stages, 12 maps)"
    toggle.set_value(True)
    at.run()
    assert not at.exception and not at.main.error, [e.message for e in at.exception] + [e.value for e in at.main.error]
    grids = {c.proto.id.rsplit("-", 1)[-1]: json.loads(c.proto.spec)["layout"] for c in at.get("plotly_chart")
             if "heads_grid" in c.proto.id}
    assert sorted(grids) == ["heads_grid_stage1", "heads_grid_stage2"], sorted(grids)
    for name, layers, heads in (("heads_grid_stage1", ["L1", "L2"], 2), ("heads_grid_stage2", ["L3", "L4"], 4)):
        assert grids[name]["yaxis"]["ticktext"] == layers
        assert grids[name]["xaxis"]["ticktext"] == [f"head {h + 1}" for h in range(heads)]
    assert [m.value for m in at.main.markdown if m.value.startswith("**Stage")] == [
        "**Stage 1**: layers 1–2, 2 heads, on a 10×10 grid", "**Stage 2**: layers 3–4, 4 heads, on a 5×5 grid"]
    expected = np.concatenate([on_patch_grid(layer_row(attentions, layouts, i, covering_token(
        patch, (10, 10), layouts[i].grid))[0].numpy(), (10, 10)) for i in range(4)])  # (2 + 2 + 4 + 4, 10, 10)
    np.testing.assert_allclose(thumbnails[-1], expected, atol=1e-5)
