"""Image segments as features of a VLM's answer (issue 92, item 4): ``VLMAnswer.segments`` equals captum 0.9's own
``LLMAttribution`` call made here (its ``FeatureAblation`` / ``ShapleyValueSampling`` over an ``ImageMaskInput`` of
the same segments, a processor function written here: the chat template and the processor, as transformers' docs
write it), and one segment's ablation equals the change of the answer's log-probability done by hand on
transformers' model (the segment painted white, the image through the processor, one forward over the prompt and the
answer).
"""

import numpy as np
import pytest
import torch
from PIL import Image

transformers = pytest.importorskip("transformers")
from lazy_modules import lazy  # noqa: E402
from test_vlm_answer import QUESTION, picture, saved_whole  # noqa: E402

import vit  # noqa: E402

captum_attr = lazy("captum.attr")  # imported by the first test that reads it (tests/lazy_modules.py)

pytestmark = pytest.mark.slow  # importing transformers takes seconds

# Qwen2-VL's, Qwen3-VL's and GLM-4.1V's M-RoPE needs the processor's mm_token_type_ids (transformers 5.23 refuses
# the image without them)
KINDS = ["llava", "qwen2_5_vl", "gemma3", "qwen2_vl", "qwen3_vl", "glm4v"]
NEW = 3


@pytest.fixture(scope="module")
def vlms(tmp_path_factory):
    return saved_whole(tmp_path_factory, KINDS)


@pytest.fixture(scope="module")
def asked(vlms):
    return {kind: vit.ask_vlm(vit.open_vlm(folder), picture(), QUESTION, max_new_tokens=NEW)
            for kind, folder in vlms.items()}


def processor_fn(folder, answer: int = 0):
    """transformers alone: an image and the question through the folder's chat template and processor; the
    processor's per-token modality types (Qwen's, GLM's ``mm_token_type_ids``) extended by the ``answer``'s tokens
    with zeros (text), as ``generate`` extends them: captum appends the answer to the ids and the mask alone."""
    processor = transformers.AutoProcessor.from_pretrained(folder)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)

    def run(image):
        inputs = processor(images=[image], text=text, return_tensors="pt")
        if "mm_token_type_ids" in inputs:
            types = inputs["mm_token_type_ids"]
            inputs["mm_token_type_ids"] = torch.cat([types, types.new_zeros(1, answer)], dim=-1)
        return inputs
    return run


def first_cell_ablation_by_hand(model, run, answer: tuple[int, ...], image) -> float:
    """Cell 0 of a 2 x 3 grid of a 90 x 70 ``image`` painted white: the answer's log-probability (its tokens',
    teacher-forced after the prompt) with the image whole, less with the cell white, each one forward of ``model`` on
    ``run(image)``'s inputs and the answer appended."""
    tokens = torch.tensor([answer])

    def log_probability(shown) -> float:
        inputs = run(shown)
        prompt = inputs["input_ids"].shape[1]
        inputs["input_ids"] = torch.cat([inputs["input_ids"], tokens], -1)
        inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
        with torch.no_grad():
            logits = model(**inputs).logits[0, prompt - 1:-1].log_softmax(-1)
        return float(logits[torch.arange(len(answer)), tokens[0]].sum())

    white = np.asarray(image).copy()
    white[:35, :30] = 255
    return log_probability(image) - log_probability(Image.fromarray(white))


def cells(image, rows: int, cols: int) -> torch.Tensor:
    """(H, W) int32: ``rows x cols`` cells, row-major, each pixel's cell by its row and column."""
    r = torch.arange(image.height)[:, None] * rows // image.height
    c = torch.arange(image.width)[None, :] * cols // image.width
    return (r * cols + c).to(torch.int32)


def captums_own(folder, tokens, mask=None, mask_list=None, method="FeatureAblation", **kwargs):
    model = getattr(transformers, transformers.AutoConfig.from_pretrained(folder).architectures[0]).from_pretrained(
        folder).eval()
    tokenizer = transformers.AutoProcessor.from_pretrained(folder).tokenizer
    method = getattr(captum_attr, method)
    inp = captum_attr.ImageMaskInput(image=picture(), mask=mask, mask_list=mask_list,
                                     processor_fn=processor_fn(folder, len(tokens)))
    with torch.no_grad():
        return captum_attr.LLMAttribution(method(model), tokenizer).attribute(inp, target=torch.tensor(tokens),
                                                                 forward_in_tokens=False, **kwargs)


@pytest.mark.parametrize("kind", KINDS)
def test_feature_ablation_over_a_grid_is_captums_own_call(vlms, asked, kind):
    answer = asked[kind]
    ours = answer.segments(grid=(2, 3))
    theirs = captums_own(vlms[kind], list(answer.tokens), mask=cells(picture(), 2, 3))
    np.testing.assert_allclose(ours.seq, theirs.seq_attr.numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(ours.tokens, theirs.token_attr.numpy(), rtol=0, atol=1e-5)
    assert ours.tokens.shape == (len(answer.tokens), 6) and np.abs(ours.seq).max() > 0
    drawn = ours.map()  # each pixel its cell's value, on the image's pixels
    assert drawn.shape == (70, 90) and drawn[0, 0] == ours.seq[0] and drawn[-1, -1] == ours.seq[5]


def test_one_cells_ablation_is_the_answers_log_probability_change_by_hand(vlms, asked):
    """FeatureAblation's value of cell 0: the answer's log-probability (its tokens', teacher-forced after the prompt)
    with the image whole, less with cell 0 painted white, each a forward of transformers' model."""
    answer, folder = asked["llava"], vlms["llava"]
    model = transformers.LlavaForConditionalGeneration.from_pretrained(folder).eval()
    run = processor_fn(folder)
    image = picture()
    expected = first_cell_ablation_by_hand(model, run, answer.tokens, image)
    assert answer.segments(grid=(2, 3)).seq[0] == pytest.approx(expected, abs=1e-4)


def test_shapley_sampling_and_a_list_of_masks_are_captums_own_call(vlms, asked):
    """Shapley value sampling (its permutations seeded alike) over two overlapping masks, as ``vit.segment`` gives a
    list of boolean masks."""
    answer = asked["llava"]
    masks = [np.zeros((70, 90), bool), np.zeros((70, 90), bool)]
    masks[0][:40, :50], masks[1][30:, 40:] = True, True
    torch.manual_seed(5)
    ours = answer.segments(masks=masks, method="shapley", samples=3)
    torch.manual_seed(5)
    theirs = captums_own(vlms["llava"], list(answer.tokens), mask_list=[torch.as_tensor(m) for m in masks],
                         method="ShapleyValueSampling", n_samples=3)
    np.testing.assert_allclose(ours.seq, theirs.seq_attr.numpy(), rtol=0, atol=1e-5)
    assert ours.mask[0, 0] == 0 and ours.mask[-1, -1] == 1 and ours.mask[0, -1] == -1  # (none covers the corner)


def test_a_wrong_segmentation_or_too_much_work_is_refused_in_one_line_before_any_forward(asked, monkeypatch):
    answer = asked["llava"]
    vlm = answer._source[0]
    monkeypatch.setattr(vlm.model, "forward", lambda *a, **k: pytest.fail("the model ran"))
    for call, message in [
            (dict(), r"^give grid=\(rows, cols\) or masks=, one of them$"),
            (dict(grid=(20, 20)), r"^grid must be \(rows, cols\) whole numbers, at most 256 cells, got \(20, 20\)$"),
            (dict(masks=np.zeros((5, 5), int)), r"^masks as one array must be \(H, W\) = \(70, 90\) segment ids"),
            (dict(grid=(2, 2), method="lime"), r"^method must be one of ablation, shapley, got 'lime'$"),
            (dict(grid=(16, 16), method="shapley", samples=100),
             r"^shapley over 256 segments runs the model 25,700 times, past 4,096; choose fewer segments or "
             r"samples$")]:
        with pytest.raises(ValueError, match=message):
            answer.segments(**call)



def test_paligemmas_segments_are_captums_own_call_without_its_processors_labels(tmp_path_factory):
    """PaliGemma's processor returns ``labels`` (kept by transformers for backward compatibility) beside its
    ``token_type_ids``: captum's own call, on a processor function written here that drops them and extends the token
    types by the answer's with 1 (its causal suffix, as ``generate`` extends them), is ``segments``'s (before issue
    113 the labels reached the model and its loss refused the extended logits: a raw ValueError)."""
    folder = saved_whole(tmp_path_factory, ["paligemma"])["paligemma"]
    answer = vit.ask_vlm(vit.open_vlm(folder), picture(), QUESTION, max_new_tokens=NEW)
    processor = transformers.AutoProcessor.from_pretrained(folder)

    def run(image):
        inputs = processor(images=[image], text=processor.image_token + QUESTION, return_tensors="pt")
        inputs.pop("labels")
        types = inputs["token_type_ids"]
        inputs["token_type_ids"] = torch.cat([types, types.new_ones(1, NEW)], dim=-1)
        return inputs

    model = transformers.PaliGemmaForConditionalGeneration.from_pretrained(folder).eval()
    inp = captum_attr.ImageMaskInput(image=picture(), mask=cells(picture(), 2, 3), processor_fn=run)
    with torch.no_grad():
        theirs = captum_attr.LLMAttribution(captum_attr.FeatureAblation(model), processor.tokenizer).attribute(
            inp, target=torch.tensor(answer.tokens), forward_in_tokens=False)
    ours = answer.segments(grid=(2, 3))
    np.testing.assert_allclose(ours.seq, theirs.seq_attr.numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(ours.tokens, theirs.token_attr.numpy(), rtol=0, atol=1e-5)
    assert np.abs(ours.seq).max() > 0
