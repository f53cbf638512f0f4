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
from test_vlm_answer import NEW_TOKENS, QUESTION, by_hand, eager_image_rows, noisy, picture, processor_inputs  # noqa: E402

import vit  # noqa: E402
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


def _saved(kind: str, folder, **text):
    """``(model, folder)``: ``kind`` built tiny by the census's generic builder, its text config's ``SPARSE`` settings
    (and ``text``) set, saved whole with its processor in ``folder``."""
    from bench.census_vlm import generic_build

    torch.manual_seed(0)
    model, processor = generic_build(kind)
    config = model.config
    for name, value in {**SPARSE.get(kind, {}), **text}.items():
        setattr(config.get_text_config(), name, value)
    torch.manual_seed(0)
    model = type(model)(config)
    for name, value in IMAGES.get(kind, {}).items():
        setattr(processor.image_processor, name, value)
    noisy(model).save_pretrained(folder)
    processor.save_pretrained(folder)
    return model, folder


@pytest.fixture(scope="module", params=list(SPARSE))
def asked(request, tmp_path_factory):
    """``(kind, vit's answer, transformers' eager generate output, its default generate's tokens, the inputs)``."""
    kind = request.param
    model, folder = _saved(kind, tmp_path_factory.mktemp(kind))
    vlm = vit.open_vlm(folder)
    answer = vit.ask_vlm(vlm, picture(), QUESTION, max_new_tokens=NEW_TOKENS)
    inputs = processor_inputs(folder, picture())
    outputs = {}
    for implementation in ("eager", "sdpa"):
        reference = type(model).from_pretrained(folder, attn_implementation=implementation).eval()
        with torch.no_grad():
            outputs[implementation] = reference.generate(
                **inputs, max_new_tokens=NEW_TOKENS, do_sample=False, return_dict_in_generate=True,
                output_attentions=implementation == "eager")
    start = inputs["input_ids"].shape[1]
    return kind, vlm, answer, outputs["eager"], outputs["sdpa"].sequences[0, start:].tolist(), inputs


def test_the_answer_is_generates_under_the_default_implementation(asked):
    kind, vlm, answer, eager, default, _ = asked
    assert kind not in VLM_ARCHITECTURES and vlm.same_branch
    assert list(answer.tokens) == default and len(default) > 1


def test_each_tokens_attention_is_the_eager_row_of_the_sparse_mask(asked):
    kind, vlm, answer, out, _, inputs = asked
    positions = (inputs["input_ids"][0] == vlm.model.config.image_token_id).nonzero()[:, 0]
    assert torch.equal(answer.layout.positions, positions)
    dropped = 0
    for i in range(len(answer.tokens)):
        for layer in range(len(out.attentions[0])):
            seen = out.attentions[0][layer].shape[-2] + i
            eager = out.attentions[i][layer][0, :, -1, :seen]  # (H, seen): the keys the query may read
            dropped += int((eager == 0).sum())
            np.testing.assert_allclose(answer.row(i, layer).numpy(), eager.numpy(), rtol=0, atol=1e-5)
            np.testing.assert_allclose(answer.image_rows(i, layer).numpy(), eager_image_rows(out, i, layer, positions),
                                       rtol=0, atol=1e-5)
    assert dropped  # the sparse mask dropped keys: a dense row would differ


def test_a_cache_of_latents_answers_with_the_keys_its_attention_read(tmp_path):
    """Mistral Large 4 caches compressed latents, expanded into keys after the cache: the answer keeps the keys each
    call hands its attention (``vlm_cache.latent_layers``), so its rows are still the eager ones."""
    model, folder = _saved("mistral_large4", tmp_path, index_topk=4)
    vlm = vit.open_vlm(folder)
    assert vlm.same_branch
    answer = vit.ask_vlm(vlm, picture(), QUESTION, max_new_tokens=NEW_TOKENS)
    inputs = processor_inputs(folder, picture())
    reference = type(model).from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        out = reference.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, return_dict_in_generate=True,
                                 output_attentions=True)
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    for i in range(len(answer.tokens)):
        for layer in range(len(out.attentions[0])):
            seen = out.attentions[0][layer].shape[-2] + i
            np.testing.assert_allclose(answer.row(i, layer).numpy(), out.attentions[i][layer][0, :, -1, :seen].numpy(),
                                       rtol=0, atol=1e-5)


def test_the_image_tokens_are_placed_on_the_grid_the_processor_states(asked):
    if asked[0] == "dots3_note":
        pytest.skip("dots.ocr 3's top-k mask keeps too few image keys here to tell a transposed placement")
    """MiniMax-M3-VL's processor states each image's patch grid (``image_grid_thw``), merged ``merge_size`` x
    ``merge_size`` into one image token, row-major: placed so, on a grid a transposed placement would fail."""
    kind, vlm, answer, out, _, inputs = asked
    grid, unit = tuple(inputs["image_grid_thw"][0, 1:].tolist()), vlm.processor.image_processor.merge_size
    assert grid[0] != grid[1] and answer.layout.grid == grid and answer.layout.unit == unit
    checked = 0
    for i in range(len(answer.tokens)):
        # a layer whose sparse mask kept some image key (a row of 0s reads the same transposed)
        layer = max(range(len(out.attentions[0])),
                    key=lambda n: np.ptp(eager_image_rows(out, i, n, answer.layout.positions).mean(0)))
        row = eager_image_rows(out, i, layer, answer.layout.positions).mean(0)
        if np.ptp(row) == 0:
            continue
        checked += 1
        ours = answer.attention(i, layer=layer)
        np.testing.assert_allclose(ours, by_hand(row, grid, unit, 0), rtol=0, atol=1e-5)
        (gh, gw), u = grid, unit
        transposed = row.reshape(gw // u, gh // u).T.repeat(u, 0).repeat(u, 1)
        assert np.abs(ours - transposed).max() > 1e-3
    assert checked
