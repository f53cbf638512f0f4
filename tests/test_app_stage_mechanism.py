"""The explorer's Mechanism view on models with stages (a tiny HF Swin and Hiera opened by path): the logit lens and
head attribution on the last stage's layers, labelled so; heads switched off per layer (each layer its stage's heads),
zero and mean over uploaded reference images, each head alone; patching each head and each layer's input token; the
phenomena per layer's grid, sinks refused in one line. What is shown is the engine's, which ``test_stage_mechanism``
checks against HF's own models edited by hooks."""

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image
from test_app import array_shape, charts, dirs, run_app, sidebar_widget, upload  # noqa: F401 (a fixture)
from test_app_mechanism import heatmaps, open_mechanism, switch_heads_off, upload_references
from test_app_swin import swin_folder
from test_hiera_parity import save_hf_hiera

from vit.core.inference import preprocess
from vit.explain.mechanism import components as mechanism
from vit.sources.open import open_source

pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("dirs")]  # the app's own empty world


def png(size: int, seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


# family: (folder maker, input side, each layer's heads, the last stage's first layer, a head of an early stage and
# one of the last, 1-based as the page lists them)
FAMILIES = {
    "swin": (lambda folder: swin_folder(folder), 40, [2, 2, 4, 4], 2, ["2.2", "4.3"]),
    "hiera": (lambda folder: save_hf_hiera(folder, 32, num_labels=3), 32, [1, 2, 2, 4, 4], 3, ["2.2", "5.4"]),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_mechanism_view_of_a_model_with_stages(tmp_path, name):
    make, size, heads, first, chosen = FAMILIES[name]
    make(tmp_path / name)
    checkpoint = open_source(tmp_path / name)
    model, L = checkpoint.model, len(heads)
    image, references = png(size, 1), [png(size, 2), png(size, 3)]
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(tmp_path / name))
    at.run()
    upload(at, "photo.png", image)
    x = preprocess([Image.open(io.BytesIO(image)).convert("RGB")], checkpoint.preprocessing)
    last = [f"layer {i + 1}" for i in range(first, L)]

    open_mechanism(at, "Logit lens")
    assert list(at.dataframe[0].value["after"]) == last  # the last stage's layers, labelled
    assert any("last stage's layers" in c.value for c in at.caption)

    at.session_state["mechanism_tab"] = "Head attribution"
    at.run()
    [grid] = heatmaps(at, "Direct logit attribution")
    assert array_shape(grid["z"]) == (L - first, heads[-1] + 1) and list(grid["y"]) == last

    at.session_state["mechanism_tab"] = "Ablation"
    at.run()
    key = next(w.key for w in at.multiselect if w.label.startswith("Switch heads off"))
    assert len(at.multiselect(key=key).options) == sum(heads)  # each layer its stage's heads
    upload_references(at, *references)
    at.radio(key="ablation_mode").set_value("mean")
    switch_heads_off(at, chosen)
    assert not at.main.warning, [w.value for w in at.main.warning]
    refs = preprocess([Image.open(io.BytesIO(r)).convert("RGB") for r in references], checkpoint.preprocessing)
    pairs = [(int(a) - 1, int(b) - 1) for a, _, b in (c.partition(".") for c in chosen)]
    with torch.no_grad():
        expected = mechanism.ablate_heads(model, x, pairs, "mean", mechanism.mean_contexts(model, refs))[0]
    after = [t for fig in charts(at) for t in fig["data"] if t.get("type") == "bar"][2]
    names = checkpoint.class_names
    for label, p in zip(after["y"], after["x"], strict=True):
        assert p == pytest.approx(float(expected.softmax(-1)[0, names.index(label)]), abs=1e-6)
    at.toggle(key="ablation_grid").set_value(True)
    at.run()
    [effects] = heatmaps(at, "Logit change when one head is ablated")
    z = effects["z"]
    z = (np.frombuffer(base64.b64decode(z["bdata"]), dtype=np.dtype(z["dtype"])).reshape(array_shape(z))
         if isinstance(z, dict) else np.array(z, dtype=float))
    assert z.shape == (L, max(heads)) and all(np.isnan(z[i, h:]).all() for i, h in enumerate(heads))
    assert any("Blank: heads a layer's stage" in c.value for c in at.caption)

    at.session_state["mechanism_tab"] = "Patching"
    at.run()
    [corrupted] = [u for u in at.get("file_uploader") if u.label.startswith("Corrupted image")]
    corrupted.set_value(("other.png", png(size, 4), "image/png"))
    at.run()
    at.toggle(key="patch_positions").set_value(True)
    at.run()
    assert not at.exception and not at.main.warning, [w.value for w in at.main.warning]
    [patched] = heatmaps(at, "Recovered by patching one head")
    assert array_shape(patched["z"]) == (L, max(heads))
    assert any("on the grid that input is on" in c.value for c in at.caption)
    other = preprocess([Image.open(io.BytesIO(png(size, 4))).convert("RGB")], checkpoint.preprocessing)
    with torch.no_grad():  # one class for both: every share recovered is 0/0, and the page says why it is blank
        same = bool(model(x)[0].argmax() == model(other)[0].argmax())
    assert any("Both images are predicted as" in i.value for i in at.info) == same

    at.session_state["mechanism_tab"] = "Phenomena"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert any("Attention sinks are not measured for a model with stages" in i.value for i in at.info)
