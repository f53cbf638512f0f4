"""The library road's layouts of two named families (issue 91): C-RADIO's CLS and register tokens, counted from its own
config, on a grid that is not square; EoMT's and EoMT-DINOv3's object queries, the extra tokens of their last blocks.
Each model is built tiny with random weights in transformers, saved natively and opened by path with ``vit.load``;
every layer's attention is held to transformers' eager attention, the outputs to transformers' own forward."""

from __future__ import annotations

import importlib

import pytest
import torch
from layer_reference import caught_eager, widened
from PIL import Image

import vit
from vit.checkpoint import CheckpointError
from vit.core.inference import preprocess

transformers = pytest.importorskip("transformers")

from test_library_path import SMALL, reference  # noqa: E402

HEIGHT, WIDTH, PATCH = 32, 48, 8  # a 4 x 6 grid: read transposed (6 x 4), a map lands on other patches
CLS_TOKENS, REGISTERS = 2, 3  # not C-RADIO's 3 and 7 (test_library_path's FAMILIES), so the count is read, not assumed


def an_image(seed: int = 3) -> Image.Image:
    return Image.fromarray((torch.rand(30, 50, 3, generator=torch.Generator().manual_seed(seed)) * 255)
                           .byte().numpy())


@pytest.fixture(scope="module")
def radio(tmp_path_factory):
    """A C-RADIO folder: its config names one image side (RadioConfig's image_size is an int), its processor a
    32 x 48 input, which C-RADIO's cropped position embedding runs; no normalisation in the processor, as the model
    normalises its own input (its input conditioner)."""
    folder = tmp_path_factory.mktemp("radio")
    torch.manual_seed(0)
    config = transformers.RadioConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, patch_size=PATCH,
                                      image_size=HEIGHT, max_img_size=64, num_cls_tokens=CLS_TOKENS,
                                      num_registers=REGISTERS)
    model = transformers.RadioModel(config)
    widened(model)
    model.save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": HEIGHT, "width": WIDTH}, do_normalize=False).save_pretrained(folder)
    return folder


def test_c_radios_cls_and_register_tokens_are_counted_from_its_own_config(radio):
    checkpoint = vit.load(radio, device="cpu")
    config = transformers.AutoConfig.from_pretrained(radio)
    assert checkpoint.road == "library"
    assert checkpoint.model.layout.num_prefix_tokens == config.num_summary_tokens == CLS_TOKENS + REGISTERS
    assert checkpoint.model.layout.grid == (HEIGHT // PATCH, WIDTH // PATCH) == (4, 6)


def test_c_radios_pixels_are_its_processors_at_its_processors_own_non_square_size(radio):
    checkpoint = vit.load(radio, device="cpu")
    x = preprocess([an_image()], checkpoint.preprocessing)
    theirs = transformers.ViTImageProcessor.from_pretrained(radio)(an_image(), return_tensors="pt")["pixel_values"]
    assert x.shape == theirs.shape == (1, 3, HEIGHT, WIDTH)
    torch.testing.assert_close(x, theirs, atol=1e-5, rtol=0)


def test_c_radios_summary_and_features_are_transformers_sdpa_forward(radio):
    checkpoint = vit.load(radio, device="cpu")
    x = torch.rand(2, 3, HEIGHT, WIDTH, generator=torch.Generator().manual_seed(1))
    ours, _ = checkpoint.model.run(x)
    with torch.no_grad():
        theirs = reference(radio, "sdpa")(pixel_values=x)
    for name in ("summary", "features", "last_hidden_state"):
        torch.testing.assert_close(getattr(ours, name), getattr(theirs, name), atol=1e-5, rtol=0)
    torch.testing.assert_close(checkpoint.model(x), theirs.last_hidden_state, atol=1e-5, rtol=0)


def test_c_radios_every_layer_is_eager_output_attentions_and_its_maps_sit_row_major(radio):
    checkpoint = vit.load(radio, device="cpu")
    image = an_image()
    x = preprocess([image], checkpoint.preprocessing)
    _, attentions = checkpoint.model.run(x, layers=range(3))
    with torch.no_grad():
        eager = reference(radio, "eager")(pixel_values=x, output_attentions=True).attentions
    prefix, tokens = CLS_TOKENS + REGISTERS, CLS_TOKENS + REGISTERS + 24
    for layer in range(3):
        assert attentions[layer].shape == eager[layer].shape == (1, 4, tokens, tokens)
        torch.testing.assert_close(attentions[layer], eager[layer], atol=1e-5, rtol=0)
        for query in (0, prefix + 7):  # the first CLS token; the patch at row 1, col 1
            drawn = vit.explain(checkpoint, image, "attention", layer=layer, head=1, query=query)
            row = eager[layer][0, 1, query, prefix:]  # the patches' keys, row-major
            assert drawn.grid == (4, 6) and drawn.num_prefix_tokens == prefix
            torch.testing.assert_close(torch.from_numpy(drawn.map), row.reshape(4, 6), atol=1e-5, rtol=0)
            assert not torch.allclose(torch.from_numpy(drawn.map), row.reshape(6, 4).T, atol=1e-5, rtol=0)


# --- EoMT: its object queries join before the CLS token in its last num_blocks layers (the layout's extra tokens)

FAMILIES = {"eomt": "Eomt", "eomt_dinov3": "EomtDinov3"}  # model_type -> transformers' class prefix


def eomt_folder(folder, family: str, processor_hw: tuple[int, int] = (32, 32)):
    """A tiny EoMT (or EoMT-DINOv3: RoPE, registers) segmenter, one block of 3 object queries, at 32 px: transformers
    builds EoMT for one square size only (its mask head's grid is ``image_size // patch_size`` both ways; a
    (height, width) image_size is a TypeError in its ``__init__``), so its grid is square."""
    name = FAMILIES[family]
    config = getattr(transformers, f"{name}Config")(**SMALL, image_size=32, num_blocks=1, num_queries=3, num_labels=2)
    torch.manual_seed(0)
    model = getattr(transformers, f"{name}ForUniversalSegmentation")(config)
    widened(model)
    model.save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": processor_hw[0], "width": processor_hw[1]}).save_pretrained(
        folder)
    return folder


def eager_probabilities(folder, family: str, x: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's post-softmax attention ``(B, H, T, T)`` of transformers' own EoMT on ``x``, as its modelling
    file's eager function returns it (EoMT collects none with ``output_attentions``: the function is hooked)."""
    modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    model = reference(folder, "eager")
    return caught_eager(modeling, lambda: model(pixel_values=x))


@pytest.mark.parametrize("family", FAMILIES)
def test_eomts_class_and_mask_logits_are_transformers_own_forward(tmp_path, family):
    folder = eomt_folder(tmp_path, family)
    checkpoint = vit.load(folder, device="cpu")
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    ours, _ = checkpoint.model.run(x, layers=range(3))  # recorded: the outputs are the same
    with torch.no_grad():
        theirs = reference(folder, "sdpa")(pixel_values=x)
    for name in ("class_queries_logits", "masks_queries_logits", "last_hidden_state"):
        torch.testing.assert_close(getattr(ours, name), getattr(theirs, name), atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_eomts_every_layer_and_head_is_its_eager_attention_the_queries_first_in_the_last(tmp_path, family):
    folder = eomt_folder(tmp_path, family)
    checkpoint = vit.load(folder, device="cpu")
    prefix = 1 + transformers.AutoConfig.from_pretrained(folder).num_register_tokens
    assert checkpoint.model.layout.num_prefix_tokens == prefix and checkpoint.model.layout.extra_tokens == (0, 0, 3)
    image = an_image()
    x = preprocess([image], checkpoint.preprocessing)
    expected = eager_probabilities(folder, family, x)
    _, attentions = checkpoint.model.run(x, layers=range(3))
    for layer, extra in enumerate((0, 0, 3)):
        tokens = extra + prefix + 16
        assert attentions[layer].shape == expected[layer].shape == (1, 4, tokens, tokens)
        torch.testing.assert_close(attentions[layer], expected[layer], atol=1e-5, rtol=0)
        query = prefix + 6  # the patch at row 1, col 2, its row past the layer's queries
        drawn = vit.explain(checkpoint, image, "attention", layer=layer, head=2, query=query)
        row = expected[layer][0, 2, extra + query, extra + prefix:]  # the queries' and prefix keys dropped
        torch.testing.assert_close(torch.from_numpy(drawn.map), row.reshape(4, 4), atol=1e-5, rtol=0)
        assert not torch.allclose(torch.from_numpy(drawn.map), row.reshape(4, 4).T, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("family", "message"), [
    ("eomt", r"its forward cannot be traced on the meta device to check where its tokens sit \(.*16.*24"),
    ("eomt_dinov3", r"its image processor asks for 32x48-px inputs, not its config's image_size, and its forward "
                    r"reads a value of its input"),
])
def test_an_eomt_whose_processor_asks_for_a_size_it_cannot_run_is_refused_in_one_line_at_opening(tmp_path, family,
                                                                                                 message):
    """At a size other than its config's, transformers' EoMT fails (its mask head is built for the config's grid).
    EoMT's learned positions fail the meta trace at once; EoMT-DINOv3's rotary ones pass its first blocks, and its
    forward then reads its mask annealing (a value the meta device does not hold), so no trace reaches the head:
    both refused before any weight is read, not a traceback at the first map."""
    folder = eomt_folder(tmp_path, family, processor_hw=(32, 48))
    with pytest.raises(CheckpointError, match=message) as refused:
        vit.load(folder, device="cpu")
    assert "\n" not in str(refused.value)
