"""timm families whose attention runs off timm's ``Attention`` and whose layers are not all attention over image
tokens open through the recorder at the attention function (issue 117 items 2, 3 and 6;
``vit.sources.library_road.placing.layer_kinds``):
windows a block cuts itself (TinyViT, DaViT's spatial blocks, GC ViT's
local blocks, padded where the grid is not whole windows), NesT's blocks of the image, XCiT's class-attention layers;
attention over channels (XCiT's and DaViT's cross-covariance attention) and GC ViT's global queries are named and left
out, the other layers drawn. EdgeNeXt (channels only) and HaloNet (halo attention) are refused in one line naming what
they lack.

Reference: each layer's probabilities as timm's own explicit path makes them (``fused_attn`` off), caught at the
softmax of the layer's module (``layer_reference.library_softmax``); a windowed layer's placed on the grid by the
library's own partition (``timm.models.davit.window_partition``, ``timm.models.gcvit.window_partition``,
``timm.models.nest.blockify``, TinyViT's inline cut read at its attention's input) applied to a map of token indices.
Inputs are non-square wherever the family takes one (NesT takes square inputs only), so a transposed grid fails."""

import numpy as np
import pytest
import timm
import torch
from layer_reference import MEAN_STD, library_softmax, on_its_grid, placed, recorded_and_library, tiny, transposed
from PIL import Image

import vit
from vit.checkpoint import CheckpointError


def _index_map(grid, channels=1):
    """(1, gh, gw, channels): each token's index + 1 in channel 0 (0: padding, no token)."""
    index = torch.zeros(1, *grid, channels)
    index[0, :, :, 0] = torch.arange(1, grid[0] * grid[1] + 1, dtype=torch.float32).view(*grid)
    return index


def _padded(index, window):
    """The bottom and right zero padding to whole windows (DaViT's ``F.pad(x, (0, 0, 0, pad_r, 0, pad_b))``)."""
    pad_b, pad_r = (-index.shape[1]) % window[0], (-index.shape[2]) % window[1]
    return torch.nn.functional.pad(index, (0, 0, 0, pad_r, 0, pad_b))


def _davit_table(model, layer, grid):
    from timm.models.davit import window_partition

    block = model.get_submodule(layer.rpartition(".attn")[0])
    cut = window_partition(_padded(_index_map(grid), block.window_size), block.window_size)
    return cut.reshape(-1, block.window_size[0] * block.window_size[1]) - 1


def _gcvit_table(model, layer, grid):
    from timm.models.gcvit import window_partition

    block = model.get_submodule(layer.rpartition(".attn")[0])
    window = block.window_size
    return window_partition(_index_map(grid), window).reshape(-1, window[0] * window[1]) - 1


def _nest_table(model, layer, grid):
    from timm.models.nest import blockify

    level = model.get_submodule(layer.split(".transformer_encoder.")[0])
    return blockify(_index_map(grid), level.block_size)[0, ..., 0] - 1


def _tiny_vit_table(model, layer, grid):
    """TinyViT's block cuts (and pads) its windows inline: the tokens its attention receives from a map of indices."""
    block = model.get_submodule(layer.rpartition(".attn")[0])
    seen = []
    handle = block.attn.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    try:
        with torch.no_grad():
            block(_index_map(grid, block.dim))
    finally:
        handle.remove()
    return seen[0][..., 0] - 1


def _own_softmax(model, layers, pixels):
    """``library_softmax`` of ``layers``, an ``nn.Softmax`` of a layer's own (DaViT's ``attn.softmax``) caught as
    its layer's; timm's fused path restored after, as the model was opened with it."""
    fused = {m: m.fused_attn for m in model.modules() if "fused_attn" in vars(m)}
    owners = [m.softmax if isinstance(getattr(m, "softmax", None), torch.nn.Softmax) else m for m in layers]
    try:
        return library_softmax(model, owners, pixels)
    finally:
        for module, flag in fused.items():
            module.fused_attn = flag


def _mobilenetv5():
    """MobileNetV5 as timm's ``mobilenetv5_300m`` stages it (a stride-2 inverted residual, then multi-query attention
    over keys pooled by 2 in its third stage, unpooled in its fourth), one block of each, narrow."""
    from timm.models._efficientnet_builder import decode_arch_def
    from timm.models.mobilenetv5 import MobileNetV5

    stages = [["er_r1_k3_s2_e4_c16"], ["uir_r1_a3_k5_s2_e4_c24"],
              ["uir_r1_a3_k5_s2_e4_c32", "mqa_r1_k3_h2_v2_s1_d8_c32", "uir_r1_a0_k0_s1_e2_c32"],
              ["uir_r1_a3_k5_s2_e4_c48", "mqa_r1_k3_h2_s1_d8_c48", "uir_r1_a0_k0_s1_e2_c48"]]
    return MobileNetV5(decode_arch_def(stages), num_classes=3, num_features=64, msfa_output_resolution=4)


def _nest_raw(raw):  # NesT's (B, H, blocks, n, n): its blocks first, as the other families' windows
    return raw.transpose(1, 2).flatten(0, 1) if raw.dim() == 5 else raw


# name, build, input (height, width), layers, layers left out, the library's partition where a layer attends in pieces
FAMILIES = [
    ("xcit", lambda: timm.create_model("xcit_nano_12_p8_224", num_classes=3, depth=2, embed_dim=32, num_heads=2,
                                       img_size=(32, 48)), (32, 48), 2, 2, None),
    ("davit", lambda: timm.create_model("davit_tiny", num_classes=3, depths=(1, 1, 1, 1), embed_dims=(16, 32, 64, 64),
                                        num_heads=(1, 2, 2, 2)), (64, 96), 4, 4, _davit_table),
    ("tiny_vit", lambda: timm.create_model("tiny_vit_5m_224", num_classes=3, depths=(1, 1, 1, 1)), (64, 96), 3, 0,
     _tiny_vit_table),
    ("gcvit", lambda: timm.create_model("gcvit_xxtiny", num_classes=3, img_size=(64, 96)), (64, 96), 6, 6,
     _gcvit_table),
    ("nest", lambda: timm.models.nest.Nest(img_size=64, depths=(1, 1, 1), embed_dims=(16, 32, 64), num_heads=(2, 2, 4),
                                           num_classes=3), (64, 64), 3, 0, _nest_table),
    # its DCT stem folds 8x8 px into 192 channels: the input's 3 channels are read from its in_chans
    ("csatv2", lambda: timm.create_model("csatv2", num_classes=3, dims=(8, 16, 32, 64), depths=(1, 1, 1, 1),
                                         transformer_depths=(0, 0, 1, 1)), (128, 192), 2, 0, None),
    # over the census's cap at their registered sizes (issue 117 item 6): built small by their own fields
    ("deepseek_vit", lambda: timm.create_model("deepseek_vit_412m", num_classes=3, depth=2, embed_dim=64, num_heads=2,
                                               img_size=(42, 56), patch_size=14), (42, 56), 2, 0, None),
    ("mobilenetv5", lambda: _mobilenetv5(), (64, 96), 2, 0, None),
    ("gemma4_vit", lambda: timm.create_model("gemma4_vit_167m", num_classes=3, depth=2, embed_dim=64, num_heads=2,
                                             head_dim=32, intermediate_size=128, img_size=(48, 64), patch_size=16),
     (48, 64), 2, 0, None),
]

# Each layer's key grid, worked out by hand: XCiT's 32x48 px / 8 px patches (its class-attention layers); DaViT's and
# TinyViT's stages / 4, 8, 16, 32 px of 64x96 px (TinyViT's first stage is convolutions); GC ViT's the same, its
# global layers left out; NesT's 64 px / 4 px patches, pooled by each level; CSATv2's third and fourth stages / 32
# and / 64 px of 128x192 px; DeepSeek's 42x56 px / 14 px patches; MobileNetV5's multi-query attention: / 16 px
# queries over keys pooled to / 32 px, then / 32 px over / 32 px; Gemma 4's 48x64 px / 16 px patches
KEY_GRIDS = {"xcit": [(4, 6)] * 2, "davit": [(16, 24), (8, 12), (4, 6), (2, 3)], "tiny_vit": [(8, 12), (4, 6), (2, 3)],
             "gcvit": [(16, 24), (8, 12), (4, 6), (4, 6), (4, 6), (2, 3)], "nest": [(16, 16), (8, 8), (4, 4)],
             "csatv2": [(4, 6), (2, 3)], "deepseek_vit": [(3, 4)] * 2, "mobilenetv5": [(2, 3), (2, 3)],
             "gemma4_vit": [(3, 4)] * 2}


@pytest.fixture(scope="module", params=FAMILIES, ids=[f[0] for f in FAMILIES])
def opened(request):
    name, build, size, layers, left_out, table = request.param
    model = tiny(build())
    checkpoint = vit.load(model, image_size=size, **MEAN_STD)
    return name, model, checkpoint, size, layers, left_out, table


def test_each_layer_equals_timms_own_softmax_placed_on_its_grid_not_its_transpose(opened):
    name, model, checkpoint, size, layers, left_out, table = opened
    wrapped = checkpoint.model
    assert checkpoint.road == "library" and wrapped.num_layers == layers
    assert ([p.key_grid for p in wrapped.places] or [wrapped.layout.grid] * layers) == KEY_GRIDS[name]
    recorded, own = recorded_and_library(wrapped, model, size, _own_softmax)
    for layer in range(layers):
        raw = _nest_raw(own[layer]) if name == "nest" else own[layer]
        place = wrapped.places[layer] if wrapped.places else None
        expected = on_its_grid(raw, place, table, model, wrapped.names[layer])
        assert recorded[layer].shape == expected.shape, (name, layer)
        assert torch.allclose(recorded[layer], expected, atol=1e-5), (name, layer)
        grid = place.key_grid if place is not None else None
        if place is not None and place.windows is not None and grid[0] != grid[1]:  # on the transposed grid: not so
            flipped = transposed(table(model, wrapped.names[layer], grid), grid)
            assert not torch.allclose(recorded[layer], placed(raw, flipped, grid[0] * grid[1]), atol=1e-5)


def test_gemma4s_patches_by_reshape_sit_where_its_own_patch_coordinates_say():
    """Its patches are cut by a reshape (no convolution to trace): the layout's row-major order is the library's own
    ``patch_coord`` (y, x) for each token, not its transpose."""
    model = timm.create_model("gemma4_vit_167m", num_classes=3, depth=1, embed_dim=32, num_heads=1, head_dim=32,
                              intermediate_size=64, img_size=(48, 64), patch_size=16).eval()
    checkpoint = vit.load(model, image_size=(48, 64), **MEAN_STD)
    gh, gw = checkpoint.model.layout.grid
    embed = next(m for m in model.modules() if type(m).__name__ == "Gemma4PatchEmbed")
    coords, _ = embed._default_patch_coord(1, 48 // 16, 64 // 16, torch.device("cpu"))
    assert (gh, gw) == (3, 4)
    assert coords[0].tolist() == [list(divmod(token, gw)) for token in range(gh * gw)]


def test_layers_that_are_no_attention_over_tokens_are_named_and_the_others_drawn(opened):
    name, model, checkpoint, size, layers, left_out, table = opened
    named = checkpoint.metadata.get("left_out", {})
    assert len(named) == left_out
    kinds = {"xcit": "cross-covariance attention", "davit": "cross-covariance attention",
             "gcvit": "global-query attention"}
    assert all(kinds[name] in why for why in named.values())
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (*size, 3), dtype=np.uint8))
    drawn = vit.explain(checkpoint, image, "attention")
    places = checkpoint.model.places
    grid = places[-1].key_grid if places else checkpoint.model.layout.grid
    assert drawn.map.shape == grid and np.isfinite(drawn.map).all()


@pytest.mark.parametrize("build, size, says", [
    (lambda: timm.create_model("edgenext_xx_small", num_classes=3), (64, 96),
     "cross-covariance attention (CrossCovarianceAttn"),
    (lambda: timm.create_model("halonet26t", num_classes=3), (256, 512), "halo attention"),
], ids=["edgenext", "halonet"])
def test_a_family_without_attention_over_tokens_or_a_layout_is_refused_in_one_line_naming_it(build, size, says):
    with pytest.raises(CheckpointError) as raised:
        vit.load(tiny(build()), image_size=size, **MEAN_STD)
    assert "\n" not in str(raised.value) and says in str(raised.value)


def test_a_folder_saved_with_its_tied_weights_once_loads_them_and_names_coats_factorized_attention(tmp_path):
    from safetensors.torch import save_model
    from timm.models import _hub

    args = dict(embed_dims=(32, 32, 32, 32), serial_depths=(1, 1, 1, 1), mlp_ratios=(2, 2, 2, 2))
    model = timm.create_model("coat_lite_tiny", num_classes=3, **args).eval()
    save_model(model, str(tmp_path / "model.safetensors"))  # safetensors' way with shared weights: each saved once
    _hub.save_config_for_hf(model, tmp_path / "config.json", model_args=args)
    with pytest.raises(CheckpointError) as raised:
        vit.load(tmp_path, device="cpu")
    assert "\n" not in str(raised.value) and "factorized attention (CoaT's" in str(raised.value)
