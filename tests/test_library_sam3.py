"""SAM 3's vision encoder and SAM 3 tracker on the library road (issue 91, item 4). Each is built tiny with random
weights in transformers and saved with its processor (never downloaded), then opened by path with ``vit.load``.
SAM 3's ViT attends in windows in all but its ``global_attn_indexes`` layers (ViTDet's: the grid padded at its
bottom and right to a multiple of the window, each window's attention its own); every layer's attention, windowed
and global, is held to transformers' eager attention (its modelling file's ``eager_attention_forward``, hooked:
SAM 3 returns no attention weights from its ViT) placed on the grid, and the features to transformers' forward.

The vision encoder's grid is 4 x 6 (32 x 48 px, patch 8) in windows of 4: its second window covers padding, and the
grid read transposed (6 x 4) is cut into other windows, so a map placed on it lands on other patches."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
from layer_reference import caught_eager, widened
from PIL import Image

import vit
from vit.checkpoint import CheckpointError
from vit.core.inference import preprocess
from vit.model.stages import LayerLayout, layer_on_grid

transformers = pytest.importorskip("transformers")

from test_app import dirs  # noqa: E402, F401 (a fixture: the explorer's own folders)

HEIGHT, WIDTH, PATCH, WINDOW = 32, 48, 8, 4  # a 4 x 6 grid in 4 x 4 windows: 1 x 2 windows, the second padded
GLOBAL = (1,)  # the layers that attend globally (global_attn_indexes)
LAYERS = 3
SAM3_MODELING = "transformers.models.sam3.modeling_sam3"


def backbone(image_hw: tuple[int, int]) -> dict:
    return dict(model_type="sam3_vit_model", hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                num_attention_heads=2, image_size=list(image_hw), patch_size=PATCH, window_size=WINDOW,
                global_attn_indexes=list(GLOBAL), pretrain_image_size=16)


def an_image(seed: int = 3) -> Image.Image:
    return Image.fromarray((torch.rand(30, 50, 3, generator=torch.Generator().manual_seed(seed)) * 255)
                           .byte().numpy())


@pytest.fixture(scope="module")
def vision(tmp_path_factory):
    """A ``Sam3VisionModel`` folder (its ViT, its FPN neck) with its ``Sam3ImageProcessor`` at 32 x 48."""
    folder = tmp_path_factory.mktemp("sam3_vision")
    torch.manual_seed(0)
    config = transformers.Sam3VisionConfig(backbone_config=backbone((HEIGHT, WIDTH)), fpn_hidden_size=16,
                                           backbone_feature_sizes=[[16, 24], [8, 12], [4, 6]])
    model = transformers.Sam3VisionModel(config)
    widened(model)
    model.save_pretrained(folder)
    transformers.Sam3ImageProcessor(size={"height": HEIGHT, "width": WIDTH}).save_pretrained(folder)
    return folder


def eager_windows(module_name: str, run) -> list[torch.Tensor]:
    """Each layer's post-softmax attention as the modelling file's eager function returns it, in the order the
    forward ``run()`` calls it (``layer_reference.caught_eager``): ``(B * windows, H, w*w, w*w)`` for a windowed
    layer, ``(B, H, T, T)`` a global one."""
    return caught_eager(importlib.import_module(module_name), run)


def library(folder, cls: str, implementation: str = "eager"):
    """The folder's model as transformers opens it, with the attention ``implementation``."""
    return getattr(transformers, cls).from_pretrained(folder, attn_implementation=implementation).eval()


def test_sam3s_vision_encoder_opens_by_path_with_its_windows_read_from_its_config(vision):
    checkpoint = vit.load(vision, device="cpu")
    layout = checkpoint.model.layout
    assert checkpoint.road == "library"
    assert layout.grid == (HEIGHT // PATCH, WIDTH // PATCH) == (4, 6)
    assert layout.num_prefix_tokens == 0
    assert layout.windows == (WINDOW, 0, WINDOW)  # layer 1 is global
    assert checkpoint.model.num_layers == LAYERS and checkpoint.model.num_heads == 2


def test_sam3s_pixels_are_its_processors_at_its_non_square_size(vision):
    checkpoint = vit.load(vision, device="cpu")
    x = preprocess([an_image()], checkpoint.preprocessing)
    theirs = transformers.Sam3ImageProcessor.from_pretrained(vision)(an_image(), return_tensors="pt")["pixel_values"]
    assert x.shape == theirs.shape == (1, 3, HEIGHT, WIDTH)
    torch.testing.assert_close(x, theirs, atol=1e-5, rtol=0)


def test_sam3s_features_and_fpn_are_transformers_forward(vision):
    checkpoint = vit.load(vision, device="cpu")
    x = torch.randn(2, 3, HEIGHT, WIDTH, generator=torch.Generator().manual_seed(1))
    # every layer recorded: each computed once as the eager function computes it (softmax(q k^T) @ v, the asked
    # probabilities and the output from one product), so the run is transformers' eager forward; unrecorded, the
    # road runs SDPA as transformers' sdpa forward does (the FPN magnifies their 3e-6 float difference past 1e-5)
    ours, _ = checkpoint.model.run(x, layers=range(LAYERS))
    with torch.no_grad():
        eager = library(vision, "Sam3VisionModel", "eager")(pixel_values=x)
        sdpa = library(vision, "Sam3VisionModel", "sdpa")(pixel_values=x)
    torch.testing.assert_close(ours.last_hidden_state, eager.last_hidden_state, atol=1e-5, rtol=0)
    for a, b in zip(ours.fpn_hidden_states, eager.fpn_hidden_states, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    torch.testing.assert_close(checkpoint.model(x), sdpa.last_hidden_state, atol=1e-5, rtol=0)


def test_sam3s_every_layer_windowed_and_global_is_its_eager_attention_placed_on_the_grid(vision):
    checkpoint = vit.load(vision, device="cpu")
    x = torch.randn(2, 3, HEIGHT, WIDTH, generator=torch.Generator().manual_seed(2))
    model = library(vision, "Sam3VisionModel")
    eager = eager_windows(SAM3_MODELING, lambda: model(pixel_values=x))
    assert [tuple(a.shape) for a in eager] == [(4, 2, 16, 16), (2, 2, 24, 24), (4, 2, 16, 16)]  # 2 images x 2 windows
    _, ours = checkpoint.model.run(x, layers=range(LAYERS))
    grid = (HEIGHT // PATCH, WIDTH // PATCH)
    for layer in range(LAYERS):
        placed = eager[layer] if layer in GLOBAL else layer_on_grid(eager[layer], LayerLayout(grid, WINDOW))
        assert ours[layer].shape == (2, 2, 24, 24)
        torch.testing.assert_close(ours[layer], placed, atol=1e-5, rtol=0)
    # a windowed row is its window's alone: patch (0, 5) sits in the second window, cols 4 and 5 (6, 7 padding)
    row = ours[0][0, 0, 5].reshape(grid)
    assert row[:, :4].abs().max() == 0 and row[:, 4:].sum() < 1  # the padding keys' share is not on the image
    # the asked heads and rows alone, from the query's own window
    _, rows = checkpoint.model.run(x, layers=[0, 1], heads=[1], rows=[5, 23])
    # (a global layer's asked rows are formed alone, q[rows] k^T: equal to the whole layer's to float rounding)
    torch.testing.assert_close(rows[0], ours[0][:, [1]][:, :, [5, 23]], atol=1e-6, rtol=0)
    torch.testing.assert_close(rows[1], ours[1][:, [1]][:, :, [5, 23]], atol=1e-6, rtol=0)


def test_sam3s_windowed_map_is_placed_row_major_and_a_transposed_grid_would_fail(vision):
    checkpoint = vit.load(vision, device="cpu")
    image = an_image()
    x = preprocess([image], checkpoint.preprocessing)
    model = library(vision, "Sam3VisionModel")
    eager = eager_windows(SAM3_MODELING, lambda: model(pixel_values=x))
    query = 7  # patch (1, 1) in the first window
    explained = vit.explain(checkpoint, image, "attention", layer=0, query=query)
    grid = (4, 6)
    right = layer_on_grid(eager[0], LayerLayout(grid, WINDOW))[0, :, query].mean(0).reshape(grid)
    assert explained.map.shape == grid
    torch.testing.assert_close(torch.as_tensor(explained.map), right, atol=1e-5, rtol=0)
    # the same windows read on the grid transposed (6 x 4: 2 x 1 windows) put the row on other patches
    wrong = layer_on_grid(eager[0], LayerLayout((6, 4), WINDOW))[0, :, query].mean(0).reshape(6, 4)
    assert not torch.allclose(torch.as_tensor(explained.map), wrong.reshape(4, 6), atol=1e-3)
    assert not torch.allclose(torch.as_tensor(explained.map), wrong.T, atol=1e-3)


def test_sam3s_rollout_and_eigencam_draw_over_its_windows(vision):
    """The rollout of the windowed and global layers (the placed windows' rows are the port's rollout factor: zero
    outside the window, the padding's share renormalised away) and EigenCAM of a windowed layer's input (its windows
    joined back on the grid) are drawn, each on the 4 x 6 grid."""
    from vit.explain.methods.attention import rollout_factor, rollout_rows

    checkpoint = vit.load(vision, device="cpu")
    image = an_image()
    x = preprocess([image], checkpoint.preprocessing)
    model = library(vision, "Sam3VisionModel")
    eager = eager_windows(SAM3_MODELING, lambda: model(pixel_values=x))
    placed = [a if i in GLOBAL else layer_on_grid(a, LayerLayout((4, 6), WINDOW)) for i, a in enumerate(eager)]
    expected = rollout_rows([rollout_factor(a, "mean", 0.0, 0) for a in placed], 7)[0].reshape(4, 6)
    rolled = vit.explain(checkpoint, image, "rollout", layer=LAYERS - 1, query=7)
    torch.testing.assert_close(torch.as_tensor(rolled.map), expected.float(), atol=1e-5, rtol=0)
    eigen = vit.explain(checkpoint, image, "eigencam", layer=0)
    assert eigen.map.shape == (4, 6) and float(eigen.map.max()) > 0


def test_the_windows_are_read_from_the_config_and_a_model_without_them_has_none():
    from vit.sources.library_road.transformers_models import LibraryLayout, window_sides

    config = transformers.Sam3VisionConfig(backbone_config=backbone((HEIGHT, WIDTH)))
    assert window_sides(config, LAYERS) == (WINDOW, 0, WINDOW)
    assert window_sides(transformers.IJepaConfig(), 2) == ()  # no windows: every layer global
    assert LibraryLayout(0, (8, 8), (32, 48), windows=(4, 0)).layer_layout(1, (4, 6)) is None
    bad = transformers.Sam3VisionConfig(backbone_config=dict(backbone((HEIGHT, WIDTH)), window_size=0))
    assert window_sides(bad, LAYERS) == ()


def test_a_sam3_whose_processor_asks_for_another_size_is_refused_in_one_line(tmp_path):
    """SAM 3's global layers' rotary positions are built for its config's grid: another input size cannot run, and
    the refusal says so at opening (the meta-device check), in one line."""
    torch.manual_seed(0)
    config = transformers.Sam3VisionConfig(backbone_config=backbone((HEIGHT, WIDTH)), fpn_hidden_size=16)
    transformers.Sam3VisionModel(config).save_pretrained(tmp_path)
    transformers.Sam3ImageProcessor(size={"height": 48, "width": 48}).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError) as refused:
        vit.load(tmp_path, device="cpu")
    assert "\n" not in str(refused.value)
    assert str(refused.value).endswith("it may run only at its config's image_size 32x48: give it an image "
                                       "processor of that size")


# --- SAM 3 tracker: its vision encoder drawn the same way, its points and box through vit.segment as SAM 2's ---------

TRACKER_SIDE, TRACKER_WINDOW = 32, 3  # a 4 x 4 grid in 3 x 3 windows: 2 x 2 windows, the last row and column padding
TRACKER_MODELING = "transformers.models.sam3_tracker.modeling_sam3_tracker"
PROMPTS = {"point": dict(points=[(10, 12)]), "box": dict(box=(5, 4, 40, 25)),
           "mixed": dict(points=[(10, 12), (30, 20, 0)], box=(5, 4, 40, 25))}


@pytest.fixture(scope="module")
def tracker(tmp_path_factory):
    """A ``Sam3TrackerModel`` folder (the vision encoder as SAM 3's, a prompt encoder and mask decoder on its 4 x 4
    embedding) with its ``Sam3TrackerProcessor``, which SAM 3 builds square."""
    folder = tmp_path_factory.mktemp("sam3_tracker")
    vision_config = dict(model_type="sam3_vision_model", fpn_hidden_size=16,
                         backbone_config=dict(backbone((TRACKER_SIDE, TRACKER_SIDE)), window_size=TRACKER_WINDOW),
                         backbone_feature_sizes=[[16, 16], [8, 8], [4, 4]])
    config = transformers.Sam3TrackerConfig(
        vision_config=vision_config,
        prompt_encoder_config=dict(hidden_size=16, image_size=TRACKER_SIDE, patch_size=PATCH, mask_input_channels=4),
        mask_decoder_config=dict(hidden_size=16, mlp_dim=32, num_hidden_layers=2, num_attention_heads=2,
                                 iou_head_hidden_dim=16))
    torch.manual_seed(0)
    model = transformers.Sam3TrackerModel(config)
    widened(model)
    model.save_pretrained(folder)
    transformers.Sam3TrackerProcessor(image_processor=transformers.Sam3ImageProcessor(
        size={"height": TRACKER_SIDE, "width": TRACKER_SIDE})).save_pretrained(folder)
    return folder


def tracker_inputs(processor, image, points=(), box=None):
    """The processor's inputs for one prompt, as its documentation builds them."""
    args = {}
    if points:
        args.update(input_points=[[[list(p[:2]) for p in points]]],
                    input_labels=[[[p[2] if len(p) == 3 else 1 for p in points]]])
    if box is not None:
        args.update(input_boxes=[[list(box)]])
    return processor(images=image, return_tensors="pt", **args)


def tracker_run(model, inputs, pixel_values=None):
    run = {k: v for k, v in inputs.items() if k != "original_sizes"}
    if pixel_values is not None:
        run["pixel_values"] = pixel_values
    with torch.no_grad():
        return model(**run)


def test_sam3_tracker_opens_by_path_its_vision_encoder_the_recorded_part(tracker):
    checkpoint = vit.load(tracker, device="cpu")
    model = checkpoint.model
    assert checkpoint.road == "library" and type(model.model).__name__ == "Sam3TrackerModel"
    assert type(model.part).__name__ == "Sam3VisionModel" and model.entry is model.part
    assert model.num_layers == LAYERS and model.layout.grid == (4, 4)
    assert model.layout.windows == (TRACKER_WINDOW, 0, TRACKER_WINDOW)
    x = torch.randn(1, 3, TRACKER_SIDE, TRACKER_SIDE, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        theirs = library(tracker, "Sam3TrackerModel", "sdpa").vision_encoder(pixel_values=x)
    torch.testing.assert_close(model(x), theirs.last_hidden_state, atol=1e-5, rtol=0)


def test_sam3_trackers_every_layer_is_its_eager_attention_and_a_transposed_grid_would_fail(tracker):
    checkpoint = vit.load(tracker, device="cpu")
    image = an_image()
    x = preprocess([image], checkpoint.preprocessing)
    model = library(tracker, "Sam3TrackerModel")
    eager = eager_windows(SAM3_MODELING, lambda: model.vision_encoder(pixel_values=x))
    grid = (4, 4)
    assert [tuple(a.shape) for a in eager] == [(4, 2, 9, 9), (1, 2, 16, 16), (4, 2, 9, 9)]
    _, ours = checkpoint.model.run(x, layers=range(LAYERS))
    for layer in range(LAYERS):
        placed = eager[layer] if layer in GLOBAL else layer_on_grid(eager[layer], LayerLayout(grid, TRACKER_WINDOW))
        torch.testing.assert_close(ours[layer], placed, atol=1e-5, rtol=0)
    query = 3  # patch (0, 3): the second window's, whose last column is padding
    explained = vit.explain(checkpoint, image, "attention", layer=0, query=query)
    right = layer_on_grid(eager[0], LayerLayout(grid, TRACKER_WINDOW))[0, :, query].mean(0).reshape(grid)
    torch.testing.assert_close(torch.as_tensor(explained.map), right, atol=1e-5, rtol=0)
    # a square grid read column-major: the query is patch (3, 0), its map transposed back, on other patches
    transposed = layer_on_grid(eager[0], LayerLayout(grid, TRACKER_WINDOW))[0, :, 12].mean(0).reshape(grid).T
    assert not torch.allclose(torch.as_tensor(explained.map), transposed, atol=1e-3)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_sam3_trackers_masks_and_scores_equal_transformers_for_the_same_prompt(tracker, prompt):
    checkpoint = vit.load(tracker, device="cpu")
    image = an_image()
    processor = transformers.Sam3TrackerProcessor.from_pretrained(tracker)
    inputs = tracker_inputs(processor, image, **PROMPTS[prompt])
    model = library(tracker, "Sam3TrackerModel", "sdpa")
    out = tracker_run(model, inputs)
    masks = processor.post_process_masks(out.pred_masks, inputs["original_sizes"])[0][0]  # (3, H, W)
    ours = vit.segment(checkpoint, image, **PROMPTS[prompt])
    torch.testing.assert_close(torch.from_numpy(ours.scores), out.iou_scores[0, 0], rtol=0, atol=1e-5)
    assert ours.masks.shape == (3, 30, 50) and (ours.masks == masks.numpy()).all()
    assert ours.mask == int(out.iou_scores[0, 0].argmax())
    # the processor's pixels and ours differ by float rounding (6e-8), which these wide random weights grow to
    # 2e-5 in logits of ~40; on our pixels the logits are the library's to 1e-5
    logits = torch.from_numpy(ours.mask_logits)
    torch.testing.assert_close(logits, out.pred_masks[0, 0], rtol=0, atol=1e-6 * float(logits.abs().max()))
    same = tracker_run(model, inputs, preprocess([image], checkpoint.preprocessing))
    torch.testing.assert_close(logits, same.pred_masks[0, 0], rtol=0, atol=1e-5)


def test_a_tracker_prompt_read_with_x_and_y_swapped_is_not_transformers(tracker):
    checkpoint = vit.load(tracker, device="cpu")
    image = an_image()
    processor = transformers.Sam3TrackerProcessor.from_pretrained(tracker)
    swapped = tracker_run(library(tracker, "Sam3TrackerModel"), tracker_inputs(processor, image, points=[(12, 10)]))
    ours = vit.segment(checkpoint, image, points=[(10, 12)])
    assert (torch.from_numpy(ours.mask_logits) - swapped.pred_masks[0, 0]).abs().max() > 1e-3


@pytest.mark.parametrize("token", ["mask", "iou"])
def test_sam3_trackers_decoder_attention_is_its_eager_attention_for_the_chosen_token(tracker, token):
    checkpoint = vit.load(tracker, device="cpu")
    image = an_image()
    processor = transformers.Sam3TrackerProcessor.from_pretrained(tracker)
    inputs = tracker_inputs(processor, image, **PROMPTS["mixed"])
    model = library(tracker, "Sam3TrackerModel")
    weights = eager_windows(TRACKER_MODELING, lambda: tracker_run(model, inputs))[-7:]
    ours = vit.segment(checkpoint, image, **PROMPTS["mixed"], mask=2, token=token)
    position = 2 + 1 + 2 if token == "mask" else 1  # the object-score token, the IoU token, then the mask tokens
    expected = {}
    for i in range(2):
        expected[f"layers.{i}.cross_attn_token_to_image"] = weights[3 * i + 1][0][:, position]
        expected[f"layers.{i}.cross_attn_image_to_token"] = weights[3 * i + 2][0][:, :, position]
    expected["final_attn_token_to_image"] = weights[6][0][:, position]
    assert list(ours.attention) == list(expected)
    for name, reference in expected.items():
        assert ours.attention[name].shape == (2, 4, 4)
        torch.testing.assert_close(torch.from_numpy(ours.attention[name]), reference.reshape(2, 4, 4), rtol=0,
                                   atol=1e-5, msg=name)


@pytest.mark.parametrize("at", [None, (30, 20)])
def test_sam3_trackers_gradient_x_input_of_a_mask_equals_autograd_on_transformers_model(tracker, at):
    """Summed over the mask, or at one pixel's low-resolution logit, back through the library's own decoder, neck and
    vision encoder: autograd on transformers' whole model from the same pixels and prompt."""
    from vit.explain.methods.segment import low_res_cell

    checkpoint = vit.load(tracker, device="cpu")
    image = an_image()
    processor = transformers.Sam3TrackerProcessor.from_pretrained(tracker)
    inputs = tracker_inputs(processor, image, **PROMPTS["point"])
    ours = vit.segment(checkpoint, image, **PROMPTS["point"], mask=1, methods=["gradient_x_input"], at=at)
    model = library(tracker, "Sam3TrackerModel", "sdpa")
    x = preprocess([image], checkpoint.preprocessing).requires_grad_(True)
    run = {k: v for k, v in inputs.items() if k not in ("original_sizes", "pixel_values")}
    logits = model(pixel_values=x, **run).pred_masks[0, 0, 1]  # (16, 16)
    if at is None:
        score = logits[logits.detach() > 0].sum()
    else:
        score = logits[low_res_cell(at, image.size, checkpoint.preprocessing, (32, 32), (16, 16))]
    [grad] = torch.autograd.grad(score, x)
    expected = (x.detach() * grad).sum(1)[0]  # (32, 32)
    torch.testing.assert_close(torch.from_numpy(ours.maps["gradient_x_input"]), expected, rtol=1e-4,
                               atol=1e-5 * float(expected.abs().max()))


def test_sam3_trackers_attnlrp_legrad_and_sam3s_concepts_are_refused_in_one_line(tracker):
    checkpoint = vit.load(tracker, device="cpu")
    for method in ("attnlrp", "legrad"):
        with pytest.raises(ValueError, match=f"^{method} of the mask runs through SAM's and SAM 2's image encoders "
                           "as this program ports them; sam3_tracker's runs as transformers builds it: choose "
                           "gradient_x_input$"):
            vit.segment(checkpoint, an_image(), points=[(10, 12)], methods=[method])
    with pytest.raises(ValueError, match="text concept is SAM 3's"):  # SAM 3 tracker takes SAM 2's prompts
        vit.segment(checkpoint, an_image(), text="a cat")
    with pytest.raises(ValueError, match="text concept is SAM 3's"):
        vit.segment(checkpoint, an_image(), text="a cat")


def test_vit_predict_segments_with_the_trackers_prompts_as_vit_segment(tracker, tmp_path, capsys):
    import json

    from vit import predict

    image = tmp_path / "image.png"
    an_image().save(image)
    assert predict.main([str(tracker), str(image), "--points", "10,12", "--box", "5,4,40,25", "--device", "cpu"]) == 0
    [record] = json.loads(capsys.readouterr().out)
    ours = vit.segment(vit.load(tracker, device="cpu"), Image.open(image), points=[(10, 12)], box=(5, 4, 40, 25))
    assert record["scores"] == pytest.approx(ours.scores.tolist(), abs=1e-6)
    assert record["areas"] == [int(m.sum()) for m in ours.masks] and record["mask"] == ours.mask


@pytest.mark.slow  # the explorer page imports torch and transformers in its own run
@pytest.mark.usefixtures("dirs")
def test_the_explorer_draws_a_windowed_layers_attention_of_sam3s_vision_encoder(vision, monkeypatch, tmp_path):
    """Opened by path in the explorer, SAM 3's vision encoder draws layer 1's attention (a windowed layer) as
    transformers' eager attention placed on its 4 x 6 grid: the query's window, zero elsewhere."""
    from test_app import run_app, sidebar_widget, upload
    from test_library_explorer import photo, shown_map

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(vision))
    at.run()
    png, image = photo()
    at = upload(at, "photo.png", png)
    assert not at.exception and not at.error, [e.value for e in at.error]
    at.sidebar.selectbox(key="library_method").set_value("attention")
    sidebar_widget(at, "slider", "Layer").set_value(1)
    sidebar_widget(at, "selectbox", "Head").set_value(1)
    sidebar_widget(at, "selectbox", "Query token").set_value(7)
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    x = transformers.Sam3ImageProcessor.from_pretrained(vision)(image, return_tensors="pt")["pixel_values"]
    model = library(vision, "Sam3VisionModel")
    eager = eager_windows(SAM3_MODELING, lambda: model(pixel_values=x))
    row = layer_on_grid(eager[0], LayerLayout((4, 6), WINDOW))[0, 1, 7].reshape(4, 6).numpy()
    np.testing.assert_allclose(shown_map(at, (4, 6)), row, atol=1e-6, rtol=1e-5)
    assert (row[:, 4:] == 0).all() and row[:, :4].sum() > 0.99  # patch (1, 1)'s window: the first four columns


def test_vit_load_of_a_whole_sam3_opens_its_vision_encoder_by_the_library_road(tmp_path):
    """A whole SAM 3 (``Sam3Model``, segmented by concepts through ``vit.open_sam3``) opened by ``vit.load`` is its
    vision encoder's attention on the library road, the same windows: its recorded part is the vision encoder, found
    among the model's attending parts (DETR, geometry, text) by its layer count."""
    from test_sam3_concepts import build_sam3, picture

    checkpoint = vit.load(build_sam3(tmp_path), device="cpu")
    model = checkpoint.model
    assert checkpoint.road == "library" and type(model.model).__name__ == "Sam3Model"
    assert type(model.part).__name__ == "Sam3VisionModel" and model.entry is model.part
    assert model.layout.windows == tuple(0 if i in model.vision_config.global_attn_indexes
                                         else model.vision_config.window_size for i in range(model.num_layers))
    assert vit.explain(checkpoint, picture(), "attention", layer=0, query=3).map.shape == model.layout.grid
