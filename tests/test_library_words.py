"""Asking in words of CLIP towers opened on the library road (open_clip towers as open_clip builds them: a timm
trunk's, SigLIP 2's and PE-Core's kind; CoCa's, which the port refuses for its attentional pooler): the scores are
open_clip's own zero-shot (``logit_scale * cos(encode_image, encode_text)``), and a label's maps are the library
road's class maps of that logit, each equal to its reference on open_clip's own model.

Each tiny model is built with random weights by open_clip and saved natively (``open_clip_model.safetensors`` and
``open_clip_config.json``); the text side keeps CLIP's vocabulary, whose BPE the tokenizer reads."""

import importlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file
from test_app import dirs  # noqa: F401 (a fixture)

import vit

open_clip = pytest.importorskip("open_clip")
pytestmark = pytest.mark.slow  # open_clip and timm import in seconds

TEXT = dict(context_length=77, vocab_size=49408, width=32, heads=2, layers=1)
LABELS = ["a dog", "a cat", "a red ball"]


def _saved(folder, model, model_cfg):
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "open_clip_model.safetensors")
    model.visual.image_mean, model.visual.image_std = open_clip.OPENAI_DATASET_MEAN, open_clip.OPENAI_DATASET_STD
    importlib.import_module("open_clip.push_to_hf_hub").save_config_for_hf(
        model, folder / "open_clip_config.json", model_config=model_cfg)
    return folder


def timm_trunk_folder(folder):
    """A CLIP whose image tower is a timm ViT-Tiny (open_clip builds a timm trunk at its own size), average-pooled
    and projected as open_clip does it."""
    model_cfg = dict(embed_dim=16, vision_cfg=dict(image_size=64, timm_model_name="vit_tiny_patch16_224",
                                                   timm_model_pretrained=False, timm_pool="avg", timm_proj="linear"),
                     text_cfg=TEXT)
    torch.manual_seed(0)
    model = open_clip.model.CLIP(**model_cfg).eval()
    return _saved(folder, model, model_cfg), model


def coca_folder(folder):
    """A CoCa (open_clip's ``coca_ViT-B-32`` config, tiny): its image tower's attentional pooler, its captioning
    decoder beside the towers."""
    config = json.loads((Path(open_clip.__path__[0]) / "model_configs" / "coca_ViT-B-32.json").read_text())
    model_cfg = dict(embed_dim=16,
                     vision_cfg=dict(config["vision_cfg"], layers=2, width=32, head_width=16, image_size=32,
                                     patch_size=8, attn_pooler_heads=2),
                     text_cfg=dict(config["text_cfg"], **{**TEXT, "context_length": 76}),
                     multimodal_cfg=dict(config["multimodal_cfg"], **{**TEXT, "context_length": 76},
                                         attn_pooler_heads=2),
                     custom_text=True)
    torch.manual_seed(0)
    model = open_clip.CoCa(**{k: v for k, v in model_cfg.items() if k != "custom_text"}).eval()
    return _saved(folder, model, model_cfg), model


def picture(side=64):
    return Image.fromarray(np.random.RandomState(3).randint(0, 256, (side, side + 10, 3)).astype(np.uint8))


def theirs(model, folder, x):
    """open_clip's own zero-shot logits of ``x`` for the labels in the default template: ``(1, n)``."""
    tokenizer = open_clip.get_tokenizer(f"local-dir:{folder}")
    text = model.encode_text(tokenizer([f"a photo of a {label}." for label in LABELS]), normalize=True)
    image = model.encode_image(x, normalize=True)
    return model.logit_scale.exp() * image @ text.T


@pytest.mark.parametrize("build", [timm_trunk_folder, coca_folder])
def test_the_scores_are_open_clips_own_zero_shot(tmp_path, build):
    from vit.core.inference import preprocess

    folder, model = build(tmp_path)
    checkpoint = vit.load(folder, device="cpu")
    assert checkpoint.road == "library"
    image = picture()
    x = preprocess([image], checkpoint.preprocessing)
    with torch.no_grad():
        expected = theirs(model, folder, x).softmax(-1)[0]
    answer = vit.ask(checkpoint, image, LABELS)
    np.testing.assert_allclose([answer.scores[label] for label in LABELS], expected.numpy(), rtol=0, atol=1e-5)


def test_coca_opens_on_the_recorded_road_its_pooler_named_not_a_layer(tmp_path):
    """The port refuses CoCa's attentional pooler; the tower opens as open_clip builds it, its blocks' attention
    recorded (each equal to the block's own ``nn.MultiheadAttention`` asked for its weights), its pooler's learnt
    queries named as what they are."""
    from vit.core.inference import preprocess

    folder, model = coca_folder(tmp_path)
    checkpoint = vit.load(folder, device="cpu")
    assert checkpoint.metadata["architecture"] == "open_clip:recorded" and checkpoint.model.num_layers == 2
    assert "attn_pool" in checkpoint.metadata["not_layers"]
    x = preprocess([picture()], checkpoint.preprocessing)
    inputs = []
    hooks = [block.attn.register_forward_pre_hook(lambda module, args, kwargs: inputs.append(args[0]),
                                                  with_kwargs=True) for block in model.visual.transformer.resblocks]
    try:
        with torch.no_grad():
            model.visual(x)
    finally:
        for hook in hooks:
            hook.remove()
    _, kept = checkpoint.model.run(x, layers=[0, 1])
    for layer, block in enumerate(model.visual.transformer.resblocks):
        with torch.no_grad():
            _, own = block.attn(inputs[layer], inputs[layer], inputs[layer], need_weights=True,
                                average_attn_weights=False)
        torch.testing.assert_close(kept[layer], own, atol=1e-6, rtol=0)


@pytest.mark.parametrize("build", [timm_trunk_folder, coca_folder])
def test_a_labels_input_x_gradient_is_captums_on_open_clips_own_logit(tmp_path, build):
    """The label's map by the road's captum map is captum's own ``InputXGradient`` of that label's zero-shot logit,
    computed on open_clip's own model and text features, summed over the colour channels."""
    from captum.attr import InputXGradient

    from vit.core.inference import preprocess

    folder, model = build(tmp_path)
    checkpoint = vit.load(folder, device="cpu")
    image = picture()
    answer = vit.ask(checkpoint, image, LABELS)
    methods = set(vit.ask_methods(checkpoint))
    assert {"gradcam", "input_x_gradient", "rise"} <= methods
    x = preprocess([image], checkpoint.preprocessing)
    expected = InputXGradient(lambda pixels: theirs(model, folder, pixels)).attribute(x, target=1).sum(1)[0]
    ours = answer.explain(LABELS[1], "input_x_gradient").map
    scale = float(expected.abs().max())
    assert scale > 0 and np.abs(ours - expected.detach().numpy()).max() / scale <= 1e-4
    grid = checkpoint.model.patch_grid(*x.shape[-2:])
    at_attention = ("class", "legrad")  # the gradient at each layer's attention
    for method in ("gradcam", *(at_attention if build is timm_trunk_folder else ())):  # the road's class maps
        drawn = answer.explain(LABELS[1], method).map
        assert drawn.shape == grid and np.isfinite(drawn).all() and np.abs(drawn).max() > 0, method
    if build is coca_folder:  # nn.MultiheadAttention hands its weights back off the output's path: no gradient there
        assert not methods & set(at_attention)
        with pytest.raises(ValueError, match="nn.MultiheadAttention") as refused:
            answer.explain(LABELS[1], "class")
        assert "\n" not in str(refused.value)


@pytest.mark.usefixtures("dirs")
def test_the_explorers_ask_in_words_scores_and_maps_a_label_of_a_library_road_tower(tmp_path):
    """The library road's page asks a SigLIP 2- or PE-Core-like open_clip tower (a timm trunk) in words, as the
    main page asks a port's CLIP (it had no such section, and the API raised on the port's patch size): its scores
    are open_clip's own, its methods the library road's class maps, a label's map drawn by each."""
    from test_app import charts, png_bytes, run_app, sidebar_widget, upload
    from test_app_share import open_link, url

    from vit.core.inference import preprocess

    folder, model = timm_trunk_folder(tmp_path)
    image = png_bytes(64, 64, seed=4)
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(folder))
    at.run()
    upload(at, "photo.png", image)
    assert not at.exception and not at.main.error, ([e.message for e in at.exception], [e.value for e in at.main.error])
    [area] = [w for w in at.main.text_area if w.label == "Labels"]
    area.set_value(", ".join(LABELS))
    at.run()
    assert not at.exception and not at.main.error, ([e.message for e in at.exception], [e.value for e in at.main.error])
    [bars] = [t for fig in charts(at) for t in fig["data"] if t.get("type") == "bar"]
    checkpoint = vit.load(folder, device="cpu")
    x = preprocess([Image.open(__import__("io").BytesIO(image))], checkpoint.preprocessing)
    with torch.no_grad():
        expected = theirs(model, folder, x).softmax(-1)[0]
    got = dict(zip(bars["y"], bars["x"], strict=True))
    assert [got[label] for label in LABELS] == pytest.approx(expected.tolist(), abs=1e-5)
    [method] = [w for w in at.main.selectbox if w.label == "Method"]
    assert method.options[:3] == ["Class-specific (gradient rollout)", "LeGrad (class-specific)",
                                  "Grad-CAM (class-specific)"]
    method.set_value("gradcam")
    at.run()
    assert not at.exception and not at.main.error, [e.value for e in at.main.error]
    assert any(c.value.startswith("**Grad\\-CAM") and "“a dog”" in c.value for c in at.main.caption), \
        [c.value for c in at.main.caption]
    assert not [t for t in at.main.toggle if t.label == "Deletion and insertion curves"]  # the port's cosine only

    # the page's link holds the labels, the label and the method, and opens the same view in a fresh session
    [label] = [w for w in at.main.selectbox if w.label == "Map for"]
    label.set_value(2)
    at.run()
    link = url(at)
    assert (link["labels"], link["wlabel"], link["wmethod"]) == (", ".join(LABELS), LABELS[2], "gradcam")
    again = open_link(link)
    assert not again.exception and not again.main.error, [e.value for e in again.main.error]
    assert [w.value for w in again.main.text_area if w.label == "Labels"] == [", ".join(LABELS)]
    assert [w.value for w in again.main.selectbox if w.label in ("Map for", "Method")] == [2, "gradcam"]
