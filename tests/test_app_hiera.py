"""The explorer draws a Hiera (a tiny HF folder opened by path): a clicked patch's attention in a pooled-query layer
(queries on its 2x2 grid, keys on the previous stage's 4x4, in units of 2x2), drawn over the image, with that layer's
heads; and the rollout through the query pooling. The drawn maps are checked against HF's own attentions, placed by
HF's own unroll and pooling of token indices (``test_hiera_parity``)."""

import io

import numpy as np
import pytest
import torch
from PIL import Image
from test_app import dirs, run_app, sidebar_widget, upload  # noqa: F401 (a fixture)
from test_app_swin import drawn  # noqa: F401 (a fixture)
from test_hiera_parity import dense_library_attentions, pooling_residual, save_hf_hiera

from vit.core.inference import preprocess
from vit.explain.methods.stage_maps import on_patch_grid
from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("dirs")]  # the app's own empty world

SIZE = 32  # an 8x8 patch grid in 4x4 mask units; 4x4; 2x2
IMAGE = Image.fromarray(np.random.default_rng(0).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8))


def test_a_pooled_layers_attention_for_a_clicked_patch_is_drawn_on_the_image(tmp_path, drawn):  # noqa: F811
    model = save_hf_hiera(tmp_path / "hiera", SIZE, num_labels=3)
    checkpoint = open_source(tmp_path / "hiera")
    captured = []
    hooks = [layer.attn.register_forward_hook(lambda m, i, o: captured.append(o[1]))
             for stage in model.hiera.encoder.stages for layer in stage.layers]
    with torch.no_grad():
        model(pixel_values=preprocess([IMAGE], checkpoint.preprocessing), output_attentions=True)
    for hook in hooks:
        hook.remove()
    dense = [a[0] for a in dense_library_attentions(checkpoint.model, captured, (8, 8))]  # (H, Tq, Tk) each
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(tmp_path / "hiera"))
    at.run()
    buffer = io.BytesIO()
    IMAGE.save(buffer, format="PNG")
    upload(at, "photo.png", buffer.getvalue())
    patch = 5 * 8 + 6  # row 6, column 7 of the image's 8x8 patches: cell (1, 1) of the last stage's 2x2 grid
    sidebar_widget(at, "selectbox", "Query token").set_value(patch)
    sidebar_widget(at, "select_slider", "Layer").set_value(4)  # the last stage's first block: pooled queries
    at.run()
    head = sidebar_widget(at, "selectbox", "Head")
    assert len(head.options) == 1 + 4  # fused, then the last stage's four heads
    head.set_value(2)
    at.run()
    assert not at.exception and not at.main.error, [e.message for e in at.exception] + [e.value for e in at.main.error]
    expected = dense[3][2, 3].reshape(4, 4).numpy()  # token 3 of the 2x2 grid, over the 4x4 grid's keys
    np.testing.assert_allclose(drawn[-1], on_patch_grid(expected, (8, 8)), atol=1e-5)
    assert drawn[-1][0, 0] == 0 and drawn[-1][4:, 4:].sum() == pytest.approx(4.0, abs=1e-5)  # its unit, 2x2 per key
    assert any("previous stage's 4×4 grid" in c.value for c in at.main.caption)
    sidebar_widget(at, "radio", "Map").set_value("rollout")
    at.run()
    assert not at.exception and not at.main.error, [e.value for e in at.main.error]
    product = None
    for full in dense:  # each layer's heads averaged plus its residual: the identity or the 2x2 pooling
        Tq, Tk = full.shape[-2:]
        residual = pooling_residual(Tq, Tk)
        a = full.mean(0).double() + residual
        a = a / a.sum(-1, keepdim=True)
        product = a if product is None else a @ product
    np.testing.assert_allclose(drawn[-1], product[3].reshape(8, 8).numpy(), atol=1e-5)
    assert any("query pooling" in c.value for c in at.main.caption)
