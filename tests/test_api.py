"""The notebook API (``import vit``): vit.load, vit.explain and its Explanation, vit.methods, vit.ask, the mechanism;
``import vit`` itself loads nothing else, and ``vit.explain`` stays the package for imports."""

import dataclasses
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vit
from vit.checkpoint import Preprocessing, save_checkpoint
from vit.core.inference import preprocess
from vit.explain.views import attention_maps, image_analysis, mechanism_views, method_maps
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
    from vit.explain.methods.attention import rollout

    assert callable(vit.explain) and vit.explain.methods.attention.rollout is rollout
    import vit.explain.methods.relevance as relevance  # the import system sets vit.explain: it stays callable

    assert vit.explain.methods.relevance is relevance and callable(vit.explain)


def test_the_attention_map_is_the_models_own_attention_row(tiny, photo):
    e = vit.explain(tiny, photo, "attention", layer=1, head=0, query=5)
    x = preprocess([photo], tiny.preprocessing)
    with torch.no_grad():
        _, attentions = tiny.model(x, output_attentions=True)  # the forward contract: post-softmax, per layer
    np.testing.assert_allclose(e.map, attentions[1][0, 0, 5, 1:].reshape(4, 4).numpy(), rtol=0, atol=1e-6)


def test_every_listed_method_draws_a_patch_grid_or_says_it_does_not_apply(tiny, photo):
    from vit.explain.methods import dense_clip

    words = {"grad_eclip", "dinotxt", *dense_clip.METHODS}  # typed labels alone: vit.ask draws them (issue 63, item 3)
    assert set(vit.methods()) == set(attention_maps.MAP_KINDS) | words
    for method in vit.methods():
        try:
            drawn = vit.explain(tiny, photo, method)
            # a pixel method's map is on the 16-px input's pixels (issue 90, item 3), its patch sums the grid
            assert drawn.map.shape == ((16, 16) if drawn.pixels else (4, 4)) and drawn.patch_sums().shape == (4, 4)
        except ValueError as e:
            assert (method in attention_maps.PROBE_MAP_KINDS and "attention-pooling" in str(e)
                    or method in words and f"vit.ask(checkpoint, image, labels).explain(label, '{method}')" in str(e))


def family_checkpoint(family: str) -> "vit.checkpoint.Checkpoint":
    """A random tiny model of ``family`` (test_family_relevance's, plus a plain ViT, a feature model without a
    classifier and a two-stage Swin) with three classes where it has a classifier."""
    from test_family_relevance import BASE, FAMILIES

    from vit.checkpoint import Checkpoint
    from vit.sources.ports.families import import_swin

    if family == "swin":
        config = import_swin.config_from_hf({"model_type": "swin", "architectures": ["SwinForImageClassification"],
                                             "image_size": 16, "patch_size": 2, "embed_dim": 8, "depths": [2, 2],
                                             "num_heads": [2, 4], "window_size": 4, "id2label": {"0": "a", "1": "b",
                                                                                                 "2": "c"}})
    else:
        options = {"plain": {}, "features": dict(num_classes=0), **FAMILIES}[family]
        config = ViTConfig(**{**BASE, **options})
    torch.manual_seed(0)
    return Checkpoint(model=ViT(config).eval(), class_names=CLASSES[:config.num_classes],
                      preprocessing=Preprocessing.default_for(config))


@pytest.mark.parametrize("family", ["plain", "features", "swin", "dinov2-registers", "siglip", "pe-core", "eva02",
                                    "deit-distilled", "aimv2"])
def test_the_methods_of_a_checkpoint_are_the_maps_explain_draws_for_it(family, photo):
    # Issue 69, item 11: vit.methods(checkpoint) raised TypeError; a user asks which maps apply to this model.
    checkpoint = family_checkpoint(family)
    drawn = vit.methods(checkpoint)
    shape = image_analysis.shape_of_input(checkpoint, checkpoint.preprocessing.image_hw)
    assert next(iter(drawn)) == attention_maps.map_kinds(shape, bool(checkpoint.class_names))[0]  # the page's default
    assert all(drawn[kind] == vit.methods()[kind] for kind in drawn)
    for method in attention_maps.MAP_KINDS:
        if method in drawn:
            assert vit.explain(checkpoint, photo, method).map.ndim == 2, method
        else:
            with pytest.raises(ValueError):
                vit.explain(checkpoint, photo, method)


def test_the_methods_of_a_checkpoint_leave_out_what_its_model_lacks():
    assert "lrp" in vit.methods(family_checkpoint("plain")) and "probe" not in vit.methods(family_checkpoint("plain"))
    assert "lrp" not in vit.methods(family_checkpoint("dinov2-registers"))  # layer scale: no rule in Chefer's LRP
    assert list(vit.methods(family_checkpoint("siglip")))[0] == "probe"  # no CLS: the pooling probe's map first
    features = vit.methods(family_checkpoint("features"))
    assert not set(features) & set(attention_maps.CLASS_MAP_KINDS) and "rollout" in features
    assert set(vit.methods(family_checkpoint("swin"))) == set(attention_maps.STAGE_MAP_KINDS)
    with pytest.raises(TypeError, match=r"takes a checkpoint \(vit.load\(...\)\), got a str"):
        vit.methods("model.pt")


def test_an_explanation_saves_its_overlay_as_png_and_its_arrays_as_npz(tiny, photo, tmp_path):
    # Issue 69, item 11: the dense results had .save(), an Explanation had none.
    e = vit.explain(tiny, photo, "class", target="dog", layer=1)
    assert np.asarray(Image.open(e.save(tmp_path / "map.png"))).tobytes() == np.asarray(e.overlay()).tobytes()
    with np.load(e.save(tmp_path / "map.npz")) as saved:  # no pickles: strings are numpy strings
        assert set(saved.files) == {"map", "method", "query", "input_box", "heads", "heads_layer", "target"}
        np.testing.assert_array_equal(saved["map"], e.map)
        np.testing.assert_array_equal(saved["heads"], e.heads)
        np.testing.assert_array_equal(saved["input_box"], e.input_box)
        assert (str(saved["method"]), str(saved["target"]), int(saved["query"])) == ("class", "dog", 0)
        assert int(saved["heads_layer"]) == 1 and saved["heads"].shape == (2, 4, 4)
    with pytest.raises(ValueError, match=r"cannot save as \.jpg; give a \.png or \.npz path"):
        e.save(tmp_path / "map.jpg")


def test_legrads_layer_is_the_first_it_explains_by_default_the_last_but_one(tiny, photo):
    from vit.explain.methods.relevance import legrad

    x = preprocess([photo], tiny.preprocessing)
    for layer, start in ((None, -2), (0, 0)):
        e = vit.explain(tiny, photo, "legrad", target="dog", layer=layer)
        np.testing.assert_allclose(e.map, legrad(tiny.model, x, 1, start_layer=start)[0].numpy(), rtol=1e-5,
                                   atol=1e-7)


def test_a_class_map_is_the_explorers_for_the_class_named(tiny, photo):
    e = vit.explain(tiny, photo, "class", target="dog")
    analysis = image_analysis.analyse(tiny, photo)
    relevance = method_maps.class_relevance(tiny, photo, 1)
    settings = attention_maps.MapSettings(kind="class", class_index=1)
    expected = attention_maps.attention_map(analysis, settings, relevance)
    assert e.target == "dog"
    np.testing.assert_array_equal(e.map, expected)


def test_a_description_is_plain_text_its_names_as_written_and_never_read_as_markdown(tmp_path, photo):
    """``Explanation.description`` is plain text: no ``**`` of the page's Markdown, a class name as written (not
    Markdown-escaped); its export shows that text as it is (a name's ``<b>`` or ``**`` is not read)."""
    torch.manual_seed(0)
    names = ["**bold** <b>cat</b>", "dog_1", "a [fox](x)"]
    save_checkpoint(tmp_path / "m.pt", ViT(TINY), names, Preprocessing(16, 3, (0.5,) * 3, (0.5,) * 3))
    checkpoint = vit.load(tmp_path / "m.pt", device="cpu")
    attention = vit.explain(checkpoint, photo, "attention").description
    assert attention.startswith("Layer 2 of 2, the mean over its 2 heads: how much the CLS token attends"), attention
    for method in ("class", "attnlrp"):
        e = vit.explain(checkpoint, photo, method, target=0)
        assert f"“{names[0]}”" in e.description and "\\" not in e.description, e.description
        assert "**" not in e.description.replace(names[0], ""), e.description  # the name's own alone
        page = e.html()
        assert "**bold** &lt;b&gt;cat&lt;/b&gt;" in page and "<b>cat</b>" not in page
        assert "<strong>" not in page.split('class="caption">', 1)[1].split("</p>", 1)[0]

def test_the_overlay_covers_exactly_the_pixels_the_model_saw(tiny, photo):
    e = vit.explain(tiny, photo)
    # 40 x 30 resized as torchvision does to 26 x 20 (short side 20, the long one truncated), the centre 16 x 16
    # cropped from x = 5, y = 2: in the original's pixels x from 5 * 40 / 26 to 21 * 40 / 26, y from 3 to 27.
    assert e.input_box == pytest.approx((5 * 40 / 26, 3.0, 21 * 40 / 26, 27.0))
    width, height = e.seen.size
    assert (width, height) in ((24, 24), (25, 24)) and e.overlay(scale=1).size == e.seen.size
    assert e.overlay(alpha=0.0, scale=1).tobytes() == e.seen.convert("RGB").tobytes()
    factor = -(-320 // max(width, height))  # in a notebook: enlarged by a whole factor to 320 px, as the explorer
    shown = Image.open(io.BytesIO(e._repr_png_()))
    assert shown.size == (width * factor, height * factor) and e.figure().layout.images[0].sizex == width * factor


def test_the_overlay_of_a_small_image_is_enlarged_pixel_for_pixel(tiny, photo):
    e = vit.explain(tiny, photo)
    exact = np.asarray(e.overlay(scale=1))  # (h, w, 3): each pixel the blend of one seen pixel
    factor = -(-320 // max(e.seen.size))  # 14: the long side at least 320 px
    enlarged = np.asarray(e.overlay())
    assert enlarged.shape == (exact.shape[0] * factor, exact.shape[1] * factor, 3)
    np.testing.assert_array_equal(enlarged, exact.repeat(factor, axis=0).repeat(factor, axis=1))
    assert e.overlay(scale=2).size == (2 * exact.shape[1], 2 * exact.shape[0])
    with pytest.raises(ValueError, match="scale must be a whole number of at least 1"):
        e.overlay(scale=0)


def test_an_input_past_the_token_gate_is_refused_before_any_forward_unless_max_tokens_allows_it(
        tiny, photo, monkeypatch):
    monkeypatch.setenv("VIT_MAX_TOKENS", "200")
    embed = tiny.model.embed  # every forward starts there

    def no_forward(*args, **kwargs):
        raise AssertionError("the model ran before the token gate was checked")

    monkeypatch.setattr(tiny.model, "embed", no_forward)
    with pytest.raises(ValueError, match=r"256 patches; at most 255 .* TFLOP .* larger max_tokens"):
        vit.explain(tiny, photo, "rollout", size=64, max_tokens=255)  # 16 x 16 patches (+ CLS, not counted)
    with pytest.raises(ValueError, match="256 patches; at most 200"):  # the explorer's gate by default
        vit.explain(tiny, photo, "rollout", size=64)
    monkeypatch.setattr(tiny.model, "embed", embed)
    assert vit.explain(tiny, photo, "rollout", size=64, max_tokens=256).map.shape == (16, 16)


def test_an_argument_the_method_does_not_read_is_refused(tiny, photo):
    with pytest.raises(ValueError, match="norms does not read head; it reads layer"):
        vit.explain(tiny, photo, "norms", head=1)
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        vit.explain(tiny, photo, "nope")


def test_the_mechanism_is_the_explorers_mechanism_view(tiny, photo):
    view = vit.mechanism(tiny, photo, target="fox")
    assert view.class_index == 2 and view.dla_heads.shape == (2, 2)
    np.testing.assert_array_equal(vit.head_effects(tiny, photo, target=2),
                                  mechanism_views.ablation_effects(tiny, photo, 2))
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
    with pytest.raises(ValueError, match=r"vit.ask\(checkpoint, image, labels\).explain\(label, 'legrad'\)$"):
        vit.explain(answer.checkpoint, image, "legrad")


def test_the_commands_stay_modules_of_vit():
    from vit import predict, train

    assert callable(predict.main) and callable(train.command)


# --- the sharp edges: indices, images, ablation, refusals --------------------------------------------------------

def test_negative_layers_and_heads_count_from_the_end_alike(tiny, photo):
    last = vit.explain(tiny, photo, "attention", layer=1, head=1)
    np.testing.assert_array_equal(vit.explain(tiny, photo, "attention", layer=-1, head=-1).map, last.map)


@pytest.mark.parametrize("argument, message", [
    (dict(layer=99), "layer 99 is out of range: this model has 2 layers, numbered 0 to 1 (or -2 to -1 from the end)"),
    (dict(layer=-3), "layer -3 is out of range: this model has 2 layers"),
    (dict(head=2), "head 2 is out of range: this model has 2 heads per layer, numbered 0 to 1"),
    (dict(query=17), "query 17 is out of range: this input has 17 tokens, numbered 0 to 16"),
])
def test_an_index_out_of_range_is_refused_in_one_line_naming_the_range(tiny, photo, argument, message):
    with pytest.raises(ValueError) as error:
        vit.explain(tiny, photo, "attention", **argument)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_a_target_out_of_range_names_the_classes_not_a_list(tiny, photo):
    np.testing.assert_array_equal(vit.explain(tiny, photo, "class", target=-1).map,
                                  vit.explain(tiny, photo, "class", target="fox").map)
    with pytest.raises(ValueError, match=r"^target -4 is out of range: this model has 3 classes, numbered 0 to 2"):
        vit.explain(tiny, photo, "class", target=-4)
    with pytest.raises(ValueError, match=r"^target 3 is out of range"):
        vit.mechanism(tiny, photo, target=3)


def test_ablate_speaks_of_heads_from_0_as_the_api_counts_them(tiny):
    with pytest.raises(ValueError, match=r"^head 9 is out of range: this model has 2 heads per layer"):
        vit.ablate(tiny, [(1, 9)])
    with pytest.raises(ValueError, match=r"^layer 9 is out of range"):
        vit.ablate(tiny, [(9, 9)])
    with pytest.raises(ValueError, match=r"^heads must be \(layer, head\) pairs"):
        vit.ablate(tiny, (1, 1))  # one pair, not a list of them
    x = preprocess([Image.new("RGB", (16, 16), "red")], tiny.preprocessing)
    with torch.no_grad():
        torch.testing.assert_close(vit.ablate(tiny, [(-1, -1)]).model(x)[0], vit.ablate(tiny, [(1, 1)]).model(x)[0])


def test_the_engine_names_a_missing_head_from_0():
    from vit.explain.mechanism.components import MechanismError, ablated_copy

    with pytest.raises(MechanismError, match=r"^head \(9, 9\) does not exist: the model has layers 0 to 1 and heads "
                                             r"0 to 1 \(counted from 0\)$"):
        ablated_copy(ViT(TINY).eval(), [(9, 9)])


def test_mean_ablation_over_the_image_itself_changes_nothing(tiny, photo):
    """Each head's mean over one reference, the image itself, is that head's own output on the image: replacing
    a head by it leaves every logit as it was (a hand-computed expectation)."""
    means = vit.reference_means(tiny, [photo], photo)
    assert means.shape == (2, 17, 2, 8)  # (layers, tokens, heads, head_dim)
    np.testing.assert_allclose(vit.head_effects(tiny, photo, mode="mean", means=means), np.zeros((2, 2)), atol=1e-5)
    x = preprocess([photo], tiny.preprocessing)
    with torch.no_grad():
        torch.testing.assert_close(vit.ablate(tiny, [(0, 1), (1, 0)], "mean", means=means).model(x)[0],
                                   tiny.model(x)[0], rtol=0, atol=1e-5)
    other = vit.reference_means(tiny, [Image.new("RGB", (40, 30), "blue")], photo)
    assert np.abs(vit.head_effects(tiny, photo, mode="mean", means=other)).max() > 1e-4


def test_mean_ablation_without_means_and_means_without_it_are_refused(tiny, photo):
    with pytest.raises(ValueError, match=r"^mean ablation needs means=vit.reference_means\("):
        vit.ablate(tiny, [(0, 0)], "mean")
    with pytest.raises(ValueError, match=r"^mean ablation needs means="):
        vit.head_effects(tiny, photo, mode="mean")
    with pytest.raises(ValueError, match=r"^means are read by mode='mean' only"):
        vit.ablate(tiny, [(0, 0)], means=vit.reference_means(tiny, [photo], photo))
    with pytest.raises(ValueError, match=r"^unknown ablation mode 'resample'; choose zero or mean"):
        vit.head_effects(tiny, photo, mode="resample")


def test_arrays_and_tensors_are_images_as_pil_reads_them(tiny, photo):
    expected = vit.explain(tiny, photo, "rollout").map
    pixels = np.array(photo)  # (30, 40, 3) uint8
    np.testing.assert_array_equal(vit.explain(tiny, pixels, "rollout").map, expected)
    chw = torch.from_numpy(pixels).permute(2, 0, 1).float() / 255  # (3, 30, 40) in [0, 1], unnormalised
    np.testing.assert_array_equal(vit.explain(tiny, chw, "rollout").map, expected)
    np.testing.assert_array_equal(vit.explain(tiny, chw[None], "rollout").map, expected)
    assert vit.explain(tiny, torch.from_numpy(pixels).permute(2, 0, 1), "rollout").image.tobytes() == photo.tobytes()


@pytest.mark.parametrize("image, message", [
    (torch.randn(3, 16, 16) * 3, r"^an image tensor's values must be in \[0, 1\], these run from .* pass it "
                                 r"unnormalised"),
    (torch.rand(2, 3, 16, 16), r"^give one image at a time, got a batch of 2"),
    (torch.rand(16, 16, 3), r"^an image tensor must be \(channels, height, width\).*permute\(2, 0, 1\)"),
    (np.random.default_rng(0).random((16, 16, 3)), r"^a numpy image must be uint8 \(0 to 255\), got float64"),
    (np.zeros((3, 16, 16), np.uint8), r"^a numpy image must be \(height, width, channels\)"),
    (42, r"^cannot read an image from a int"),
])
def test_an_image_that_is_not_one_is_refused_in_one_line(tiny, image, message):
    from vit.core.images import ImageError

    with pytest.raises(ImageError, match=message) as error:
        vit.explain(tiny, image)
    assert "\n" not in str(error.value)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """A tiny image encoder (no classifier)."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("api") / "encoder.pt"
    save_checkpoint(path, ViT(dataclasses.replace(TINY, num_classes=0)), [], Preprocessing(16, 3, (0.5,) * 3,
                                                                                           (0.5,) * 3))
    return vit.load(path, device="cpu")


def test_the_mechanism_of_a_model_without_a_classifier_is_refused_in_one_line(encoder, photo):
    for call in (lambda: vit.mechanism(encoder, photo), lambda: vit.head_effects(encoder, photo),
                 lambda: vit.patching(encoder, photo, photo)):
        with pytest.raises(ValueError, match=r"reads a classifier's logits and this model has none") as error:
            call()
        assert "\n" not in str(error.value)


def test_a_clip_is_pointed_to_ask_for_its_label_maps(tiny, photo, monkeypatch):
    clip = dataclasses.replace(tiny, model=ViT(dataclasses.replace(TINY, num_classes=0)).eval(), class_names=[],
                               metadata={"source": {"kind": "open_clip"}})
    for method in ("legrad", "attnlrp"):
        with pytest.raises(ValueError, match=rf"^a CLIP / SigLIP has no classes of its own: map a typed label with "
                                             rf"vit.ask\(checkpoint, image, labels\).explain\(label, '{method}'\)$"):
            vit.explain(clip, photo, method)


def test_a_checkpoints_repr_is_one_short_line(tiny, encoder):
    assert repr(tiny) == "<Checkpoint tiny.pt: vit, 5,603 parameters, 16 px in patches of 4, 3 classes (cat, dog, fox)>"
    assert repr(encoder).endswith("no classifier>") and "\n" not in repr(encoder)


def test_samples_are_the_image_files_of_the_checkpoints_samples_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("VIT_CHECKPOINTS_DIR", str(tmp_path))
    folder = tmp_path / "samples" / "tiny"
    folder.mkdir(parents=True)
    for name in ("b.png", "a.JPG", "notes.txt"):
        (folder / name).write_bytes(b"")
    (folder / "c.png").mkdir()  # a folder named like an image is not one
    assert vit.samples("tiny") == [folder / "a.JPG", folder / "b.png"]
    assert vit.samples("missing") == []


@pytest.mark.parametrize("method, layer", [("gradcam", None), ("layercam", 0), ("eigencam", None), ("eigencam", 0)])
def test_a_cam_through_vit_explain_runs_the_model_once(tiny, photo, monkeypatch, method, layer):
    """Issue 83: the explanation's analysis keeps every block's input, and the CAM starts from the explained
    block's there: the model embeds the image once (the CAM's own forward from the pixels embedded it again), and
    the map is the CAM's of the pixels (tests/test_cam.py holds that one to pytorch-grad-cam's)."""
    from vit.explain.methods.cam import cam

    embedded = []
    embed = ViT.embed
    monkeypatch.setattr(ViT, "embed", lambda self, images: embedded.append(images.shape) or embed(self, images))
    e = vit.explain(tiny, photo, method, **({} if layer is None else {"layer": layer}))
    assert len(embedded) == 1
    monkeypatch.undo()
    x = preprocess([photo], tiny.preprocessing)
    expected = cam(tiny.model, x, method, None, -1 if layer is None else layer)[0].numpy()
    np.testing.assert_allclose(e.map, expected, rtol=1e-5, atol=1e-7)
