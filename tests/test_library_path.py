"""The library road (issue 91, items 1 and 2, first slice): a transformers vision model with no port opens as
transformers builds it, its attention through our recording function; logits, features and every layer's and
head's attention equal transformers' own (SDPA's forward, eager's ``output_attentions``). Each model is built tiny
with random weights in transformers and saved with its image processor, never downloaded."""

from __future__ import annotations

import json
import threading

import pytest
import torch
from layer_reference import caught_eager, widened

import vit
from vit.checkpoint import CheckpointError
from vit.costs.bounds import TooManyTokens
from vit.model import ViT

transformers = pytest.importorskip("transformers")

SMALL = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, patch_size=8)
# model_type -> (the model transformers builds, the prefix tokens before the patches)
FAMILIES = {
    "ijepa": (lambda: transformers.IJepaModel(transformers.IJepaConfig(**SMALL, image_size=32)), 0),
    "vit_msn": (lambda: transformers.ViTMSNForImageClassification(
        transformers.ViTMSNConfig(**SMALL, image_size=32, num_labels=3, id2label={0: "cat", 1: "dog", 2: "fox"})), 1),
    "pixio": (lambda: transformers.PixioModel(transformers.PixioConfig(**SMALL, image_size=32, n_cls_tokens=2)), 2),
    # CLIP's layout (class_embedding: one token), MetaCLIP 2's vision tower and MLCD's (rotary positions)
    "metaclip_2_vision_model": (lambda: transformers.MetaClip2VisionModel(
        transformers.MetaClip2VisionConfig(**SMALL, image_size=32)), 1),
    "mlcd": (lambda: transformers.MLCDVisionModel(transformers.MLCDVisionConfig(**SMALL, image_size=32)), 1),
    # C-RADIO: three CLS tokens and seven registers in one (n, hidden) parameter before the patches
    "radio": (lambda: transformers.RadioModel(transformers.RadioConfig(**SMALL, image_size=32)), 10),
}


def save_family(folder, model_type: str, size: tuple[int, int] = (32, 32)):
    torch.manual_seed(0)
    model = FAMILIES[model_type][0]()
    widened(model)
    model.save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": size[0], "width": size[1]}).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {t: save_family(tmp_path_factory.mktemp(t), t) for t in FAMILIES}


@pytest.fixture(scope="module")
def opened(folders):
    """Each family's folder opened by ``vit.load`` once for the three tests below that read it (its road, its forward,
    its attention): ~0.2 s of CPU an opening."""
    checkpoints = {}

    def load(model_type: str):
        if model_type not in checkpoints:
            checkpoints[model_type] = vit.load(folders[model_type], device="cpu")
        return checkpoints[model_type]

    return load


def reference(folder, implementation: str):
    """The folder's model as transformers itself opens it, with the attention ``implementation``."""
    config = transformers.AutoConfig.from_pretrained(folder)
    cls = getattr(transformers, config.architectures[0])
    return cls.from_pretrained(folder, attn_implementation=implementation).eval()


def pixels(batch: int = 2, hw: tuple[int, int] = (32, 32)) -> torch.Tensor:
    return torch.randn(batch, 3, *hw, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("model_type", FAMILIES)
def test_a_family_without_a_port_opens_by_the_library_road(folders, opened, model_type):
    checkpoint = opened(model_type)
    assert checkpoint.road == "library" and checkpoint.metadata["road"] == "library"
    assert not isinstance(checkpoint.model, ViT)
    assert checkpoint.model.layout.num_prefix_tokens == FAMILIES[model_type][1]
    assert checkpoint.model.layout.grid == (4, 4) and checkpoint.model.num_layers == 3


@pytest.mark.parametrize("model_type", FAMILIES)
def test_its_logits_and_features_are_transformers_sdpa_forward(folders, opened, model_type):
    checkpoint = opened(model_type)
    x = pixels()
    ours, _ = checkpoint.model.run(x)
    with torch.no_grad():
        theirs = reference(folders[model_type], "sdpa")(pixel_values=x)
    name = "logits" if model_type == "vit_msn" else "last_hidden_state"
    assert torch.allclose(getattr(ours, name), getattr(theirs, name), atol=1e-6, rtol=0)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_every_layer_and_head_attention_is_transformers_eager_output_attentions(folders, opened, model_type):
    checkpoint = opened(model_type)
    x = pixels()
    _, attentions = checkpoint.model.run(x, layers=range(3))
    with torch.no_grad():
        theirs = reference(folders[model_type], "eager")(pixel_values=x, output_attentions=True).attentions
    assert len(attentions) == len(theirs) == 3
    tokens = 16 + FAMILIES[model_type][1]
    for layer, expected in enumerate(theirs):
        assert attentions[layer].shape == expected.shape == (2, 4, tokens, tokens)
        assert torch.allclose(attentions[layer], expected, atol=1e-6, rtol=0)


def test_the_recording_keeps_only_the_asked_layers_heads_and_rows(folders):
    model = vit.load(folders["vit_msn"], device="cpu").model
    x = pixels()
    _, every = model.run(x, layers=[0, 1, 2])
    _, asked = model.run(x, layers=[-1], heads=[2], rows=[0])
    assert list(asked) == [2] and asked[2].shape == (2, 1, 1, 17)
    assert torch.allclose(asked[2], every[2][:, [2]][:, :, [0]], atol=1e-6, rtol=0)  # one row formed alone
    _, none = model.run(x)
    assert none == {}


def test_concurrent_recordings_in_two_threads_never_mix(folders):
    model = vit.load(folders["pixio"], device="cpu").model
    inputs = {0: pixels(1), 1: torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(7))}
    alone = {i: model.run(inputs[i], layers=[i])[1] for i in inputs}
    assert not torch.allclose(alone[0][0], model.run(inputs[1], layers=[0])[1][0])
    found, barrier = {i: [] for i in inputs}, threading.Barrier(2)

    def record(i):
        barrier.wait()
        for _ in range(20):
            found[i].append(model.run(inputs[i], layers=[i])[1])

    threads = [threading.Thread(target=record, args=(i,)) for i in inputs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in inputs:
        assert all(list(kept) == [i] and torch.equal(kept[i], alone[i][i]) for kept in found[i])


def test_a_recording_past_the_memory_limit_is_refused_in_one_line_before_the_forward(folders, monkeypatch):
    model = vit.load(folders["ijepa"], device="cpu").model
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "0.01")  # 10 kB: one layer of 4 heads x 16² floats is 4 kB
    calls = []
    monkeypatch.setattr(model.model, "forward", lambda *a, **k: calls.append(1))
    with pytest.raises(TooManyTokens) as refused:
        model.run(pixels(), layers=range(3))
    assert "\n" not in str(refused.value) and "fewer layers" in str(refused.value) and not calls


def test_the_cost_model_counts_tokens_squared_heads_and_layers_asked():
    from vit.costs import plan

    cost = plan.library_attention(batch=1, heads=12, tokens=197, layers=2)
    assert dict(cost.parts)["2 asked layers' attention, kept"] == 4 * 12 * 197 * 197 * 2
    assert plan.library_attention(1, 12, 197, 2, rows=1).memory < cost.memory
    fused = plan.library_attention(1, 12, 197, 2, heads_mean=True)  # the rollout's: a head's worth a layer
    assert dict(fused.parts)["2 asked layers' attention, kept"] == 4 * 197 * 197 * 2


def test_the_heads_mean_is_kept_as_each_layer_is_recorded(folders):
    """``run(..., heads_mean=True)`` keeps each layer's heads' mean, (B, 1, T, T): the mean of what it keeps without,
    each layer's eager attention; the rollout reads it, holding a head's worth a layer instead of every head's."""
    model = vit.load(folders["ijepa"], device="cpu").model
    _, every = model.run(pixels(), layers=range(3))
    _, mean = model.run(pixels(), layers=range(3), heads_mean=True)
    for layer in range(3):
        assert mean[layer].shape == (every[layer].shape[0], 1, *every[layer].shape[-2:])
        torch.testing.assert_close(mean[layer], every[layer].float().mean(1, keepdim=True), rtol=0, atol=0)


def test_a_family_with_a_port_still_opens_by_its_port(tmp_path):
    torch.manual_seed(0)
    config = transformers.ViTConfig(**SMALL, image_size=32, num_labels=3)
    transformers.ViTForImageClassification(config).save_pretrained(tmp_path)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    checkpoint = vit.load(tmp_path, device="cpu")
    assert checkpoint.road == "port" and isinstance(checkpoint.model, ViT)


def test_a_model_without_the_attention_interface_keeps_its_one_line_refusal(tmp_path):
    config = transformers.ConvNextConfig(num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_labels=2,
                                         out_features=None, out_indices=None, stage_names=None, num_stages=2)
    transformers.ConvNextForImageClassification(config).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="convnext has no port here, and as transformers builds it "
                       "ConvNextForImageClassification's attention does not run through transformers' attention "
                       r"interface \(no module of its modelling file calls ALL_ATTENTION_FUNCTIONS\)") as refused:
        vit.load(tmp_path, device="cpu")
    assert "\n" not in str(refused.value)


def test_a_composite_config_is_refused_naming_where_its_patch_size_sits():
    """The piece the library road misses, named (issue 91's "refused in one line that names the missing piece"): a
    patch size in a part the road does not read its layers from (a backbone's config, or a vision encoder's
    backbone's, it reads: SAM 3's vision encoder and tracker open, tests/test_library_sam3.py)."""
    from vit.sources.library_road.transformers_models import missing_piece

    config_json = {"model_type": "sam3_tracker", "prompt_encoder_config": {"patch_size": 14}}
    assert missing_piece(config_json) == ("its config has no patch size at its top level to place its tokens by (it "
                                          "sits in prompt_encoder_config: open that part's own folder)")
    assert missing_piece({"model_type": "ijepa"}) is None  # it opens
    assert missing_piece({"model_type": "sam3_vision_model", "backbone_config": {"patch_size": 14}}) is None


def test_vit_explain_draws_each_heads_attention_of_a_query_as_transformers_eager_gives_it(folders):
    from PIL import Image

    from vit.core.inference import preprocess

    checkpoint = vit.load(folders["vit_msn"], device="cpu")
    image = Image.fromarray((torch.rand(40, 56, 3, generator=torch.Generator().manual_seed(3)) * 255).byte().numpy())
    assert list(vit.methods(checkpoint))[:2] == ["attention", "rollout"]  # the default first, then the rest
    explanation = vit.explain(checkpoint, image, "attention", layer=1, query=0)
    with torch.no_grad():
        eager = reference(folders["vit_msn"], "eager")(pixel_values=preprocess([image], checkpoint.preprocessing),
                                                       output_attentions=True)
    expected = eager.attentions[1][0, :, 0, 1:].reshape(4, 4, 4)  # CLS's row, the CLS key dropped, row-major
    assert explanation.grid == (4, 4) and explanation.num_prefix_tokens == 1
    assert torch.allclose(torch.from_numpy(explanation.heads), expected, atol=1e-6, rtol=0)
    assert torch.allclose(torch.from_numpy(explanation.map), expected.mean(0), atol=1e-6, rtol=0)
    assert explanation.prediction.label == ["cat", "dog", "fox"][int(eager.logits.argmax())]
    one = vit.explain(checkpoint, image, "attention", layer=-1, head=2, query=5)
    assert torch.allclose(torch.from_numpy(one.map), eager.attentions[2][0, 2, 5, 1:].reshape(4, 4), atol=1e-6)


def test_vit_explain_draws_the_rollout_of_the_recorded_attention(folders):
    from PIL import Image

    from vit.core.inference import preprocess
    from vit.explain.methods.attention import rollout

    checkpoint = vit.load(folders["pixio"], device="cpu")
    image = Image.new("RGB", (32, 32), (200, 30, 60))
    explanation = vit.explain(checkpoint, image, "rollout")
    with torch.no_grad():
        eager = reference(folders["pixio"], "eager")(pixel_values=preprocess([image], checkpoint.preprocessing),
                                                     output_attentions=True)
    expected = rollout(eager.attentions, num_prefix_tokens=2)[0, 0, 2:].reshape(4, 4)
    assert torch.allclose(torch.from_numpy(explanation.map), expected, atol=1e-6, rtol=0)


def test_a_map_the_library_road_does_not_draw_yet_is_refused_in_one_line(folders):
    from PIL import Image

    checkpoint = vit.load(folders["ijepa"], device="cpu")
    with pytest.raises(ValueError, match="not drawn yet .* issue 91") as refused:
        vit.explain(checkpoint, Image.new("RGB", (32, 32)), "flow")
    assert "\n" not in str(refused.value)
    with pytest.raises(ValueError, match="does not read head"):
        vit.explain(checkpoint, Image.new("RGB", (32, 32)), "rollout", head=0)


def test_a_non_square_grid_is_placed_row_major_and_a_transposed_grid_would_fail(tmp_path):
    from PIL import Image

    from vit.core.inference import preprocess

    torch.manual_seed(0)
    config = transformers.ViTMSNConfig(**SMALL, image_size=[32, 48], num_labels=2)  # (height, width): 4 x 6 patches
    model = transformers.ViTMSNForImageClassification(config)
    widened(model)
    model.save_pretrained(tmp_path)
    transformers.ViTImageProcessor(size={"height": 32, "width": 48}).save_pretrained(tmp_path)
    checkpoint = vit.load(tmp_path, device="cpu")
    assert checkpoint.model.layout.grid == (4, 6)
    image = Image.fromarray((torch.rand(30, 50, 3, generator=torch.Generator().manual_seed(4)) * 255).byte().numpy())
    explanation = vit.explain(checkpoint, image, "attention", layer=0, head=1, query=0)
    with torch.no_grad():
        eager = reference(tmp_path, "eager")(pixel_values=preprocess([image], checkpoint.preprocessing),
                                             output_attentions=True)
    row = eager.attentions[0][0, 1, 0, 1:]  # CLS's row over the 24 patches, row-major
    assert explanation.map.shape == (4, 6)
    assert torch.allclose(torch.from_numpy(explanation.map), row.reshape(4, 6), atol=1e-6, rtol=0)
    assert not torch.allclose(torch.from_numpy(explanation.map), row.reshape(6, 4).T, atol=1e-6, rtol=0)


def test_tokens_the_layout_does_not_place_are_refused_in_one_line_at_opening(tmp_path, monkeypatch):
    """A model whose attention runs over tokens the layout does not count (here YOLOS's detection tokens, with the
    road's count of them taken away) is refused at opening, on the meta device, before any weight is read."""
    from vit.sources.library_road import transformers_models

    config = transformers.YolosConfig(**SMALL, image_size=[32, 32], num_detection_tokens=3)  # 3 tokens after them
    transformers.YolosModel(config).save_pretrained(tmp_path)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    monkeypatch.setattr(transformers_models, "SUFFIX_PARAMETERS", ())
    with pytest.raises(CheckpointError, match=r"runs over \[20\] tokens, not the 1 prefix tokens and 4x4") as refused:
        vit.load(tmp_path, device="cpu")
    assert "\n" not in str(refused.value)


def test_open_source_without_the_library_road_refuses_it_in_one_line_naming_the_notebook_api(folders):
    """open_source without ``library_road``: how the Analyse and Train pages open a model (the explorer, vit-predict
    and vit-evaluate pass ``library_road``: tests/test_library_explorer.py, tests/test_library_commands.py; the
    commands that need our own ViT say so in a line of their own)."""
    from vit.sources.open import open_source

    with pytest.raises(CheckpointError, match=r"has no port; it opens .* \(vit.load\)") as refused:
        open_source(folders["ijepa"])
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(("edit", "message"), [
    ("shrunk", r"is refused: its weights do not match its config.json \(size mismatch for [\w.]+: \(31, 32\) in the "
               r"weights, \(32, 32\) in the config\); give the folder the config.json saved with these weights$"),
    ("no layers", r"is refused: its weights files lack 48 of the model's weights \(.*\), which transformers would "
                  r"fill at random, so the model would run with random layers; copy every weights file"),
])
def test_weights_that_do_not_fit_or_lack_layers_are_refused_in_one_line(tmp_path, edit, message):
    """Issue 95, item 6: transformers' size-mismatch refusal is a RuntimeError pointing at a report it logged ("For
    details look at the above report!"), and weights it does not find it fills at random: the model opened and
    drew maps of random layers without a word. Both are one line saying what to do (through vit.load, as the explorer
    opens it, and vit-predict)."""
    from safetensors.torch import load_file, save_file

    folder = save_family(tmp_path / "model", "ijepa")
    tensors = load_file(folder / "model.safetensors")
    if edit == "shrunk":
        name = sorted(k for k, t in tensors.items() if ".layer.0." in k and t.shape == (32, 32))[0]
        tensors[name] = tensors[name][:-1]
    else:
        tensors = {k: t for k, t in tensors.items() if ".layer." not in k}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=message) as refusal:
        vit.load(folder, device="cpu")
    assert "\n" not in str(refusal.value)


class _Runs:
    """A pickled object that would run code when unpickled (``print``, seen in the captured output)."""

    def __reduce__(self):
        return (print, ("this pickle ran",))


@pytest.mark.parametrize(("edit", "message"), [
    # the weights' headers are read before transformers reads them (issue 114, item 3): the project's own archive
    # check refuses the pickle first, in its words; transformers' weights-only refusal words it likewise
    ("pickled", r"Python objects other than tensors and plain data, which could run code.*only weights are read$"),
    ("attention flags", r": its config is refused by transformers \(The `output_attentions` attribute is not "
                        r"supported when using the `attn_implementation` set to sdpa\. Please set it to 'eager' "
                        r"instead\.\)$"),
])
def test_a_pickle_and_a_config_transformers_refuses_are_one_line(tmp_path, capfd, edit, message):
    """Issue 114, finding 6: a pickled pytorch_model.bin came out as torch's six lines advising to load it without
    weights_only (nothing ran), and ``attn_implementation`` beside ``output_attentions`` in config.json as
    huggingface_hub's two-line StrictDataclassClassValidationError."""
    folder = save_family(tmp_path / "model", "ijepa")
    if edit == "pickled":
        (folder / "model.safetensors").unlink()
        torch.save({"embeddings.cls_token": torch.zeros(1, 1, 32), "x": _Runs()}, folder / "pytorch_model.bin")
    else:
        config = json.loads((folder / "config.json").read_text())
        config.update(attn_implementation="sdpa", output_attentions=True)
        (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message) as refusal:
        vit.load(folder, device="cpu")
    assert "\n" not in str(refusal.value) and "this pickle ran" not in capfd.readouterr().out


# --- a head around a backbone (Depth Anything): the head as transformers builds it, the backbone's attention recorded

def dpt_folder(folder):
    torch.manual_seed(0)
    model = transformers.DPTForDepthEstimation(transformers.DPTConfig(
        hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=8,
        backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[8, 16, 16, 16], fusion_hidden_size=16,
        reassemble_factors=[4, 2, 1, 0.5]))
    widened(model)
    model.save_pretrained(folder)
    transformers.DPTImageProcessor(size={"height": 32, "width": 32}, keep_aspect_ratio=False).save_pretrained(folder)
    return folder


def depth_anything_folder(folder, keep_aspect_ratio=False):
    torch.manual_seed(0)
    backbone = transformers.Dinov2Config(hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                                         intermediate_size=64, image_size=32, patch_size=8, out_indices=[1, 2, 3, 4],
                                         reshape_hidden_states=False)
    model = transformers.DepthAnythingForDepthEstimation(transformers.DepthAnythingConfig(
        backbone_config=backbone, reassemble_hidden_size=32, neck_hidden_sizes=[8, 16, 16, 16], fusion_hidden_size=16,
        patch_size=8))
    widened(model)
    model.save_pretrained(folder)
    transformers.DPTImageProcessor(size={"height": 32, "width": 32}, keep_aspect_ratio=keep_aspect_ratio,
                                   ensure_multiple_of=8).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("family", ["depth_anything", "dpt"])
def test_a_depth_models_depth_is_transformers_and_its_backbones_attention_eagers(tmp_path, family):
    """Depth Anything's head does not take an attention implementation (transformers refuses one for it); its DINOv2
    backbone's does: the head runs as transformers builds it, the backbone's attention through the recording
    function. DPT's takes one: its whole model's attention is recorded."""
    from PIL import Image

    from vit.core.inference import preprocess

    folder = (depth_anything_folder if family == "depth_anything" else dpt_folder)(tmp_path)
    cls = getattr(transformers, transformers.AutoConfig.from_pretrained(folder).architectures[0])
    checkpoint = vit.load(folder, device="cpu")
    assert checkpoint.road == "library" and checkpoint.model.num_layers == 4
    assert checkpoint.model.layout.grid == (4, 4) and checkpoint.model.layout.num_prefix_tokens == 1
    image = Image.fromarray((torch.rand(40, 30, 3, generator=torch.Generator().manual_seed(3)) * 255).byte().numpy())
    x = preprocess([image], checkpoint.preprocessing)
    processor = transformers.DPTImageProcessor.from_pretrained(folder)
    torch.testing.assert_close(x, processor(image, return_tensors="pt")["pixel_values"], atol=1e-5, rtol=0)
    own = cls.from_pretrained(folder).eval()
    with torch.no_grad():
        depth = own(pixel_values=x).predicted_depth
    out, kept = checkpoint.model.run(x, layers=range(4))
    torch.testing.assert_close(checkpoint.model(x), depth, atol=1e-5, rtol=0)
    (own.backbone if family == "depth_anything" else own).set_attn_implementation("eager")
    with torch.no_grad():
        eager = own(pixel_values=x, output_attentions=True).attentions
        eager_depth = own(pixel_values=x).predicted_depth
    # every layer recorded: its output is computed once from the probabilities, eager's A @ V (not SDPA's kernel,
    # whose float32 rounding the depth head scales to depths of ~4e4: transformers' own eager and sdpa differ so)
    torch.testing.assert_close(out.predicted_depth, eager_depth, atol=1e-5, rtol=0)
    for layer in range(4):
        torch.testing.assert_close(kept[layer], eager[layer], atol=1e-6, rtol=0)
    explanation = vit.explain(checkpoint, image, "attention", layer=2, head=1, query=0)
    torch.testing.assert_close(torch.from_numpy(explanation.map), eager[2][0, 1, 0, 1:].reshape(4, 4), atol=1e-6,
                               rtol=0)


@pytest.mark.parametrize(("width", "height"), [(30, 40), (90, 20)])
def test_dpts_keep_aspect_resize_sizes_each_image_as_its_processor_and_the_map_sits_on_its_own_grid(tmp_path, width,
                                                                                                  height):
    """DPT's keep_aspect_ratio (its and Depth Anything's default): each image scaled as little as it can be toward
    the processor's size, each side a multiple of ensure_multiple_of, no crop. The pixels equal DPTImageProcessor's
    own, the depth transformers' own on them, and each layer's attention its eager one, placed on the image's own
    grid (a transposed grid fails: the grid is not square)."""
    from PIL import Image

    from vit.core.inference import preprocess

    folder = depth_anything_folder(tmp_path, keep_aspect_ratio=True)
    checkpoint = vit.load(folder, device="cpu")
    assert checkpoint.preprocessing.multiple_of == 8 and checkpoint.preprocessing.own_size
    image = Image.fromarray((torch.rand(height, width, 3, generator=torch.Generator().manual_seed(3)) * 255)
                            .byte().numpy())
    x = preprocess([image], checkpoint.preprocessing)
    theirs = transformers.DPTImageProcessor.from_pretrained(folder)(image, return_tensors="pt")["pixel_values"]
    assert x.shape == theirs.shape and x.shape[-2] != x.shape[-1]
    torch.testing.assert_close(x, theirs, atol=1e-5, rtol=0)
    own = transformers.DepthAnythingForDepthEstimation.from_pretrained(folder).eval()
    with torch.no_grad():
        depth = own(pixel_values=x).predicted_depth
    torch.testing.assert_close(checkpoint.model(x), depth, atol=1e-5, rtol=0)
    own.backbone.set_attn_implementation("eager")
    with torch.no_grad():
        eager = own(pixel_values=x, output_attentions=True).attentions
    grid = (x.shape[-2] // 8, x.shape[-1] // 8)
    explanation = vit.explain(checkpoint, image, "attention", layer=2, head=1, query=3)
    assert explanation.grid == grid and explanation.map.shape == grid
    torch.testing.assert_close(torch.from_numpy(explanation.map), eager[2][0, 1, 3, 1:].reshape(grid), atol=1e-6,
                               rtol=0)
    with pytest.raises(ValueError, match="out of range: this input has"):
        vit.explain(checkpoint, image, "attention", query=1 + grid[0] * grid[1])


def test_dpts_keep_aspect_size_is_its_processors_for_any_image():
    """``keep_aspect_multiple`` against DPT's own ``get_resize_output_image_size``, over shapes both ways round."""
    from transformers.models.dpt.image_processing_dpt import get_resize_output_image_size

    from vit.core.images import keep_aspect_multiple

    for height, width in [(40, 30), (20, 90), (518, 518), (1080, 1920), (333, 77), (7, 500)]:
        theirs = get_resize_output_image_size(torch.empty(3, height, width), (518, 518), True, 14)
        assert keep_aspect_multiple(height, width, (518, 518), 14) == (theirs.height, theirs.width), (height, width)


@pytest.mark.parametrize("edit, message", [
    ({"num_hidden_layers": 10**6}, "declares 1e\\+06 layers, over the 1000"),
    ({"image_size": 10**6}, "image_size \\(1000000, 1000000\\) is not a side"),
    ({"patch_size": [8, 0]}, "patch_size \\(8, 0\\) is not a side"),
])
def test_declared_sizes_past_what_can_be_built_are_refused_before_anything_is_built(folders, tmp_path, monkeypatch,
                                                                                       edit, message):
    import json
    import shutil

    for f in folders["ijepa"].iterdir():
        shutil.copy(f, tmp_path / f.name)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(edit)
    (tmp_path / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained",
                        lambda *a, **k: pytest.fail("read by transformers before the declared sizes' check"))
    with pytest.raises(CheckpointError, match=message) as refused:
        vit.load(tmp_path, device="cpu")
    assert "\n" not in str(refused.value)


# Classes whose modules call transformers' attention interface without saying so (no _supports_attention_backend):
# their attention is routed to the recording function over their own implementation at the first recording
UNFLAGGED = {
    "vitpose_backbone": (lambda: transformers.VitPoseBackbone(transformers.VitPoseBackboneConfig(
        **{**SMALL, "patch_size": [8, 8]}, image_size=[32, 32])), 0),
    "git_vision_model": (lambda: transformers.GitVisionModel(transformers.GitVisionConfig(**SMALL, image_size=32)), 1),
}


@pytest.mark.parametrize("model_type", UNFLAGGED)
def test_a_model_whose_modules_call_the_interface_unflagged_opens_and_records_eagers_attention(tmp_path, model_type):
    torch.manual_seed(0)
    model = UNFLAGGED[model_type][0]()
    assert not getattr(type(model), "_supports_attention_backend", False)
    widened(model)
    model.save_pretrained(tmp_path)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    checkpoint = vit.load(tmp_path, device="cpu")
    assert checkpoint.road == "library" and checkpoint.model.layout.num_prefix_tokens == UNFLAGGED[model_type][1]
    x = pixels()
    _, attentions = checkpoint.model.run(x, layers=range(3))
    with torch.no_grad():
        theirs = reference(tmp_path, "eager")(pixel_values=x, output_attentions=True).attentions
    tokens = 16 + UNFLAGGED[model_type][1]
    for layer, expected in enumerate(theirs):
        assert attentions[layer].shape == expected.shape == (2, 4, tokens, tokens)
        assert torch.allclose(attentions[layer], expected, atol=1e-6, rtol=0)
    drawn = vit.explain(checkpoint, torch.rand(3, 40, 40), "attention", layer=2, head=1, query=UNFLAGGED[model_type][1])
    assert drawn.map.shape == (4, 4)


@pytest.mark.parametrize("family", ["eomt", "eomt_dinov3"])
def test_eomts_object_queries_join_its_last_blocks_and_each_layer_is_its_eager_attention(tmp_path, family):
    """EoMT (a named family, issue 91) puts its object queries before the CLS token in its last ``num_blocks``
    layers: the layout's extra tokens, from its config. Every layer's attention equals the probabilities its own
    modelling file's eager function returns (transformers collects none for EoMT: the function is hooked), a
    patch's row read past the queries, the queries' keys dropped; rollout stops before the queries join."""
    import importlib

    from PIL import Image

    from vit.core.inference import preprocess

    name = "Eomt" if family == "eomt" else "EomtDinov3"
    config = getattr(transformers, f"{name}Config")(**SMALL, image_size=32, num_blocks=1, num_queries=3, num_labels=2)
    torch.manual_seed(0)
    model = getattr(transformers, f"{name}ForUniversalSegmentation")(config)
    widened(model)
    model.save_pretrained(tmp_path)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    checkpoint = vit.load(tmp_path, device="cpu")
    prefix = 1 + config.num_register_tokens
    assert checkpoint.road == "library" and checkpoint.model.layout.num_prefix_tokens == prefix
    assert checkpoint.model.layout.extra_tokens == (0, 0, 3)
    modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    image = Image.fromarray((torch.rand(32, 32, 3, generator=torch.Generator().manual_seed(3)) * 255).byte().numpy())
    eager = reference(tmp_path, "eager")
    seen = caught_eager(modeling, lambda: eager(pixel_values=preprocess([image], checkpoint.preprocessing)))
    assert [a.shape[-1] for a in seen] == [prefix + 16, prefix + 16, 3 + prefix + 16]
    query = prefix + 6  # the patch at row 1, col 2
    for layer, expected in enumerate(seen):
        extra = 3 if layer == 2 else 0
        drawn = vit.explain(checkpoint, image, "attention", layer=layer, head=1, query=query)
        row = expected[0, 1, query + extra, extra + prefix:].reshape(4, 4)
        assert torch.allclose(torch.from_numpy(drawn.map), row, atol=1e-6, rtol=0)
    assert vit.explain(checkpoint, image, "rollout", layer=1).map.shape == (4, 4)
    with pytest.raises(ValueError, match=r"layer 3 adds 3 tokens \(its object queries\); choose a layer up to 2$"):
        vit.explain(checkpoint, image, "rollout")


def recorded_and_eager(model: torch.nn.Module, folder):
    """``model`` (transformers', built tiny) spread, saved with a 32-px processor and opened by ``vit.load``; a 32-px
    image, every layer's recorded attention of it and transformers' eager ``output_attentions`` of the same pixels."""
    from PIL import Image

    from vit.core.inference import preprocess

    widened(model)
    model.save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    checkpoint = vit.load(folder, device="cpu")
    image = Image.fromarray((torch.rand(32, 32, 3, generator=torch.Generator().manual_seed(3)) * 255).byte().numpy())
    x = preprocess([image], checkpoint.preprocessing)
    _, attentions = checkpoint.model.run(x, layers=range(checkpoint.model.num_layers))
    with torch.no_grad():
        eager = reference(folder, "eager")(pixel_values=x, output_attentions=True).attentions
    return checkpoint, image, attentions, eager


def test_yolos_detection_tokens_after_the_patches_are_placed_and_their_rows_drawn(tmp_path):
    """YOLOS puts its detection tokens after the patches: CLS, the patches, then them (the layout's suffix, counted
    from the embeddings' ``detection_tokens``). Every layer's attention equals transformers' eager one; a map reads
    the patches' keys between them; a detection token's own row is a query; EigenCAM and the dense views leave the
    detection tokens out."""
    torch.manual_seed(0)
    model = transformers.YolosForObjectDetection(transformers.YolosConfig(
        **{**SMALL, "patch_size": 8}, image_size=[32, 32], num_detection_tokens=3, num_labels=2))
    checkpoint, image, attentions, eager = recorded_and_eager(model, tmp_path)
    layout = checkpoint.model.layout
    assert checkpoint.road == "library" and (layout.num_prefix_tokens, layout.num_suffix_tokens) == (1, 3)
    for layer in range(3):
        assert attentions[layer].shape == eager[layer].shape == (1, 4, 20, 20)
        assert torch.allclose(attentions[layer], eager[layer], atol=1e-6, rtol=0)
    for query in (5, 18):  # a patch, then the second detection token
        drawn = vit.explain(checkpoint, image, "attention", layer=1, head=2, query=query)
        assert torch.allclose(torch.from_numpy(drawn.map), eager[1][0, 2, query, 1:17].reshape(4, 4), atol=1e-6,
                              rtol=0)
    with pytest.raises(ValueError, match="query 20 is out of range: this input has 20 tokens"):
        vit.explain(checkpoint, image, "attention", query=20)
    assert vit.explain(checkpoint, image, "eigencam").map.shape == (4, 4)
    assert vit.similarity(checkpoint, image, query=5).map.shape == (4, 4)


def test_idefics3s_tower_whose_forward_reads_its_patch_mask_opens_and_records_eagers_attention(tmp_path):
    """SmolVLM's (Idefics3's) vision tower reads a value of its patch mask in its forward, which the meta device
    cannot: its layout is checked against the keys each recording gets instead. Every layer's attention equals
    transformers' eager one, the map on the grid row-major."""
    torch.manual_seed(0)
    model = transformers.Idefics3VisionTransformer(transformers.Idefics3VisionConfig(**SMALL, image_size=32))
    checkpoint, image, attentions, eager = recorded_and_eager(model, tmp_path)
    assert checkpoint.road == "library" and checkpoint.model.layout.num_prefix_tokens == 0
    for layer in range(3):
        assert torch.allclose(attentions[layer], eager[layer], atol=1e-6, rtol=0)
    drawn = vit.explain(checkpoint, image, "attention", layer=2, head=1, query=6)
    assert torch.allclose(torch.from_numpy(drawn.map), eager[2][0, 1, 6].reshape(4, 4), atol=1e-6, rtol=0)


def test_phi4_multimodals_vision_attention_is_recorded_by_its_own_classs_eager_function(tmp_path):
    """Phi-4 multimodal's vision attention falls back to its file's ``simple_eager_attention_forward``; the file's
    ``eager_attention_forward`` is its text attention's (it reads ``num_key_value_groups``, which the vision module
    has not). The road runs transformers' SDPA path, which reads the module's ``is_causal=True`` (its eager path does
    not): each layer's recorded attention is what that forward computes, softmax(q k^T / sqrt(d)) under the causal
    mask, formed here by hand from the library's modules on the layer's input in transformers' own forward, and the
    road's output is that forward's. Every map the road lists is drawn."""
    from PIL import Image

    torch.manual_seed(0)
    model = transformers.Phi4MultimodalVisionModel(transformers.Phi4MultimodalVisionConfig(**SMALL, image_size=32))
    widened(model)
    model.save_pretrained(tmp_path)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    checkpoint = vit.load(tmp_path, device="cpu")
    x = pixels()
    out, attentions = checkpoint.model.run(x, layers=range(3))
    library = reference(tmp_path, "sdpa")
    with torch.no_grad():
        theirs = library(pixel_values=x, output_hidden_states=True)
        states = theirs.hidden_states
        for layer, block in enumerate(library.encoder.layers):
            h = block.layer_norm1(states[layer])  # (B, T, D)
            q, k = (p(h).view(2, 16, 4, 8).transpose(1, 2) for p in (block.self_attn.q_proj, block.self_attn.k_proj))
            later = torch.ones(16, 16, dtype=torch.bool).triu(1)  # SDPA's is_causal: query i sees keys 0..i
            expected = torch.softmax((q @ k.transpose(-1, -2) / 8**0.5).masked_fill(later, float("-inf")), dim=-1)
            assert torch.allclose(attentions[layer], expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.last_hidden_state, theirs.last_hidden_state, atol=1e-5, rtol=0)
    image = Image.new("RGB", (32, 32), (200, 30, 60))
    for method in vit.methods(checkpoint):
        assert vit.explain(checkpoint, image, method).map.shape == (4, 4)


def test_dpts_own_vit_with_a_keep_aspect_processor_draws_its_maps_of_a_non_square_image(tmp_path):
    """DPT with its own ViT reshapes its tokens to a square grid in its neck: transformers' own model fails on a
    keep-aspect (non-square) input with a RuntimeError. Its ViT computes fine: each map is drawn from the ViT's own
    forward (its attention equal to eager's ``output_attentions`` of ``model.dpt``), and its depth is refused in one
    line instead of the neck's error."""
    from PIL import Image

    from vit.core.inference import preprocess

    dpt_folder(tmp_path)
    transformers.DPTImageProcessor(size={"height": 32, "width": 32}, keep_aspect_ratio=True,
                                   ensure_multiple_of=8).save_pretrained(tmp_path)
    checkpoint = vit.load(tmp_path, device="cpu")
    image = Image.fromarray((torch.rand(40, 30, 3, generator=torch.Generator().manual_seed(3)) * 255).byte().numpy())
    x = preprocess([image], checkpoint.preprocessing)
    grid = (x.shape[-2] // 8, x.shape[-1] // 8)
    assert grid[0] != grid[1]
    own = transformers.DPTForDepthEstimation.from_pretrained(tmp_path, attn_implementation="eager").eval()
    with torch.no_grad(), pytest.raises(RuntimeError):
        own(pixel_values=x)  # transformers' own neck fails on it
    with torch.no_grad():
        eager = own.dpt(pixel_values=x, output_attentions=True).attentions
    explanation = vit.explain(checkpoint, image, "attention", layer=2, head=1, query=0)
    torch.testing.assert_close(torch.from_numpy(explanation.map), eager[2][0, 1, 0, 1:].reshape(grid), atol=1e-6,
                               rtol=0)
    for method in vit.methods(checkpoint):
        assert vit.explain(checkpoint, image, method).map.shape[-2:] in (grid, tuple(x.shape[-2:]))
    with pytest.raises(ValueError, match="DPT's neck reshapes its 5x4 patches to a square grid") as refused:
        checkpoint.model(x)
    assert "\n" not in str(refused.value)
