"""Encoder-decoder VLMs and cross-attending decoders answer by what they have (issue 113): a decoder whose
cross-attention reads an encoder's image tokens (Pix2Struct, PP-FormulaNet, a VisionEncoderDecoder of ViT or
Donut-Swin under BERT) or a tower's states (Idefics' gated cross-attention layers), found by its layers
(``vit.core.recording_attention``), never by a name. Each tiny model is built by transformers with its own processor
(the census's generic builder, ``bench/census_vlm.py``, or by hand) and saved whole; its answer is transformers'
greedy ``generate`` on the folder (its own generation config: Pix2Struct's sets ``use_cache`` false, the answer is
generated with the cache and is the same tokens), each answer token's cross-attention row at every decoder layer is
the eager row (``generate``'s ``cross_attentions``, or, where ``generate`` returns none, Idefics', the library's
eager attention function hooked), and the map places each encoder state where the processor's outputs say (a
transposed placement fails). The types that cannot answer are refused in one line naming why."""

import numpy as np
import pytest
import torch

from vit.core.recording_attention import cross_layers, cross_module, decoder_layers
from vit.explain.language.vlm_layouts import ImageLayout
from vit.explain.language.vlm_read_layout import PENDING, flattened_layout, settle

ATOL = 1e-5
QUESTION = "what is this ?"
NEW_TOKENS = 3


# --- fast: the pieces on hand-made tensors and modules ------------------------------------------------------------

def test_flattened_patches_are_placed_where_their_row_and_column_say():
    """Pix2Struct's flattened patches: each row's first two features its patch's row and column (1-based), the
    padding's 0; given out of row-major order, each state sits at its own patch, the padding's nowhere."""
    places = [(1, 2), (2, 1), (1, 1), (2, 2), (1, 3), (2, 3)]  # a 2 x 3 grid, shuffled
    patches = torch.zeros(8, 5)
    for k, (r, c) in enumerate(places):
        patches[k, :2] = torch.tensor([r, c])
    layout = flattened_layout(patches, torch.tensor([1, 1, 1, 1, 1, 1, 0, 0]))
    assert layout.grid == (2, 3) and layout.positions.tolist() == list(range(6))
    placed = layout.place(torch.arange(6.0)[None])[0]
    for k, (r, c) in enumerate(places):
        assert placed[r - 1, c - 1] == k


def test_a_pending_layout_settles_on_the_count_of_the_encoders_states():
    """A ViT's CLS then its patches; Swin's last stage, a whole unit of patches a side; a count no unit gives is one
    list over the states, said in one line."""
    pending = ImageLayout(torch.zeros(0, dtype=torch.long), (8, 12), 1, 0, unplaced=PENDING)
    vit_like = settle(pending, 1 + 8 * 12)
    assert (vit_like.unit, vit_like.lead, vit_like.unplaced) == (1, 1, None)
    swin_like = settle(pending, 2 * 3)
    assert (swin_like.unit, swin_like.lead) == (4, 0)
    values = torch.arange(6.0)[None]
    assert torch.equal(swin_like.place(values)[0], values.reshape(2, 3).repeat_interleave(4, 0).repeat_interleave(4, 1))
    padded = settle(ImageLayout(torch.zeros(0, dtype=torch.long), (16, 21), 1, 0, unplaced=PENDING), 8 * 11)
    assert (padded.unit, padded.lead) == (2, 0)  # Swin's odd side padded to merge: the last states over one column
    placed = padded.place(torch.arange(88.0)[None])[0]  # (16, 21): state (r // 2) x 11 + c // 2 over patch (r, c)
    assert placed[15, 20] == 87 and placed[0, 19] == 9 and placed[2, 4] == 13
    odd = settle(pending, 50)
    with pytest.raises(ValueError, match=r"^its image tokens are not placed on the image: its encoder's 50 states are "
                                         r"not whole units of patches over its 8x12 patch grid; their values"):
        odd.place(torch.zeros(1, 50))


class _Attention(torch.nn.Module):
    def forward(self, x):  # its code asks the interface, as transformers' do: ALL_ATTENTION_FUNCTIONS
        return x


class _Layer(torch.nn.Module):
    def __init__(self, cross: str | None):
        super().__init__()
        self.self_attn = _Attention()
        if cross == "EncDecAttention":  # T5's: one level down
            self.layer = torch.nn.ModuleList([torch.nn.Identity(), torch.nn.Module()])
            self.layer[1].EncDecAttention = _Attention()
        elif cross:
            setattr(self, cross, torch.nn.Sequential(_Attention()))  # BERT's ``crossattention.self``


@pytest.mark.parametrize("name", ["encoder_attn", "crossattention", "encoder_decoder_attention", "EncDecAttention"])
def test_a_decoders_cross_attention_is_found_under_each_familys_name(name):
    stack = torch.nn.Module()
    stack.head = torch.nn.Module()
    stack.head.layer = torch.nn.ModuleList([_Layer(name), _Layer(name)])  # BERT's bert.encoder.layer under a head
    assert decoder_layers(stack) is stack.head.layer and cross_layers(stack) is stack.head.layer
    assert all(isinstance(cross_module(layer), _Attention) for layer in stack.head.layer)
    plain = torch.nn.Module()
    plain.layers = torch.nn.ModuleList([_Layer(None)])
    assert decoder_layers(plain) is plain.layers and cross_layers(plain) is None
    plain.gated_cross_attn_layers = torch.nn.ModuleList([_Layer(name)])  # Idefics': beside its self-attention's
    assert decoder_layers(plain) is plain.layers and cross_layers(plain) is plain.gated_cross_attn_layers


# --- slow: tiny models built by transformers, saved whole ---------------------------------------------------------

def _picture(width: int = 90, height: int = 70):
    from PIL import Image

    return Image.fromarray(np.random.default_rng(3).integers(0, 256, (height, width, 3), dtype=np.uint8))


def _donut_swin():
    """A VisionEncoderDecoder of a two-stage Donut-Swin (4-px patches merged 2 x 2 once) under a BERT decoder, with
    Donut's processor over a 64 x 96 image: 16 x 24 patches, 8 x 12 states."""
    import transformers
    from test_vlm_answer import tokenizer

    words = tokenizer([])
    encoder = transformers.DonutSwinConfig(image_size=[64, 96], patch_size=4, embed_dim=8, depths=[1, 1],
                                           num_heads=[2, 2], window_size=4)
    decoder = transformers.BertConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, intermediate_size=48, is_decoder=True,
                                      add_cross_attention=True, pad_token_id=words.pad_token_id)
    config = transformers.VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id, config.pad_token_id = words.convert_tokens_to_ids("what"), words.pad_token_id
    images = transformers.DonutImageProcessor(size={"height": 64, "width": 96}, do_align_long_axis=False,
                                              do_thumbnail=False, do_pad=False)
    return transformers.VisionEncoderDecoderModel(config), transformers.DonutProcessor(images, words)


def _idefics_latents():
    """The census's tiny Idefics with its perceiver resampler on: its cross-attention reads 64 latents."""
    import transformers

    from bench.census_vlm import generic_build

    model, processor = generic_build("idefics")
    config = model.config
    config.use_resampler = True
    return transformers.IdeficsForVisionText2Text(config), processor


KINDS = ("pix2struct", "pp_formulanet", "vision-encoder-decoder", "donut_swin", "idefics", "idefics_latents")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    pytest.importorskip("transformers")
    from test_vlm_answer import noisy

    from bench.census_vlm import generic_build

    built = {}

    def folder(kind: str):
        if kind not in built:
            torch.manual_seed(0)
            model, processor = (_donut_swin() if kind == "donut_swin" else _idefics_latents()
                                if kind == "idefics_latents" else generic_build(kind))
            built[kind] = tmp_path_factory.mktemp(kind)
            noisy(model).save_pretrained(built[kind])
            processor.save_pretrained(built[kind])
        return built[kind]

    return folder


def _reference(folder, image, hook_cross: bool = False):
    """transformers alone: the eager model and processor of ``folder``, its inputs (an encoder-decoder's question the
    decoder's prompt: the processor's ``decoder_input_ids``, else the tokenizer's ids of it, Donut's way), greedy
    ``generate`` with its folder's generation config; ``hook_cross``: each cross-attention call's last query row
    kept from the library's eager attention function (``rows[layer][step]``)."""
    import transformers

    model = transformers.AutoModelForImageTextToText.from_pretrained(folder, attn_implementation="eager").eval()
    processor = transformers.AutoProcessor.from_pretrained(folder)
    if getattr(model.config, "is_encoder_decoder", False):
        takes_text = type(processor).__name__ == "Pix2StructProcessor"
        inputs = dict(processor(images=[image], return_tensors="pt", **({"text": QUESTION} if takes_text else {})))
        if not takes_text:
            inputs["decoder_input_ids"] = processor.tokenizer(QUESTION, add_special_tokens=False,
                                                              return_tensors="pt")["input_ids"]
    else:  # no chat template: the processor puts the image's tokens before the question itself (Idefics')
        inputs = dict(processor(images=[image], text=QUESTION, return_tensors="pt"))
    rows: dict = {}
    module = __import__(type(model).__module__, fromlist=["eager_attention_forward"])

    def kept(attention, *args, **kwargs):
        out = eager(attention, *args, **kwargs)
        if getattr(attention, "is_cross_attention", False):
            rows.setdefault(attention, []).append(out[1][0, :, -1].detach())
        return out

    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        if hook_cross:
            eager = module.eager_attention_forward
            patch.setattr(module, "eager_attention_forward", kept)
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, output_attentions=True,
                             return_dict_in_generate=True)
    return out, inputs, list(rows.values())


def _answer(folder, image):
    import vit

    return vit.ask_vlm(vit.open_vlm(folder), image, QUESTION, max_new_tokens=NEW_TOKENS)


def _differs(a, b) -> bool:
    return a.shape != b.shape or not np.allclose(a, b, rtol=0, atol=1e-4)


ENCODER_DECODERS = ("pix2struct", "pp_formulanet", "vision-encoder-decoder", "donut_swin")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ENCODER_DECODERS)
def test_each_tokens_cross_attention_row_at_every_decoder_layer_is_the_eager_row(folders, kind):
    """The tokens are generate's (after the decoder's prompt), and every answer token's row over the encoder's states
    at every decoder layer is generate's eager cross-attention row of its last query."""
    image = _picture()
    answer = _answer(folders(kind), image)
    out, _, _ = _reference(folders(kind), image)
    steps = len(out.decoder_attentions)
    assert list(answer.tokens) == out.sequences[0, -steps:].tolist() and steps == NEW_TOKENS
    assert answer.layers == len(out.cross_attentions[0]) == 2
    for i in range(NEW_TOKENS):
        for k in range(answer.layers):
            eager = out.cross_attentions[i][k][0, :, -1]  # (H, encoder states)
            np.testing.assert_allclose(answer.row(i, k).numpy(), eager.numpy(), rtol=0, atol=ATOL)
            np.testing.assert_allclose(answer.image_rows(i, k).numpy(), eager[:, answer.layout.positions].numpy(),
                                       rtol=0, atol=ATOL)


@pytest.mark.slow
def test_a_folder_whose_generation_config_sets_use_cache_false_answers_with_the_cache(folders):
    """Pix2Struct's text config keeps no cache by default, so its saved generation config says use_cache false: the
    answer is generated with the cache (its rows read it), the same greedy tokens as generate with the folder's own
    settings (the test above); the folder is not refused."""
    import json

    folder = folders("pix2struct")
    assert json.loads((folder / "generation_config.json").read_text())["use_cache"] is False
    assert len(_answer(folder, _picture()).tokens) == NEW_TOKENS


@pytest.mark.slow
def test_use_cache_false_is_refused_in_one_line_where_the_model_keeps_no_cache(folders, monkeypatch):
    """Where transformers says the class cannot build generate's cache, the folder's use_cache false stands: refused
    in one line, as before any weight is used."""
    import transformers

    import vit

    monkeypatch.setattr(transformers.Pix2StructForConditionalGeneration, "_supports_default_dynamic_cache",
                        classmethod(lambda cls: False))
    with pytest.raises(ValueError, match=r"is refused: its generation_config.json sets use_cache false and its "
                                         r"Pix2StructForConditionalGeneration keeps no cache transformers' generate "
                                         r"builds[^\n]*$"):
        vit.open_vlm(folders("pix2struct"))


def _mean_row(out, i: int, k: int) -> np.ndarray:
    return out.cross_attentions[i][k][0, :, -1].mean(0).numpy()


@pytest.mark.slow
def test_pix2struct_states_are_placed_at_the_patches_their_rows_and_columns_name(folders):
    image = _picture()
    answer = _answer(folders("pix2struct"), image)
    out, inputs, _ = _reference(folders("pix2struct"), image)
    patches, mask = inputs["flattened_patches"][0], inputs["attention_mask"][0]
    rows, cols = int(patches[mask.bool(), 0].max()), int(patches[mask.bool(), 1].max())
    assert answer.grid == (rows, cols) and rows != cols
    for i in range(NEW_TOKENS):
        row = _mean_row(out, i, 1)
        expected = np.zeros((rows, cols), dtype=np.float32)
        for k in range(len(mask)):
            if mask[k]:
                expected[int(patches[k, 0]) - 1, int(patches[k, 1]) - 1] = row[k]
        np.testing.assert_allclose(answer.attention(i, 1), expected, rtol=0, atol=ATOL)
    transposed = row[:rows * cols].reshape(cols, rows).T  # the states laid column-major: another map
    assert _differs(answer.attention(NEW_TOKENS - 1, 1), transposed)


# kind: (patch grid, states a side per unit, states before the patches') as each processor and encoder give them
# (Donut keeps the image's aspect: 64 x 82 pixels, 16 x 21 patches, the last padded; Swin pads the odd side again to
# merge it, 8 x 11 states)
PLACED = {"vision-encoder-decoder": ((14, 14), 1, 1), "pp_formulanet": ((48, 48), 4, 0), "donut_swin": ((16, 21), 2, 0)}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(PLACED))
def test_an_encoders_states_are_placed_row_major_over_its_last_grid(folders, kind):
    """A ViT's CLS then its 14 x 14 patches; PP-FormulaNet's 12 x 12 states after its strided convolutions over
    48 x 48 patches; Donut-Swin's 8 x 11 after one 2 x 2 merge of 16 x 21 patches (its last column of states over
    the last patch and the padding): each state over its unit's patches, row-major (the transposed layout fails)."""
    (gh, gw), unit, lead = PLACED[kind]
    rows, cols = -(-gh // unit), -(-gw // unit)
    image = _picture()
    answer = _answer(folders(kind), image)
    out, _, _ = _reference(folders(kind), image)
    assert answer.grid == (gh, gw) and (answer.layout.unit, answer.layout.lead) == (unit, lead)
    ones = np.ones((unit, unit), dtype=np.float32)
    for i in range(NEW_TOKENS):
        expected = np.kron(_mean_row(out, i, 1)[lead:].reshape(rows, cols), ones)[:gh, :gw]
        np.testing.assert_allclose(answer.attention(i, 1), expected, rtol=0, atol=ATOL)
    transposed = np.kron(_mean_row(out, NEW_TOKENS - 1, 1)[lead:].reshape(cols, rows).T, ones)[:gh, :gw]
    assert _differs(answer.attention(NEW_TOKENS - 1, 1), transposed)


@pytest.mark.slow
def test_idefics_answers_through_its_gated_cross_attention_over_the_towers_states(folders):
    """Idefics' decoder reads the image through its gated cross-attention layers, whose keys no cache keeps (the
    answer keeps them); generate returns no cross rows, so the reference is the library's eager attention function
    hooked at each cross-attention call. Without the resampler the states are the tower's CLS then its 16 x 16
    patches, placed row-major."""
    image = _picture()
    answer = _answer(folders("idefics"), image)
    out, inputs, rows = _reference(folders("idefics"), image, hook_cross=True)
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    assert answer.layers == len(rows) == 2 and answer.grid == (16, 16) and answer.layout.lead == 1
    for i in range(NEW_TOKENS):
        for k in range(answer.layers):
            np.testing.assert_allclose(answer.image_rows(i, k).numpy(), rows[k][i].numpy(), rtol=0, atol=ATOL)
        np.testing.assert_allclose(answer.attention(i, 1), rows[1][i].mean(0)[1:].reshape(16, 16).numpy(),
                                   rtol=0, atol=ATOL)


@pytest.mark.slow
def test_idefics_perceiver_latents_answer_and_their_placement_is_refused_in_one_line(folders):
    image = _picture()
    answer = _answer(folders("idefics_latents"), image)
    out, inputs, rows = _reference(folders("idefics_latents"), image, hook_cross=True)
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    np.testing.assert_allclose(answer.image_rows(0, 0).numpy(), rows[0][0].numpy(), rtol=0, atol=ATOL)
    assert answer.image_rows(0, 0).shape[-1] == 64
    with pytest.raises(ValueError, match=r"^its image tokens are not placed on the image: they are a perceiver "
                                         r"resampler's 64 latents \(perceiver_config.resampler_n_latents\)[^\n]*$"):
        answer.attention(0)


REFUSED = {  # (GIT's and BLIP's, whose text attention computes its softmax itself, answer: test_vlm_inline)
    "udop": r"its encoder \(UdopForConditionalGeneration\) reads the prompt and the image together, and neither its "
            r"config nor its processor names an image token",
    "diffusion_gemma": r"transformers' DiffusionGemmaForBlockDiffusion takes no image \(its forward has no "
                       r"pixel_values, patches or image input\); ask a model that does",
    "evolla": r"transformers' EvollaForProteinText2Text takes no image \(its forward has no pixel_values, patches or "
              r"image input; it reads protein_input_ids\); ask a model that does",
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_the_types_that_cannot_answer_are_refused_in_one_line_naming_why(folders, kind):
    import vit

    with pytest.raises(ValueError, match=REFUSED[kind]) as refused:
        vit.ask_vlm(vit.open_vlm(folders(kind)), _picture(), QUESTION, max_new_tokens=NEW_TOKENS)
    assert "\n" not in str(refused.value) and "no decoder stack" not in str(refused.value)
