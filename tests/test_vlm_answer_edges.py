"""A VLM's answer at the edges of what its config and its answer may hold (issue 90, item 8): LLaVA 1.5 reading a
list of its tower's layers, LLaVA-NeXT over SigLIP under the "full" strategy (Granite Vision's), and an answer that
says the image placeholder token itself.

References are transformers' own tiny random models saved whole (``test_vlm_answer``'s builders): greedy ``generate``
of the eager model with every step's attentions, its hidden states, and, for gradient x attention, one eager forward
of the prompt and the answer's first tokens as ``generate`` fed them (the image's features at the prompt's
placeholders, every answer token its embedding row), the gradient of the logit to every layer's attention.
"""

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_vlm_answer import (  # noqa: E402
    CLIP_TOWER,
    LLAMA,
    NEW_TOKENS,
    NEXT_PINPOINTS,
    QUESTION,
    TEMPLATE,
    _build,
    by_hand,
    eager_generate,
    noisy,
    packed_like_transformers,
    packed_places,
    picture,
    tokenizer,
)

import vit  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

ATOL = 1e-5


def _saved(folder, model, processor):
    noisy(model).save_pretrained(folder, max_shard_size="20KB")
    processor.save_pretrained(folder)
    return folder


def _llava_layers(folder, strategy: str):
    """LLaVA 1.5 reading its 3-layer CLIP tower's hidden states after layers 1 and 3, concatenated."""
    torch.manual_seed(0)
    words = tokenizer(["<image>"])
    config = transformers.LlavaConfig(vision_config=CLIP_TOWER, text_config=dict(LLAMA, vocab_size=len(words)),
                                      image_token_id=words.convert_tokens_to_ids("<image>"),
                                      vision_feature_layer=[-3, -1], vision_feature_select_strategy=strategy)
    images = transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processor = transformers.LlavaProcessor(image_processor=images, tokenizer=words, patch_size=8,
                                            vision_feature_select_strategy=strategy, num_additional_image_tokens=1,
                                            chat_template=TEMPLATE.replace("IMAGE", "<image>"))
    return _saved(folder, transformers.LlavaForConditionalGeneration(config), processor)


def _next_siglip_full(folder):
    """LLaVA-NeXT over a SigLIP tower (no CLS) under the "full" strategy, as Granite Vision is built."""
    torch.manual_seed(0)
    words = tokenizer(["<image>"])
    tower = dict(CLIP_TOWER, model_type="siglip_vision_model", vision_use_head=False)
    config = transformers.LlavaNextConfig(vision_config=tower, text_config=dict(LLAMA, vocab_size=len(words)),
                                          image_token_id=words.convert_tokens_to_ids("<image>"),
                                          image_grid_pinpoints=NEXT_PINPOINTS, vision_feature_layer=-1,
                                          vision_feature_select_strategy="full")
    images = transformers.LlavaNextImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                                                  image_grid_pinpoints=NEXT_PINPOINTS, image_mean=[0.5] * 3,
                                                  image_std=[0.5] * 3)
    processor = transformers.LlavaNextProcessor(image_processor=images, tokenizer=words, patch_size=8,
                                                vision_feature_select_strategy="full", num_additional_image_tokens=0,
                                                chat_template=TEMPLATE.replace("IMAGE", "<image>"))
    return _saved(folder, transformers.LlavaNextForConditionalGeneration(config), processor)


def _generated(folder):
    out, inputs, image_token = eager_generate(folder, picture())
    return out, inputs, (inputs["input_ids"][0] == image_token).nonzero()[:, 0]


@pytest.mark.parametrize("strategy, lead", [("default", 0), ("full", 1)])
def test_llava_reading_a_list_of_layers_answers_and_maps_transformers_eager_rows(tmp_path, strategy, lead):
    answer = vit.ask_vlm(vit.open_vlm(_llava_layers(tmp_path, strategy)), picture(), QUESTION,
                         max_new_tokens=NEW_TOKENS)
    out, inputs, positions = _generated(tmp_path)
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    assert answer.grid == (4, 4) and len(positions) == lead + 16
    for i in range(NEW_TOKENS):
        for layer in range(answer.layers):
            rows = out.attentions[i][layer][0, :, -1, positions].numpy()  # (H, lead + 16)
            for head in range(rows.shape[0]):
                np.testing.assert_allclose(answer.attention(i, layer, head), by_hand(rows[head], (4, 4), 1, lead),
                                           rtol=0, atol=ATOL)
            np.testing.assert_allclose(answer.attention(i, layer), by_hand(rows.mean(0), (4, 4), 1, lead),
                                       rtol=0, atol=ATOL)


def test_llava_next_over_siglip_under_full_places_its_crops_as_transformers_packs_them(tmp_path):
    """Granite Vision's shape: "full" keeps every token of a tower that has no CLS, so its base image's 16 tokens
    and its 2 x 3 crops' canvas (8 x 10 unpadded, a newline after each row) are placed as ``pack_image_features``
    packs them."""
    folder = _next_siglip_full(tmp_path)
    answer = vit.ask_vlm(vit.open_vlm(folder), picture(), QUESTION, max_new_tokens=NEW_TOKENS)
    out, inputs, positions = _generated(folder)
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    places = packed_places(folder, inputs)
    assert len(positions) == len(places) == 104 and answer.grid == (8, 10) and answer.layout.lead == 0
    packed_like_transformers(answer, out, positions, places)


@pytest.fixture(scope="module")
def says_the_placeholder(tmp_path_factory):
    """``(folder, image token id)``: ``test_vlm_answer``'s LLaVA whose head scores the image placeholder as three
    times the answer's second word: its greedy answer says the placeholder, a word, then the placeholder twice."""
    torch.manual_seed(0)
    model, processor = _build("llava")
    folder = tmp_path_factory.mktemp("says_the_placeholder")
    _saved(folder, model, processor)
    out, inputs, image_token = eager_generate(folder, picture())
    said = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    with torch.no_grad():
        model.lm_head.weight[image_token] = 3 * model.lm_head.weight[said[1]]
    model.save_pretrained(folder, max_shard_size="20KB")
    return folder, image_token


def as_generated(folder, tokens: list[int], i: int) -> tuple[list[np.ndarray], torch.Tensor]:
    """transformers alone: ``([mean_h (dy/dA_l * A_l)^+ query row for each layer], image positions)`` for answer
    token ``i``, from one eager forward of the prompt and the answer's first ``i`` tokens embedded as ``generate``
    embedded them: the image's features (LLaVA's ``get_image_features``) at the prompt's placeholders, each answer
    token its row of the embedding table, a placeholder id too."""
    model = transformers.LlavaForConditionalGeneration.from_pretrained(folder, attn_implementation="eager").eval()
    processor = transformers.AutoProcessor.from_pretrained(folder)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    inputs = processor(images=[picture()], text=processor.apply_chat_template(messages, add_generation_prompt=True),
                       return_tensors="pt")
    positions = (inputs["input_ids"][0] == model.config.image_token_id).nonzero()[:, 0]
    ids = torch.cat([inputs["input_ids"], torch.tensor([tokens[:i]], dtype=torch.long)], -1)
    embeds = model.get_input_embeddings()(ids).detach()
    with torch.no_grad():
        features = torch.cat(model.model.get_image_features(pixel_values=inputs["pixel_values"],
                                                            return_dict=True).pooler_output)
    embeds[0, positions] = features
    out = model(inputs_embeds=embeds, attention_mask=torch.ones_like(ids), output_attentions=True, use_cache=False)
    grads = torch.autograd.grad(out.logits[0, -1, tokens[i]], out.attentions)
    return [(g * a)[0].clamp(min=0).mean(0)[-1].detach().numpy() for g, a in zip(grads, out.attentions, strict=True)
            ], positions


def test_an_answer_that_says_the_image_placeholder_keeps_every_tokens_maps(says_the_placeholder, monkeypatch):
    """The image's tokens are the prompt's: the answer's placeholder is a word (``generate`` read it so), and the
    tokens after it have gradient x attention on the eager model fed as ``generate`` fed it, TAM over the hidden
    states ``generate`` computed, and AttnLRP."""
    from vit.explain.language import vlm_tam

    folder, image_token = says_the_placeholder
    answer = vit.ask_vlm(vit.open_vlm(folder), picture(), QUESTION, max_new_tokens=NEW_TOKENS)
    out, inputs, positions = _generated(folder)
    prompt = inputs["input_ids"].shape[1]
    tokens = out.sequences[0, prompt:].tolist()
    assert list(answer.tokens) == tokens and tokens[1] == image_token
    assert answer.layout.positions.tolist() == positions.tolist()
    for i in (2, NEW_TOKENS - 1):  # after the placeholder
        cams, _ = as_generated(folder, tokens, i)
        for layer in range(answer.layers):
            expected = by_hand(cams[layer][positions.numpy()], answer.grid, 1, 0)
            assert np.abs(expected).max() > 0
            np.testing.assert_allclose(answer.relevance(i, layer), expected, rtol=0,
                                       atol=ATOL * max(1.0, float(np.abs(expected).max())))
    # TAM reads the last hidden states of the prompt and the answer's first i tokens: generate's own
    caught = []
    tam_values = vlm_tam.tam_values
    monkeypatch.setattr(vlm_tam, "tam_values", lambda hidden, *args: caught.append(hidden) or tam_values(hidden, *args))
    model = transformers.LlavaForConditionalGeneration.from_pretrained(folder).eval()
    with torch.no_grad():
        steps = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, output_hidden_states=True,
                               return_dict_in_generate=True).hidden_states
    final = [torch.cat([step[-1][0] for step in steps[:i + 1]]) for i in range(NEW_TOKENS)]  # (T, D) after the norm
    for i in range(NEW_TOKENS):
        assert np.isfinite(answer.tam(i)).all()
        np.testing.assert_allclose(caught[-1].numpy(), final[i].numpy(), rtol=0, atol=ATOL)
    lrp = answer.relevance(NEW_TOKENS - 1, method="attnlrp")
    assert np.isfinite(lrp).all() and np.abs(lrp).max() > 0


def test_predict_ask_save_maps_keeps_an_answer_that_says_the_image_placeholder(says_the_placeholder, tmp_path,
                                                                               capsys):
    from vit.predict import main

    folder, image_token = says_the_placeholder
    picture().save(tmp_path / "photo.png")
    out, inputs, _ = _generated(folder)
    tokens = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    assert main([str(folder), str(tmp_path / "photo.png"), "--ask", QUESTION, "--max-new-tokens", str(NEW_TOKENS),
                 "--save-maps", str(tmp_path / "maps"), "--device", "cpu", "--lm-method", "attention", "tam",
                 "gradxattn"]) == 0
    [record] = json.loads(capsys.readouterr().out)
    assert record["tokens"] == tokens and image_token in tokens
    saved = np.load(record["maps"]["npz"])
    assert saved["tam"].shape == (NEW_TOKENS, 4, 4) and saved["gradxattn"].shape == (NEW_TOKENS, 2, 4, 4)
    assert list(saved["tokens"]) == tokens
