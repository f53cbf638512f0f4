"""The dense views on every family the project opens (issue 48, "everywhere"): ``vit.pca``, ``vit.similarity`` and
``vit.correspondences`` on a tiny random model of each, built by its own library, at a non-square input.

The maps take the model's own patch grid and leave its prefix tokens (CLS, registers, storage tokens, distillation)
out, and each layer's tokens are the library's own: its hidden states (HF ``output_hidden_states``; timm, open_clip
and vit-pytorch through a forward hook on the block) after its own final norm, compared to 1e-4.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from parity_helpers import randomize
from PIL import Image

import vit
from vit.checkpoint import Checkpoint, Preprocessing, save_checkpoint
from vit.core.inference import TRAINING_SIZE, InputSize, preprocess
from vit.explain.methods import dense
from vit.model import ViT, ViTConfig

pytestmark = pytest.mark.slow  # importing transformers, timm and open_clip takes seconds
ATOL = 1e-4
WIDE = InputSize(48, keep_aspect=True)  # a 96 x 64 photo at 48 x 32 px: 6 x 4 patches of 8 px
HF_TINY = dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
               num_attention_heads=2)


@dataclass
class Family:
    """A model opened by the project, the library's tokens and what the input must come out as."""

    checkpoint: Checkpoint
    prefix: int  # the library's own count of tokens before the patches
    grid: tuple[int, int]  # the library's own patch grid at ``size``
    layers: Callable[[torch.Tensor], list[torch.Tensor]]  # x (1, C, H, W) -> each layer's (N, D) after the norm
    size: InputSize = WIDE


def photo(seed: int, size: tuple[int, int] = (96, 64)) -> Image.Image:
    rng = np.random.default_rng(seed)
    array = rng.integers(0, 60, (size[1], size[0], 3), dtype=np.uint8)
    array[size[1] // 4: 3 * size[1] // 4, size[0] // 3: 2 * size[0] // 3] += np.uint8(150)
    return Image.fromarray(array)


def hooked(blocks, run, norm) -> list[torch.Tensor]:
    """Each of ``blocks``' outputs during ``run()`` (first item of a batch of one), after ``norm``."""
    seen = []
    handles = [b.register_forward_hook(lambda m, i, o: seen.append(o[0] if isinstance(o, tuple) else o))
               for b in blocks]
    try:
        with torch.no_grad():
            run()
            return [norm(s)[0] for s in seen]
    finally:
        for handle in handles:
            handle.remove()


def hf_states(model, norm, prefix: int, **kwargs) -> Callable[[torch.Tensor], list[torch.Tensor]]:
    def layers(x):
        with torch.no_grad():
            states = model(pixel_values=x, output_hidden_states=True, **kwargs).hidden_states[1:]
            return [norm(s)[0].flatten(0, -2)[prefix:] for s in states]  # SAM's are (B, H, W, D)
    return layers


def transformers_family(tmp_path, name: str, config_name: str, norm: str, prefix: int, grid=(4, 6),
                        size=WIDE, **options) -> Family:
    transformers = pytest.importorskip("transformers")
    config = getattr(transformers, config_name)(**options)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = randomize(getattr(transformers, name)(config))
    model.save_pretrained(tmp_path)
    kwargs = {} if name.startswith(("Dinov2", "DINOv3", "Sam")) else dict(interpolate_pos_encoding=True)
    if name == "ViTMAEModel":  # noise in patch order: argsort keeps it, and no patch is masked (mask_ratio 0)
        kwargs["noise"] = torch.arange(grid[0] * grid[1], dtype=torch.float32)[None]
    module = getattr(model, "vision_model", model)
    return Family(vit.load(tmp_path, device="cpu"), prefix, grid,
                  hf_states(module, getattr(module, norm) if norm else torch.nn.Identity(), prefix, **kwargs), size)


def timm_family(tmp_path, name: str, prefix: int, **options) -> Family:
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = randomize(timm.create_model(name, pretrained=False, img_size=32, patch_size=8, embed_dim=32, depth=2,
                                        num_heads=2, num_classes=0, dynamic_img_size=True, **options))
    timm.models.save_for_hf(model, tmp_path, model_args=dict(num_heads=2, img_size=32), safe_serialization=True)
    return Family(vit.load(tmp_path, device="cpu"), prefix, (4, 6),
                  lambda x: [t[prefix:] for t in hooked(model.blocks, lambda: model(x), model.norm)])


def open_clip_family(tmp_path) -> Family:
    """open_clip's positions do not follow the input: the reference is open_clip's own model built at the 32 x 48
    input, its positions resized by open_clip's ``resize_pos_embed`` (without antialias, as transformers)."""
    open_clip = pytest.importorskip("open_clip")
    from safetensors.torch import save_file

    vision = dict(image_size=32, patch_size=8, width=32, layers=2, head_width=16)
    text = dict(context_length=8, vocab_size=64, width=16, heads=1, layers=1)
    torch.manual_seed(0)
    model = randomize(open_clip.model.CLIP(embed_dim=16, vision_cfg=vision, text_cfg=text))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, tmp_path / "open_clip_model.safetensors")
    (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": dict(
        embed_dim=16, vision_cfg=vision, text_cfg=text), "preprocess_cfg": {
        "mean": list(open_clip.OPENAI_DATASET_MEAN), "std": list(open_clip.OPENAI_DATASET_STD)}}))
    wide = open_clip.model.CLIP(embed_dim=16, vision_cfg={**vision, "image_size": (32, 48)}, text_cfg=text).eval()
    state = model.state_dict()
    open_clip.model.resize_pos_embed(state, wide, antialias=False)
    wide.load_state_dict(state)
    visual = wide.visual
    return Family(vit.load(tmp_path, device="cpu"), 1, (4, 6),
                  lambda x: [t[1:] for t in hooked(visual.transformer.resblocks, lambda: visual(x), visual.ln_post)])


def vit_pytorch_family(tmp_path) -> Family:
    """Rectangular patches (2 x 8 px) on a 16 x 64 input: its own size, so the photo is stretched to it."""
    vit_pytorch = pytest.importorskip("vit_pytorch")
    arguments = dict(image_size=(16, 64), patch_size=(2, 8), num_classes=10, dim=32, depth=2, heads=2, mlp_dim=48)
    torch.manual_seed(0)
    model = randomize(vit_pytorch.ViT(**arguments))
    torch.save(model.state_dict(), tmp_path / "vit.pt")
    (tmp_path / "config.json").write_text(json.dumps(arguments))
    blocks = [ff for _, ff in model.transformer.layers]

    def layers(x):  # vit-pytorch adds each feed-forward's residual outside the module: input + output
        seen = []
        handles = [b.register_forward_hook(lambda m, i, o: seen.append(i[0] + o)) for b in blocks]
        try:
            with torch.no_grad():
                model(x)
                return [model.transformer.norm(s)[0, 1:] for s in seen]
        finally:
            for handle in handles:
                handle.remove()

    return Family(vit.load(tmp_path / "vit.pt", device="cpu"), 1, (8, 8), layers, TRAINING_SIZE)


def siglip2_naflex_family(tmp_path) -> Family:
    """SigLIP 2 NaFlex: the 96 x 64 photo on its own 3 x 5 grid (16 patches of 8 px at its aspect, no crop), HF's
    tokens from its patch rows of our pixels (which equal transformers' own: test_siglip2_naflex_parity)."""
    transformers = pytest.importorskip("transformers")
    from test_siglip2_naflex_parity import VISION

    config = transformers.Siglip2VisionConfig(**VISION)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = randomize(transformers.Siglip2VisionModel(config)).eval()
    model.save_pretrained(tmp_path)
    transformers.Siglip2ImageProcessorPil(patch_size=8, max_num_patches=16).save_pretrained(tmp_path)
    return Family(vit.load(tmp_path, device="cpu"), 0, (3, 5), lambda x: siglip2_naflex_layers(model, x),
                  TRAINING_SIZE)


def siglip2_naflex_layers(model, x: torch.Tensor) -> list[torch.Tensor]:
    """HF Siglip2VisionModel's hidden states after its post_layernorm, each ``(gh*gw, D)``, for our ``x`` (1, C, H, W)
    as its unpadded patch rows."""
    from test_siglip2_naflex_parity import as_patches

    _, _, H, W = x.shape
    patches = as_patches(x[0], 8)[None]  # (1, gh*gw, 8*8*C)
    with torch.no_grad():
        states = model(pixel_values=patches, pixel_attention_mask=torch.ones(patches.shape[:2], dtype=torch.long),
                       spatial_shapes=torch.tensor([[H // 8, W // 8]]), output_hidden_states=True).hidden_states[1:]
        return [model.post_layernorm(s)[0] for s in states]


def preset_family(tmp_path, preset: str, **overrides) -> Family:
    """Our own model: its hook points are the reference (the block outputs), its ``norm`` the final norm."""
    torch.manual_seed(0)
    config = ViTConfig.from_preset(preset, **overrides)
    model = ViT(config).eval()
    path = tmp_path / "ours.pt"
    save_checkpoint(path, model, [str(i) for i in range(config.num_classes)], Preprocessing.default_for(config))
    prefix = model.num_prefix_tokens
    names = [f"blocks.{i}.hook_resid_post" for i in range(config.num_layers)]

    def layers(x):
        with torch.no_grad():
            _, cache = model.run_with_cache(x, names)
            return [model.norm(cache[n])[0, prefix:] for n in names]

    return Family(vit.load(path, device="cpu"), prefix, (8, 12), layers)


FAMILIES: dict[str, Callable] = {
    "HF ViT": lambda p: transformers_family(p, "ViTModel", "ViTConfig", "layernorm", 1, **HF_TINY),
    "HF DeiT (distillation token)": lambda p: transformers_family(p, "DeiTModel", "DeiTConfig", "layernorm", 2,
                                                                  **HF_TINY),
    "HF DINOv2 with registers": lambda p: transformers_family(
        p, "Dinov2WithRegistersModel", "Dinov2WithRegistersConfig", "layernorm", 5, num_register_tokens=4,
        **HF_TINY),
    "HF DINOv3 (storage tokens, RoPE)": lambda p: transformers_family(
        p, "DINOv3ViTModel", "DINOv3ViTConfig", "norm", 5, num_register_tokens=4, layerscale_value=0.5, **HF_TINY),
    "HF SigLIP (no CLS)": lambda p: transformers_family(p, "SiglipVisionModel", "SiglipVisionConfig",
                                                        "post_layernorm", 0, **HF_TINY),
    "HF SigLIP 2 NaFlex (its own 3 x 5 grid)": siglip2_naflex_family,
    "HF MAE": lambda p: transformers_family(p, "ViTMAEModel", "ViTMAEConfig", "layernorm", 1, mask_ratio=0.0,
                                            **HF_TINY),
    "HF BEiT": lambda p: transformers_family(p, "BeitModel", "BeitConfig", "layernorm", 1,
                                             use_relative_position_bias=True, use_mean_pooling=False,
                                             layer_scale_init_value=0.1, **HF_TINY),
    # SAM's absolute positions are fixed in transformers: its own 56 px square, the photo padded to it as
    # SamImageProcessor pads (its longer side 56 px).
    "HF SAM (windows, no CLS)": lambda p: transformers_family(
        p, "SamVisionModel", "SamVisionConfig", None, 0, (7, 7), TRAINING_SIZE, image_size=56, patch_size=8,
        hidden_size=32, mlp_dim=48, num_hidden_layers=3, num_attention_heads=2, window_size=3,
        global_attn_indexes=[1], output_channels=8),
    "timm EVA-02 (RoPE)": lambda p: timm_family(p, "eva02_tiny_patch14_224", 1),
    "timm DINOv3": lambda p: timm_family(p, "vit_small_patch16_dinov3_qkvb", 5),
    "open_clip CLIP": open_clip_family,
    "vit-pytorch (2 x 8 px patches)": vit_pytorch_family,
    "ours (tintn-cifar10)": lambda p: preset_family(p, "tintn-cifar10"),
    "ours (registers)": lambda p: preset_family(p, "cifar-s", num_register_tokens=4, num_layers=2),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory) -> Family:
    if "timm" in request.param:
        timm = pytest.importorskip("timm")
        timm.layers.set_fused_attn(False)  # the explicit attention path, as our model's
        try:
            return FAMILIES[request.param](tmp_path_factory.mktemp("family"))
        finally:
            timm.layers.set_fused_attn(True)
    return FAMILIES[request.param](tmp_path_factory.mktemp("family"))


def library_layers(family: Family, image: Image.Image) -> list[torch.Tensor]:
    c = family.checkpoint
    x = preprocess([image], c.preprocessing, family.size, c.model.config.patch_size)
    return family.layers(x)


def test_the_maps_take_the_models_own_grid_and_leave_its_prefix_tokens_out(family):
    c, image = family.checkpoint, photo(0)
    assert c.model.num_prefix_tokens == family.prefix
    tokens = library_layers(family, image)
    assert tokens[-1].shape[0] == family.grid[0] * family.grid[1]
    assert vit.pca(c, image, size=family.size).map.shape == (*family.grid, 3)
    first = vit.similarity(c, image, query=family.prefix, size=family.size)  # the top-left patch
    assert first.map.shape == family.grid and first.map[0, 0] == pytest.approx(1.0, abs=1e-5)
    matches = vit.correspondences(c, image, c, photo(1), size=family.size)
    assert matches.grid_a == matches.grid_b == family.grid
    assert matches.matches.max() < family.grid[0] * family.grid[1]


def test_the_similarity_at_every_layer_is_the_cosine_of_the_librarys_patch_tokens(family):
    c, image = family.checkpoint, photo(2)
    query = family.grid[1] + 1  # row 1, column 1
    for layer, tokens in enumerate(library_layers(family, image)):
        ours = vit.similarity(c, image, query=family.prefix + query, layer=layer, size=family.size)
        expected = F.cosine_similarity(tokens, tokens[query][None], dim=-1).reshape(family.grid)
        np.testing.assert_allclose(ours.map, expected.numpy(), atol=ATOL, err_msg=f"layer {layer}")


def test_pca_and_correspondences_are_those_of_the_librarys_patch_tokens(family):
    c, a, b = family.checkpoint, photo(3), photo(4)
    tokens_a, tokens_b = library_layers(family, a)[-1], library_layers(family, b)[-1]
    colours, _ = dense.pca_images([tokens_a])
    ours = vit.pca(c, a, size=family.size).map
    np.testing.assert_allclose(ours, colours[0].reshape(*family.grid, 3).numpy(), atol=ATOL)
    similar = F.normalize(tokens_a, dim=-1) @ F.normalize(tokens_b, dim=-1).T  # (N_a, N_b)
    forward, backward = similar.argmax(dim=1), similar.argmax(dim=0)
    mutual = [(i, int(forward[i])) for i in range(len(forward)) if backward[forward[i]] == i]
    assert mutual  # at least the best pair of all is mutual
    matches = vit.correspondences(c, a, c, b, top=None, size=family.size)
    assert sorted(map(tuple, matches.matches.tolist())) == mutual
    np.testing.assert_allclose(np.sort(matches.scores), np.sort([float(similar[i, j]) for i, j in mutual]),
                               atol=ATOL)


def test_naflex_correspondences_pair_two_aspects_on_their_own_grids():
    """Two photos of different aspect ratios come out on different grids (3 x 5 and 5 x 3); the matches are the
    mutual nearest neighbours of HF's own tokens of each, and each point lies in its own photo."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        family = siglip2_naflex_family(Path(folder))
        c, a, b = family.checkpoint, photo(3), photo(4, (48, 96))
        tokens_a, tokens_b = library_layers(family, a)[-1], library_layers(family, b)[-1]
        matches = vit.correspondences(c, a, c, b, top=None)
    assert matches.grid_a == (3, 5) and matches.grid_b == (5, 3)
    assert tokens_a.shape[0] == 15 and tokens_b.shape[0] == 15
    similar = F.normalize(tokens_a, dim=-1) @ F.normalize(tokens_b, dim=-1).T  # (15, 15)
    forward, backward = similar.argmax(dim=1), similar.argmax(dim=0)
    mutual = [(i, int(forward[i])) for i in range(len(forward)) if backward[forward[i]] == i]
    assert mutual and sorted(map(tuple, matches.matches.tolist())) == mutual
    np.testing.assert_allclose(np.sort(matches.scores), np.sort([float(similar[i, j]) for i, j in mutual]), atol=ATOL)
    assert (matches.points_a < [96, 64]).all() and (matches.points_b < [48, 96]).all()
    for j, (i_a, i_b) in enumerate(matches.matches):  # the patch centres on each photo's own grid
        np.testing.assert_allclose(matches.points_a[j], [(i_a % 5 + 0.5) * 96 / 5, (i_a // 5 + 0.5) * 64 / 3])
        np.testing.assert_allclose(matches.points_b[j], [(i_b % 3 + 0.5) * 48 / 3, (i_b // 3 + 0.5) * 96 / 5])
