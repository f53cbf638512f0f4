"""Every reading on every VLM family the suite builds (issue 113, item 3): each works, or is refused in one line.

For each tiny VLM family the other VLM tests build (``test_vlm_answer._build``'s kinds, ``test_vlm_any``'s types nobody
names, BLIP-2's learned queries, the census builder's encoder-decoders and Idefics), one short question is asked and
every reading of ``VLMAnswer`` is called on the first answer token: the attention, gradient x attention at a layer and
its rollout, AttnLRP, TAM, the logit lens, a region's ablation and patching (at the image and inside the language
model), the knockout, the visual sinks (and the map without them), the localization and visual heads and captum's
segments; the maps also on the overview beside a tiled image's tiles (refused where the image was read in one view).
Each must return a finite result of its documented shape, or raise the project's own one-line refusal: a ``ValueError``
raised by ``vit/`` itself (never an AttributeError, an IndexError, or transformers' own ValueError passed through). The
refusals are printed (``-s``) as the family x reading table."""
import sys
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))
from test_vlm_answer import QUESTION, _build, noisy, picture, tokenizer  # noqa: E402
from test_vlm_any import build as build_any  # noqa: E402

import vit  # noqa: E402
from bench.census_vlm import generic_build  # noqa: E402

VIT = Path(vit.__file__).resolve().parent
NEW = ["llava", "llava_full", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "gemma3", "gemma3_pas",
       "paligemma", "paligemma2", "internvl", "glm4v", "glm4v_moe", "glm46v", "mistral3", "pixtral", "qwen3_5",
       "qwen3_5_moe", "llama4", "llama4_tiles", "gemma3n", "llava_next", "llava_next_video", "llava_onevision",
       "llava_onevision_2", "internvl_tiles", "idefics3", "smolvlm", "molmo2", "mllama", "florence2"]
# Types whose canvas the processor's own code chooses (test_vlm_canvases): built by the census's generic builder
CANVASED = ["perception_lm", "granite4_vision", "nemotron_h_omni", "unlimited_ocr"]
# the census's generic builder's: encoder-decoders whose encoder reads the image alone, Idefics' gated cross-attention,
# GIT's and BLIP's text attention that computes its softmax itself, Inkling's whose eager function adds sinks
GENERIC = ["pix2struct", "vision-encoder-decoder", "pp_formulanet", "idefics",
           "git", "blip", "inkling2", "inkling_mm_model"]  # attention off the plain interface (test_vlm_inline)
FAMILIES = NEW + ["vipllava", "glm_ocr", "deepseek_vl", "minimax_m3_vl", "cosmos3_edge", "blip2", "chameleon", "emu3",
                  "glm5_next", "fast_vlm", "fuyu"] + CANVASED + GENERIC
BOX = (0, 0, 1, 1)  # one patch, top left, on every grid
REFUSED: dict[tuple[str, str], str] = {}  # (family, reading): the one-line refusal, printed at the module's end


def blip2_model():
    import transformers

    words = tokenizer(["<image>"])
    config = transformers.Blip2Config(
        vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                           image_size=32, patch_size=8),
        qformer_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48,
                            encoder_hidden_size=32, vocab_size=len(words)),
        text_config=dict(model_type="opt", hidden_size=32, ffn_dim=48, num_hidden_layers=2, num_attention_heads=4,
                         vocab_size=len(words), word_embed_proj_dim=32, eos_token_id=1, pad_token_id=1),
        num_query_tokens=4, image_token_index=words.convert_tokens_to_ids("<image>"))
    processor = transformers.Blip2Processor(
        image_processor=transformers.BlipImageProcessor(size={"height": 32, "width": 32}), tokenizer=words,
        num_query_tokens=4)
    return transformers.Blip2ForConditionalGeneration(config), processor


# The canvased types the census builds at their processor's own canvas (Unlimited-OCR's 1024-px global view: 4,096 SAM
# patches; Perception LM's thumbnail and 4 tiles of 448 px: 1,280 image tokens; Nemotron-H Omni's >= 1,024 patches):
# 6-20 s of CPU each. Here on a smaller canvas: the same code path (the one global view, the thumbnail beside its
# tiles, the pixel-shuffled grid with gh != gw; Nemotron's Mamba at the census's own narrow widths, its chunked scan
# over a padded chunk, its shared expert), each reading refused in the same line or working as at the full size; the
# canvases' own geometry at their full size is test_vlm_canvases'.
SMALLER = {
    # 16 x 16 SAM patches, 4 x 4 tokens; the prompt (27 tokens) past the text's sliding window as at 1024 px (276
    # tokens past 128): the recorder keeps the window's keys itself
    "unlimited_ocr": ({"size": {"height": 256, "width": 256}},
                      {"vision_config": {"sam_config": {"image_size": 256}}, "text_config": {"sliding_window": 16}}),
    # 112-px views (8 x 8 patches, 4 x 4 tokens each pooled) where 448 px gave 32 x 32: the thumbnail and the tiles
    # the processor cuts picture() into, as at 448 px
    "perception_lm": ({"size": {"height": 112, "width": 112}, "tile_size": 112},
                      {"vision_config": {"model_args": {"img_size": 112}}}),
    "nemotron_h_omni": ({"min_num_patches": 64, "max_num_patches": 256}, {}),  # 8 x 10 patches for picture()
}


def smaller(family: str, model, processor):
    """``(model, processor)`` of ``family`` on ``SMALLER``'s canvas and widths, the model built again (seed 0)."""
    if family not in SMALLER:
        return model, processor
    canvas, widths = SMALLER[family]
    for key, value in canvas.items():
        setattr(processor.image_processor, key, value)
    return (narrowed(model, widths) if widths else model), processor


def narrowed(model, widths: dict):
    """``model``'s type built again (seed 0) on its config with ``widths``' fields (nested as the config's) set."""
    config = model.config

    def update(sub, fields):
        for key, value in fields.items():
            inner = sub.get(key) if isinstance(sub, dict) else getattr(sub, key, None)
            assert inner is not None, key  # a field the type no longer has: SMALLER to be revised
            if isinstance(value, dict):
                update(inner, value)
            elif isinstance(sub, dict):
                sub[key] = value
            else:
                setattr(sub, key, value)

    update(config, widths)
    torch.manual_seed(0)
    return type(model)(config)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """``{family: folder}`` built lazily, each once (seed 0), saved whole with its processor."""
    built: dict = {}

    def folder(family: str):
        if family not in built:
            torch.manual_seed(0)
            model, processor = (_build(family.removesuffix("_tiles") if family == "internvl_tiles" else family)
                                if family in NEW else blip2_model() if family == "blip2" else
                                smaller(family, *generic_build(family)) if family in GENERIC + CANVASED else
                                build_any(family))
            if family == "internvl_tiles":  # test_vlm_answer.internvl_tiles': 3 x 2 tiles and a thumbnail
                processor.image_processor.max_patches = 6
            built[family] = tmp_path_factory.mktemp(family)
            noisy(model).save_pretrained(built[family])
            processor.save_pretrained(built[family])
        return built[family]

    yield folder
    if REFUSED:
        print("\nrefused (family x reading):")
        for (family, reading), line in sorted(REFUSED.items()):
            print(f"  {family:18} {reading:16} {line}")


def finite(x) -> bool:
    return bool(np.isfinite(np.asarray(x, dtype=np.float64)).all())


def readings(answer, other: Image.Image) -> dict:
    """``{reading: (call, check)}``: every reading on answer token 0 and what its result must be."""
    grid = answer.layout.view(False).grid

    def on_grid(m):
        return isinstance(m, np.ndarray) and m.shape == tuple(grid) and finite(m)

    def ablation(a):
        return finite([a.logit, a.ablated_logit, a.probability, a.ablated_probability])

    def on_overview(m):  # the view beside the tiles (InternVL's thumbnail, Idefics3's global image); else refused
        return isinstance(m, np.ndarray) and m.shape == tuple(answer.layout.view(True).grid) and finite(m)

    return {
        "attention": (lambda: answer.attention(0), on_grid),
        "gradxattn": (lambda: answer.relevance(0, layer=-1), on_grid),
        "rollout": (lambda: answer.relevance(0), on_grid),
        "attnlrp": (lambda: answer.relevance(0, method="attnlrp"), on_grid),
        "tam": (lambda: answer.tam(0), lambda m: on_grid(m) and 0 <= m.min() and m.max() <= 1),
        "logit_lens": (lambda: answer.logit_lens(0),
                       lambda p: p.ndim == 1 and len(p) >= 2 and finite(p) and 0 <= p.min() and p.max() <= 1),
        "ablate": (lambda: answer.ablate(0, BOX), ablation),
        "patch": (lambda: answer.patch(0, BOX, other), ablation),
        "patch_inside": (lambda: answer.patch(0, BOX, other, layer=0), ablation),
        "knockout": (lambda: answer.knockout(0), lambda k: finite([k.baseline, k.probability])),
        "sinks": (lambda: answer.sinks(), lambda s: len(s.tokens) >= 1 and all(
            isinstance(p, int) for layer in s.tokens for p in layer)),
        "attention@view": (lambda: answer.attention(0, overview=True), on_overview),
        "gradxattn@view": (lambda: answer.relevance(0, layer=-1, overview=True), on_overview),
        "rollout@view": (lambda: answer.relevance(0, overview=True), on_overview),
        "attnlrp@view": (lambda: answer.relevance(0, method="attnlrp", overview=True), on_overview),
        "tam@view": (lambda: answer.tam(0, overview=True), on_overview),
        "ablate@view": (lambda: answer.ablate(0, BOX, overview=True), ablation),
        "patch@view": (lambda: answer.patch(0, BOX, other, overview=True), ablation),
        "knockout@box": (lambda: answer.knockout(0, target=BOX), lambda k: finite([k.baseline, k.probability])),
        "attention-sinks": (lambda: answer.attention(0, sinks=answer.sinks()), on_grid),
        "attention@head": (lambda: answer.attention(0, layer=0, head=answer.heads - 1, fusion="max"), on_grid),
        "grounding_heads": (lambda: answer.grounding_heads(0),
                            lambda h: h.attention_sum.shape == (answer.layers, answer.heads)
                            and finite(h.attention_sum)),
        "visual_heads": (lambda: answer.visual_heads([(0, BOX)]),
                         lambda v: v.shape == (answer.layers, answer.heads) and finite(v)),
        "segments": (lambda: answer.segments(grid=(1, 2)),
                     lambda s: s.seq.shape == (2,) and s.tokens.shape == (len(answer.tokens), 2)
                     and finite(s.seq) and finite(s.tokens)),
    }


def ours(error: BaseException) -> bool:
    """The project's own one-line refusal: a ValueError whose innermost frame is in ``vit/``."""
    frames = traceback.extract_tb(error.__traceback__)
    return (isinstance(error, ValueError) and bool(frames) and Path(frames[-1].filename).resolve().is_relative_to(VIT)
            and "\n" not in str(error) and bool(str(error).strip()))


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_every_reading_works_or_is_refused_in_one_line(folders, family):
    image = picture()
    other = Image.fromarray(np.random.default_rng(5).integers(0, 256, (image.height, image.width, 3), np.uint8))
    asked = {"prompt": QUESTION} if family == "blip2" else {"question": QUESTION}  # BLIP-2: no chat template
    answer = vit.ask_vlm(vit.open_vlm(folders(family)), image, max_new_tokens=2, **asked)
    raw, wrong = [], []
    for name, (call, check) in readings(answer, other).items():
        try:
            result = call()
        except Exception as error:  # noqa: BLE001 - sorted below into ours and raw
            if ours(error):
                REFUSED[family, name] = str(error)
            else:
                where = traceback.extract_tb(error.__traceback__)[-1]
                raw.append(f"{name}: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''} "
                           f"({Path(where.filename).name}:{where.lineno})")
            continue
        if not check(result):
            wrong.append(f"{name}: {result!r}"[:300])
    assert not raw and not wrong, f"{family}: raw exceptions {raw}, results off their shape {wrong}"


@pytest.mark.slow
def test_the_logit_lens_of_an_opt_decoder_reads_its_own_final_layer_norm_and_head(folders):
    """BLIP-2's OPT decoder names its final norm ``final_layer_norm`` (no ``norm``): the lens is transformers' eager
    model's hidden states at the query read through that norm and the head, as ``test_vlm_lens.by_hand_lens``."""
    import transformers

    folder = folders("blip2")
    answer = vit.ask_vlm(vit.open_vlm(folder), picture(), prompt=QUESTION, max_new_tokens=3)
    model = transformers.Blip2ForConditionalGeneration.from_pretrained(folder, attn_implementation="eager").eval()
    inputs = dict(transformers.AutoProcessor.from_pretrained(folder)(images=[picture()], text=QUESTION,
                                                                      return_tensors="pt"))
    for i in (0, 2):
        new = torch.tensor([list(answer.tokens[:i])], dtype=torch.long)
        extended = {**inputs, "input_ids": torch.cat([inputs["input_ids"], new], -1),
                    "attention_mask": torch.cat([inputs["attention_mask"], torch.ones_like(new)], -1)}
        with torch.no_grad():
            out = model(**extended, output_hidden_states=True, use_cache=False)
        decoder = model.language_model.model.decoder
        states = out.language_model_outputs.hidden_states
        expected = [float(model.get_output_embeddings()(decoder.final_layer_norm(state[0, -1])).softmax(-1)
                          [answer.tokens[i]]) for state in states[:-1]]
        expected.append(float(out.logits[0, -1].softmax(-1)[answer.tokens[i]]))
        np.testing.assert_allclose(answer.logit_lens(i), np.array(expected, dtype=np.float32), rtol=0, atol=1e-5)
