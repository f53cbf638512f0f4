"""VLMs whose language model's attention is off transformers' plain attention interface answer (issues 113, 117 item
2): GIT's ``GitSelfAttention`` and BLIP's ``BlipTextSelfAttention`` compute their softmax themselves, recorded by the
recorder at the attention function (``AttentionRecording``); Inkling 2's attention hands its eager function per-query
sinks and a relative position bias, recorded over that function. Each answer's tokens are transformers' greedy
``generate``'s on a second copy of the model opened from the folder, each answer token's row at every layer the
eager one that copy returns (``output_attentions``: GIT's self-attention over the image's states and the text,
Inkling 2's; BLIP's text decoder's cross-attention over the ViT's CLS and patches, read from its own forward), and
the drawn map is the reference row's patches laid row-major on the tower's grid (a transposed placement fails)."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

sys.path.insert(0, str(Path(__file__).parent))
from test_vlm_answer import picture  # noqa: E402
from vlm_saved import saved  # noqa: E402

import vit  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds
QUESTION = "what is this ?"


@pytest.fixture(scope="module")
def asked(tmp_path_factory):
    """``{family: (answer, reference model, the answer's inputs)}`` built lazily, each once (seed 0)."""
    built: dict = {}

    def ask(family: str):
        if family not in built:
            folder = tmp_path_factory.mktemp(family)
            saved(family, folder)
            answer = vit.ask_vlm(vit.open_vlm(folder), picture(), QUESTION, max_new_tokens=3)
            reference = transformers.AutoModelForImageTextToText.from_pretrained(
                folder, attn_implementation="eager").eval()
            built[family] = answer, reference, dict(answer._source[1].inputs)
        return built[family]

    return ask


def generated(reference, inputs: dict):
    with torch.no_grad():
        return reference.generate(**{k: v.clone() for k, v in inputs.items()}, max_new_tokens=3, do_sample=False,
                                  output_attentions=True, return_dict_in_generate=True)


@pytest.mark.parametrize("family", ["git", "inkling2"])
def test_self_attention_rows_are_generates_eager_rows(asked, family):
    answer, reference, inputs = asked(family)
    out = generated(reference, inputs)
    assert list(answer.tokens) == out.sequences[0, -len(out.attentions):].tolist()
    assert answer.layers == len(out.attentions[0])
    for i in range(len(answer.tokens)):
        for layer in range(answer.layers):
            expected = out.attentions[i][layer][0, :, -1].float()  # (H, keys): the eager row of step i
            torch.testing.assert_close(answer.row(i, layer), expected, atol=1e-5, rtol=0)


def test_git_map_is_the_eager_rows_clip_patches_row_major(asked):
    """GIT's image states (CLIP's CLS, then its patches) stand before the prompt: the map is the eager row's
    positions 1..N laid row-major on the 14 x 14 grid, CLS dropped."""
    answer, reference, inputs = asked("git")
    out = generated(reference, inputs)
    gh, gw = answer.grid
    assert answer.layout.lead == 1 and len(answer.layout.positions) == 1 + gh * gw
    for layer in range(answer.layers):
        row = out.attentions[1][layer][0, :, -1].float()  # answer token 1's query: one token, over the cache
        expected = row[:, 1:1 + gh * gw].mean(0).reshape(gh, gw).numpy()
        drawn = answer.attention(1, layer)
        np.testing.assert_allclose(drawn, expected, atol=1e-6)
        assert not np.allclose(drawn, expected.T, atol=1e-6)  # a transposed placement fails


def test_blip_reads_its_decoders_cross_attention_over_the_vits_tokens(asked):
    """BLIP's captioner (the type image-text-to-text maps, ``BlipForConditionalGeneration``): its text decoder
    writes the answer after the prompt, each token's cross-attention over the ViT's CLS and patches at every layer;
    the reference is that decoder's own forward over generate's sequence (generate returns no cross rows)."""
    answer, reference, inputs = asked("blip")
    with torch.no_grad():
        sequences = reference.generate(**{k: v.clone() for k, v in inputs.items()}, max_new_tokens=3,
                                       do_sample=False)
        states = reference.vision_model(pixel_values=inputs["pixel_values"])[0]
        forward = reference.text_decoder(input_ids=sequences[:, :-1], encoder_hidden_states=states,
                                         output_attentions=True)
    prompt = sequences.shape[1] - len(answer.tokens)
    assert list(answer.tokens) == sequences[0, prompt:].tolist()
    gh, gw = answer.grid
    assert answer.layers == len(forward.cross_attentions) and states.shape[1] == 1 + gh * gw
    for i in range(len(answer.tokens)):
        for layer in range(answer.layers):
            expected = forward.cross_attentions[layer][0, :, prompt - 1 + i].float()  # (H, 1 + N)
            torch.testing.assert_close(answer.row(i, layer), expected, atol=1e-5, rtol=0)
            drawn = answer.attention(i, layer, head=0)
            np.testing.assert_allclose(drawn, expected[0, 1:].reshape(gh, gw).numpy(), atol=1e-6)
            assert not np.allclose(drawn, expected[0, 1:].reshape(gh, gw).numpy().T, atol=1e-6)


@pytest.mark.parametrize("family", ["git", "blip", "inkling2"])
def test_readings_that_run_the_model_again_are_refused_in_one_line(asked, family):
    answer = asked(family)[0]
    with pytest.raises(ValueError, match="attention interface") as refused:
        answer.logit_lens(0)
    assert "\n" not in str(refused.value)


def test_git_answers_cost_counts_the_image_states_before_the_prompt(asked, monkeypatch):
    """GIT's decoder attends over the tower's states joined before the prompt (not in its input_ids): the answer's
    cost counts them with the prompt, against the keys transformers' eager prompt forward reads (every patch and at
    most two leading states counted before the tower has run: GIT's CLIP has one, a CLS)."""
    from vit.costs import plan
    from vit.explain.language.vlm_answer import prepare

    answer, reference, inputs = asked("git")
    attended = generated(reference, inputs).attentions[0][0].shape[-1]  # (1, H, T, T) the prompt's forward
    assert attended > inputs["input_ids"].shape[1]
    counted, count = [], plan.vlm_answer
    monkeypatch.setattr(plan, "vlm_answer", lambda *a, **k: counted.append(count(*a, **k)) or counted[-1])
    prepare(answer._source[0], picture(), QUESTION, max_new_tokens=3)
    assert attended + 3 <= counted[0].tokens <= attended + 3 + 1
