"""DETR and its kin open through the recorder at the attention function (issue 117 item 3, the census's "forward the
meta device cannot trace" rows): their backbone's mask reads a value (``.item()``), so where the tokens sit is read
from one real forward of a small image, every allocation counted before it is made
(``vit.sources.library_road.placing.bounded_forward``); their encoder attends over the CNN's feature map flattened into
tokens, and their decoder's calls, over learnt object queries, are set aside by name
(``vit.sources.library_road.placing.image_tokens``).

Reference: transformers' own eager attention (``attn_implementation="eager"``, ``output_attentions=True``: the
encoder's post-softmax probabilities, layer by layer), and the feature map's (rows, cols) as the library's own
``input_projection`` makes it, at a non-square 64x96-px input (a 2x3 grid), so a transposed grid fails. The tiny
models use transformers' own ResNet as their backbone (the census's full-size timm ResNet-50 is seconds to build)."""

from __future__ import annotations

import pytest
import torch
from layer_reference import widened
from parity_helpers import run_hooked
from PIL import Image

import vit
from vit.checkpoint import CheckpointError
from vit.core.inference import preprocess

transformers = pytest.importorskip("transformers")

FAMILIES = ("DetrModel", "ConditionalDetrModel", "DabDetrModel", "TableTransformerModel")
MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.3, 0.4)
SIZE = (64, 96)  # a 2x3 feature map at the backbone's stride 32


def tiny(name: str) -> torch.nn.Module:
    cls = getattr(transformers, name)
    fields = cls.config_class().to_dict()
    sizes = dict(d_model=16, hidden_size=16, encoder_layers=2, decoder_layers=1, encoder_attention_heads=2,
                 decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_queries=3)
    backbone = transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 8, 16, 16], depths=[1, 1, 1, 1],
                                         out_features=["stage4"])
    config = cls.config_class(**{k: v for k, v in sizes.items() if k in fields}, use_timm_backbone=False,
                              use_pretrained_backbone=False, backbone_config=backbone, backbone=None)
    torch.manual_seed(0)
    return widened(cls(config).eval(), matrices_only=True)


def eager(model: torch.nn.Module, pixels: torch.Tensor) -> tuple[list[torch.Tensor], tuple[int, int]]:
    """The library's own eager encoder attentions for ``pixels`` and the feature map's (rows, cols) its
    ``input_projection`` makes."""
    seen = []
    handle = model.input_projection.register_forward_hook(lambda m, a, out: seen.append(tuple(out.shape[-2:])))
    implementation = model.config._attn_implementation
    model.config._attn_implementation = "eager"  # the encoder's layers read it at each call
    try:
        out = run_hooked([handle], lambda: model(pixel_values=pixels, output_attentions=True))
    finally:
        model.config._attn_implementation = implementation
    return list(out.encoder_attentions), seen[0]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    model = tiny(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    transformers.DetrImageProcessor(size={"height": SIZE[0], "width": SIZE[1]}, image_mean=list(MEAN),
                                    image_std=list(STD), do_pad=False).save_pretrained(folder)
    return model, folder


def test_a_detr_like_folder_records_its_encoder_layers_as_the_librarys_eager_attention_on_its_feature_map(family):
    model, folder = family
    checkpoint = vit.load(folder, device="cpu")
    wrapped = checkpoint.model
    assert checkpoint.road == "library" and wrapped.num_layers == 2
    assert all(".encoder.layers." in f".{name}" for name in wrapped.names)
    assert "decoder.layers.0" in checkpoint.metadata["not_layers"]  # the object queries' calls, named
    x = torch.randn(1, 3, *SIZE, generator=torch.Generator().manual_seed(1))
    _, kept = wrapped.run(x, layers=range(2))
    own, grid = eager(model, x)
    assert grid == (2, 3) and wrapped.layout.grid == grid and wrapped.layout.num_prefix_tokens == 0
    assert len(own) == 2
    for layer in range(2):
        torch.testing.assert_close(kept[layer], own[layer], atol=1e-5, rtol=0)
    _, rows = wrapped.run(x, layers=[1], rows=[4])  # one query's row, only it formed
    torch.testing.assert_close(rows[1], own[1][:, :, 4:5], atol=1e-5, rtol=0)
    image = Image.fromarray((torch.rand(*SIZE, 3, generator=torch.Generator().manual_seed(2)) * 255).byte().numpy())
    explanation = vit.explain(checkpoint, image, "attention", layer=-1, head=1, query=4)
    own, grid = eager(model, preprocess([image], checkpoint.preprocessing))
    torch.testing.assert_close(torch.from_numpy(explanation.map), own[-1][0, 1, 4].reshape(grid), atol=1e-5, rtol=0)


def test_a_detr_like_model_in_hand_goes_as_its_folder_each_encoder_layer_the_librarys_eager_attention(family):
    """``vit.load(DetrModel(...), image_size=, mean=, std=)``: the library road would refuse it for want of a patch
    size; it opens through the recorder as its folder does, on the feature map's (rows, cols) grid."""
    from vit.sources.library_road.placing.image_part import no_patch_size

    model, _ = family
    assert no_patch_size(model.config.to_dict())  # what the library road would refuse it for
    checkpoint = vit.load(model, image_size=SIZE, mean=MEAN, std=STD)
    wrapped = checkpoint.model
    assert checkpoint.road == "library" and checkpoint.metadata["source"]["kind"] == "module"
    assert wrapped.num_layers == 2 and all(".encoder.layers." in f".{name}" for name in wrapped.names)
    x = torch.randn(1, 3, *SIZE, generator=torch.Generator().manual_seed(3))
    _, kept = wrapped.run(x, layers=range(2))
    own, grid = eager(model, x)
    assert grid == (2, 3) and wrapped.layout.grid == grid and wrapped.layout.num_prefix_tokens == 0
    for layer in range(2):
        torch.testing.assert_close(kept[layer], own[layer], atol=1e-5, rtol=0)
    image = Image.fromarray((torch.rand(*SIZE, 3, generator=torch.Generator().manual_seed(4)) * 255).byte().numpy())
    explanation = vit.explain(checkpoint, image, "attention", layer=0, head=0, query=5)
    own, grid = eager(model, preprocess([image], checkpoint.preprocessing))
    torch.testing.assert_close(torch.from_numpy(explanation.map), own[0][0, 0, 5].reshape(grid), atol=1e-5, rtol=0)


class Latents(torch.nn.Module):
    """Perceiver's kind: learnt latents cross-attend the pixels (a 1x1 convolution's tokens), then attend among
    themselves; no layer attends among the image's tokens."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Conv2d(3, 8, 4, stride=4)
        self.latents = torch.nn.Parameter(torch.randn(5, 8))
        self.cross = torch.nn.MultiheadAttention(8, 2, batch_first=True)
        self.self_attention = torch.nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        tokens = self.embed(x).flatten(2).transpose(1, 2)  # (B, h * w, 8)
        latents = self.latents.expand(x.shape[0], -1, -1)
        latents = self.cross(latents, tokens, tokens)[0]
        return self.self_attention(latents, latents, latents)[0]


def test_learnt_latents_that_only_cross_attend_the_image_are_refused_in_one_line_naming_them():
    with pytest.raises(CheckpointError) as refused:
        vit.load(Latents().eval(), image_size=(16, 24), mean=MEAN, std=STD)
    message = str(refused.value)
    assert "\n" not in message and "cross-attention from 5 learnt queries (latents)" in message


class Lying(torch.nn.Module):
    """A forward that reads a value of its input (the meta device cannot trace it), then allocates what its
    attribute declares: 2^34 floats, 64 GB."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Conv2d(3, 8, 4, stride=4)
        self.queries = 2**34

    def forward(self, x):
        tokens = self.embed(x).flatten(2).transpose(1, 2)
        if tokens.abs().sum().item() >= 0:  # a value read: no meta trace
            scratch = torch.zeros(self.queries, device=x.device)
            tokens = tokens + scratch[:1]
        return torch.nn.functional.scaled_dot_product_attention(tokens[:, None], tokens[:, None], tokens[:, None])


def test_a_forward_that_reads_a_value_and_declares_a_huge_allocation_is_refused_before_making_it():
    with pytest.raises(CheckpointError) as refused:
        vit.load(Lying().eval(), image_size=(16, 24), mean=MEAN, std=STD)
    message = str(refused.value)
    assert "\n" not in message and "would allocate more than" in message and "zeros" in message


def test_deformable_detr_has_no_attention_over_image_tokens_and_says_so_in_one_line(tmp_path):
    """Its encoder's (and its decoder's cross-) attention is multi-scale deformable: a softmax over each query's
    sampled points, ``(B, queries, heads, levels * points)``, no rows of queries over tokens; its decoder's
    self-attention is among its object queries."""
    backbone = transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 8, 16, 16], depths=[1, 1, 1, 1],
                                         out_features=["stage2", "stage3", "stage4"])
    config = transformers.DeformableDetrConfig(d_model=32, encoder_layers=1, decoder_layers=1,
                                               encoder_attention_heads=2, decoder_attention_heads=2,
                                               encoder_ffn_dim=32, decoder_ffn_dim=32, num_queries=3,
                                               use_timm_backbone=False, use_pretrained_backbone=False,
                                               backbone_config=backbone, backbone=None)
    torch.manual_seed(0)
    transformers.DeformableDetrModel(config).eval().save_pretrained(tmp_path)
    transformers.DeformableDetrImageProcessor(size={"height": SIZE[0], "width": SIZE[1]}, image_mean=list(MEAN),
                                              image_std=list(STD), do_pad=False).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError) as refused:
        vit.load(tmp_path, device="cpu")
    message = str(refused.value)
    assert "\n" not in message and "no attention over image tokens" in message
    assert "among 3 learnt queries" in message and "decoder.layers.0.self_attn" in message


def test_a_library_road_build_with_a_tensor_made_off_the_meta_device_is_traced_to_its_layout(tmp_path):
    """LW-DETR's ViT builds its layer scales with ``nn.Parameter(torch.Tensor(n))``, which ignores the meta device
    it is built on: the layout's trace on the meta device swaps them for meta tensors, and the folder is judged by
    its layout (its windows, which the library road refuses and the recorder's road places: ``test_partitions``),
    not refused for the trace."""
    config = transformers.LwDetrViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                          intermediate_size=64, image_size=32, patch_size=8, num_windows=4,
                                          window_block_indices=[0])
    torch.manual_seed(0)
    transformers.LwDetrViTBackbone(config).eval().save_pretrained(tmp_path)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    checkpoint = vit.load(tmp_path, device="cpu")
    assert checkpoint.road == "library" and checkpoint.model.layout.grid == (4, 4)

