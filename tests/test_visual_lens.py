"""The visual logit lens (issue 68, item 3): each image token a VLM's projector gives its language model, dotted
with a word's input embedding, placed on the patch grid by the unit each token covers.

References are transformers' own tiny random VLMs (σ 0.05 noise on every parameter) saved whole in many shards with
their image processor and a tiny word-level tokenizer built offline: the product done by hand on transformers'
modules, ``get_image_features`` · ``get_input_embeddings().weight[token_ids]``, each token's value spread by hand
over the 1 x 1 (LLaVA, PaliGemma), 4 x 4 (Gemma 3) or 2 x 2 (Qwen-VL, InternVL) patches it covers, to 1e-5.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402

import vit  # noqa: E402
from vit.checkpoint import CheckpointError  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

ATOL = 1e-5
VOCAB = {"[UNK]": 0, "<pad>": 1, "dog": 5, "cat": 6, "hot": 7, "red": 9, "sky": 17}
CLIP_TOWER = dict(model_type="clip_vision_model", image_size=32, patch_size=8, hidden_size=32, intermediate_size=48,
                  num_hidden_layers=3, num_attention_heads=2)
SIGLIP_TOWER = dict(CLIP_TOWER, model_type="siglip_vision_model", vision_use_head=False)
TEXT = dict(hidden_size=24, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
            head_dim=12, vocab_size=64)
QWEN_VISION = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=24,
                   fullatt_block_indexes=[1])
QWEN_TEXT = dict(hidden_size=24, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, vocab_size=64, max_position_embeddings=64,
                 rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 1], "rope_theta": 10000.0})
QWEN3_VISION = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=24,
                    num_position_embeddings=64, deepstack_visual_indexes=[0])
QWEN3_TEXT = dict(QWEN_TEXT, head_dim=12, rope_parameters={"rope_type": "default", "mrope_section": [2, 2, 2],
                                                           "rope_theta": 10000.0, "mrope_interleaved": True})
INTERNVL_TOWER = dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=2, attention_bias=True, use_qk_norm=True)
KINDS = ["llava", "paligemma", "gemma3", "qwen2_5_vl", "qwen3_vl", "internvl"]
UNIT = {"llava": 1, "paligemma": 1, "gemma3": 4, "qwen2_5_vl": 2, "qwen3_vl": 2, "internvl": 2}  # patches per token


def noisy(model: torch.nn.Module) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    return model.eval()


def _build(kind: str):
    if kind == "llava":
        config = transformers.LlavaConfig(vision_config=CLIP_TOWER, text_config=dict(TEXT, model_type="llama"),
                                          image_token_id=3)
        processor = transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
        return transformers.LlavaForConditionalGeneration(config), processor
    if kind == "paligemma":
        config = transformers.PaliGemmaConfig(vision_config=SIGLIP_TOWER, text_config=dict(TEXT, model_type="gemma"),
                                              projection_dim=24, image_token_id=3)
        return (transformers.PaliGemmaForConditionalGeneration(config),
                transformers.SiglipImageProcessor(size={"height": 32, "width": 32}, resample=3))
    if kind == "gemma3":
        config = transformers.Gemma3Config(vision_config=dict(SIGLIP_TOWER, image_size=64),  # 8 x 8, pooled to 2 x 2
                                           text_config=dict(TEXT, model_type="gemma3_text"), mm_tokens_per_image=4,
                                           image_token_id=3)
        return (transformers.Gemma3ForConditionalGeneration(config),
                transformers.Gemma3ImageProcessor(size={"height": 64, "width": 64}))
    if kind == "internvl":  # a 4 x 4 grid, pixel-shuffled 2 x 2 into 2 x 2 image tokens
        config = transformers.InternVLConfig(vision_config=INTERNVL_TOWER, text_config=dict(TEXT, model_type="qwen2"),
                                             image_token_id=3)
        return (transformers.InternVLForConditionalGeneration(config),
                transformers.GotOcr2ImageProcessor(size={"height": 32, "width": 32}))
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    if kind == "qwen3_vl":  # 16-px patches, global attention
        config = transformers.Qwen3VLConfig(vision_config=QWEN3_VISION, text_config=QWEN3_TEXT)
        return (transformers.Qwen3VLForConditionalGeneration(config),
                Qwen2VLImageProcessor(patch_size=16, merge_size=2, min_pixels=64 * 64, max_pixels=32 * 32 * 64,
                                      image_mean=[0.5] * 3, image_std=[0.5] * 3))
    config = transformers.Qwen2_5_VLConfig(vision_config=QWEN_VISION, text_config=QWEN_TEXT)
    return (transformers.Qwen2_5_VLForConditionalGeneration(config),
            Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=28 * 28 * 40))


def tiny_tokenizer():
    """A word-level tokenizer of ``VOCAB`` split at spaces (so "hot dog" is two tokens), built offline."""
    tokenizer = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="<pad>")


@pytest.fixture(scope="module")
def vlms(tmp_path_factory):
    """``{kind: (folder, model, processor)}``: each VLM saved whole in many shards with its processor and tokenizer."""
    built = {}
    for kind in KINDS:
        torch.manual_seed(0)
        model, processor = _build(kind)
        model = noisy(model)
        model.set_attn_implementation("eager")  # the path that returns attention probabilities
        folder = tmp_path_factory.mktemp(kind)
        model.save_pretrained(folder, max_shard_size="20KB")
        processor.save_pretrained(folder)
        tiny_tokenizer().save_pretrained(folder)
        built[kind] = folder, model, processor
    return built


def picture(width: int = 90, height: int = 70) -> Image.Image:
    return Image.fromarray(np.random.default_rng(3).integers(0, 256, (height, width, 3), dtype=np.uint8))


def by_hand(model, processor, kind: str, image: Image.Image, token_ids: list[int]) -> np.ndarray:
    """transformers' image features · the mean of the word's input embeddings, each image token's value written
    into every patch its unit covers (units row-major)."""
    inputs = processor(images=[image], return_tensors="pt")
    with torch.no_grad():
        if kind.startswith("qwen"):
            features = model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output[0]
            gh, gw = inputs["image_grid_thw"][0, 1:].tolist()
        else:
            features = model.get_image_features(pixel_values=inputs["pixel_values"]).pooler_output
            features = features[0]
            side = inputs["pixel_values"].shape[-1] // 8
            gh = gw = side
        word = model.get_input_embeddings().weight[token_ids].mean(0)
        scores = (features @ word).numpy()  # (N,)
    unit = UNIT[kind]
    expected = np.zeros((gh, gw), dtype=np.float32)
    for r in range(gh):
        for c in range(gw):
            expected[r, c] = scores[(r // unit) * (gw // unit) + c // unit]
    return expected


@pytest.mark.parametrize("kind", KINDS)
def test_the_lens_is_the_projected_tokens_dot_the_words_input_embedding(vlms, kind):
    folder, model, processor = vlms[kind]
    checkpoint, image = vit.load(folder, device="cpu"), picture()
    dog, hot_dog = vit.visual_logit_lens(checkpoint, image, ["dog", "hot dog"])
    assert dog.tokens == ("dog",) and dog.token_ids == (5,) and hot_dog.token_ids == (7, 5)
    for shown, ids in ((dog, [5]), (hot_dog, [7, 5])):  # a word of two tokens: the mean of their embeddings
        expected = by_hand(model, processor, kind, image, ids)
        assert shown.grid == expected.shape and shown.map.shape == expected.shape
        np.testing.assert_allclose(shown.map, expected, rtol=0, atol=ATOL)
        np.testing.assert_allclose(shown.units, expected[::UNIT[kind], ::UNIT[kind]], rtol=0, atol=ATOL)
    assert not np.allclose(dog.map, hot_dog.map, atol=1e-3)


def _index(folder: Path) -> dict[str, str]:
    return json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]


@pytest.mark.parametrize("kind", ["llava", "qwen2_5_vl"])
def test_only_the_words_rows_of_the_language_models_embedding_are_read(vlms, kind, monkeypatch):
    from safetensors import safe_open

    folder, _, _ = vlms[kind]
    checkpoint = vit.load(folder, device="cpu")  # the tower's own reads are tested in test_vlm_towers
    opened, whole, rows = [], [], []

    class Recording:
        def __init__(self, path, **kwargs):
            opened.append(Path(path).name)
            self.file = safe_open(path, **kwargs)

        def __enter__(self):
            self.file.__enter__()
            return self

        def __exit__(self, *exc):
            return self.file.__exit__(*exc)

        def get_tensor(self, name):
            whole.append(name)
            return self.file.get_tensor(name)

        def get_slice(self, name):
            part = self.file.get_slice(name)

            class Rows:
                def __getitem__(self, index):
                    tensor = part[index]
                    rows.append((name, tensor.shape[0]))
                    return tensor

            return Rows()

    monkeypatch.setattr("safetensors.safe_open", Recording)
    monkeypatch.setattr("safetensors.torch.load_file", lambda *a, **k: pytest.fail("a whole file was read"))
    [shown] = vit.visual_logit_lens(checkpoint, picture(), ["hot dog"])
    weight_map = _index(folder)
    [name] = [k for k in weight_map if k.endswith("embed_tokens.weight")]
    assert whole == [] and rows == [(name, 1), (name, 1)]  # its two rows, one at a time
    assert opened == [weight_map[name]]
    vocabulary, width = 64, 24
    assert shown.embedding.startswith(f"{name} in {weight_map[name]}: {vocabulary} x {width} float32 (0.0 MiB)")


def test_a_word_the_tokenizer_cannot_encode_is_refused_in_one_line(vlms):
    checkpoint = vit.load(vlms["llava"][0], device="cpu")
    with pytest.raises(ValueError, match="tokenizer cannot encode 'zebra' .it gives the unknown token") as e:
        vit.visual_logit_lens(checkpoint, picture(), ["dog", "zebra"])
    assert "\n" not in str(e.value)


def test_a_model_without_a_projector_is_refused_in_one_line():
    with pytest.raises(ValueError, match="has no projector; open a LLaVA") as e:
        vit.visual_logit_lens(vit.load(vit.shipped(), device="cpu"), picture(), ["dog"])
    assert "\n" not in str(e.value)


def test_a_tower_saved_apart_from_its_language_model_is_refused_in_one_line(vlms, tmp_path):
    from vit.checkpoint import save_checkpoint

    checkpoint = vit.load(vlms["paligemma"][0], device="cpu")
    save_checkpoint(tmp_path / "tower.pt", checkpoint.model, [], checkpoint.preprocessing, checkpoint.metadata)
    with pytest.raises(ValueError, match="open the VLM's folder") as e:
        vit.visual_logit_lens(vit.load(tmp_path / "tower.pt", device="cpu"), picture(), ["dog"])
    assert "\n" not in str(e.value)


def test_a_folder_without_its_tokenizer_or_its_embeddings_shard_is_refused_in_one_line(vlms, tmp_path):
    folder = vlms["llava"][0]
    bare = tmp_path / "bare"
    shutil.copytree(folder, bare, ignore=shutil.ignore_patterns("tokenizer*"))
    with pytest.raises(CheckpointError, match="has no tokenizer files") as e:
        vit.visual_logit_lens(vit.load(bare, device="cpu"), picture(), ["dog"])
    assert "\n" not in str(e.value)
    [name] = [k for k in _index(folder) if k.endswith("embed_tokens.weight")]
    (bare / _index(folder)[name]).unlink()  # as a Hub download that fetched the tower's shards alone
    with pytest.raises(CheckpointError, match=f"lacks {_index(folder)[name]}, the shard that holds {name}") as e:
        vit.visual_logit_lens(vit.load(bare, device="cpu"), picture(), ["dog"])
    assert "\n" not in str(e.value)


def test_a_word_map_saves_its_arrays_and_exports_as_the_explorers_html(vlms, tmp_path):
    [shown] = vit.visual_logit_lens(vit.load(vlms["gemma3"][0], device="cpu"), picture(), "red")
    saved = np.load(shown.save(tmp_path / "red.npz"))
    assert saved["map"].shape == (8, 8) and saved["units"].shape == (2, 2) and str(saved["word"]) == "red"
    assert saved["token_ids"].tolist() == [9]
    assert "visual logit lens of" in shown.to_html(tmp_path / "red.html").read_text()
    assert shown.overlay(scale=1).size == shown.seen.size


# -- a word's lens score as the target of the gradient maps -------------------------------------------------------

def _legrad_on_transformers(model, pixel_values: torch.Tensor, word: torch.Tensor, unit: int | None,
                            skip: int = 1) -> np.ndarray:
    """LeGrad by hand on transformers' LLaVA: at each of the tower's two layers read (vision_feature_layer -2), the
    word's score read from that layer's output through the projector (no final norm, the first ``skip`` tokens left
    out, as get_image_features: the CLS for strategy "default", none for "full"), its gradient with respect to the
    layer's attention, clamped at 0, averaged over heads and queries, summed over the layers; the patches' part."""
    tower, projector = model.model.vision_tower, model.model.multi_modal_projector
    with torch.enable_grad():
        out = tower(pixel_values, output_attentions=True, output_hidden_states=True)
        total = 0
        for layer in (0, 1):
            scores = projector(out.hidden_states[layer + 1][:, skip:]) @ word  # (1, N)
            score = scores.sum() if unit is None else scores[0, unit]
            [grad] = torch.autograd.grad(score, out.attentions[layer], retain_graph=True)
            total = total + grad.clamp(min=0).mean(dim=1).mean(dim=1)[0]  # (T,)
    return total[1:].reshape(4, 4).detach().numpy()


@pytest.mark.parametrize("patch", [None, 6])
def test_legrad_of_a_words_score_at_one_token_or_all_is_legrad_on_transformers(vlms, patch):
    folder, model, processor = vlms["llava"]
    checkpoint, image = vit.load(folder, device="cpu"), picture()
    shown = vit.explain_word(checkpoint, image, "hot dog", "legrad", patch=patch)
    word = model.get_input_embeddings().weight[[7, 5]].mean(0).detach()
    pixels = processor(images=[image], return_tensors="pt")["pixel_values"]
    expected = _legrad_on_transformers(model, pixels, word, patch)
    assert shown.map.shape == (4, 4) and shown.target == "hot dog"
    np.testing.assert_allclose(shown.map, expected, rtol=0, atol=ATOL)
    assert ("summed over every image token" if patch is None else "over patch 6") in shown.description


@pytest.mark.parametrize("kind, patch", [("qwen2_5_vl", 7), ("gemma3", 13), ("llava", None), ("internvl", 6)])
def test_the_target_is_the_words_score_at_the_unit_under_the_patch(vlms, kind, patch):
    from vit.core.inference import preprocess
    from vit.explain.methods.vlm_targets import lens_model, unit_of_patch

    folder, model, processor = vlms[kind]
    checkpoint, image = vit.load(folder, device="cpu"), picture()
    x = preprocess([image], checkpoint.preprocessing, patch_size=checkpoint.config.patch_size)
    grid = checkpoint.model.patch_grid(*x.shape[2:])
    word = model.get_input_embeddings().weight[[9]].detach()  # (1, E): "red"
    units = None if patch is None else torch.tensor([unit_of_patch(patch, grid, UNIT[kind])])
    with torch.no_grad():
        logits = lens_model(checkpoint.model, word, grid, units)(x)[0]  # (1, 1)
    expected = by_hand(model, processor, kind, image, [9])  # each token's score on its patches
    want = expected.sum() / UNIT[kind] ** 2 if patch is None else expected.reshape(-1)[patch]
    torch.testing.assert_close(logits, torch.tensor([[float(want)]]), rtol=0, atol=ATOL)
    assert checkpoint.model.head is None  # the wrapped tower shares the weights, the tower keeps no head


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen3_vl", "paligemma", "gemma3", "internvl"])
def test_attnlrp_and_the_gradient_maps_of_a_word_draw_on_the_patch_grid_or_refuse_in_one_line(vlms, kind):
    checkpoint, image = vit.load(vlms[kind][0], device="cpu"), picture()
    for method in ("legrad", "attnlrp", "class"):
        try:
            shown = vit.explain_word(checkpoint, image, "dog", method, patch=0)
        except ValueError as e:
            raise AssertionError((kind, method, str(e))) from None
        assert shown.map.shape == shown.grid and np.isfinite(shown.map).all() and np.abs(shown.map).max() > 0
    with pytest.raises(ValueError, match="is a target of legrad, class, attnlrp, not 'rollout'") as e:
        vit.explain_word(checkpoint, image, "dog", "rollout")
    assert "\n" not in str(e.value)


def _legrad_on_transformers_qwen(model, inputs, word: torch.Tensor, unit: int | None) -> np.ndarray:
    """LeGrad by hand on transformers' Qwen2.5-VL tower, in its own window order: each layer's output (a forward
    hook on the block) read through the merger and taken back to the units' row-major order (argsort of its window
    index, as its forward does), the word's score there; its gradient with respect to the probabilities each
    ``eager_attention_forward`` call forms (one per window in a windowed layer, one in a global one), clamped at
    0, averaged over heads, summed over the window's queries and divided by every query (T); each window's keys
    placed on the grid by the window index; summed over the tower's two layers."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl
    from transformers.vision_utils import get_vision_window_index

    visual, grid_thw = model.model.visual, inputs["image_grid_thw"]
    calls, hidden, eager = [], [], modeling_qwen2_5_vl.eager_attention_forward

    def spy(module, *args, **kwargs):
        out, weights = eager(module, *args, **kwargs)
        calls.append(weights)
        return out, weights

    hooks = [block.register_forward_hook(lambda module, args, out: hidden.append(out)) for block in visual.blocks]
    modeling_qwen2_5_vl.eager_attention_forward = spy
    try:
        with torch.enable_grad():
            visual(inputs["pixel_values"], grid_thw=grid_thw)
    finally:
        modeling_qwen2_5_vl.eager_attention_forward = eager
        for hook in hooks:
            hook.remove()
    _, gh, gw = grid_thw[0].tolist()
    units, cu = get_vision_window_index(grid_thw, 2, 112, 14)
    order = torch.tensor([(u // (gw // 2) * 2 + py) * gw + u % (gw // 2) * 2 + px
                          for u in units.tolist() for py in (0, 1) for px in (0, 1)])  # its i-th token's place
    reverse, T = torch.argsort(units), gh * gw
    windows = torch.diff(cu).tolist()
    total = torch.zeros(T, dtype=torch.float64)
    with torch.enable_grad():
        for layer, out in enumerate(hidden):
            spans = [T] if layer in QWEN_VISION["fullatt_block_indexes"] else windows
            probs, calls = calls[:len(spans)], calls[len(spans):]
            scores = visual.merger(out)[reverse] @ word  # (N,): units row-major
            score = scores.sum() if unit is None else scores[unit]
            grads = torch.autograd.grad(score, probs, retain_graph=True)
            start = 0
            for n, grad in zip(spans, grads, strict=True):
                keys = grad[0].clamp(min=0).mean(dim=0).sum(dim=0)  # (n,): heads averaged, queries summed
                total[order[start:start + n]] += keys.double() / T
                start += n
    assert not calls
    return total.reshape(gh, gw).float().numpy()


@pytest.mark.parametrize("patch", [None, 30])
def test_legrad_of_a_words_score_through_qwens_windows_is_legrad_on_transformers(vlms, patch):
    from vit.explain.methods.vlm_targets import unit_of_patch

    folder, model, processor = vlms["qwen2_5_vl"]
    checkpoint, image = vit.load(folder, device="cpu"), picture(330, 90)  # three windows across, the last ragged
    shown = vit.explain_word(checkpoint, image, "hot dog", "legrad", patch=patch)
    inputs = processor(images=[image], return_tensors="pt")
    gh, gw = inputs["image_grid_thw"][0, 1:].tolist()
    assert shown.map.shape == (gh, gw) and gw > 16  # more than two 8-patch windows across
    word = model.get_input_embeddings().weight[[7, 5]].mean(0).detach()
    unit = None if patch is None else unit_of_patch(patch, (gh, gw), 2)
    expected = _legrad_on_transformers_qwen(model, inputs, word, unit)
    scale = np.abs(expected).max()  # the scores of a tiny random tower are small: compared to the map's maximum
    assert scale > 0
    np.testing.assert_allclose(shown.map / scale, expected / scale, rtol=0, atol=ATOL)


@pytest.mark.parametrize("patch", [0, 30, 41])
def test_gradient_rollout_of_a_words_score_through_qwens_windows_is_chefers_rollout_on_transformers(vlms, patch):
    """Chefer et al. 2021b by hand on transformers' Qwen2.5-VL tower, in its own window order: the gradient of the
    word's score at the unit under the patch (the last block's output through the merger) with respect to the
    probabilities each ``eager_attention_forward`` call forms (one per window in a windowed layer, one in the global
    one), relu(gradient x attention) averaged over heads, each window's block placed on the grid by the window index
    (zero outside the windows), R = R + A R from the identity, the patch's row."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl
    from transformers.vision_utils import get_vision_window_index

    from vit.explain.methods.vlm_targets import unit_of_patch

    folder, model, processor = vlms["qwen2_5_vl"]
    checkpoint, image = vit.load(folder, device="cpu"), picture(330, 90)  # three windows across, the last ragged
    shown = vit.explain_word(checkpoint, image, "hot dog", "class", patch=patch)
    inputs = processor(images=[image], return_tensors="pt")
    visual, grid_thw = model.model.visual, inputs["image_grid_thw"]
    _, gh, gw = grid_thw[0].tolist()
    assert shown.map.shape == (gh, gw) and gw > 16
    word = model.get_input_embeddings().weight[[7, 5]].mean(0).detach()
    calls, hidden, eager = [], [], modeling_qwen2_5_vl.eager_attention_forward

    def spy(module, *args, **kwargs):
        out, weights = eager(module, *args, **kwargs)
        calls.append(weights)
        return out, weights

    hook = visual.blocks[-1].register_forward_hook(lambda module, args, out: hidden.append(out))
    modeling_qwen2_5_vl.eager_attention_forward = spy
    try:
        with torch.enable_grad():
            visual(inputs["pixel_values"], grid_thw=grid_thw)
            units, cu = get_vision_window_index(grid_thw, 2, 112, 14)
            reverse, T = torch.argsort(units), gh * gw
            score = (visual.merger(hidden[0])[reverse] @ word)[unit_of_patch(patch, (gh, gw), 2)]
            grads = torch.autograd.grad(score, calls)
    finally:
        modeling_qwen2_5_vl.eager_attention_forward = eager
        hook.remove()
    order = torch.tensor([(u // (gw // 2) * 2 + py) * gw + u % (gw // 2) * 2 + px
                          for u in units.tolist() for py in (0, 1) for px in (0, 1)])  # its i-th token's place
    windows, R, i = torch.diff(cu).tolist(), torch.eye(T, dtype=torch.float64), 0
    for layer in range(QWEN_VISION["depth"]):
        A, start = torch.zeros(T, T, dtype=torch.float64), 0
        for n in [T] if layer in QWEN_VISION["fullatt_block_indexes"] else windows:
            term = (grads[i] * calls[i]).clamp(min=0).mean(dim=1)[0].detach().double()  # (n, n)
            place = order[start:start + n]
            A[place[:, None], place[None, :]] = term
            i, start = i + 1, start + n
        R = R + A @ R
    assert i == len(calls)
    expected = R[patch].numpy()
    ours = shown.map.reshape(-1).astype(np.float64)
    np.testing.assert_allclose(ours[patch], expected[patch], rtol=1e-6)  # the identity's 1 and ~1e-5 on it
    others = np.arange(T) != patch  # the rest, on its own scale (the scores of a tiny random tower are small)
    scale = np.abs(expected[others]).max()
    assert scale > 0
    np.testing.assert_allclose(ours[others] / scale, expected[others] / scale, rtol=0, atol=ATOL)


def test_gradient_rollout_of_a_words_score_is_chefers_rollout_on_transformers(vlms):
    """Chefer et al. 2021b by hand on transformers' attentions: each layer's relu(gradient x attention) averaged
    over heads, R = R + A R from the identity, the row of the clicked patch's token (CLS first in the tower)."""
    folder, model, processor = vlms["llava"]
    checkpoint, image, patch = vit.load(folder, device="cpu"), picture(), 9
    shown = vit.explain_word(checkpoint, image, "cat", "class", patch=patch)
    word = model.get_input_embeddings().weight[6].detach()
    pixels = processor(images=[image], return_tensors="pt")["pixel_values"]
    with torch.enable_grad():
        out = model.model.vision_tower(pixels, output_attentions=True, output_hidden_states=True)
        score = (model.model.multi_modal_projector(out.hidden_states[2][:, 1:]) @ word)[0, patch]
        gradients = torch.autograd.grad(score, out.attentions[:2])
    R = torch.eye(17)
    for attention, gradient in zip(out.attentions[:2], gradients, strict=True):
        term = (gradient * attention).clamp(min=0).mean(dim=1)[0].detach()  # (T, T)
        R = R + term @ R
    expected = R[1 + patch, 1:].reshape(4, 4).numpy()
    np.testing.assert_allclose(shown.map, expected, rtol=0, atol=ATOL)
    with pytest.raises(ValueError, match="gradient rollout draws one token's row") as e:
        vit.explain_word(checkpoint, image, "cat", "class")
    assert "\n" not in str(e.value)


def test_what_is_read_of_the_embedding_is_bounded_by_the_words_and_their_tokens(vlms):
    checkpoint = vit.load(vlms["llava"][0], device="cpu")
    with pytest.raises(ValueError, match="'dog dog dog .* is 17 tokens, over the 16 a word may have") as e:
        vit.visual_logit_lens(checkpoint, picture(), [" ".join(["dog"] * 17)])
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="give 1 to 64 words, got 65"):
        vit.visual_logit_lens(checkpoint, picture(), ["dog"] * 65)


@pytest.mark.parametrize("projector", [
    dict(pre_norm=True, activation="quick_gelu", projector="mlp", projector_skip=1),  # LLaVA's CLIP and MLP
    dict(class_token=False, norm="rms", gated_mlp=True, activation="silu", projector="qwen", spatial_merge=2),
    dict(class_token=False, projector="gemma3", projector_pool=2),  # Gemma 3's pool, RMSNorm and linear
    dict(layer_scale=0.5, qk_norm=True, projector="internvl", projector_skip=1, projector_unit=2),  # InternVL's
], ids=["llava", "qwen", "gemma3", "internvl"])
def test_cp_lrp_of_a_words_score_passes_all_of_it_to_the_embedding_through_the_projector(projector):
    """CP-LRP's defining property, with the lens head on top: with no bias to absorb any, the relevance of the first
    block's input sums to the word's score, which holds only if the projector's operations carry their rules."""
    from vit.explain.methods.relevance import AttnLRPRules
    from vit.explain.methods.vlm_targets import lens_model
    from vit.model import ViT, ViTConfig, use_rules

    torch.manual_seed(0)
    config = ViTConfig(image_size=16, patch_size=4, num_classes=0, hidden_size=16, num_layers=2, num_heads=2,
                       mlp_size=24, pooling="avg", projector_dim=8, **projector)
    model = ViT(config).eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            if key.endswith("bias"):
                p.zero_()
            elif "norm" in key:
                p.add_(torch.randn_like(p) * 0.1)
    wrapped = lens_model(model, torch.randn(1, 8), (4, 4), torch.tensor([1]))
    images = torch.randn(2, 3, 16, 16)
    with torch.enable_grad(), use_rules(AttnLRPRules(cp=True)):
        encoding, cache = wrapped.run_with_cache(images.requires_grad_(True), ["hook_embed"])
        score = encoding.logits[:, 0]
        [grad] = torch.autograd.grad(score.sum(), cache["hook_embed"])
    total = (cache["hook_embed"] * grad).sum(dim=(1, 2))  # (B,)
    torch.testing.assert_close(total, score.detach(), rtol=1e-3, atol=1e-5 * float(score.detach().abs().max()))


# -- LLaVA with vision_feature_select_strategy "full": the CLS's projection is an image token too (issue 76) ----------

@pytest.fixture(scope="module")
def llava_full(vlms, tmp_path_factory):
    """The tiny LLaVA's folder with strategy "full": its projector gives the language model 1 + 16 image tokens."""
    folder = tmp_path_factory.mktemp("llava_full") / "llava"
    shutil.copytree(vlms["llava"][0], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vision_feature_select_strategy": "full"}))
    return folder, *vlms["llava"][1:]


def test_the_lens_of_a_llava_reading_every_token_maps_the_patches_tokens_and_leaves_the_cls_off(llava_full):
    folder, model, processor = llava_full
    checkpoint, image = vit.load(folder, device="cpu"), picture()
    [dog] = vit.visual_logit_lens(checkpoint, image, ["dog"])
    pixels = processor(images=[image], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        features = model.get_image_features(pixel_values=pixels, vision_feature_select_strategy="full")
        scores = features.pooler_output[0] @ model.get_input_embeddings().weight[5]  # (17,): the CLS's first
    assert scores.shape == (17,)
    np.testing.assert_allclose(dog.map, scores[1:].reshape(4, 4).numpy(), rtol=0, atol=ATOL)
    assert "the CLS's image token, which the language model reads too, covers no patch" in dog.description


@pytest.mark.parametrize("patch", [None, 6])
def test_legrad_of_a_words_score_on_a_llava_reading_every_token_targets_the_patchs_own_token(llava_full, patch):
    """The token over patch 6 is the projector's row 7 (the CLS's is row 0); every token's sum includes the CLS's."""
    folder, model, processor = llava_full
    checkpoint, image = vit.load(folder, device="cpu"), picture()
    shown = vit.explain_word(checkpoint, image, "hot dog", "legrad", patch=patch)
    word = model.get_input_embeddings().weight[[7, 5]].mean(0).detach()
    pixels = processor(images=[image], return_tensors="pt")["pixel_values"]
    expected = _legrad_on_transformers(model, pixels, word, None if patch is None else 1 + patch, skip=0)
    np.testing.assert_allclose(shown.map, expected, rtol=0, atol=ATOL)
