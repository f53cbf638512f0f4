"""SAM's and SAM 2's prompts through ``vit.segment`` equal transformers' whole model on the same image and prompt:
the masks and IoU scores, every decoder cross-attention, and gradient x input of a mask.

- Tiny random ``SamModel`` / ``Sam2Model`` (eager attention) saved whole with their processors (``SamProcessor``:
  longest edge 48 padded to 56; ``Sam2Processor``: a 128 px square), opened by ``vit.load``.
- The reference is the library's own: the processor turns the image and the prompt (in the image's pixels) into
  ``pixel_values``, ``input_points``, ``input_labels``, ``input_boxes``; the whole model runs on them;
  ``post_process_masks`` puts the masks on the image. Its decoder attention is what its eager attention function
  returns (``eager_attention_forward`` wrapped for the forward); its gradient is autograd on ``pixel_values``.
- The image is 90 x 50 px, so a prompt read with x and y swapped lands elsewhere (and outside the image).
"""

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from parity_helpers import hf_random
from PIL import Image

import vit
from vit.explain.methods.segment import PromptError
from vit.sources.sam_prompts import PromptHalfError

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing transformers takes seconds

SAM_VISION = dict(image_size=56, patch_size=8, hidden_size=32, mlp_dim=48, num_hidden_layers=3, num_attention_heads=2,
                  window_size=3, global_attn_indexes=[1], output_channels=16, num_pos_feats=8)
SAM2_BACKBONE = dict(model_type="sam2_hiera_det_model", hidden_size=8, embed_dim_per_stage=[8, 16, 32],
                     num_attention_heads_per_stage=[1, 2, 4], blocks_per_stage=[1, 2, 2], num_query_pool_stages=2,
                     window_size_per_stage=[4, 6, 2], global_attention_blocks=[4],
                     window_positional_embedding_background_size=[3, 3], image_size=[128, 128])
DECODER = dict(hidden_size=16, mlp_dim=24, num_attention_heads=2, iou_head_hidden_dim=8)
PROMPTS = {"points": dict(points=[(30, 20), (70, 40, 0)]), "box": dict(box=(10, 5, 80, 45)),
           "mixed": dict(points=[(52, 30)], box=(10, 5, 80, 45))}


def _sam():
    config = transformers.SamConfig(
        vision_config=SAM_VISION, prompt_encoder_config=dict(hidden_size=16, image_size=56, image_embedding_size=7,
                                                             mask_input_channels=4),
        mask_decoder_config=dict(**DECODER, num_hidden_layers=2))
    processor = transformers.SamProcessor(image_processor=transformers.SamImageProcessor(
        size={"longest_edge": 48}, pad_size={"height": 56, "width": 56}))
    return hf_random(transformers.SamModel, config), processor


def _sam2():
    vision = dict(backbone_config=SAM2_BACKBONE, backbone_channel_list=[32, 16, 8],
                  backbone_feature_sizes=[[32, 32], [16, 16], [8, 8]], fpn_hidden_size=16, fpn_top_down_levels=[1, 2])
    config = transformers.Sam2Config(vision_config=vision,
                                     prompt_encoder_config=dict(hidden_size=16, image_size=128, patch_size=16),
                                     mask_decoder_config=DECODER)
    processor = transformers.Sam2Processor(image_processor=transformers.Sam2ImageProcessor(
        size={"height": 128, "width": 128}))
    return hf_random(transformers.Sam2Model, config), processor


@pytest.fixture(scope="module", params=["sam", "sam2"])
def whole(request, tmp_path_factory):
    """(family, the library's model, its processor, our checkpoint) of a tiny model saved whole."""
    model, processor = (_sam if request.param == "sam" else _sam2)()
    folder = tmp_path_factory.mktemp(request.param) / "model"
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return request.param, model, processor, vit.load(folder, device="cpu")


@pytest.fixture(scope="module")
def image():
    return Image.fromarray(np.random.RandomState(0).randint(0, 256, (50, 90, 3)).astype(np.uint8))  # 90 x 50


def library_inputs(processor, image, points=None, box=None):
    """The processor's tensors for one image and one mask, as its docs pass a prompt."""
    kwargs = {}
    if points:
        kwargs["input_points"] = [[[list(p[:2]) for p in points]]]
        kwargs["input_labels"] = [[[p[2] if len(p) == 3 else 1 for p in points]]]
    if box:
        kwargs["input_boxes"] = [[list(box)]]
    return processor(images=image, return_tensors="pt", **kwargs)


def library_run(family, model, processor, inputs, pixel_values=None):
    run = {k: v for k, v in inputs.items() if k not in ("original_sizes", "reshaped_input_sizes")}
    if pixel_values is not None:
        run["pixel_values"] = pixel_values
    out = model(**run)
    sizes = (inputs["original_sizes"], inputs["reshaped_input_sizes"]) if family == "sam" \
        else (inputs["original_sizes"],)
    masks = processor.post_process_masks(out.pred_masks.detach(), *sizes)[0][0]  # (3, H, W)
    return out, masks


@pytest.mark.parametrize("prompt", PROMPTS)
def test_masks_and_scores_equal_the_librarys_for_the_same_prompt(whole, image, prompt):
    family, model, processor, checkpoint = whole
    inputs = library_inputs(processor, image, **PROMPTS[prompt])
    with torch.no_grad():
        out, masks = library_run(family, model, processor, inputs)
    ours = vit.segment(checkpoint, image, **PROMPTS[prompt])
    torch.testing.assert_close(torch.from_numpy(ours.scores), out.iou_scores[0, 0], rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.from_numpy(ours.mask_logits), out.pred_masks[0, 0], rtol=0, atol=1e-5)
    assert ours.masks.shape == (3, 50, 90) and ours.masks.dtype == bool
    assert (ours.masks == masks.numpy()).all()
    assert ours.mask == int(out.iou_scores[0, 0].argmax())


def test_a_prompt_read_with_x_and_y_swapped_is_not_the_librarys(whole, image):
    # What the parity test above tells apart: the library's answer to the swapped prompt is another answer
    family, model, processor, checkpoint = whole
    with torch.no_grad():
        swapped, _ = library_run(family, model, processor, library_inputs(processor, image, points=[(20, 30)]))
    ours = vit.segment(checkpoint, image, points=[(30, 20)])
    assert (torch.from_numpy(ours.mask_logits) - swapped.pred_masks[0, 0]).abs().max() > 1e-3


def recorded_attention(family, model, processor, inputs):
    """The library's decoder attention weights in call order, from its eager attention function."""
    module = __import__(f"transformers.models.{family}.modeling_{family}", fromlist=["eager_attention_forward"])
    eager, captured = module.eager_attention_forward, []

    def recording(*args, **kwargs):
        out, weights = eager(*args, **kwargs)
        captured.append(weights)
        return out, weights

    module.eager_attention_forward = recording
    try:
        with torch.no_grad():
            library_run(family, model, processor, inputs, inputs["pixel_values"])
    finally:
        module.eager_attention_forward = eager
    return captured[-7:]  # the decoder's: 2 blocks x (self, token-to-image, image-to-token), the final one


@pytest.mark.parametrize("token", ["mask", "iou"])
def test_every_decoder_cross_attention_equals_the_librarys_for_the_chosen_token(whole, image, token):
    family, model, processor, checkpoint = whole
    prompt = PROMPTS["mixed"]
    weights = recorded_attention(family, model, processor, library_inputs(processor, image, **prompt))
    ours = vit.segment(checkpoint, image, **prompt, mask=2, token=token)
    # the decoder's tokens: SAM's IoU token then 4 mask tokens; SAM 2's object-score token first; the multimask
    # outputs are mask tokens 1..3
    position = {"sam": 1, "sam2": 2}[family] + 1 + 2 if token == "mask" else {"sam": 0, "sam2": 1}[family]
    grid = {"sam": (7, 7), "sam2": (8, 8)}[family]
    expected = {}
    for i in range(2):
        t2i, i2t = weights[3 * i + 1][0], weights[3 * i + 2][0]  # (heads, queries, keys)
        expected[f"layers.{i}.cross_attn_token_to_image"] = t2i[:, position]
        expected[f"layers.{i}.cross_attn_image_to_token"] = i2t[:, :, position]
    expected["final_attn_token_to_image"] = weights[6][0][:, position]
    assert list(ours.attention) == list(expected)
    for name, reference in expected.items():
        assert ours.attention[name].shape == (2, *grid)
        torch.testing.assert_close(torch.from_numpy(ours.attention[name]), reference.reshape(2, *grid), rtol=0,
                                   atol=1e-5, msg=name)


@pytest.mark.parametrize("at", [None, (52, 30)])
def test_gradient_x_input_of_a_mask_equals_autograd_on_the_librarys_model(whole, image, at):
    family, model, processor, checkpoint = whole
    prompt = PROMPTS["mixed"]
    inputs = library_inputs(processor, image, **prompt)
    ours = vit.segment(checkpoint, image, **prompt, mask=1, methods=["gradient_x_input"], at=at)
    pixels = inputs["pixel_values"].clone().requires_grad_(True)
    out, _ = library_run(family, model, processor, inputs, pixels)
    logits = out.pred_masks[0, 0, 1]  # (h, w) over the whole input, SAM's padding included
    if at is None:
        score = logits[logits.detach() > 0].sum()
    else:  # the low-resolution cell over the pixel: the prompt's own mapping into the input
        x, y = inputs["input_points"][0, 0, 0].tolist()
        h, w = logits.shape
        score = logits[int(y * h / pixels.shape[2]), int(x * w / pixels.shape[3])]
    [grad] = torch.autograd.grad(score, pixels)
    expected = (pixels.detach() * grad).sum(dim=1)[0]  # (H, W)
    assert float(expected.abs().max()) > 0
    torch.testing.assert_close(torch.from_numpy(ours.maps["gradient_x_input"]), expected, rtol=1e-4,
                               atol=1e-5 * float(expected.abs().max()))
    grid = checkpoint.model.patch_grid(*pixels.shape[-2:])
    assert ours.patch_maps["gradient_x_input"].shape == grid


def test_a_second_prompt_on_the_same_image_runs_the_decoder_alone(whole, image):
    from vit.explain.methods.segment import segmenter

    _, _, _, checkpoint = whole
    other = Image.fromarray(np.random.RandomState(1).randint(0, 256, (50, 90, 3)).astype(np.uint8))
    first = vit.segment(checkpoint, other, points=[(10, 10)])
    encoded = segmenter(checkpoint, None).encoded  # made by vit.segment: no prompt half to open here
    second = vit.segment(checkpoint, other, points=[(60, 30, 0)], box=(5, 5, 85, 45))
    assert not first.embedding_reused and second.embedding_reused
    assert segmenter(checkpoint, None).encoded == encoded


@pytest.mark.parametrize("size", [(640, 480), (480, 640), (1024, 1024), (1500, 1000), (90, 50), (50, 90)])
def test_the_masks_on_the_image_are_the_processors_post_processed_logits_at_sam_vit_b_size(size):
    """SAM ViT-B's shapes (256 x 256 low-resolution logits, a 1,024 px input): the logits resized onto the image
    are the processor's ``post_process_masks`` floats, bit for bit, though the padding is never resized (random
    logits: a sign change at almost every pixel, so a row read off by one shows)."""
    from types import SimpleNamespace

    from vit.checkpoint import Preprocessing
    from vit.explain.methods.segment import mask_logits_on_image, masks_on_image

    processor = transformers.SamImageProcessor()
    sizes = processor(images=Image.new("RGB", size), return_tensors="pt")
    logits = torch.randn(3, 256, 256, generator=torch.Generator().manual_seed(0))
    expected = processor.post_process_masks(logits[None, None], sizes["original_sizes"],
                                            sizes["reshaped_input_sizes"], binarize=False)[0][0]
    preprocessing = Preprocessing(image_size=1024, num_channels=3, mean=(0.5,) * 3, std=(0.5,) * 3,
                                  resize_size=1024, resize_mode="longest_edge_pad")
    half = SimpleNamespace(family="sam")
    ours = mask_logits_on_image(half, logits, size, preprocessing)
    assert ours.shape == (3, size[1], size[0]) and torch.equal(ours, expected)
    assert torch.equal(masks_on_image(half, logits, size, preprocessing), expected > 0)


def test_a_prompt_runs_the_decoder_on_one_thread_whatever_the_process_uses(whole, image):
    # the decoder's ~250 small ops share no work across threads (segment.DECODER_THREADS); the count comes back
    from vit.explain.methods.segment import DECODER_THREADS, segmenter
    from vit.sources.sam_prompts import open_prompt_half

    _, _, _, checkpoint = whole
    decoder = segmenter(checkpoint, open_prompt_half).half.decoder
    seen = []
    handle = decoder.register_forward_pre_hook(lambda module, args: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        vit.segment(checkpoint, image, points=[(30, 20)])
        after = torch.get_num_threads()
    finally:
        handle.remove()
        torch.set_num_threads(before)
    assert DECODER_THREADS == 1 and seen == [1] and after == 2


def test_a_new_prompt_reuses_the_grids_positional_encoding(whole, image, monkeypatch):
    # it depends on the weights alone: the library's forward made it again at every prompt
    from vit.explain.methods.segment import segmenter
    from vit.sources.sam_prompts import open_prompt_half

    family, _, _, checkpoint = whole
    vit.segment(checkpoint, image, points=[(30, 20)])
    library = segmenter(checkpoint, open_prompt_half).half.library
    made = []
    encoding = library.get_image_wide_positional_embeddings
    monkeypatch.setattr(library, "get_image_wide_positional_embeddings", lambda: made.append(1) or encoding())
    vit.segment(checkpoint, image, points=[(60, 30, 0)])
    vit.segment(checkpoint, image, box=(10, 5, 80, 45))
    assert made == [] if family == "sam" else len(made) == 2  # SAM 2's whole forward runs as it is


def test_a_model_no_checkpoint_holds_any_more_is_let_go_with_its_prompt_half(whole, image):
    """The segmenters are kept per model, weakly: once no checkpoint holds the model, it goes, with its prompt half
    and its kept embeddings (a Segmenter holding its checkpoint kept every model it ever served alive)."""
    import gc
    import weakref

    checkpoint = vit.load(whole[3].path, device="cpu")
    vit.segment(checkpoint, image, points=[(10, 10)])
    model = weakref.ref(checkpoint.model)
    del checkpoint
    gc.collect()
    assert model() is None


@pytest.mark.parametrize(("prompt", "message"), [
    (dict(points=[(95, 10)]), r"point 0 \(95, 10\) is outside the 90x50 image"),
    (dict(points=[(10, 10, 2)]), "label must be 1 .* or 0"),
    (dict(box=(50, 5, 40, 45)), "x0 < x1"),
    (dict(), "at least one point"),
    (dict(points=[(10, 10)] * 10_000), "at most 256 points in one prompt, got 10,000"),  # 3 GB at SAM ViT-B's sizes
])
def test_a_prompt_that_cannot_be_used_is_refused_in_one_line(whole, image, prompt, message):
    _, _, _, checkpoint = whole
    with pytest.raises(PromptError, match=message) as error:
        vit.segment(checkpoint, image, **prompt)
    assert "\n" not in str(error.value)


def test_an_image_encoder_alone_is_refused_in_one_line(tmp_path, image):
    transformers.SamVisionModel(transformers.SamVisionConfig(**SAM_VISION)).save_pretrained(tmp_path / "encoder")
    with pytest.raises(PromptHalfError, match="no prompt encoder or mask decoder") as error:
        vit.segment(vit.load(tmp_path / "encoder", device="cpu"), image, points=[(10, 10)])
    assert "\n" not in str(error.value)


def test_a_whole_sam_hq_opens_its_image_encoder_and_refuses_prompts_in_one_line(tmp_path, image):
    """SAM-HQ (issue 117, item 6): its whole folder opens by SAM's port (its image encoder is SAM's; parity in
    tests/test_sam_parity.py), and its prompts, which its mask decoder reads with the encoder's intermediate
    embeddings, are refused in one line saying so."""
    transformers.SamHQModel(transformers.SamHQConfig(vision_config=SAM_VISION)).save_pretrained(tmp_path / "hq")
    checkpoint = vit.load(tmp_path / "hq", device="cpu")
    assert checkpoint.metadata["architecture"] == "hf:SamHQModel"
    with pytest.raises(PromptHalfError, match=r"^SAM-HQ's mask decoder also reads its image encoder's global "
                                              r"layers' outputs") as error:
        vit.segment(checkpoint, image, points=[(10, 10)])
    assert "\n" not in str(error.value)


def with_a_shrunk_decoder_weight(source: str | Path, tmp_path: Path) -> tuple[Path, str]:
    """A copy of the SAM folder ``source`` whose first matrix of the mask decoder lost a row: ``(folder, its
    name)``."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "shrunk"
    shutil.copytree(source, folder)
    tensors = load_file(folder / "model.safetensors")
    name = sorted(k for k, t in tensors.items() if k.startswith("mask_decoder.") and t.ndim == 2)[0]
    tensors[name] = tensors[name][:-1]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder, name


def test_a_config_transformers_refuses_is_one_line(whole, image, tmp_path):
    """Issue 114, finding 6: ``attn_implementation`` beside ``output_attentions`` in config.json was huggingface_hub's
    two-line StrictDataclassClassValidationError when the prompt half read it."""
    import json
    import shutil

    folder = tmp_path / "flags"
    shutil.copytree(whole[3].metadata["source"]["path"], folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(attn_implementation="sdpa", output_attentions=True)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"flags: its config is refused by transformers \(The `output_attentions` "
                                         r"attribute is not supported when using the `attn_implementation` set to "
                                         r"sdpa\. Please set it to 'eager' instead\.\)$") as e:
        vit.segment(vit.load(folder, device="cpu"), image, points=[(10, 10)])
    assert "\n" not in str(e.value)


def test_a_prompt_half_whose_weights_do_not_fit_its_config_is_one_line_in_the_api_and_the_cli(whole, image, tmp_path,
                                                                                                capsys):
    """Issue 95, item 6: torch's strict load raised a RuntimeError of a line per mismatch, whose first line ("Error(s)
    in loading state_dict for SamModel:") was all the CLI printed and the explorer showed as a traceback."""
    from vit.predict import main

    folder, name = with_a_shrunk_decoder_weight(whole[3].metadata["source"]["path"], tmp_path)
    with pytest.raises(PromptHalfError, match=rf"the \w+ weights do not match its config.json \(size mismatch for "
                                              rf"{re.escape(name)}: \(\d+, \d+\) in the weights") as refusal:
        vit.segment(vit.load(folder, device="cpu"), image, points=[(10, 10)])
    assert "\n" not in str(refusal.value) and str(refusal.value).endswith("(save_pretrained writes both)")
    image.save(tmp_path / "photo.png")
    capsys.readouterr()
    main([str(folder), str(tmp_path / "photo.png"), "--points", "10,10", "--device", "cpu"])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"size mismatch for {name}" in err, err


def test_a_mask_gradient_over_the_memory_limit_is_refused_before_any_work(whole, image, monkeypatch):
    from vit.costs.bounds import TooManyTokens
    from vit.explain.methods import segment

    _, _, _, checkpoint = whole
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "0.01")
    ran = []
    monkeypatch.setattr(segment, "gradient_x_input", lambda *args: ran.append(args))
    with pytest.raises(TooManyTokens, match="mask decoder|limit") as error:
        vit.segment(checkpoint, image, points=[(10, 10)], methods=["gradient_x_input"])
    assert not ran and "\n" not in str(error.value)


def test_a_method_asked_a_thousand_times_is_drawn_once(whole, image, monkeypatch):
    """Issue 114, finding 6: ``methods=("gradient_x_input",) * 1000`` ran a thousand backward passes."""
    from vit.explain.methods import segment

    _, _, _, checkpoint = whole
    ran, backward = [], segment.gradient_x_input
    monkeypatch.setattr(segment, "gradient_x_input", lambda *args: ran.append(args) or backward(*args))
    done = vit.segment(checkpoint, image, points=[(10, 10)], methods=("gradient_x_input",) * 1000)
    assert len(ran) == 1 and list(done.maps) == ["gradient_x_input"]
    with pytest.raises(ValueError, match=r"^a method is a name \(text\), got a list$"):
        vit.segment(checkpoint, image, points=[(10, 10)], methods=[["gradient_x_input"]])


def test_a_mask_gradients_refusal_advises_what_vit_segment_takes(whole, image, monkeypatch):
    """Issue 90, item 6: over the bound (at ViT-B's shapes, the default one) the advice was a smaller input size,
    which vit.segment does not take (it encodes at the model's own size): it names the limit to raise, and what runs
    without a gradient. 0.2 MB: the tiny models' forward fits, their mask gradient does not."""
    from vit.costs.bounds import TooManyTokens

    _, _, _, checkpoint = whole
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "0.2")
    with pytest.raises(TooManyTokens) as error:
        vit.segment(checkpoint, image, points=[(10, 10)], methods=["gradient_x_input"])
    message = str(error.value)
    assert message.startswith("Gradient x input of the mask keeps the image encoder's graph and the mask decoder's")
    assert "smaller input" not in message and "largest square input" not in message
    assert re.search(r"vit\.segment encodes the image at the model's own input size, never a smaller one: raise "
                     r"VIT_ANALYSIS_MEMORY_MB to [\d,]+ or more, or ask for the masks and the decoder's attention "
                     r"alone \(no gradient\)\.$", message), message

def test_predict_with_a_prompt_prints_the_librarys_scores_and_saves_the_maps(whole, image, tmp_path, capsys):
    import json

    from vit.predict import main

    family, model, processor, checkpoint = whole
    image.save(tmp_path / "photo.png")
    folder = checkpoint.path if checkpoint.path is not None else checkpoint.metadata["source"]["path"]
    code = main([str(folder), str(tmp_path / "photo.png"), "--points", "52,30", "--box", "10,5,80,45",
                 "--save-maps", str(tmp_path / "maps"), "--relevance", "gradient_x_input", "--device", "cpu"])
    [record] = json.loads(capsys.readouterr().out)
    with torch.no_grad():
        out, masks = library_run(family, model, processor, library_inputs(processor, image, **PROMPTS["mixed"]))
    assert code == 0 and record["mask"] == int(out.iou_scores[0, 0].argmax())
    torch.testing.assert_close(torch.tensor(record["scores"]), out.iou_scores[0, 0], rtol=0, atol=1e-5)
    assert record["areas"] == [int(m.sum()) for m in masks]
    saved = np.load(record["maps"]["npz"])
    torch.testing.assert_close(torch.from_numpy(saved["mask_logits"]), out.pred_masks[0, 0], rtol=0, atol=1e-5)
    assert saved["points"].tolist() == [[52, 30, 1]] and saved["box"].tolist() == [10, 5, 80, 45]
    assert saved["attention/final_attn_token_to_image"].shape[0] == 2 and "map/gradient_x_input" in saved
    assert Image.open(record["maps"]["mask0"]).size == (90, 50)


@pytest.mark.parametrize(("argv", "message"), [
    (["--points", "30"], "expected a point x,y"),
    (["--points", "30,20,5"], "label must be 1"),
    (["--mask", "1"], "--mask goes with a SAM prompt"),
    (["--points", "30,20", "--relevance", "gradient_x_input"], "give --save-maps"),
])
def test_predict_refuses_a_prompt_it_cannot_use_in_one_line(whole, image, tmp_path, capsys, argv, message):
    from vit.predict import main

    _, _, _, checkpoint = whole
    image.save(tmp_path / "photo.png")
    code = main([checkpoint.metadata["source"]["path"], str(tmp_path / "photo.png"), "--device", "cpu", *argv])
    error = capsys.readouterr().err
    assert code == 2 and message in error and error.count("\n") == 1


def test_two_sessions_prompting_one_model_at_once_each_get_their_own_decoder_attention(whole, image, monkeypatch):
    # Issue 95: the recording hooks sat on modules every session shares, so a second session's decoder, run while
    # the first's recording was open, wrote its attention into the first's. Here the first session's decoder runs,
    # then waits inside its recording while the second session's whole prompt runs; each must get what it gets alone.
    import threading

    from vit.explain.methods import segment as segment_module

    _, _, _, checkpoint = whole
    first_prompt, second_prompt = dict(points=[(30, 20)]), dict(box=(10, 5, 80, 45))
    alone = [vit.segment(checkpoint, image, **p).attention for p in (first_prompt, second_prompt)]
    original, first_decoded, second_done, results = segment_module.decode, threading.Event(), threading.Event(), {}

    def decode_then_wait(*args, **kwargs):
        out = original(*args, **kwargs)
        if threading.current_thread().name == "first":
            first_decoded.set()
            assert second_done.wait(60)
        return out

    monkeypatch.setattr(segment_module, "decode", decode_then_wait)

    def run(name, prompt):
        results[name] = vit.segment(checkpoint, image, **prompt).attention
        if name == "second":
            second_done.set()

    threads = [threading.Thread(target=run, args=("first", first_prompt), name="first"),
               threading.Thread(target=run, args=("second", second_prompt), name="second")]
    threads[0].start()
    assert first_decoded.wait(60)  # the first session's recording is open, its decoder run: now the second's
    threads[1].start()
    for thread in threads:
        thread.join(120)
    for got, expected in zip((results["first"], results["second"]), alone, strict=True):
        assert got.keys() == expected.keys()
        for key in expected:
            np.testing.assert_array_equal(got[key], expected[key])
