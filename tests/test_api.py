"""The notebook API (``import vit``): vit.load, vit.explain and its Explanation, vit.methods, vit.ask, the mechanism;
``import vit`` itself loads nothing else, and ``vit.explain`` stays the package for imports."""

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vit
from vit.app import explorer
from vit.checkpoint import Preprocessing, save_checkpoint
from vit.inference import preprocess
from vit.model import ViT, ViTConfig

ROOT = Path(__file__).resolve().parent.parent
CLASSES = ["cat", "dog", "fox"]
TINY = ViTConfig(image_size=16, patch_size=4, num_channels=3, num_classes=3, hidden_size=16, num_layers=2,
                 num_heads=2, mlp_size=32)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random checkpoint whose preprocessing resizes the short side to 20 px and crops the centre 16."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("api") / "tiny.pt"
    crop = Preprocessing(16, 3, (0.5,) * 3, (0.5,) * 3, resize_size=20, resize_mode="shortest_edge")
    save_checkpoint(path, ViT(TINY), CLASSES, crop)
    return vit.load(path, device="cpu")


@pytest.fixture(scope="module")
def photo():
    return Image.fromarray(np.random.default_rng(3).integers(0, 256, (30, 40, 3), dtype=np.uint8))  # 40 x 30


def test_import_vit_loads_no_wing_until_a_function_is_used():
    code = "import sys, vit; print(sorted(m for m in sys.modules if m.startswith('vit')), 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "['vit'] False"
    assert vit.methods is vit.api.methods  # the first use loads vit.api


def test_vit_explain_is_the_function_when_called_and_the_package_for_imports():
    from vit.explain.attention import rollout

    assert callable(vit.explain) and vit.explain.attention.rollout is rollout
    import vit.explain.relevance as relevance  # the import system sets vit.explain: it stays callable

    assert vit.explain.relevance is relevance and callable(vit.explain)


def test_the_attention_map_is_the_models_own_attention_row(tiny, photo):
    e = vit.explain(tiny, photo, "attention", layer=1, head=0, query=5)
    x = preprocess([photo], tiny.preprocessing)
    with torch.no_grad():
        _, attentions = tiny.model(x, output_attentions=True)  # the forward contract: post-softmax, per layer
    np.testing.assert_allclose(e.map, attentions[1][0, 0, 5, 1:].reshape(4, 4).numpy(), rtol=0, atol=1e-6)


def test_every_listed_method_draws_a_patch_grid_or_says_it_does_not_apply(tiny, photo):
    assert set(vit.methods()) == set(explorer.MAP_KINDS)
    for method in vit.methods():
        try:
            assert vit.explain(tiny, photo, method).map.shape == (4, 4)
        except ValueError as e:
            assert method in explorer.PROBE_MAP_KINDS and "attention-pooling" in str(e)


def test_a_class_map_is_the_explorers_for_the_class_named(tiny, photo):
    e = vit.explain(tiny, photo, "class", target="dog")
    analysis = explorer.analyse(tiny, photo)
    relevance = explorer.class_relevance(tiny, photo, 1)
    expected = explorer.attention_map(analysis, explorer.MapSettings(kind="class", class_index=1), relevance)
    assert e.target == "dog"
    np.testing.assert_array_equal(e.map, expected)


def test_the_overlay_covers_exactly_the_pixels_the_model_saw(tiny, photo):
    e = vit.explain(tiny, photo)
    # 40 x 30 resized as torchvision does to 26 x 20 (short side 20, the long one truncated), the centre 16 x 16
    # cropped from x = 5, y = 2: in the original's pixels x from 5 * 40 / 26 to 21 * 40 / 26, y from 3 to 27.
    assert e.input_box == pytest.approx((5 * 40 / 26, 3.0, 21 * 40 / 26, 27.0))
    width, height = e.seen.size
    assert (width, height) in ((24, 24), (25, 24)) and e.overlay().size == e.seen.size
    assert e.overlay(alpha=0.0).tobytes() == e.seen.convert("RGB").tobytes()
    factor = -(-320 // max(width, height))  # in a notebook: enlarged by a whole factor to 320 px, as the explorer
    shown = Image.open(io.BytesIO(e._repr_png_()))
    assert shown.size == (width * factor, height * factor) and e.figure().layout.images[0].sizex == width * factor


def test_an_input_past_the_token_gate_is_refused_before_any_forward_unless_max_tokens_allows_it(
        tiny, photo, monkeypatch):
    monkeypatch.setenv("VIT_MAX_TOKENS", "200")
    embed = tiny.model.embed  # every forward starts there

    def no_forward(*args, **kwargs):
        raise AssertionError("the model ran before the token gate was checked")

    monkeypatch.setattr(tiny.model, "embed", no_forward)
    with pytest.raises(ValueError, match=r"257 tokens; at most 256 .* TFLOP .* larger max_tokens"):
        vit.explain(tiny, photo, "rollout", size=64, max_tokens=256)  # 16 x 16 patches + CLS
    with pytest.raises(ValueError, match="257 tokens; at most 200"):  # the explorer's gate by default
        vit.explain(tiny, photo, "rollout", size=64)
    monkeypatch.setattr(tiny.model, "embed", embed)
    assert vit.explain(tiny, photo, "rollout", size=64, max_tokens=257).map.shape == (16, 16)


def test_an_argument_the_method_does_not_read_is_refused(tiny, photo):
    with pytest.raises(ValueError, match="norms does not read head; it reads layer"):
        vit.explain(tiny, photo, "norms", head=1)
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        vit.explain(tiny, photo, "nope")


def test_the_mechanism_is_the_explorers_mechanism_view(tiny, photo):
    view = vit.mechanism(tiny, photo, target="fox")
    assert view.class_index == 2 and view.dla_heads.shape == (2, 2)
    np.testing.assert_array_equal(vit.head_effects(tiny, photo, target=2),
                                  explorer.ablation_effects(tiny, photo, 2))
    assert vit.registers(tiny, photo, [photo], threshold=0.0, top_k=2).attention_before.shape == (4, 4)


@pytest.mark.slow
def test_ask_gives_open_clips_own_zero_shot_probabilities(tmp_path):
    from test_prompts import save_open_clip

    open_clip = pytest.importorskip("open_clip")
    model, folder = save_open_clip(tmp_path / "clip")
    image = Image.fromarray(np.random.default_rng(4).integers(0, 256, (32, 32, 3), dtype=np.uint8))
    answer = vit.ask(vit.load(folder, device="cpu"), image, ["a dog", "a cat"])
    transform = open_clip.image_transform(32, is_train=False, mean=open_clip.OPENAI_DATASET_MEAN,
                                          std=open_clip.OPENAI_DATASET_STD)
    tokens = open_clip.get_tokenizer(f"local-dir:{folder}")(["a photo of a a dog.", "a photo of a a cat."])
    with torch.no_grad():
        expected = (model.logit_scale.exp() * model.encode_image(transform(image)[None], normalize=True)
                    @ model.encode_text(tokens, normalize=True).T).softmax(dim=-1)[0]
    assert [answer.scores[label] for label in ("a dog", "a cat")] == pytest.approx(expected.tolist(), abs=1e-5)
    assert answer.explain("a cat", "legrad").map.shape == (4, 4)


def test_the_commands_stay_modules_of_vit():
    from vit import predict, train

    assert callable(predict.main) and callable(train.command)
