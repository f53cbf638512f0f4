"""What the patches represent (issue 48): PCA colours, patch similarity and correspondences.

The PCA and the matching are DINOv3's own notebook cells (``tests/reference/dinov3_notebooks``) run on the tokens
HF transformers' ``DINOv3ViTModel`` gives for the same image, with scikit-learn's own ``PCA`` as the notebook
imports it (scikit-learn is in requirements.txt since KernelSHAP needs it), compared after aligning each
component's sign where the notebook's colours allow either.
"""

import io
import math
import re
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import vit
from vit.checkpoint import Preprocessing, save_checkpoint
from vit.core.inference import InputSize, preprocess
from vit.costs.bounds import TooManyTokens
from vit.explain.methods import dense
from vit.explain.views import dense_views as dense_view
from vit.model import ViT, ViTConfig

NOTEBOOKS = Path(__file__).resolve().parent / "reference" / "dinov3_notebooks"
TINY = ViTConfig(image_size=16, patch_size=4, num_channels=3, num_classes=0, hidden_size=16, num_layers=2,
                 num_heads=2, mlp_size=32, num_register_tokens=2)


def notebook_cells(name: str) -> dict[str, str]:
    """The verbatim cells of a reference file, by the name after ``# %%``."""
    text = (NOTEBOOKS / name).read_text()
    parts = re.split(r"^# %% (.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def run_pca_notebook(x: torch.Tensor, grid: tuple[int, int], foreground: torch.Tensor) -> np.ndarray:
    """pca.ipynb's cells 14, 16, 18 on patch tokens ``x (N, D)``; ``foreground (gh, gw)`` stands for the classifier's
    median-filtered score: ``(gh, gw, 3)`` colours."""
    from sklearn.decomposition import PCA  # here, not at the top: scikit-learn is ~1 s of CPU in each xdist worker

    space = dict(torch=torch, PCA=PCA, plt=mock.MagicMock(), x=x, h_patches=grid[0], w_patches=grid[1],
                 fg_score_mf=foreground.double())
    for cell in ("cell 14", "cell 16", "cell 18"):
        exec(notebook_cells("pca_cells.py")[cell], space)
    return space["projected_image"].permute(1, 2, 0).numpy()


def aligned(reference: np.ndarray, ours: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``reference`` colours with each channel flipped (``1 - c``: the component's sign) where that brings it to
    ``ours``, on the foreground ``mask``."""
    out = reference.copy()
    for c in range(3):
        flipped = np.where(mask, 1 - reference[..., c], 0)
        if np.abs(flipped - ours[..., c]).max() < np.abs(reference[..., c] - ours[..., c]).max():
            out[..., c] = flipped
    return out


@pytest.fixture(scope="module")
def dinov3(tmp_path_factory):
    """A tiny random HF DINOv3 (4 registers, rotary positions) and our checkpoint opened from its folder."""
    transformers = pytest.importorskip("transformers")
    from parity_helpers import randomize

    folder = tmp_path_factory.mktemp("dinov3") / "model"
    config = transformers.DINOv3ViTConfig(image_size=32, patch_size=8, hidden_size=32, intermediate_size=48,
                                          num_hidden_layers=2, num_attention_heads=2, num_register_tokens=4,
                                          layerscale_value=0.5)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    reference = randomize(transformers.DINOv3ViTModel(config))
    reference.save_pretrained(folder)
    return reference, vit.load(folder, device="cpu")


def photo(seed: int, size=(96, 64)) -> Image.Image:
    """A picture with structure (two regions and noise), so components are well separated."""
    rng = np.random.default_rng(seed)
    array = rng.integers(0, 60, (size[1], size[0], 3), dtype=np.uint8)
    array[size[1] // 4: 3 * size[1] // 4, size[0] // 3: 2 * size[0] // 3] += np.uint8(150)
    return Image.fromarray(array)


def reference_tokens(reference, checkpoint, image, size) -> tuple[torch.Tensor, tuple[int, int]]:
    """HF's output patch tokens (after its final norm, registers and CLS off) for ``image`` at ``size``."""
    x = preprocess([image], checkpoint.preprocessing, size, checkpoint.model.config.patch_size)
    with torch.no_grad():
        out = reference(pixel_values=x).last_hidden_state[0]  # (T, D)
    grid = (x.shape[2] // 8, x.shape[3] // 8)
    return out[1 + reference.config.num_register_tokens:], grid


@pytest.mark.slow
def test_pca_colours_equal_the_dinov3_notebooks_on_a_non_square_input(dinov3):
    reference, checkpoint = dinov3
    image, size = photo(0), InputSize(96, keep_aspect=True)  # 96 x 64 px: a 12 x 8 grid
    ours = vit.pca(checkpoint, image, size=size)
    x, grid = reference_tokens(reference, checkpoint, image, size)
    assert ours.map.shape == (*grid, 3) and grid == (8, 12)
    expected = run_pca_notebook(x, grid, torch.ones(grid))
    np.testing.assert_allclose(ours.map, aligned(expected, ours.map, np.ones(grid, bool)), atol=1e-4)


@pytest.mark.slow
def test_pca_on_the_foreground_equals_the_notebooks_fit_on_the_same_patches(dinov3):
    reference, checkpoint = dinov3
    image, size = photo(1), InputSize(96, keep_aspect=True)
    ours = vit.pca(checkpoint, image, foreground=0.0, size=size)
    assert 2 <= ours.mask.sum() < ours.mask.size
    x, grid = reference_tokens(reference, checkpoint, image, size)
    expected = run_pca_notebook(x, grid, torch.from_numpy(ours.mask))  # the notebook's refit on that foreground
    np.testing.assert_allclose(ours.map, aligned(expected, ours.map, ours.mask), atol=1e-4)
    assert not ours.map[~ours.mask].any()  # background black, as the notebook masks it


@pytest.mark.slow
def test_pca_of_several_images_is_one_fit_on_all_their_patches(dinov3):
    reference, checkpoint = dinov3
    size = InputSize(64)
    images = [photo(2, (64, 64)), photo(3, (64, 64))]
    ours = vit.pca(checkpoint, images, size=size)
    tokens = [reference_tokens(reference, checkpoint, i, size)[0] for i in images]
    both = run_pca_notebook(torch.cat(tokens), (16, 8), torch.ones(16, 8))  # the two 8 x 8 grids stacked
    joint = np.concatenate([o.map for o in ours])  # (16, 8, 3)
    np.testing.assert_allclose(joint, aligned(both, joint, np.ones((16, 8), bool)), atol=1e-4)


def run_matching_notebook(left: torch.Tensor, right: torch.Tensor, grid_left, grid_right) -> torch.Tensor:
    """dense_sparse_matching.ipynb's matching cell on two images' patch tokens (every patch foreground): the right
    image's patch each left patch is matched to, ``(N_left,)``."""
    features = [t.T.reshape(-1, *g).clone() for t, g in ((left, grid_left), (right, grid_right))]  # (D, h, w)
    space = dict(torch=torch, F=F, patch_features=features, dim=left.shape[1], PATCH_SIZE=8,
                 patch_mask_values=[torch.ones(grid_left), torch.ones(grid_right)])
    exec(notebook_cells("matching_cells.py")["matching"], space)
    assert space["patches_fg_selection"].all()
    return space["patch_indices_right"]


@pytest.mark.slow
def test_correspondences_are_the_matching_notebooks_matches_kept_when_mutual(dinov3):
    reference, checkpoint = dinov3
    size = InputSize(96, keep_aspect=True)
    a, b = photo(4), photo(5, (64, 96))  # 12 x 8 and 8 x 12 grids
    ours = vit.correspondences(checkpoint, a, checkpoint, b, top=None, size=size)
    left, grid_left = reference_tokens(reference, checkpoint, a, size)
    right, grid_right = reference_tokens(reference, checkpoint, b, size)
    forward = run_matching_notebook(left, right, grid_left, grid_right)
    backward = run_matching_notebook(right, left, grid_right, grid_left)
    mutual = torch.nonzero(backward[forward] == torch.arange(len(forward)))[:, 0]
    assert len(mutual) > 0
    scores = F.cosine_similarity(left[mutual], right[forward[mutual]], dim=-1)
    expected = sorted(zip(mutual.tolist(), forward[mutual].tolist(), strict=True))
    assert sorted(map(tuple, ours.matches.tolist())) == expected
    np.testing.assert_allclose(ours.scores, np.sort(scores.numpy())[::-1], atol=1e-5)
    assert (np.diff(ours.scores) <= 0).all()
    assert len(vit.correspondences(checkpoint, a, checkpoint, b, top=3, size=size).matches) == min(3, len(mutual))
    # mutual=False: the notebook's own one-way matches, every left patch to its most similar right patch
    one_way = vit.correspondences(checkpoint, a, checkpoint, b, top=None, mutual=False, size=size)
    assert len(forward) > len(mutual)  # the filter drops some here, so the two settings differ
    assert sorted(map(tuple, one_way.matches.tolist())) == list(enumerate(forward.tolist()))


@pytest.mark.slow
def test_similarity_is_the_cosine_of_the_query_token_to_every_patch_of_the_target(dinov3):
    reference, checkpoint = dinov3
    size = InputSize(96, keep_aspect=True)
    a, b = photo(6), photo(7)
    prefix = checkpoint.model.num_prefix_tokens  # CLS + 4 registers
    tokens_a, grid = reference_tokens(reference, checkpoint, a, size)
    tokens_b, _ = reference_tokens(reference, checkpoint, b, size)
    query = prefix + 13  # patch 13: row 1, column 1 of the 12-wide grid
    same = vit.similarity(checkpoint, a, query=query, size=size)
    other = vit.similarity(checkpoint, a, query=query, target=b, size=size)
    np.testing.assert_allclose(same.map, F.cosine_similarity(tokens_a, tokens_a[13][None]).reshape(grid), atol=1e-5)
    np.testing.assert_allclose(other.map, F.cosine_similarity(tokens_b, tokens_a[13][None]).reshape(grid), atol=1e-5)
    assert same.map[1, 1] == pytest.approx(1.0, abs=1e-5)


# -- the engine on hand-made tokens -------------------------------------------------------------------------------

def test_similarity_of_hand_made_tokens():
    unit = dense.unit_tokens(torch.tensor([[1.0, 0.0], [0.0, 2.0], [-3.0, 0.0], [1.0, 1.0]]))
    np.testing.assert_allclose(dense.similarity(unit, torch.tensor([2.0, 0.0])), [1, 0, -1, math.sqrt(0.5)],
                               atol=1e-6)


def test_correspondences_recover_a_permutation_and_drop_one_way_matches():
    a = torch.eye(4)  # four orthogonal tokens
    b = torch.eye(4)[[2, 0, 3, 1]] * torch.tensor([[1.0], [2.0], [3.0], [4.0]])  # permuted, scaled
    b = torch.cat([b, torch.tensor([[1.0, 0.0, 0.0, 0.2]])])  # a fifth B token whose nearest A is 0, one way only
    m = dense.correspondences(dense.unit_tokens(a), dense.unit_tokens(b))
    assert dict(zip(m.a.tolist(), m.b.tolist(), strict=True)) == {0: 1, 1: 3, 2: 0, 3: 2}
    kept = dense.correspondences(dense.unit_tokens(b), dense.unit_tokens(a))
    assert 4 not in kept.a.tolist()  # B's fifth token's nearest A patch (0) prefers B token 1


def test_nearest_patches_are_the_same_in_blocks_of_any_size():
    torch.manual_seed(0)
    a, b = dense.unit_tokens(torch.randn(37, 8)), dense.unit_tokens(torch.randn(23, 8))
    whole = dense.nearest_patches(a, b)
    for chunk in (4 * 23, 4 * 23 * 5):  # one row, five rows per block
        best_b, score_b, best_a, score_a = dense.nearest_patches(a, b, chunk)
        assert torch.equal(best_b, whole[0]) and torch.equal(best_a, whole[2])
        torch.testing.assert_close(score_b, whole[1])
        torch.testing.assert_close(score_a, whole[3])
    assert torch.equal(whole[0], (a @ b.T).argmax(dim=1)) and torch.equal(whole[2], (a @ b.T).argmax(dim=0))


def test_pca_components_take_sklearns_sign_and_whiten_to_unit_variance():
    torch.manual_seed(1)
    tokens = torch.randn(50, 6) @ torch.randn(6, 6)
    fit = dense.fit_pca(tokens)
    largest = fit.components.gather(1, fit.components.abs().argmax(dim=1, keepdim=True))
    assert (largest > 0).all()
    projected = fit.transform(tokens)
    np.testing.assert_allclose(projected.var(dim=0, unbiased=True), np.ones(3), atol=1e-10)


def test_pca_of_token_sets_added_one_at_a_time_equals_sklearns_on_all_of_them():
    torch.manual_seed(2)
    sets = [torch.randn(n, 8) @ torch.randn(8, 8) + 1000.0 for n in (7, 30, 1, 12)]  # far from 0: a naive sum fails
    moments = dense.PCAMoments()
    for tokens in sets:
        moments.add(tokens)
    every = torch.cat(sets).double().numpy()
    from sklearn.decomposition import PCA

    reference = PCA(3, whiten=True, svd_solver="full").fit(every)
    fit = moments.fit()
    np.testing.assert_allclose(fit.components.numpy(), reference.components_, atol=1e-9)
    np.testing.assert_allclose(fit.transform(torch.from_numpy(every)).numpy(), reference.transform(every),
                               atol=1e-8)


def test_pca_of_constant_tokens_is_grey_not_nan():
    colours, _ = dense.pca_images([torch.ones(6, 4)])
    np.testing.assert_allclose(colours[0], 0.5)


# -- the notebook API on our own tiny model -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("dense") / "tiny.pt"
    save_checkpoint(path, ViT(TINY), [], Preprocessing(16, 3, (0.5,) * 3, (0.5,) * 3))
    return vit.load(path, device="cpu")


def test_every_layer_s_tokens_are_its_block_output_after_the_final_norm(tiny):
    image = photo(8, (16, 16))
    x = preprocess([image], tiny.preprocessing)
    _, cache = tiny.model.run_with_cache(x, ["blocks.0.hook_resid_post"])
    expected = tiny.model.norm(cache["blocks.0.hook_resid_post"])[0, tiny.model.num_prefix_tokens:]  # (16, D)
    unit = F.normalize(expected, dim=-1)
    s = vit.similarity(tiny, image, query=tiny.model.num_prefix_tokens + 5, layer=0)
    np.testing.assert_allclose(s.map.ravel(), (unit @ unit[5]).detach().numpy(), atol=1e-5)
    cls = vit.similarity(tiny, image, query=0, layer=-2)  # CLS, the same layer counted from the end
    cls_token = F.normalize(tiny.model.norm(cache["blocks.0.hook_resid_post"])[0, 0], dim=-1)
    np.testing.assert_allclose(cls.map.ravel(), (unit @ cls_token).detach().numpy(), atol=1e-5)


def test_results_save_as_png_and_npz_and_draw_figures(tiny, tmp_path):
    image = photo(9, (16, 16))
    p = vit.pca(tiny, image)
    s = vit.similarity(tiny, image, query=3)
    c = vit.correspondences(tiny, image, tiny, photo(10, (16, 16)), top=4)
    for name, result in (("pca", p), ("similarity", s), ("matches", c)):
        assert Image.open(result.save(tmp_path / f"{name}.png")).size[0] > 0
        assert Image.open(io.BytesIO(result._repr_png_())).format == "PNG"  # what a notebook shows
        result.figure()
    with np.load(p.save(tmp_path / "pca.npz")) as saved:
        np.testing.assert_array_equal(saved["map"], p.map)
    with np.load(c.save(tmp_path / "m.npz")) as saved:
        np.testing.assert_array_equal(saved["matches"], c.matches)
        assert saved["points_a"].shape == (len(c.matches), 2)
    with pytest.raises(ValueError, match=r"^cannot save as \.jpg; give a \.png or \.npz path$"):
        p.save(tmp_path / "pca.jpg")


def test_wrong_layers_and_queries_are_refused_in_one_line(tiny):
    image = photo(9, (16, 16))
    with pytest.raises(ValueError, match=r"^layer 2 is out of range: this model has 2 layers"):
        vit.pca(tiny, image, layer=2)
    with pytest.raises(ValueError, match=r"^query 99 is out of range: this input has 19 tokens"):
        vit.similarity(tiny, image, query=99)
    with pytest.raises(ValueError, match="top must be a whole number"):
        vit.correspondences(tiny, image, tiny, image, top=0)


def test_an_input_past_the_memory_bound_is_refused_naming_the_largest_size_that_fits(tiny, monkeypatch):
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "384.5")  # the fixed 384 MB (cache, chunk) and about 0.5 MB
    image = photo(11, (64, 64))
    with pytest.raises(TooManyTokens) as refused:
        vit.pca(tiny, image, size=2048)
    message = str(refused.value)
    assert "\n" not in message and "VIT_ANALYSIS_MEMORY_MB" in message
    side = int(re.search(r"largest square input that fits is (\d+) px", message).group(1))
    dense_view.check_dense_fits(tiny, image, InputSize(side))  # that size fits
    with pytest.raises(TooManyTokens):
        dense_view.check_dense_fits(tiny, image, InputSize(side + 2 * TINY.patch_size))  # and the next one does not
