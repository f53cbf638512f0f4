"""Where a VLM looked when it said each word (issue 80, items 1, 2a, 3, 5): ``vit.ask_vlm`` answers with transformers'
own greedy ``generate``, and each answer token's attention to the image tokens is the row transformers' eager
attention returns for the query that predicted it, placed on the tower's patch grid through the model's own layout.

References are transformers' own tiny random VLMs (noise on every parameter) saved whole in many shards with their
processor: its image processor, a word-level tokenizer built offline with the image's special tokens, and a chat
template. Each answer is compared with ``generate(..., output_attentions=True, return_dict_in_generate=True)`` of the
eager model opened from the same folder, at every answer token, layer and head (and their mean), to 1e-5; each eager
row is placed by hand, each image token's value written into every patch its unit covers.
"""

import json

import numpy as np
import pytest
import torch
from PIL import Image

transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402

import vit  # noqa: E402
from vit.bounds import TooManyTokens  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

ATOL = 1e-5
NEW_TOKENS = 5
WORDS = ["[UNK]", "<pad>", "dog", "cat", "hot", "red", "sky", "what", "is", "this", "?", "a", "the", "user:",
         "assistant:", *(f"w{i}" for i in range(40))]
# A chat template of the shape real ones have: each message's role, its image placeholder and text
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {% for c in m['content'] %}{% if c['type'] == 'image' %}"
            "IMAGE {% else %}{{ c['text'] }} {% endif %}{% endfor %}{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}")
QWEN_SPECIALS = ["<|image_pad|>", "<|vision_start|>", "<|vision_end|>", "<|video_pad|>"]
CLIP_TOWER = dict(model_type="clip_vision_model", image_size=32, patch_size=8, hidden_size=32, intermediate_size=48,
                  num_hidden_layers=3, num_attention_heads=2)
LLAMA = dict(model_type="llama", hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8)
KINDS = ["llava", "llava_full", "qwen2_5_vl"]
QUESTION = "what is this ?"


def tokenizer(specials: list[str]):
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    made = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="<pad>",
                                                eos_token="<pad>")
    made.add_special_tokens({"additional_special_tokens": specials})
    return made


def _build(kind: str):
    if kind.startswith("llava"):
        strategy = "full" if kind == "llava_full" else "default"  # "full": CLIP's CLS is an image token too
        words = tokenizer(["<image>"])
        config = transformers.LlavaConfig(vision_config=CLIP_TOWER, text_config=dict(LLAMA, vocab_size=len(words)),
                                          image_token_id=words.convert_tokens_to_ids("<image>"),
                                          vision_feature_select_strategy=strategy)
        images = transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
        processor = transformers.LlavaProcessor(image_processor=images, tokenizer=words, patch_size=8,
                                                vision_feature_select_strategy=strategy,
                                                num_additional_image_tokens=1,
                                                chat_template=TEMPLATE.replace("IMAGE", "<image>"))
        return transformers.LlavaForConditionalGeneration(config), processor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    words = tokenizer(QWEN_SPECIALS)
    ids = {token: words.convert_tokens_to_ids(token) for token in QWEN_SPECIALS}
    text = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=len(words), max_position_embeddings=256,
                rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0})
    config = transformers.Qwen2_5_VLConfig(
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=32,
                           fullatt_block_indexes=[1]),
        text_config=text, image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], eos_token_id=1)
    processor = transformers.Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=28 * 28 * 40), tokenizer=words,
        video_processor=transformers.Qwen2VLVideoProcessor(),
        chat_template=TEMPLATE.replace("IMAGE", "<|vision_start|><|image_pad|><|vision_end|>"))
    return transformers.Qwen2_5_VLForConditionalGeneration(config), processor


def noisy(model: torch.nn.Module) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.3)
    return model.eval()


@pytest.fixture(scope="module")
def vlms(tmp_path_factory):
    """``{kind: folder}``: each VLM saved whole in many shards with its processor."""
    built = {}
    for kind in KINDS:
        torch.manual_seed(0)
        model, processor = _build(kind)
        folder = tmp_path_factory.mktemp(kind)
        noisy(model).save_pretrained(folder, max_shard_size="20KB")
        processor.save_pretrained(folder)
        built[kind] = folder
    return built


def picture(width: int = 90, height: int = 70) -> Image.Image:
    return Image.fromarray(np.random.default_rng(3).integers(0, 256, (height, width, 3), dtype=np.uint8))


def eager_generate(folder, image: Image.Image, text: str | None = None):
    """transformers alone: the eager model and the processor from ``folder``, greedy ``generate`` with every step's
    attentions, and the prompt's input ids."""
    config = json.loads((folder / "config.json").read_text())
    model = getattr(transformers, config["architectures"][0]).from_pretrained(folder, attn_implementation="eager")
    processor = transformers.AutoProcessor.from_pretrained(folder)
    if text is None:
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(images=[image], text=text, return_tensors="pt")
    with torch.no_grad():
        out = model.eval().generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, output_attentions=True,
                                    return_dict_in_generate=True)
    return out, inputs, model.config.image_token_id


def by_hand(row: np.ndarray, grid: tuple[int, int], unit: int, lead: int) -> np.ndarray:
    """Each image token's value written into every patch its unit covers, units row-major after ``lead`` tokens."""
    gh, gw = grid
    placed = np.zeros(grid, dtype=np.float32)
    for r in range(gh):
        for c in range(gw):
            placed[r, c] = row[lead + (r // unit) * (gw // unit) + c // unit]
    return placed


LAYOUT = {"llava": (1, 0), "llava_full": (1, 1), "qwen2_5_vl": (2, 0)}  # (unit, lead)


@pytest.fixture(scope="module")
def answers(vlms):
    """``{kind: (vit's answer, transformers' eager generate output, the prompt's input ids, image token id)}``."""
    image = picture()
    return {kind: (vit.ask_vlm(vit.open_vlm(folder), image, QUESTION, max_new_tokens=NEW_TOKENS),
                   *eager_generate(folder, image)) for kind, folder in vlms.items()}


@pytest.mark.parametrize("kind", KINDS)
def test_the_answer_is_generates_greedy_answer_token_for_token(vlms, answers, kind):
    answer, out, inputs, _ = answers[kind]
    expected = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    assert list(answer.tokens) == expected and len(expected) == NEW_TOKENS
    processor = transformers.AutoProcessor.from_pretrained(vlms[kind])
    assert answer.text == processor.decode(expected, skip_special_tokens=True) and answer.text.strip()
    assert answer.pieces == tuple(processor.decode([t]) for t in expected)


@pytest.mark.parametrize("kind", KINDS)
def test_each_tokens_attention_is_the_eager_row_placed_through_the_models_layout(answers, kind):
    answer, out, inputs, image_token = answers[kind]
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    unit, lead = LAYOUT[kind]
    grid = answer.grid
    assert len(positions) == lead + (grid[0] // unit) * (grid[1] // unit)
    for i in range(NEW_TOKENS):
        for layer in range(answer.layers):
            rows = out.attentions[i][layer][0, :, -1, positions].numpy()  # (H, lead + N): step i's query
            for head in range(rows.shape[0]):
                np.testing.assert_allclose(answer.attention(i, layer, head), by_hand(rows[head], grid, unit, lead),
                                           rtol=0, atol=ATOL)
            np.testing.assert_allclose(answer.attention(i, layer), by_hand(rows.mean(0), grid, unit, lead),
                                       rtol=0, atol=ATOL)
