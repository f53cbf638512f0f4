"""Llama 3.2 Vision answers (issue 92, item 1): a language model that reads the image through cross-attention layers
(``MllamaForConditionalGeneration``: its self-attention sees one ``<|image|>`` placeholder, its ``cross_attn`` layers
the tower's states, each tile's CLS then its patches). Each answer token's map at a cross-attention layer is the row
transformers' eager ``generate(output_attentions=True)`` returns at that layer, over the tower's states, placed on
the tiles' canvas where the processor cut each tile (read off the pixels the tower read, not from our layout); the
maps that read the image's tokens in the sequence are refused in one line.

The model is ``test_vlm_answer``'s tiny random one (``_build("mllama")``), saved whole with its processor."""

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_vlm_answer import (  # noqa: E402
    NEW_TOKENS,
    QUESTION,
    _differs,
    eager_generate,
    picture,
    processor_inputs,
    quadrant_places,
    quadrants,
    saved_whole,
)

import vit  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

ATOL = 1e-5
CROSS_LAYERS = (1, 3)  # the decoder layers that cross-attend (the config's cross_attention_layers)
SIDE, CELLS = 32, 4  # a tile's pixels, patches per side
PER_TILE = CELLS * CELLS + 1  # a tile's states: its CLS, then its patches


@pytest.fixture(scope="module")
def mllama(tmp_path_factory):
    return saved_whole(tmp_path_factory, ["mllama"])["mllama"]


def expected_map(row: np.ndarray, places: list[tuple[int, int]], rows: int, cols: int) -> np.ndarray:
    """The row over the tower's states written by hand onto the canvas: tile ``k``'s patches (after its CLS) at the
    canvas place its pixels came from."""
    canvas = np.zeros((rows * CELLS, cols * CELLS), dtype=np.float32)
    for k, (r, c) in enumerate(places):
        patches = row[k * PER_TILE + 1:(k + 1) * PER_TILE].reshape(CELLS, CELLS)
        canvas[r * CELLS:(r + 1) * CELLS, c * CELLS:(c + 1) * CELLS] = patches
    return canvas


@pytest.mark.parametrize(("width", "height", "places"), [(80, 80, [(0, 0), (0, 1), (1, 0), (1, 1)]),
                                                         (100, 50, [(0, 0), (0, 1)])])
def test_each_tokens_map_is_the_eager_cross_attention_row_placed_on_the_tiles(mllama, width, height, places):
    """Every answer token, every cross-attention layer and head: the eager row over the tower's states, each tile's
    patches where the processor cut it (a wide image's two tiles side by side, not stacked); the tokens are
    generate's; the row's share on the image is its whole (the tiles past the canvas masked)."""
    image = quadrants(width, height)
    answer = vit.ask_vlm(vit.open_vlm(mllama), image, QUESTION, max_new_tokens=NEW_TOKENS)
    out, inputs, _ = eager_generate(mllama, image)
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    found = quadrant_places(inputs["pixel_values"][0, 0, :len(places)])
    rows, cols = max(p[0] for p in places) + 1, max(p[1] for p in places) + 1
    assert found == places and answer.grid == (rows * CELLS, cols * CELLS) and answer.layers == len(CROSS_LAYERS)
    for i in range(NEW_TOKENS):
        for k, layer in enumerate(CROSS_LAYERS):
            heads = out.attentions[i][layer][0, :, -1].numpy()  # (H, tiles x 17): the tower's states
            np.testing.assert_allclose(answer.image_rows(i, k).numpy(), heads, rtol=0, atol=ATOL)
            for head in (*range(heads.shape[0]), None):
                row = heads.mean(0) if head is None else heads[head]
                np.testing.assert_allclose(answer.attention(i, k, head), expected_map(row, found, rows, cols),
                                           rtol=0, atol=ATOL)
            assert answer.image_share(i, k) == pytest.approx(1.0, abs=1e-5)
    row = out.attentions[1][CROSS_LAYERS[-1]][0, :, -1].numpy().mean(0)
    swapped = [found[1], found[0], *found[2:]]  # the first two tiles in each other's place: another map
    assert _differs(answer.attention(1, -1), expected_map(row, swapped, rows, cols))


def test_the_map_is_drawn_over_the_tiles_canvas_the_tower_read(mllama):
    """The canvas's pixels are the processor's tiles side by side, its normalisation undone."""
    answer = vit.ask_vlm(vit.open_vlm(mllama), quadrants(100, 50), QUESTION, max_new_tokens=1)
    processor = transformers.AutoProcessor.from_pretrained(mllama).image_processor
    tiles = processor(images=[[quadrants(100, 50)]], return_tensors="pt")["pixel_values"][0, 0, :2]
    mean, std = torch.tensor(processor.image_mean)[:, None, None], torch.tensor(processor.image_std)[:, None, None]
    pixels = ((tiles * std + mean) / processor.rescale_factor).round().clamp(0, 255).byte()
    canvas = torch.cat(list(pixels), dim=-1).permute(1, 2, 0).numpy()  # (32, 64, 3): left tile, right tile
    assert np.array_equal(answer.layouts[0].pixels, canvas)


def test_gradient_x_attention_at_a_cross_attention_layer_is_chefers_rule_on_the_eager_model(mllama):
    """One layer's gradient x attention (Chefer et al. 2021b's ``mean_h (dy/dA ⊙ A)^+``) at each cross-attention
    layer: autograd of the answer token's logit to the eager model's cross-attention probabilities over the tower's
    states, from one forward over the prompt and the answer's first ``i`` tokens (the cross-attention mask extended
    as generate extends it), placed on the tiles' canvas by hand."""
    image = quadrants(80, 80)
    answer = vit.ask_vlm(vit.open_vlm(mllama), image, QUESTION, max_new_tokens=NEW_TOKENS)
    model = transformers.MllamaForConditionalGeneration.from_pretrained(mllama, attn_implementation="eager").eval()
    base = processor_inputs(mllama, image)
    places = [(0, 0), (0, 1), (1, 0), (1, 1)]
    for i in (0, NEW_TOKENS - 1):
        new = torch.tensor([answer.tokens[:i]], dtype=torch.long)
        mask = base["cross_attention_mask"]
        out = model(input_ids=torch.cat([base["input_ids"], new], -1),
                    attention_mask=torch.cat([base["attention_mask"], torch.ones_like(new)], -1),
                    cross_attention_mask=torch.cat([mask, mask[:, -1:].expand(-1, i, -1, -1)], 1),
                    pixel_values=base["pixel_values"], aspect_ratio_ids=base["aspect_ratio_ids"],
                    aspect_ratio_mask=base["aspect_ratio_mask"], output_attentions=True, use_cache=False)
        attentions = [out.attentions[layer] for layer in CROSS_LAYERS]  # (1, H, T, states), in the graph
        grads = torch.autograd.grad(out.logits[0, -1, answer.tokens[i]], attentions)
        for k, (g, a) in enumerate(zip(grads, attentions, strict=True)):
            cam = (g * a)[0].clamp(min=0).mean(0)[-1].detach().numpy()  # the query that predicted token i
            expected = expected_map(cam, places, 2, 2)
            assert np.abs(expected).max() > 0
            np.testing.assert_allclose(answer.relevance(i, k), expected, rtol=0,
                                       atol=ATOL * max(1.0, float(np.abs(expected).max())))


@pytest.mark.parametrize(("call", "what"), [
    (lambda a: a.relevance(0), "the rollout of gradient x attention"),
    (lambda a: a.tam(0), "TAM"),
])
def test_the_maps_that_read_image_tokens_in_the_sequence_are_refused_in_one_line(mllama, call, what):
    answer = vit.ask_vlm(vit.open_vlm(mllama), picture(), QUESTION, max_new_tokens=2)
    with pytest.raises(ValueError, match=rf"^{what} reads the image's tokens in the language model's sequence, and "
                                         r"this model reads the image through its cross-attention layers instead: "
                                         r"ask its attention$"):
        call(answer)


TWO = (quadrants(80, 80), quadrants(100, 50))  # a square image (2 x 2 tiles) and a wide one (1 x 2)
TWO_CANVASES = ((2, 2, [(0, 0), (0, 1), (1, 0), (1, 1)]), (1, 2, [(0, 0), (0, 1)]))  # rows, cols, tiles' places


@pytest.fixture(scope="module")
def two_images(mllama):
    """Two images in one question: our answer, and transformers' eager generate over the processor's prompt of both
    (the chat template's two ``<|image|>`` in a row, so every later token cross-attends to both)."""
    from test_vlm_several_images import eager_two

    return (vit.ask_vlm(vit.open_vlm(mllama), list(TWO), QUESTION, max_new_tokens=NEW_TOKENS),
            *eager_two(mllama, TWO)[:2])


def test_two_images_each_tokens_map_on_each_image_is_the_eager_rows_slice_over_its_tile_slots(two_images):
    """The row over the tower's states holds the first image's tile slots (the processor's ``max_image_tiles``, the
    slots past its canvas masked), then the second's. Each answer token's map at each cross-attention layer and head
    on each image is the eager row's slice over that image's states, its tiles where the processor cut them (read
    off the pixels); its share per image the slice's sum. The second image's slice on the first's canvas would be
    another map."""
    answer, out, inputs = two_images
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    slots = inputs["pixel_values"].shape[2] * PER_TILE
    for m, (rows, cols, places) in enumerate(TWO_CANVASES):
        assert quadrant_places(inputs["pixel_values"][0, m, :rows * cols]) == places
    assert [layout.grid for layout in answer.layouts] == [(8, 8), (4, 8)]
    for i in range(NEW_TOKENS):
        for k, layer in enumerate(CROSS_LAYERS):
            heads = out.attentions[i][layer][0, :, -1].numpy()  # (H, both images' tile slots' states)
            assert heads.shape[1] == 2 * slots
            for m, (rows, cols, places) in enumerate(TWO_CANVASES):
                mine = heads[:, m * slots:(m + 1) * slots]
                for head in (*range(heads.shape[0]), None):
                    row = mine.mean(0) if head is None else mine[head]
                    np.testing.assert_allclose(answer.attention(i, k, head, image=m),
                                               expected_map(row, places, rows, cols), rtol=0, atol=ATOL)
                share = float(mine.sum(-1).mean())
                assert answer.image_share(i, k, image=m) == pytest.approx(share, abs=1e-5) and share > 0.05
            assert answer.image_share(i, k) == pytest.approx(1.0, abs=1e-5)
    row = out.attentions[1][CROSS_LAYERS[-1]][0, :, -1].numpy().mean(0)
    assert _differs(answer.attention(1, -1, image=0), expected_map(row[slots:], TWO_CANVASES[0][2], 2, 2))


def test_two_images_gradient_x_attention_and_each_images_ablation_are_the_eager_models_by_hand(two_images, mllama):
    """On each image: one layer's gradient x attention is Chefer's rule by autograd on the eager model's
    cross-attention probabilities, the slice over that image's states placed on its canvas; ablating the image is the
    answer token's logit with every state of its tile slots zeroed (or set to the mean of its canvas's patch states)
    in the ``cross_attention_states`` handed to transformers' model by hand."""
    answer, _, inputs = two_images
    model = transformers.MllamaForConditionalGeneration.from_pretrained(mllama, attn_implementation="eager").eval()
    slots = inputs["pixel_values"].shape[2] * PER_TILE
    with torch.no_grad():
        vision = model.model.vision_model(pixel_values=inputs["pixel_values"],
                                          aspect_ratio_ids=inputs["aspect_ratio_ids"],
                                          aspect_ratio_mask=inputs["aspect_ratio_mask"]).last_hidden_state
        states = model.model.multi_modal_projector(vision).reshape(1, -1, model.config.text_config.hidden_size)
    second = slice(slots, 2 * slots)
    patches = [slots + k * PER_TILE + 1 + p for k in (0, 1) for p in range(CELLS * CELLS)]  # the wide canvas's
    for i in (0, NEW_TOKENS - 1):
        new = torch.tensor([answer.tokens[:i]], dtype=torch.long)
        mask = inputs["cross_attention_mask"]
        run = {"input_ids": torch.cat([inputs["input_ids"], new], -1),
               "attention_mask": torch.cat([inputs["attention_mask"], torch.ones_like(new)], -1),
               "cross_attention_mask": torch.cat([mask, mask[:, -1:].expand(-1, i, -1, -1)], 1), "use_cache": False}
        out = model(**run, pixel_values=inputs["pixel_values"], aspect_ratio_ids=inputs["aspect_ratio_ids"],
                    aspect_ratio_mask=inputs["aspect_ratio_mask"], output_attentions=True)
        attentions = [out.attentions[layer] for layer in CROSS_LAYERS]
        grads = torch.autograd.grad(out.logits[0, -1, answer.tokens[i]], attentions)
        for k, (g, a) in enumerate(zip(grads, attentions, strict=True)):
            cam = (g * a)[0].clamp(min=0).mean(0)[-1].detach().numpy()
            for m, (rows, cols, places) in enumerate(TWO_CANVASES):
                expected = expected_map(cam[m * slots:(m + 1) * slots], places, rows, cols)
                np.testing.assert_allclose(answer.relevance(i, k, image=m), expected, rtol=0,
                                           atol=ATOL * max(1.0, float(np.abs(expected).max())))
        for how in ("zero", "mean"):
            ablated = states.clone()
            ablated[0, second] = 0 if how == "zero" else states[0, patches].mean(0)
            with torch.no_grad():
                logits = [float(model(**run, cross_attention_states=handed).logits[0, -1, answer.tokens[i]])
                          for handed in (states, ablated)]
            ours = answer.ablate_image(i, 1, how=how)
            assert ours.image_tokens == slots and abs(logits[1] - logits[0]) > 1e-4
            assert ours.logit == pytest.approx(logits[0], abs=1e-4)
            assert ours.ablated_logit == pytest.approx(logits[1], abs=1e-4)


def test_predict_ask_writes_the_cross_attention_maps_and_refuses_the_others_before_answering(mllama, tmp_path, capsys):
    """``vit-predict --ask --save-maps`` writes each token's attention at every cross-attention layer and head (its
    default TAM left out: no image tokens in the sequence), the API's; another ``--lm-method`` is refused in one
    line before any answer."""
    from vit.predict import main

    picture().save(tmp_path / "photo.png")
    assert main([str(mllama), str(tmp_path / "photo.png"), "--ask", QUESTION, "--max-new-tokens", "3",
                 "--save-maps", str(tmp_path / "maps"), "--device", "cpu"]) == 0
    saved = np.load(tmp_path / "maps" / "photo.npz")
    assert "tam" not in saved.files and saved["attention"].shape[:3] == (3, len(CROSS_LAYERS), 4)
    answer = vit.ask_vlm(vit.open_vlm(mllama), picture(), QUESTION, max_new_tokens=3)
    np.testing.assert_allclose(saved["attention"][2, 1, 3], answer.attention(2, 1, 3), rtol=0, atol=1e-6)
    capsys.readouterr()
    assert main([str(mllama), str(tmp_path / "photo.png"), "--ask", QUESTION, "--save-maps", str(tmp_path / "m2"),
                 "--lm-method", "tam", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("mllama reads the image through cross-attention layers: --lm-method attention or lens or "
                        "attnlrp")
    assert len(err.splitlines()) == 1 and not (tmp_path / "m2" / "photo.npz").exists()
    assert main([str(mllama), str(tmp_path / "photo.png"), "--ask", QUESTION, "--max-new-tokens", "2", "--save-maps",
                 str(tmp_path / "m3"), "--lm-method", "attnlrp", "--device", "cpu"]) == 0
    saved = np.load(tmp_path / "m3" / "photo.npz")
    np.testing.assert_allclose(saved["attnlrp"][1], answer.relevance(1, method="attnlrp"), rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def florence2(tmp_path_factory):
    return saved_whole(tmp_path_factory, ["florence2"])["florence2"]


def florence_eager(folder, image):
    """transformers alone: Florence-2's eager model, its processor's inputs for ``image`` and the question (the
    processor lays out the image's tokens itself), greedy ``generate`` with every step's attentions."""
    model = transformers.Florence2ForConditionalGeneration.from_pretrained(folder, attn_implementation="eager")
    inputs = transformers.AutoProcessor.from_pretrained(folder)(images=[image], text=QUESTION, return_tensors="pt")
    with torch.no_grad():
        out = model.eval().generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, output_attentions=True,
                                    return_dict_in_generate=True)
    return out, inputs, model.config.image_token_id


def test_florence2s_answer_is_its_decoders_cross_attention_to_the_images_tokens(florence2):
    """Florence-2 (an encoder-decoder): the answer is generate's decoder tokens after its start token; each token's
    map at each decoder layer and head is the eager cross-attention row over the encoder's image tokens: the grid's
    mean first (it covers no patch), then the 4 x 4 grid row-major (transposed would be another map); drawn over the
    pixels the processor prepared; one layer's gradient x attention Chefer's rule on the eager model's
    cross-attention."""
    from test_vlm_answer import by_hand

    image = picture()
    answer = vit.ask_vlm(vit.open_vlm(florence2), image, QUESTION, max_new_tokens=NEW_TOKENS)
    out, inputs, image_token = florence_eager(florence2, image)
    assert list(answer.tokens) == out.sequences[0, 1:].tolist()  # after the decoder's start token
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    assert len(positions) == 17 and answer.grid == (4, 4) and answer.layers == 2
    for i in range(NEW_TOKENS):
        for layer in range(answer.layers):
            heads = out.cross_attentions[i][layer][0, :, -1, positions].numpy()  # (H, 1 + 16)
            for head in (*range(heads.shape[0]), None):
                row = heads.mean(0) if head is None else heads[head]
                np.testing.assert_allclose(answer.attention(i, layer, head), by_hand(row, (4, 4), 1, 1),
                                           rtol=0, atol=ATOL)
    row = out.cross_attentions[2][1][0, :, -1, positions].numpy().mean(0)
    assert _differs(answer.attention(2, 1), by_hand(row, (4, 4), 1, 1).T)
    assert _differs(answer.attention(2, 1), by_hand(row, (4, 4), 1, 0)[:4, :4])  # the mean read as a patch
    processor = transformers.AutoProcessor.from_pretrained(florence2).image_processor
    mean, std = torch.tensor(processor.image_mean)[:, None, None], torch.tensor(processor.image_std)[:, None, None]
    pixels = ((inputs["pixel_values"][0] * std + mean) / processor.rescale_factor).round().clamp(0, 255).byte()
    assert np.array_equal(answer.layouts[0].pixels, pixels.permute(1, 2, 0).numpy())
    with pytest.raises(ValueError, match=r"^the logit lens reads a decoder-only language model's stream, and this "
                                         r"model's answer is written by an encoder-decoder's decoder: ask its "
                                         r"attention$"):
        answer.logit_lens(0)
    with pytest.raises(ValueError, match=r"^TAM reads the image's tokens in the language model's sequence"):
        answer.tam(0)
    for call, what in ((lambda: answer.ablate(0, (0, 0, 1, 1)), "a region's ablation"),
                       (lambda: answer.patch(0, (0, 0, 1, 1), image), "a region's patching"),
                       (lambda: answer.relevance(0, method="attnlrp"), "AttnLRP"),
                       (lambda: answer.segments(grid=(2, 2)), "captum's segment attribution")):
        with pytest.raises(ValueError, match=rf"^{what} runs a decoder-only language model here, and this model's "
                                             r"answer is written by an encoder-decoder's decoder: ask its attention "
                                             r"or gradient × attention$"):
            call()
    model = transformers.Florence2ForConditionalGeneration.from_pretrained(florence2, attn_implementation="eager")
    for i in (0, NEW_TOKENS - 1):  # one layer's gradient x attention: Chefer's rule by autograd on the eager model
        decoder = torch.tensor([[model.generation_config.decoder_start_token_id, *answer.tokens[:i]]])
        out = model.eval()(**inputs, decoder_input_ids=decoder, output_attentions=True, use_cache=False)
        grads = torch.autograd.grad(out.logits[0, -1, answer.tokens[i]], out.cross_attentions)
        for layer, (g, a) in enumerate(zip(grads, out.cross_attentions, strict=True)):
            cam = (g * a)[0].clamp(min=0).mean(0)[-1].detach().numpy()[positions.numpy()]
            expected = by_hand(cam, (4, 4), 1, 1)
            assert np.abs(expected).max() > 0
            np.testing.assert_allclose(answer.relevance(i, layer), expected, rtol=0,
                                       atol=ATOL * max(1.0, float(np.abs(expected).max())))


def test_florence2_larges_tower_is_within_the_parameters_its_weights_hold(monkeypatch, tmp_path):
    """The declared tower's lower bound on its parameters (``declared._declared_tower_problem``) holds for
    Florence-2-large's DaViT (depths 1, 1, 9, 1 up to 2,048 wide): built on the meta device, its weights are not
    refused as fewer than its config declares (the bound once counted every block at the widest width)."""
    from vit.sources import open as opening
    from vit.sources.vlm import declared

    config = transformers.Florence2VisionConfig(depths=[1, 1, 9, 1], embed_dim=[256, 512, 1024, 2048],
                                                num_heads=[8, 16, 32, 64], num_groups=[8, 16, 32, 64],
                                                projection_dim=1024)
    with torch.device("meta"):
        tower = transformers.models.florence2.modeling_florence2.Florence2VisionBackbone(config)
    monkeypatch.setattr(opening, "read_hf_weights", lambda folder, device: dict(tower.state_dict()))
    vision = {**config.to_dict(), "model_type": "florence_vision"}
    assert declared._declared_tower_problem(tmp_path, {"vision_config": vision}) is None
    monkeypatch.setattr(opening, "read_hf_weights", lambda folder, device: {"one": torch.empty(10, device="meta")})
    refused = declared._declared_tower_problem(tmp_path, {"vision_config": vision})
    assert "declares a vision tower of at least" in refused


def extended_processor_fn(folder, n: int):
    """transformers alone: an image and the question through the processor, the cross-attention mask extended by the
    ``n`` answer tokens captum appends to the ids, its last row repeated as generate extends it."""
    def run(image):
        inputs = dict(processor_inputs(folder, image))
        mask = inputs["cross_attention_mask"]
        inputs["cross_attention_mask"] = torch.cat([mask, mask[:, -1:].expand(-1, n, -1, -1)], 1)
        return inputs
    return run


def test_segment_attribution_is_captums_own_call_and_one_cells_ablation_the_log_probability_change(mllama):
    """Llama 3.2 Vision's answer over image segments: captum's ``FeatureAblation`` over an ``ImageMaskInput``, called
    here on transformers' model with the processor function above, and cell 0's value the answer's log-probability
    with the image whole less with cell 0 painted white, each one forward of transformers' model over the prompt and
    the answer (the cross-attention mask extended as generate extends it)."""
    from captum.attr import FeatureAblation, ImageMaskInput, LLMAttribution
    from test_vlm_segments import first_cell_ablation_by_hand

    image = picture()
    answer = vit.ask_vlm(vit.open_vlm(mllama), image, QUESTION, max_new_tokens=NEW_TOKENS)
    ours = answer.segments(grid=(2, 3))
    model = transformers.MllamaForConditionalGeneration.from_pretrained(mllama).eval()
    tokenizer = transformers.AutoProcessor.from_pretrained(mllama).tokenizer
    run = extended_processor_fn(mllama, len(answer.tokens))
    r = torch.arange(image.height)[:, None] * 2 // image.height
    c = torch.arange(image.width)[None, :] * 3 // image.width
    inp = ImageMaskInput(image=image, mask=(r * 3 + c).to(torch.int32), processor_fn=run)
    with torch.no_grad():
        theirs = LLMAttribution(FeatureAblation(model), tokenizer).attribute(
            inp, target=torch.tensor(answer.tokens), forward_in_tokens=False)
    np.testing.assert_allclose(ours.seq, theirs.seq_attr.numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(ours.tokens, theirs.token_attr.numpy(), rtol=0, atol=1e-5)
    assert np.abs(ours.seq).max() > 0

    assert ours.seq[0] == pytest.approx(first_cell_ablation_by_hand(model, run, answer.tokens, image), abs=1e-4)


@pytest.mark.parametrize("how", ["zero", "mean"])
def test_a_regions_ablation_is_the_logit_with_its_patches_tower_states_ablated_by_hand(mllama, how):
    """The answer token's logit with the projected tower states of a box's patches zeroed (or set to the mean of the
    canvas's patch states: not the tiles' CLS, nor the padding tile slots), handed to transformers' model as its
    ``cross_attention_states``, the cross-attention mask extended as generate extends it. A wide image: two tiles
    side by side on a 4 x 8 canvas, the processor's other tile slots padding; the box covers the right tile's
    top-left 2 x 2 patches (states 18, 19, 22, 23 of tile 1: its CLS first)."""
    image = quadrants(100, 50)
    answer = vit.ask_vlm(vit.open_vlm(mllama), image, QUESTION, max_new_tokens=NEW_TOKENS)
    model = transformers.MllamaForConditionalGeneration.from_pretrained(mllama).eval()
    base = processor_inputs(mllama, image)
    with torch.no_grad():
        vision = model.model.vision_model(pixel_values=base["pixel_values"], aspect_ratio_ids=base["aspect_ratio_ids"],
                                          aspect_ratio_mask=base["aspect_ratio_mask"]).last_hidden_state
        states = model.model.multi_modal_projector(vision).reshape(1, -1, model.config.text_config.hidden_size)
    box = [PER_TILE + 1 + r * CELLS + c for r in (0, 1) for c in (0, 1)]
    patches = [k * PER_TILE + 1 + p for k in (0, 1) for p in range(CELLS * CELLS)]
    ablated = states.clone()
    ablated[0, box] = 0 if how == "zero" else states[0, patches].mean(0)
    for i in (0, NEW_TOKENS - 1):
        new = torch.tensor([answer.tokens[:i]], dtype=torch.long)
        mask = base["cross_attention_mask"]
        logits = []
        for handed in (states, ablated):
            with torch.no_grad():
                out = model(input_ids=torch.cat([base["input_ids"], new], -1),
                            attention_mask=torch.cat([base["attention_mask"], torch.ones_like(new)], -1),
                            cross_attention_mask=torch.cat([mask, mask[:, -1:].expand(-1, i, -1, -1)], 1),
                            cross_attention_states=handed, use_cache=False)
            logits.append(float(out.logits[0, -1, answer.tokens[i]]))
        ours = answer.ablate(i, (0, CELLS, 2, CELLS + 2), how=how)
        assert ours.image_tokens == 4
        assert ours.logit == pytest.approx(logits[0], abs=1e-4)
        assert ours.ablated_logit == pytest.approx(logits[1], abs=1e-4)
        assert abs(logits[1] - logits[0]) > 1e-4  # the ablation moved it


def test_attnlrp_through_the_cross_attention_equals_lxts_rules_on_transformers_whole_model(mllama, monkeypatch):
    """AttnLRP of an answer token to the pixels: lxt's rules patched into transformers' eager model as
    ``test_vlm_answer_attnlrp`` patches them (the cross-attention runs the modelling file's eager attention, wrapped as
    the self-attention is), the cross-attention mask extended as generate extends it; input x gradient summed over
    the channels and each tile's 8 x 8-pixel patches, the wide image's two tiles side by side by hand (the processor's
    padding slots dropped). Fails with the tiles swapped."""
    from test_vlm_answer_attnlrp import _patch_lxt, assert_equal_to_lxt

    image = quadrants(100, 50)
    answer = vit.ask_vlm(vit.open_vlm(mllama), image, QUESTION, max_new_tokens=NEW_TOKENS)
    model = transformers.MllamaForConditionalGeneration.from_pretrained(mllama, attn_implementation="eager").eval()
    base = processor_inputs(mllama, image)
    for i in (0, NEW_TOKENS - 1):
        new = torch.tensor([answer.tokens[:i]], dtype=torch.long)
        mask = base["cross_attention_mask"]
        x = base["pixel_values"].clone().requires_grad_(True)
        with monkeypatch.context() as m, torch.enable_grad():
            _patch_lxt(m, model)
            logits = model(input_ids=torch.cat([base["input_ids"], new], -1),
                           attention_mask=torch.cat([base["attention_mask"], torch.ones_like(new)], -1),
                           cross_attention_mask=torch.cat([mask, mask[:, -1:].expand(-1, i, -1, -1)], 1),
                           pixel_values=x, aspect_ratio_ids=base["aspect_ratio_ids"],
                           aspect_ratio_mask=base["aspect_ratio_mask"], use_cache=False).logits
            logits[0, -1, answer.tokens[i]].backward()
        relevance = (x * x.grad).detach()[0, 0]  # (tile slots, C, 32, 32)
        step = SIDE // CELLS
        tiles = relevance.sum(1).reshape(-1, CELLS, step, CELLS, step).sum((2, 4))  # (slots, 4, 4)
        ours = answer.relevance(i, method="attnlrp")
        assert_equal_to_lxt(ours, torch.cat([tiles[0], tiles[1]], dim=1).numpy())
        assert _differs(ours, torch.cat([tiles[1], tiles[0]], dim=1).numpy())
    with pytest.raises(ValueError, match=r"^this image was read in one view, not as tiles beside an overview; ask "
                                         r"without overview$"):
        answer.relevance(0, overview=True, method="attnlrp")


def test_attnlrp_counts_the_tower_over_every_tile_slot_at_once_before_any_forward(mllama, monkeypatch):
    """Llama 3.2 Vision's tower attends over all its tile slots (the padding's too) in one sequence: AttnLRP's graph
    is counted as one view of them all, not as tiles apart, and refused in one line before the model runs."""
    from vit.costs import plan
    from vit.costs.bounds import TooManyTokens

    image = quadrants(100, 50)
    answer = vit.ask_vlm(vit.open_vlm(mllama), image, QUESTION, max_new_tokens=2)
    slots = processor_inputs(mllama, image)["pixel_values"].shape[2]
    seen = {}
    counted = plan.vlm_attnlrp

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return counted(*args, **kwargs)
    monkeypatch.setattr(plan, "vlm_attnlrp", spy)
    monkeypatch.setattr(answer._source[0].model, "forward", lambda *a, **k: pytest.fail("the model ran"))
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "0.01")
    with pytest.raises(TooManyTokens, match=r"^AttnLRP of answer token 1 runs the model over \d+ tokens \(a "
                                            r"4x8-patch image\)"):
        answer.relevance(1, method="attnlrp")
    assert slots > 2 and seen["views"] == 1 and seen["view_grid"] == (slots * CELLS, CELLS)


def test_patching_a_regions_tower_states_from_a_source_image_is_the_same_intervention_by_hand(mllama):
    """Llama 3.2 Vision's region patching: the projected tower states of the box's patches (its cross-attention
    layers' keys and values) replaced by those a source image of the same canvas gives, handed to transformers' model
    by hand as its ``cross_attention_states``."""
    image, source = quadrants(100, 50), quadrants(100, 50).rotate(180)
    answer = vit.ask_vlm(vit.open_vlm(mllama), image, QUESTION, max_new_tokens=NEW_TOKENS)
    model = transformers.MllamaForConditionalGeneration.from_pretrained(mllama).eval()

    def states_of(picture_):
        base = processor_inputs(mllama, picture_)
        with torch.no_grad():
            vision = model.model.vision_model(pixel_values=base["pixel_values"],
                                              aspect_ratio_ids=base["aspect_ratio_ids"],
                                              aspect_ratio_mask=base["aspect_ratio_mask"]).last_hidden_state
            return base, model.model.multi_modal_projector(vision).reshape(1, -1, model.config.text_config.hidden_size)

    (base, states), (_, theirs) = states_of(image), states_of(source)
    box = [PER_TILE + 1 + r * CELLS + c for r in (0, 1) for c in (0, 1)]  # the right tile's top-left 2 x 2 patches
    patched = states.clone()
    patched[0, box] = theirs[0, box]
    i = NEW_TOKENS - 1
    new = torch.tensor([answer.tokens[:i]], dtype=torch.long)
    mask = base["cross_attention_mask"]
    with torch.no_grad():
        logits = [float(model(input_ids=torch.cat([base["input_ids"], new], -1),
                              attention_mask=torch.cat([base["attention_mask"], torch.ones_like(new)], -1),
                              cross_attention_mask=torch.cat([mask, mask[:, -1:].expand(-1, i, -1, -1)], 1),
                              cross_attention_states=handed, use_cache=False).logits[0, -1, answer.tokens[i]])
                  for handed in (states, patched)]
    ours = answer.patch(i, (0, CELLS, 2, CELLS + 2), source)
    assert ours.image_tokens == 4 and abs(logits[1] - logits[0]) > 1e-4
    assert ours.logit == pytest.approx(logits[0], abs=1e-4) and ours.ablated_logit == pytest.approx(logits[1], abs=1e-4)


def test_the_answer_counts_the_tower_over_every_tile_slot_of_each_image_at_once(mllama, monkeypatch):
    """The answer's count (``vit.costs.plan.vlm_answer``) takes the tower's one pass over every tile slot of an image
    (the padding slots too: its attention runs over them all), one per image, not the canvas's tiles apart; and the
    logit lens' and gradient x attention's counts take every image's, not the first's alone."""
    from vit.costs import plan

    seen = []
    for name in ("vlm_answer", "vlm_lens", "vlm_relevance"):
        counted = getattr(plan, name)
        monkeypatch.setattr(plan, name, lambda *a, _name=name, _counted=counted, **k: seen.append((_name, a, k))
                            or _counted(*a, **k))
    slots = processor_inputs(mllama, quadrants(100, 50))["pixel_values"].shape[2]
    answer = vit.ask_vlm(vit.open_vlm(mllama), [quadrants(100, 50), quadrants(80, 80)], QUESTION, max_new_tokens=2)
    [(_, args, _)] = [s for s in seen if s[0] == "vlm_answer"]
    assert slots > 2 and args[5:] == (2, (slots * CELLS, CELLS))
    answer.ablate_image(1, 1)
    answer.relevance(1, 0, image=1)
    counts = {name: (k["views"], k["view_grid"]) for name, _, k in seen if name != "vlm_answer"}
    assert counts == {"vlm_lens": (2, (slots * CELLS, CELLS)), "vlm_relevance": (2, (slots * CELLS, CELLS))}
