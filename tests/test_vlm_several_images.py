"""A question about several images (issue 92, item 2): ``vit.ask_vlm(vlm, [image, image], question)`` answers with
transformers' own greedy ``generate`` over the processor's prompt of both images, and each answer token's attention
to each image is the eager row over that image's tokens, placed by hand on that image's own patch grid (the tokens
split image after image: LLaVA's 16 each, Qwen2.5-VL's and GLM-4.1V's ``image_grid_thw`` row by row, Mistral 3's
``image_sizes``, Gemma 3's pooled 2 x 2, InternVL's 2 x 2 units of one view each); its share per image the row's sum
over that image's tokens. Taken in the other order the maps would differ. Images a model cuts into tiles (Idefics3,
SmolVLM, Llama 4, InternVL) or packs on a canvas (LLaVA-NeXT) each have their own, placed where the processor cut
them.
"""

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from test_vlm_answer import (  # noqa: E402
    ATOL,
    NEW_TOKENS,
    PAN_AND_SCAN,
    QUESTION,
    by_hand,
    eager_image_rows,
    gemma3_pas,  # noqa: F401 - a fixture
    internvl_tiles,  # noqa: F401 - a fixture
    llava_next,  # noqa: F401 - a fixture
    molmo2,  # noqa: F401 - a fixture
    molmo2_tokens,
    packed_places,
    picture,
    quadrant_places,
    quadrants,
    saved_whole,
    split_tiles,  # noqa: F401 - a fixture
    where_crops_are,
    where_tiles_are,
)

import vit  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

# kind -> (unit, lead, patch): patches per image token along each side, tokens before the patches', patch px
KINDS = {"llava": (1, 0, 8), "qwen2_5_vl": (2, 0, 14), "glm4v": (2, 0, 14), "mistral3": (2, 0, 8),
         "gemma3": (4, 0, 8), "internvl": (2, 0, 8)}
IMAGES = (picture(90, 70), picture(60, 90))  # a wide image and a tall one: their grids differ where the model keeps it


@pytest.fixture(scope="module")
def vlms(tmp_path_factory):
    return saved_whole(tmp_path_factory, list(KINDS))


def eager_two(folder, images=IMAGES, **images_kwargs):
    """transformers alone: the eager model's greedy generate, every step's attentions, over the processor's prompt of
    ``images`` and the question through the chat template (``images_kwargs``: the processor's, as its call takes
    them)."""
    config = json.loads((folder / "config.json").read_text())
    model = getattr(transformers, config["architectures"][0]).from_pretrained(folder, attn_implementation="eager")
    processor = transformers.AutoProcessor.from_pretrained(folder)
    messages = [{"role": "user", "content": [*({"type": "image"} for _ in images),
                                             {"type": "text", "text": QUESTION}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    # in the model's dtype, as transformers' examples pass them (Llama 4's processor gives bfloat16 pixels)
    inputs = processor(images=list(images), text=text, return_tensors="pt", **images_kwargs).to(dtype=model.dtype)
    with torch.no_grad():
        out = model.eval().generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, output_attentions=True,
                                    return_dict_in_generate=True)
    image_token = getattr(model.config, "image_token_id", None)
    image_token = model.config.image_token_index if image_token is None else image_token
    return out, inputs, (inputs["input_ids"][0] == image_token).nonzero()[:, 0]


def grids_by_hand(kind: str, inputs) -> list[tuple[int, int]]:
    """Each image's patch grid as the processor's outputs give it."""
    patch = KINDS[kind][2]
    if "image_grid_thw" in inputs:
        return [(int(h), int(w)) for _, h, w in inputs["image_grid_thw"].tolist()]
    if "image_sizes" in inputs:
        return [(int(h) // patch, int(w) // patch) for h, w in inputs["image_sizes"].tolist()]
    side = inputs["pixel_values"].shape[-1] // patch
    return [(side, side)] * 2


@pytest.fixture(scope="module")
def answers(vlms):
    return {kind: (vit.ask_vlm(vit.open_vlm(folder), list(IMAGES), QUESTION, max_new_tokens=NEW_TOKENS),
                   *eager_two(folder)) for kind, folder in vlms.items()}


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_tokens_attention_to_each_image_is_the_eager_row_over_that_images_tokens(answers, kind):
    answer, out, inputs, positions = answers[kind]
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    unit, lead, _ = KINDS[kind]
    grids = grids_by_hand(kind, inputs)
    counts = [lead + (gh // unit) * (gw // unit) for gh, gw in grids]
    assert len(answer.layouts) == 2 and [layout.grid for layout in answer.layouts] == grids
    assert len(positions) == sum(counts)
    split = np.split(np.arange(len(positions)), [counts[0]])
    for i in range(len(answer.tokens)):  # generate may end on its end token before NEW_TOKENS
        for layer in range(answer.layers):
            rows = out.attentions[i][layer][0, :, -1, positions].numpy()  # (H, both images' tokens)
            for k, (grid, tokens) in enumerate(zip(grids, split, strict=True)):
                np.testing.assert_allclose(answer.attention(i, layer, image=k),
                                           by_hand(rows[:, tokens].mean(0), grid, unit, lead), rtol=0, atol=ATOL)
                np.testing.assert_allclose(answer.attention(i, layer, head=0, image=k),
                                           by_hand(rows[0, tokens], grid, unit, lead), rtol=0, atol=ATOL)
                assert answer.image_share(i, layer, image=k) == pytest.approx(rows[:, tokens].sum(-1).mean(),
                                                                                abs=ATOL)
            assert answer.image_share(i, layer) == pytest.approx(rows.sum(-1).mean(), abs=ATOL)
    if grids[0] == grids[1]:  # the images in the other order would be another map
        rows = out.attentions[1][-1][0, :, -1, positions].numpy().mean(0)
        assert not np.allclose(answer.attention(1, -1, image=0), by_hand(rows[split[1]], grids[1], unit, lead),
                               rtol=0, atol=1e-4)


def test_a_tokens_gradient_x_attention_and_an_images_ablation_are_per_image(answers, vlms):
    """Gradient x attention at a layer on each image is the same forward and backward's row over that image's tokens
    (the whole row's entries, split); ablating every token of one image moves the token's logit, each image its own
    way."""
    answer, out, inputs, positions = answers["llava"]
    whole = answer.image_relevance(2, (0,), 0)
    second = answer.image_relevance(2, (0,), 1)
    assert whole.shape == second.shape == (1, 16) and not torch.allclose(whole, second)
    np.testing.assert_allclose(answer.relevance(2, 0, image=1), second[0].reshape(4, 4).numpy(), rtol=0, atol=1e-6)
    first, other = answer.ablate_image(2, 0), answer.ablate_image(2, 1)
    assert first.logit == pytest.approx(other.logit) and first.image_tokens == other.image_tokens == 16
    assert abs(first.ablated_logit - other.ablated_logit) > 1e-4


def test_what_is_drawn_for_one_image_only_and_unplaced_tiles_are_refused_in_one_line(answers, vlms,
                                                                                     tmp_path_factory):
    answer = answers["llava"][0]
    with pytest.raises(ValueError, match=r"^TAM is drawn for a question about one image; this one has 2: use "
                                         r"attention or gradient × attention, per image$"):
        answer.tam(0)
    with pytest.raises(ValueError, match=r"^AttnLRP is drawn for a question about one image"):
        answer.relevance(0, method="attnlrp")
    with pytest.raises(ValueError, match=r"^image 2 does not exist: the question has 2 images, numbered 0 to 1$"):
        answer.attention(0, image=2)
    with pytest.raises(ValueError, match=r"^ask about 1 to 16 images at once, got 17$"):
        vit.ask_vlm(vit.open_vlm(vlms["llava"]), [object()] * 17, QUESTION)  # refused before any is read
    florence2 = saved_whole(tmp_path_factory, ["florence2"])["florence2"]  # one image per question in its processor
    with pytest.raises(ValueError, match=r"^a florence2 model reads one image per question; ask about one image$"):
        vit.ask_vlm(vit.open_vlm(florence2), list(IMAGES), QUESTION, max_new_tokens=1)


def canvas_by_hand(row: np.ndarray, places: list[tuple[int, int]], first: int) -> np.ndarray:
    """One image's tiles on its canvas from ``row`` (the eager row over every image's tokens): its tiles' tokens from
    ``first`` on, four each (2 x 2 pixel-shuffle units of a 4 x 4-patch tile), tile k at ``places[k]``."""
    rows, cols = max(p[0] for p in places) + 1, max(p[1] for p in places) + 1
    canvas = np.zeros((4 * rows, 4 * cols), dtype=np.float32)
    for k, (r, c) in enumerate(places):
        canvas[4 * r:4 * r + 4, 4 * c:4 * c + 4] = by_hand(row[first + 4 * k:first + 4 * k + 4], (4, 4), 2, 0)
    return canvas


def assert_each_image_on_its_canvas(answer, out, positions, images: list[tuple[int, list | None]]) -> None:
    """Every answer token's map of each image, every layer, each head and their mean, is the eager row over that
    image's tokens on its own canvas (``images``: each image's first token and its tiles' places, None for an image
    read in one view), and its overview the tokens after its tiles'."""
    for i in range(len(answer.tokens)):  # generate may end on its end token before NEW_TOKENS
        for layer in range(answer.layers):
            heads = eager_image_rows(out, i, layer, positions)
            for head in (*range(heads.shape[0]), None):
                row = heads.mean(0) if head is None else heads[head]
                for k, (first, places) in enumerate(images):
                    shown = answer.attention(i, layer, head, image=k)
                    if places is None:
                        np.testing.assert_allclose(shown, by_hand(row[first:first + 4], (4, 4), 2, 0), rtol=0,
                                                   atol=ATOL)
                        continue
                    np.testing.assert_allclose(shown, canvas_by_hand(row, places, first), rtol=0, atol=ATOL)
                    after = first + 4 * len(places)
                    np.testing.assert_allclose(answer.attention(i, layer, head, overview=True, image=k),
                                               by_hand(row[after:after + 4], (4, 4), 2, 0), rtol=0, atol=ATOL)


def test_two_images_cut_into_tiles_each_have_their_tiles_on_their_own_canvas(split_tiles):  # noqa: F811
    """Idefics3's, SmolVLM's and Llama 4's two split images: the first's 2 x 2 tiles and global image, then the
    second's 1 x 2 and its global image, in the pixel tensor and the prompt; each tile placed where its pixels came
    from (read off the quadrants' colours of the pixels the tower read), each image's global image its overview."""
    kind, folder = split_tiles
    pair = [quadrants(80, 80), quadrants(100, 50)]
    answer = vit.ask_vlm(vit.open_vlm(folder), pair, QUESTION, max_new_tokens=NEW_TOKENS)
    out, inputs, positions = eager_two(folder, pair)
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    views = inputs["pixel_values"] if kind == "llama4_tiles" else inputs["pixel_values"][0]
    assert views.shape[0] == 5 + 3 and len(positions) == 8 * 4
    placed = [quadrant_places(views[0:4]), quadrant_places(views[5:7])]  # each image's global view after its tiles
    assert placed == [[(0, 0), (0, 1), (1, 0), (1, 1)], [(0, 0), (0, 1)]]
    assert [layout.grid for layout in answer.layouts] == [(8, 8), (4, 8)]
    assert_each_image_on_its_canvas(answer, out, positions, [(0, placed[0]), (20, placed[1])])


def test_an_image_cut_into_tiles_beside_one_read_whole_each_on_its_own_grid(internvl_tiles):  # noqa: F811
    """InternVL: ``picture()`` cut into 3 x 2 tiles and a thumbnail, then a 32-px image read in one view; each placed
    as the processor cut it (the tiles found by their pixels on the canvas), and the second image has no overview."""
    pair = [picture(), picture(32, 32)]
    answer = vit.ask_vlm(vit.open_vlm(internvl_tiles), pair, QUESTION, max_new_tokens=NEW_TOKENS)
    out, inputs, positions = eager_two(internvl_tiles, pair)
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    assert inputs["pixel_values"].shape[0] == 7 + 1 and len(positions) == 8 * 4
    places = where_tiles_are(internvl_tiles, pair[0])
    assert [layout.grid for layout in answer.layouts] == [(8, 12), (4, 4)]
    assert_each_image_on_its_canvas(answer, out, positions, [(0, places), (28, None)])
    with pytest.raises(ValueError, match=r"^this image was read in one view"):
        answer.attention(0, overview=True, image=1)


def test_two_images_llava_next_packs_each_on_its_own_canvas(llava_next):  # noqa: F811
    """LLaVA-NeXT's two images, each its base image's 16 tokens then its canvas's rows with their newlines: the
    first's 2 x 3 crops unpadded to 8 x 10 patches, the second (a wider image) keeps all 8 x 12; each token of each
    image placed where transformers' own ``pack_image_features`` puts that image's patches."""
    pair = [picture(), picture(100, 60)]
    answer = vit.ask_vlm(vit.open_vlm(llava_next), pair, QUESTION, max_new_tokens=NEW_TOKENS)
    out, inputs, positions = eager_two(llava_next, pair)
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    images, first = [], 0
    for k in range(2):
        places = packed_places(llava_next, {"pixel_values": inputs["pixel_values"][k:k + 1],
                                            "image_sizes": inputs["image_sizes"][k:k + 1]})
        images.append((first, places))
        first += len(places)
    assert first == len(positions) and [layout.grid for layout in answer.layouts] == [(8, 10), (8, 12)]
    for i in range(len(answer.tokens)):
        for layer in range(answer.layers):
            heads = out.attentions[i][layer][0, :, -1, positions].numpy()
            for head in (*range(heads.shape[0]), None):
                row = heads.mean(0) if head is None else heads[head]
                for k, (start, places) in enumerate(images):
                    top, left = min(p[0] for p in places if p), min(p[1] for p in places if p)
                    expected = np.full(answer.layouts[k].grid, np.nan, dtype=np.float32)
                    for value, place in zip(row[start:start + len(places)], places, strict=True):
                        if place is not None:
                            expected[place[0] - top, place[1] - left] = value
                    np.testing.assert_allclose(answer.attention(i, layer, head, image=k), expected, rtol=0, atol=ATOL)
                    np.testing.assert_allclose(answer.attention(i, layer, head, overview=True, image=k),
                                               by_hand(row[start:start + 16], (4, 4), 1, 0), rtol=0, atol=ATOL)


def test_two_images_molmo2_places_each_images_pooled_tokens_on_its_own_crops(molmo2):  # noqa: F811
    """Molmo 2 writes each image's tokens after the one before's (its overview's pooled tokens, then its canvas's),
    each naming the patches of its own crops: each image's map at every layer and head is the eager row over its
    tokens, each canvas patch under the token whose pooling window holds the crop patch it was read from
    (transformers' own crop and pooling functions, ``molmo2_tokens``), on its own canvas and overview. The first
    image's tokens on the second's canvas would be another map."""
    images = (picture(90, 70), picture(100, 40))
    answer = vit.ask_vlm(vit.open_vlm(molmo2), list(images), QUESTION, max_new_tokens=NEW_TOKENS)
    out, inputs, positions = eager_two(molmo2, images)
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    places = [molmo2_tokens(molmo2, image) for image in images]  # (canvas, overview) token per patch, each image
    counts = [int(whole.max()) + 1 + int(canvas.max()) + 1 for canvas, whole in places]
    assert len(positions) == sum(counts) and [layout.grid for layout in answer.layouts] == [p[0].shape for p in places]
    for i in range(NEW_TOKENS):
        for layer in range(answer.layers):
            heads = eager_image_rows(out, i, layer, positions)
            for k, ((canvas, whole), tokens) in enumerate(zip(places, np.split(heads, [counts[0]], axis=1),
                                                              strict=True)):
                low = int(whole.max()) + 1
                for head in (0, None):
                    row = tokens.mean(0) if head is None else tokens[head]
                    np.testing.assert_allclose(answer.attention(i, layer, head, image=k), row[low:][canvas],
                                               rtol=0, atol=ATOL)
                    np.testing.assert_allclose(answer.attention(i, layer, head, overview=True, image=k),
                                               row[:low][whole], rtol=0, atol=ATOL)
    row = eager_image_rows(out, 1, 0, positions).mean(0)
    canvas, whole = places[1]
    assert not np.allclose(answer.attention(1, 0, image=1), row[int(whole.max()) + 1:][canvas], rtol=0, atol=1e-4)
    # the second image's map is drawn over its own crops: the image as its processor resizes it to its canvas (its
    # own function, without the normalisation), to the rounding of undoing the normalisation
    from transformers.models.molmo2.image_processing_molmo2 import resize_and_normalize_image

    processor = transformers.AutoProcessor.from_pretrained(molmo2).image_processor
    resized = resize_and_normalize_image(processor, torch.from_numpy(np.asarray(images[1])).permute(2, 0, 1)[None],
                                         [canvas.shape[0] * 8, canvas.shape[1] * 8], processor.resample, False, 1.0,
                                         False, processor.image_mean, processor.image_std)[0].permute(1, 2, 0).numpy()
    assert np.abs(answer.layouts[1].pixels.astype(int) - resized.astype(int)).max() <= 1


def test_three_images_gemma3s_pan_and_scan_places_each_images_crops_on_its_own_canvas(gemma3_pas):  # noqa: F811
    """Gemma 3's pan-and-scan of three images: a wide one (its original, then 3 crops side by side), a square one
    (not cut: one view) and a tall one (2 crops, one above the other), image after image in the pixel tensor and the
    prompt, 4 pooled tokens a view. Each crop on its image's canvas where ``pan_and_scan_batched`` cut it
    (``where_crops_are``), each original its overview; every layer and head the eager row over its tokens."""
    images = [picture(200, 60), picture(40, 40), picture(60, 130)]
    answer = vit.ask_vlm(vit.open_vlm(gemma3_pas, pan_and_scan=True), images, QUESTION, max_new_tokens=NEW_TOKENS)
    out, inputs, positions = eager_two(gemma3_pas, images, **PAN_AND_SCAN)
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    cuts = [where_crops_are(gemma3_pas, image) if k != 1 else [] for k, image in enumerate(images)]
    assert [len(c) for c in cuts] == [3, 0, 2] and inputs["pixel_values"].shape[0] == 8 and len(positions) == 32
    firsts = [0, 16, 20]  # each image's first token: its original's 4, then its crops' 4 each

    def expected(row: np.ndarray, k: int) -> np.ndarray:
        tops, lefts = sorted({t for t, _ in cuts[k]}), sorted({left for _, left in cuts[k]})
        canvas = np.zeros((8 * len(tops), 8 * len(lefts)), dtype=np.float32)
        for n, (t, left) in enumerate(cuts[k]):
            r, c, at = tops.index(t), lefts.index(left), firsts[k] + 4 * (n + 1)
            canvas[8 * r:8 * r + 8, 8 * c:8 * c + 8] = by_hand(row[at:at + 4], (8, 8), 4, 0)
        return canvas

    assert [layout.grid for layout in answer.layouts] == [(8, 24), (8, 8), (16, 8)]
    for i in range(len(answer.tokens)):
        for layer in range(answer.layers):
            heads = eager_image_rows(out, i, layer, positions)
            for head in (0, None):
                row = heads.mean(0) if head is None else heads[head]
                for k, first in enumerate(firsts):
                    original = by_hand(row[first:first + 4], (8, 8), 4, 0)
                    if not cuts[k]:
                        np.testing.assert_allclose(answer.attention(i, layer, head, image=k), original, rtol=0,
                                                   atol=ATOL)
                        continue
                    np.testing.assert_allclose(answer.attention(i, layer, head, image=k), expected(row, k), rtol=0,
                                               atol=ATOL)
                    np.testing.assert_allclose(answer.attention(i, layer, head, overview=True, image=k), original,
                                               rtol=0, atol=ATOL)
    row = eager_image_rows(out, 1, 0, positions).mean(0)
    assert not np.allclose(answer.attention(1, 0, image=2), expected(np.roll(row, -4), 2), rtol=0, atol=1e-4)


def test_two_images_gemma3n_each_have_their_own_fixed_grid_of_tokens(tmp_path_factory):
    """Gemma 3n writes each image's 16 x 16 tokens (MobileNetV5's fused grid, whatever the input's size) after the
    one before's: each image's map at every layer and head is the eager row over its 256 tokens, row-major, drawn
    over the pixels its processor prepared for that image."""
    from test_vlm_answer import unnormalised

    folder = saved_whole(tmp_path_factory, ["gemma3n"])["gemma3n"]
    answer = vit.ask_vlm(vit.open_vlm(folder), list(IMAGES), QUESTION, max_new_tokens=NEW_TOKENS)
    out, inputs, positions = eager_two(folder)
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    assert len(positions) == 2 * 256 and [layout.grid for layout in answer.layouts] == [(16, 16)] * 2
    for i in range(len(answer.tokens)):
        for layer in range(answer.layers):
            heads = eager_image_rows(out, i, layer, positions)
            for k in range(2):
                mine = heads[:, 256 * k:256 * (k + 1)]
                for head in (0, None):
                    row = mine.mean(0) if head is None else mine[head]
                    np.testing.assert_allclose(answer.attention(i, layer, head, image=k), row.reshape(16, 16),
                                               rtol=0, atol=ATOL)
    row = eager_image_rows(out, 1, 0, positions).mean(0)
    assert not np.allclose(answer.attention(1, 0, image=1), row[:256].reshape(16, 16), rtol=0, atol=1e-4)
    processor = transformers.AutoProcessor.from_pretrained(folder).image_processor
    for k in range(2):
        np.testing.assert_array_equal(answer.layouts[k].pixels, unnormalised(processor, inputs["pixel_values"][k]))
