"""Sparse autoencoders on a layer of a model with stages (a tiny HF Swin, opened by path): ``vit.sae train`` reads
that layer's tokens at its own grid and width, the features of an image are the SAE's encoding of HF's own hidden
states there, and the explorer's Features section draws a feature over the image's patches, with its exemplars."""

import io
import json

import numpy as np
import pytest
import torch
from helpers import make_image_folder
from PIL import Image
from test_app import dirs, run_app, sidebar_widget, upload  # noqa: F401 (a fixture)
from test_swin_parity import _hf

from vit.core.inference import preprocess
from vit.explain.methods.stage_maps import on_patch_grid
from vit.features import explore
from vit.features.autoencoder import check_fits, load_sae, stream_shape
from vit.sae import main
from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing transformers takes seconds; the last test starts the app

SIZE = 40  # the image's 10x10 patches, then stage 1's 5x5 cells of 48 channels


@pytest.fixture(scope="module")
def swin_sae(tmp_path_factory):
    """A tiny HF Swin saved by path, six images in class folders, and an SAE trained by the CLI on block 4's output
    (stage 1's last block: 5x5 tokens, 48 wide)."""
    root = tmp_path_factory.mktemp("swin-sae")
    model = _hf("swin", SIZE)
    model.save_pretrained(root / "swin")
    data = make_image_folder(root / "data", per_class=3, size=SIZE)
    code = main(["train", str(root / "swin"), "--data", str(data), "--layer", "4", "--expansion", "2", "--k", "4",
                 "--epochs", "1", "--batch-size", "16", "--buffer-tokens", "64", "--holdout", "1",
                 "--out", str(root / "sae"), "--device", "cpu"])
    assert code == 0
    return model, open_source(root / "swin"), root / "sae", data


def test_the_cli_trains_on_a_stage_layers_own_tokens(swin_sae):
    _, checkpoint, folder, _ = swin_sae
    sae = load_sae(folder)
    assert check_fits(sae, checkpoint.model) == 4 and sae.d_in == 48  # stage 1's width, not the embedding's 24
    assert stream_shape(checkpoint.model, 4) == ((5, 5), 0, 48) and stream_shape(checkpoint.model, 2)[2] == 24
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["images"] == 1 and metrics["tokens"] == 25  # a fifth of 6 held out; the layer's 5x5 tokens
    features = np.load(folder / "features.npz")
    assert int(features["tokens_per_image"]) == 25 and features["exemplar_tokens"].max() < 25


def test_an_images_features_are_the_sae_of_hfs_states_on_the_layers_grid(swin_sae):
    model, checkpoint, folder, _ = swin_sae
    sae = load_sae(folder)
    x = torch.randn(1, 3, SIZE, SIZE)
    with torch.no_grad():
        hf = model.swin(x, output_hidden_states=True, output_hidden_states_before_downsampling=True)
        expected = sae.encode(hf.reshaped_hidden_states[-1].flatten(2).transpose(1, 2)[0])  # (25, d_sae)
        ours = explore.image_features(checkpoint.model, sae, x)
    assert ours.grid == (5, 5) and ours.patch_grid == (10, 10) and ours.num_prefix_tokens == 0
    torch.testing.assert_close(ours.latents, expected, atol=1e-5, rtol=0)
    latent = int(expected.max(dim=0).values.argmax())
    cells = expected[:, latent].reshape(5, 5).numpy()
    np.testing.assert_allclose(ours.patch_maps([latent])[0], np.kron(cells, np.ones((2, 2))), atol=1e-5)
    assert ours.cell(3 * 10 + 7) == 1 * 5 + 3  # patch (3, 7) of the image: cell (1, 3)
    view = explore.intervention_view(checkpoint.model, sae, x, {latent: 0.0})
    assert view.rollouts().shape == (2, 10, 10)  # through the stages, from what the average pooling reads


def test_the_features_section_draws_a_swin_feature_over_the_image(swin_sae, dirs, monkeypatch):  # noqa: F811
    from app_pages.explorer_sections import features

    _, checkpoint, folder, data = swin_sae
    drawn = []

    def recording(image, map2d, *args, **kwargs):
        drawn.append(np.asarray(map2d))
        return overlay(image, map2d, *args, **kwargs)

    overlay = features.overlay
    monkeypatch.setattr(features, "overlay", recording)
    monkeypatch.setenv("VIT_DATA_ROOTS", str(data.parent))
    image = Image.open(data / "cat" / "0.png")
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(folder.parent / "swin"))
    at.run()
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    upload(at, "photo.png", buffer.getvalue())
    at.toggle(key="sae_view").set_value(True)
    at.run()
    at.text_input(key="sae_folder").set_value(str(folder))
    at.run()
    assert not at.exception and not at.main.error, [e.message for e in at.exception] + [e.value for e in at.main.error]
    sae = load_sae(folder)
    z = explore.image_features(checkpoint.model, sae, preprocess([image], checkpoint.preprocessing)).latents
    shown = at.session_state["sae_feature"]
    np.testing.assert_allclose(drawn[-1], on_patch_grid(z[:, shown].reshape(5, 5).numpy(), (10, 10)), atol=1e-5)
    assert any("own 5×5 grid" in c.value for c in at.caption)
    at.session_state["sae_token"] = 3 * 10 + 7  # a click on patch (3, 7): cell (1, 3) of the layer
    at.run()
    fired = z[8][z[8] > 0]
    if len(fired):
        [active] = [r for r in at.radio if r.key == "sae_active"]
        assert [int(o.split(" ")[1]) for o in active.options] == z[8].topk(len(fired)).indices.tolist()
    assert not any("no crops can be placed" in c.value for c in at.caption)  # exemplars on the layer's grid


def test_feature_attribution_on_a_stage_layer_sums_to_hfs_gradient_times_its_state(swin_sae):
    """The SAE spliced in at stage 1's last block: latents, bias and error sum, cell by cell, to the gradient of HF's
    own logit at its hidden state there times that state (autograd on HF's model, not ours)."""
    from vit.features.attribution import feature_attribution

    model, checkpoint, folder, _ = swin_sae
    sae = load_sae(folder)
    torch.manual_seed(0)
    x = torch.randn(1, 3, SIZE, SIZE)
    out = model(x, output_hidden_states=True, output_hidden_states_before_downsampling=True)
    target = int(out.logits[0].argmax())
    state = out.hidden_states[-1]  # (1, 25, 48): the last stage's output, before the final norm
    (g,) = torch.autograd.grad(out.logits[0, target], state)
    result = feature_attribution(checkpoint.model, sae, x)
    assert result.target == target and result.grid == (5, 5) and result.image_grid == (10, 10)
    torch.testing.assert_close(result.attributions.sum(-1) + result.bias + result.error,
                               (g[0] * state[0]).sum(-1).detach(), rtol=0, atol=1e-5)
    latent = result.top(1)[0][0]
    cells = result.attributions[:, latent].reshape(5, 5).numpy()
    np.testing.assert_allclose(result.patch_maps([latent])[0], np.kron(cells, np.ones((2, 2))), atol=1e-6)
