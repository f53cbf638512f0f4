"""The hidden states of a model with stages (Swin, Swin V2, Hiera), each layer's on its own grid and width, row-major:
equal to HF's ``reshaped_hidden_states`` (each stage's end; Swin's before its downsampling, Hiera's rerolled from
its unrolled order) to 1e-5; and the dense views of a stage layer (PCA colours, patch similarity, correspondences)
against numbers computed by hand from those HF states."""

import numpy as np
import pytest
import torch
from PIL import Image
from test_hiera_parity import save_hf_hiera
from test_swin_parity import _hf

from vit.core.inference import preprocess
from vit.explain.methods.hidden import forward_with_hidden_states, forward_with_stage_states
from vit.explain.views import dense_views, image_analysis
from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing transformers takes seconds


def stage_ends(checkpoint) -> list[int]:
    """The state index (0: the embedding, l + 1: block l's output) at each stage's end."""
    c = checkpoint.model.config
    return [0] + [c.stage_start(s) + c.stage_depths[s] for s in range(c.num_stages)]


@pytest.mark.parametrize("kind, size", [("swin", 40), ("swinv2", 32)])
def test_swin_states_are_hf_reshaped_hidden_states(tmp_path, kind, size):
    model = _hf(kind, size)
    model.save_pretrained(tmp_path)
    checkpoint = open_source(tmp_path)
    images = torch.randn(2, 3, size, size)
    with torch.no_grad():
        swin = model.swinv2 if kind == "swinv2" else model.swin  # V2's model does not pass "before downsampling" on
        hf = swin.encoder(*swin.embeddings(images)[:2], output_hidden_states=True,
                          output_hidden_states_before_downsampling=True)
        logits, states = forward_with_stage_states(checkpoint.model, images)
    expected = [h.flatten(2).transpose(1, 2) for h in hf.reshaped_hidden_states]  # (B, C, H, W) -> (B, H*W, C)
    ours = [states[i] for i in stage_ends(checkpoint)]
    assert [s.shape for s in ours] == [e.shape for e in expected]  # e.g. 10x10 x 24, 10x10 x 24, 5x5 x 48 at 40 px
    for s, e in zip(ours, expected, strict=True):
        assert torch.allclose(s, e, atol=1e-5), (s - e).abs().max()
    assert logits.shape == (2, 5)
    with pytest.raises(ValueError, match="forward_with_stage_states"):
        forward_with_hidden_states(checkpoint.model, images)


def test_hiera_states_are_hf_rerolled_hidden_states(tmp_path):
    model = save_hf_hiera(tmp_path)
    checkpoint = open_source(tmp_path)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        hf = model.hiera(images, output_hidden_states=True)
        _, states = forward_with_stage_states(checkpoint.model, images)
    expected = [h.flatten(1, 2) for h in hf.reshaped_hidden_states]  # (B, H, W, C) -> (B, H*W, C)
    ours = [states[i] for i in stage_ends(checkpoint)]
    assert [s.shape[1:] for s in ours] == [(64, 8), (64, 8), (16, 16), (4, 32)]
    for s, e in zip(ours, expected, strict=True):
        assert torch.allclose(s, e, atol=1e-5), (s - e).abs().max()
    unrolled = hf.hidden_states[1]  # the library's own order is not row-major: a test that would see a mix-up
    assert not torch.allclose(states[1], unrolled, atol=1e-3)


# -- the dense views of a stage layer, from HF's states by hand ----------------------------------------------------

SIZE = 40  # Swin: the image's 10x10 patches (stage 0), then 5x5 (stage 1: 2x2 patches a cell)


@pytest.fixture(scope="module")
def swin_dense(tmp_path_factory):
    """A tiny HF Swin (``test_swin_parity``'s) opened by path, two images, each one's analysis and HF's states:
    stage 0's output (10x10 x 24, no norm) and the encoder's normed output (5x5 x 48)."""
    folder = tmp_path_factory.mktemp("swin")
    model = _hf("swin", SIZE)
    model.save_pretrained(folder)
    checkpoint = open_source(folder)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)) for _ in range(2)]
    x = preprocess(images, checkpoint.preprocessing)
    with torch.no_grad():
        hf = model.swin.encoder(*model.swin.embeddings(x)[:2], output_hidden_states=True,
                                output_hidden_states_before_downsampling=True)
        last = model.swin(x).last_hidden_state  # (2, 25, 48), after the final norm
    stage0 = hf.reshaped_hidden_states[1].flatten(2).transpose(1, 2)  # (2, 100, 24)
    return checkpoint, [image_analysis.analyse(checkpoint, i) for i in images], stage0.double(), last.double()


def cosine(tokens: torch.Tensor, query: torch.Tensor) -> np.ndarray:
    return (tokens @ query / (tokens.norm(dim=-1) * query.norm())).numpy()


def test_patch_similarity_of_a_stage_layer_is_the_cosine_on_its_grid(swin_dense):
    checkpoint, (analysis, other), stage0, last = swin_dense
    patch = 3 * 10 + 7  # row 3, column 7 of the image: cell (1, 3) of the 5x5 grid
    ours = dense_views.similarity_map(checkpoint, analysis, dense_views.query_vector(checkpoint, analysis, patch, 1), 1)
    np.testing.assert_allclose(ours, cosine(stage0[0], stage0[0, patch]).reshape(10, 10), atol=1e-5)
    vector = dense_views.query_vector(checkpoint, analysis, patch, -1)
    expected = cosine(last[0], last[0, 1 * 5 + 3]).reshape(5, 5)
    np.testing.assert_allclose(dense_views.similarity_map(checkpoint, analysis, vector),
                               np.kron(expected, np.ones((2, 2))), atol=1e-5)  # each cell over its 2x2 patches
    expected_other = cosine(last[1], last[0, 8]).reshape(5, 5)
    np.testing.assert_allclose(dense_views.similarity_map(checkpoint, other, vector),
                               np.kron(expected_other, np.ones((2, 2))), atol=1e-5)
    with pytest.raises(ValueError, match="width 48 .* width 24"):
        dense_views.similarity_map(checkpoint, analysis, vector, 0)


def test_pca_colours_of_a_stage_layer_are_its_tokens_components_on_its_grid(swin_dense):
    checkpoint, analyses, _, last = swin_dense
    views = dense_views.pca_views([checkpoint] * 2, analyses, -1)
    x = last.reshape(50, 48).numpy()  # both images' tokens, fitted together
    centred = x - x.mean(axis=0)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    vt = vt[:3] * np.sign(vt[:3][np.arange(3), np.abs(vt[:3]).argmax(axis=1)])[:, None]  # sklearn's svd_flip
    colours = 1 / (1 + np.exp(-2 * centred @ vt.T / (s[:3] / np.sqrt(49))))  # (50, 3)
    for i, view in enumerate(views):
        expected = np.kron(colours[25 * i:25 * (i + 1)].reshape(5, 5, 3), np.ones((2, 2, 1)))
        np.testing.assert_allclose(view.colours, expected, atol=1e-5)


def test_correspondences_of_a_stage_layer_are_mutual_nearest_cells(swin_dense):
    checkpoint, (a, b), _, last = swin_dense
    view = dense_views.match_view(checkpoint, a, checkpoint, b, top=None)
    unit = torch.nn.functional.normalize(last, dim=-1)
    sims = (unit[0] @ unit[1].T).numpy()  # (25, 25)
    best_b, best_a = sims.argmax(axis=1), sims.argmax(axis=0)
    mutual = [i for i in range(25) if best_a[best_b[i]] == i]
    assert sorted(view.a.tolist()) == mutual and (view.b == best_b[view.a]).all()
    np.testing.assert_allclose(view.score, sims[view.a, view.b], atol=1e-5)
    assert view.grid_a == view.grid_b == (5, 5)
    centres = dense_views.patch_centres(np.array([0, 24]), (5, 5), (SIZE, SIZE), (10, 10))
    np.testing.assert_allclose(centres, [[4, 4], [36, 36]])  # a cell's middle: 2 patches of 4 px a side
    np.testing.assert_allclose(dense_views.patch_centres(np.array([8]), (3, 3), (20, 20), (5, 5)), [[18, 18]])  # padded
