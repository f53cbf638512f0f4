"""A model whose attention code tests the implementation's name answers through the recording attention (issue 113):
MiniMax-M3-VL's attention builds its sparse top-k block mask only under the names 'eager' and 'sdpa'
(``config._attn_implementation in ("eager", "sdpa")``; another name hands the indices to a flash kernel). The
recording attention runs under a name equal to the implementation it wraps too (``recording_attention.SameBranch``),
so the code takes the branch it takes without recording. Built tiny by the VLM census's generic builder with its own
processor's classes, a sparse layer of 2-token blocks keeping the query's own and each head's top other one, saved
whole: it answers with ``generate``'s tokens, and each answer token's attention at every layer is the eager row, per
head (the mask is each head's), the keys the sparse mask dropped 0 in both. dots.ocr 3 and Mistral Large 4 take the
same branch and cache compressed latents, expanded into keys after the cache: the answer keeps the keys each call
hands the attention (``vlm_cache.latent_layers``), its rows the eager ones still."""

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from test_vlm_answer import by_hand, eager_image_rows  # noqa: E402
from vlm_saved import answered_tokens, asked, assert_rows_are_eager, saved  # noqa: E402

from vit.registry import VLM_ARCHITECTURES  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

# Each type's text-config settings that make its sparse mask drop keys of a short prompt
SPARSE = {"minimax_m3_vl": dict(layer_types=["minimax_m3_sparse", "full_attention"], index_block_size=2,
                                   index_topk_blocks=2, index_local_blocks=1),
          # dots.ocr 3 caches compressed latents, expanded into keys after the cache: its keys kept by the answer
          "dots3_note": dict(index_topk=9)}
# The processor's settings the model reads otherwise than the census's generic builder sets them (dots.ocr 3's patch
# embedding has no temporal patch: one frame a patch)
IMAGES = {"dots3_note": dict(temporal_patch_size=1)}


@pytest.fixture(scope="module", params=list(SPARSE))
def asked_sparse(request, tmp_path_factory):
    """``(kind, vit's answer, transformers' eager generate output, its default generate's tokens, the inputs)``."""
    kind = request.param
    folder = tmp_path_factory.mktemp(kind)
    model = saved(kind, folder, SPARSE[kind], IMAGES.get(kind))
    vlm, answer, inputs, outputs = asked(model, folder, ("eager", "sdpa"))
    return kind, vlm, answer, outputs["eager"], answered_tokens(outputs["sdpa"], inputs), inputs


def test_the_answer_is_generates_under_the_default_implementation(asked_sparse):
    kind, vlm, answer, eager, default, _ = asked_sparse
    assert kind not in VLM_ARCHITECTURES and vlm.same_branch
    assert list(answer.tokens) == default and len(default) > 1


def test_each_tokens_attention_is_the_eager_row_of_the_sparse_mask(asked_sparse):
    kind, vlm, answer, out, _, inputs = asked_sparse
    positions = (inputs["input_ids"][0] == vlm.model.config.image_token_id).nonzero()[:, 0]
    assert torch.equal(answer.layout.positions, positions)
    dropped = assert_rows_are_eager(answer, out)  # over the keys the query may read
    for i in range(len(answer.tokens)):
        for layer in range(len(out.attentions[0])):
            np.testing.assert_allclose(answer.image_rows(i, layer).numpy(), eager_image_rows(out, i, layer, positions),
                                       rtol=0, atol=1e-5)
    assert dropped  # the sparse mask dropped keys: a dense row would differ


def test_a_cache_of_latents_answers_with_the_keys_its_attention_read(tmp_path):
    """Mistral Large 4 caches compressed latents, expanded into keys after the cache: the answer keeps the keys each
    call hands its attention (``vlm_cache.latent_layers``), so its rows are still the eager ones."""
    model = saved("mistral_large4", tmp_path, dict(index_topk=4))
    vlm, answer, inputs, outputs = asked(model, tmp_path)
    assert vlm.same_branch
    assert list(answer.tokens) == answered_tokens(outputs["eager"], inputs)
    assert_rows_are_eager(answer, outputs["eager"])


def _transposed(row: np.ndarray, grid: tuple[int, int], unit: int) -> np.ndarray:
    """The image tokens' ``row`` placed as if the processor's merged grid were laid column-major (wrong)."""
    (gh, gw), u = grid, unit
    return row.reshape(gw // u, gh // u).T.repeat(u, 0).repeat(u, 1)


def test_the_image_tokens_are_placed_on_the_grid_the_processor_states(asked_sparse):
    """The processor states each image's patch grid (``image_grid_thw``), merged ``merge_size`` x ``merge_size`` into
    one image token, row-major: placed so, on a grid a transposed placement would fail. Each answer token is checked
    at the layer whose row tells the two placements apart most: a sparse mask that keeps only image keys the
    transposition leaves in place (the merged grid's first and last token) reads the same both ways."""
    kind, vlm, answer, out, _, inputs = asked_sparse
    grid, unit = tuple(inputs["image_grid_thw"][0, 1:].tolist()), vlm.processor.image_processor.merge_size
    assert grid[0] != grid[1] and answer.layout.grid == grid and answer.layout.unit == unit
    checked = 0
    for i in range(len(answer.tokens)):
        rows = [eager_image_rows(out, i, n, answer.layout.positions).mean(0) for n in range(len(out.attentions[0]))]
        tells = [np.abs(by_hand(row, grid, unit, 0) - _transposed(row, grid, unit)).max() for row in rows]
        layer = int(np.argmax(tells))
        if tells[layer] <= 1e-3:
            continue
        checked += 1
        ours = answer.attention(i, layer=layer)
        np.testing.assert_allclose(ours, by_hand(rows[layer], grid, unit, 0), rtol=0, atol=1e-5)
        assert np.abs(ours - _transposed(rows[layer], grid, unit)).max() > 1e-3
    assert checked == len(answer.tokens), (kind, checked)  # every token tells them apart at some layer
