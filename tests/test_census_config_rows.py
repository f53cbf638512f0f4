"""Census rows a tiny config opened rather than a change under vit/ (issue 117 item 6, ``bench/census_families.py``):
Swin2SR at its own 1-px patch, Sapiens2 built as its per-layer lists say, and the depth heads CHMv2 and TIPSv2 DPT
whose backbones' ``out_indices`` name the layers their tiny configs build. Each is tested on the product path it
runs, so that it fails where that path breaks, not where the census's config does:

- Swin2SR (a model in hand): the recorder at its softmax, its shifted windows placed by ``layer_places``' ``_swin``
  (``vit.model.stages.LayerLayout``'s padded, rolled windows);
- Sapiens2, CHMv2 and TIPSv2 DPT (folders, as the census opens them): the library road's recording attention in
  transformers' interface (Sapiens2's grouped key heads shared as its ``repeat_kv`` shares them), its prefix tokens
  counted from the embeddings' CLS and register parameters (``transformers_models.prefix_tokens``), a drawn map a
  patch's row over the patches, row-major.

Reference: transformers' own eager attention, caught where its modelling file calls its eager attention function
(``layer_reference.caught_eager``; Swin2SR's explicit softmax, ``layer_reference.library_softmax``), every layer, at a
non-square input (a 4x6 grid of 8-px patches), so a transposed placement fails. Built tiny with random weights in
transformers, never downloaded."""

from __future__ import annotations

import pytest
import torch
from layer_reference import caught_eager, library_softmax, placed, transposed, widened
from PIL import Image

import vit
from vit.core.inference import preprocess

transformers = pytest.importorskip("transformers")

SIZE = (32, 48)  # 8-px patches: a 4x6 grid
GRID = (4, 6)


def _swin2sr_table(model, layer, grid):
    """Swin2SR's windows as its own layer cuts them: a map of token indices + 1 padded by its ``maybe_pad``, rolled
    by its ``shift_size`` and cut by its module's ``window_partition`` (0: padding, no token; -1 below)."""
    from transformers.models.swin2sr.modeling_swin2sr import window_partition

    block = model.get_submodule(layer.rpartition(".attention")[0])
    index = torch.arange(1, grid[0] * grid[1] + 1, dtype=torch.float32).view(1, *grid, 1)
    padded, _ = block.maybe_pad(index, *grid)
    if block.shift_size > 0:
        padded = torch.roll(padded, shifts=(-block.shift_size, -block.shift_size), dims=(1, 2))
    return window_partition(padded, block.window_size).reshape(-1, block.window_size ** 2) - 1


def test_swin2sr_records_every_windowed_layer_as_its_own_softmax_placed_by_its_own_partition():
    """Its plain and its shifted layer each placed window by window: a shift left out, or the windows cut on the
    transposed grid, fails."""
    config = transformers.Swin2SRConfig(image_size=16, patch_size=1, embed_dim=8, depths=[2], num_heads=[2],
                                        window_size=4, upsampler="pixelshuffledirect")
    torch.manual_seed(0)
    model = widened(transformers.Swin2SRModel(config).eval())
    checkpoint = vit.load(model, image_size=(8, 12), mean=(0.0,) * 3, std=(1.0,) * 3)
    wrapped = checkpoint.model
    assert wrapped.num_layers == 2 and [p.key_grid for p in wrapped.places] == [(8, 12)] * 2
    x = torch.rand(1, 3, 8, 12, generator=torch.Generator().manual_seed(1))
    _, recorded = wrapped.run(x, layers=range(2))
    own = library_softmax(model, wrapped._attention, x)
    assert len(own) == 2 and [model.get_submodule(n.rpartition(".attention")[0]).shift_size
                              for n in wrapped.names] == [0, 2]  # one plain, one shifted
    for layer in range(2):
        table = _swin2sr_table(model, wrapped.names[layer], (8, 12))
        torch.testing.assert_close(recorded[layer], placed(own[layer], table, 8 * 12), atol=1e-5, rtol=0)
        assert not torch.allclose(recorded[layer], placed(own[layer], transposed(table, (8, 12)), 8 * 12), atol=1e-3)
    unshifted = _swin2sr_table(model, wrapped.names[0], (8, 12))  # the shifted layer cut as the plain one: not so
    assert not torch.allclose(recorded[1], placed(own[1], unshifted, 8 * 12), atol=1e-3)


def _every_layer_and_a_drawn_row_are_eager(folder, cls, modelling, layers: int, prefix: int, head: int):
    """The folder opened: every layer equal to the probabilities of ``modelling``'s ``eager_attention_forward`` in
    transformers' own model of class ``cls`` built with eager attention, a drawn map a patch's eager row."""
    reference = cls.from_pretrained(folder, attn_implementation="eager").eval()

    def _eager(pixels):
        return caught_eager(modelling, lambda: reference(pixel_values=pixels))

    checkpoint = vit.load(folder, device="cpu")
    wrapped = checkpoint.model
    assert checkpoint.road == "library" and wrapped.num_layers == layers
    assert wrapped.layout.grid == GRID and wrapped.layout.num_prefix_tokens == prefix
    x = torch.randn(1, 3, *SIZE, generator=torch.Generator().manual_seed(1))
    _, kept = wrapped.run(x, layers=range(layers))
    own = _eager(x)
    assert len(own) == layers
    for layer in range(layers):
        assert kept[layer].shape == own[layer].shape == (1, own[layer].shape[1], prefix + 24, prefix + 24)
        torch.testing.assert_close(kept[layer], own[layer], atol=1e-5, rtol=0)
    image = Image.fromarray((torch.rand(*SIZE, 3, generator=torch.Generator().manual_seed(2)) * 255).byte().numpy())
    query = prefix + 6 + 2  # the patch at row 1, column 2 of the 4x6 grid
    drawn = vit.explain(checkpoint, image, "attention", layer=layers - 1, head=head, query=query)
    row = _eager(preprocess([image], checkpoint.preprocessing))[-1][0, head, query, prefix:]
    torch.testing.assert_close(torch.from_numpy(drawn.map), row.reshape(GRID), atol=1e-5, rtol=0)
    assert not torch.allclose(row.reshape(GRID), row.reshape(GRID[::-1]).T, atol=1e-3)  # column-major: not so


def test_sapiens2_as_its_lists_say_records_its_grouped_key_heads_as_its_eager_attention(tmp_path):
    """Its second layer's 4 query heads read 2 key heads (``repeat_kv``: heads 0, 1 the first, 2, 3 the second), its
    9 prefix tokens a CLS and 8 registers; the census's row failed for per-layer lists left at 24 layers."""
    from transformers.models.sapiens2 import modeling_sapiens2

    config = transformers.Sapiens2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=64, image_size=list(SIZE), patch_size=8,
                                         num_first_full_attention_layers=1, num_last_full_attention_layers=1,
                                         num_key_value_attention_heads=2, num_key_value_heads_per_layer=[4, 2])
    torch.manual_seed(0)
    model = widened(transformers.Sapiens2Backbone(config).eval())
    groups = [m.num_key_value_groups for m in model.modules() if isinstance(m, modeling_sapiens2.Sapiens2Attention)]
    assert groups == [1, 2]  # the second layer grouped: keys shared by the wrong heads fail
    model.save_pretrained(tmp_path)
    transformers.ViTImageProcessor(size={"height": SIZE[0], "width": SIZE[1]}).save_pretrained(tmp_path)
    _every_layer_and_a_drawn_row_are_eager(tmp_path, transformers.Sapiens2Backbone, modeling_sapiens2, 2, 9, 3)


DEPTH_BACKBONE = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64,
                      image_size=SIZE[0], patch_size=8, out_indices=[1, 2, 3, 4])  # the census's: 4 layers, all read


def _backbone(head_config) -> dict:
    """The head's default backbone (its registers, its class token returned), made tiny as the census makes it."""
    config = head_config().backbone_config.to_dict()
    config.pop("out_features", None), config.pop("stage_names", None)  # named for the full depth: derived again
    return {**config, **DEPTH_BACKBONE}


def test_chmv2s_dinov3_backbone_records_every_layer_as_its_eager_attention_on_the_grid(tmp_path):
    """CHMv2's depth head over DINOv3 (a CLS and 4 registers, RoPE on the patches)."""
    from transformers.models.dinov3_vit import modeling_dinov3_vit

    config = transformers.CHMv2Config(backbone_config=_backbone(transformers.CHMv2Config), patch_size=8,
                                      post_process_channels=[8, 16, 16, 16], fusion_hidden_size=16,
                                      head_hidden_size=16, number_output_channels=16)
    torch.manual_seed(0)
    widened(transformers.CHMv2ForDepthEstimation(config).eval()).save_pretrained(tmp_path)
    transformers.CHMv2ImageProcessor(do_resize=True, size={"height": SIZE[0], "width": SIZE[1]},
                                     keep_aspect_ratio=False, ensure_multiple_of=8).save_pretrained(tmp_path)
    _every_layer_and_a_drawn_row_are_eager(tmp_path, transformers.CHMv2ForDepthEstimation, modeling_dinov3_vit, 4, 5,
                                           1)


def test_tipsv2_dpts_backbone_records_every_layer_as_its_eager_attention_on_the_grid(tmp_path):
    """TIPSv2 DPT's depth head over TIPSv2's vision model (a CLS and a register)."""
    from transformers.models.tipsv2 import modeling_tipsv2

    config = transformers.Tipsv2DptConfig(backbone_config=_backbone(transformers.Tipsv2DptConfig),
                                          neck_hidden_sizes=[8, 16, 16, 16], fusion_hidden_size=16)
    torch.manual_seed(0)
    widened(transformers.Tipsv2DptForDepthEstimation(config).eval()).save_pretrained(tmp_path)
    transformers.Tipsv2DptImageProcessor(size={"height": SIZE[0], "width": SIZE[1]}).save_pretrained(tmp_path)
    _every_layer_and_a_drawn_row_are_eager(tmp_path, transformers.Tipsv2DptForDepthEstimation, modeling_tipsv2, 4, 2,
                                           1)
