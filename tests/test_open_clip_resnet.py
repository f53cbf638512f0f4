"""open_clip's ResNet towers (RN50 ...) open from their folder as open_clip builds them
(``vit.sources.library_road.open_clip_towers``, issue 117): their attention-pooling head is one layer, the mean token
first, then the last feature map's cells row-major.

Reference: the head's own attention computed from its own ``q_proj`` / ``k_proj`` on the tokens its forward makes
(``open_clip.modified_resnet.AttentionPool2d.forward``'s first lines, read at its input by a hook), ``softmax(q k^T /
sqrt(d))`` a head; the map placed as its ``reshape(N, C, H*W)`` orders the cells, a transposed grid failing."""

import importlib

import open_clip
import torch
from PIL import Image
from safetensors.torch import save_file

import vit
from vit.core.inference import preprocess

TEXT = dict(context_length=8, vocab_size=64, width=32, heads=1, layers=1)


def _folder(tmp_path):
    torch.manual_seed(0)
    model_cfg = dict(embed_dim=16, vision_cfg=dict(layers=[1, 1, 1, 1], width=16, head_width=8, image_size=96),
                     text_cfg=TEXT)
    model = open_clip.model.CLIP(**model_cfg).eval()
    with torch.no_grad():  # weights far from the small init, so that every row is its own
        for parameter in model.visual.attnpool.parameters():
            parameter.normal_(0, 0.3)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, tmp_path / "open_clip_model.safetensors")
    model.visual.image_mean, model.visual.image_std = open_clip.OPENAI_DATASET_MEAN, open_clip.OPENAI_DATASET_STD
    hub = importlib.import_module("open_clip.push_to_hf_hub")
    hub.save_config_for_hf(model, tmp_path / "open_clip_config.json", model_config=model_cfg)
    return model


def _own_attention(pool, feature_map):
    """(1, H, 1 + side**2, 1 + side**2): the head's attention from its own projections, its tokens as it makes them."""
    x = feature_map.reshape(*feature_map.shape[:2], -1).permute(2, 0, 1)  # (HW, 1, C)
    x = torch.cat([x.mean(dim=0, keepdim=True), x], dim=0) + pool.positional_embedding[:, None, :]
    q, k = pool.q_proj(x[:, 0]), pool.k_proj(x[:, 0])  # (T, C)
    heads = pool.num_heads
    q, k = (t.view(t.shape[0], heads, -1).transpose(0, 1) for t in (q, k))  # (H, T, d)
    return (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).softmax(-1)[None]


def test_an_open_clip_resnet_folder_records_its_pooling_heads_own_attention_placed_row_major(tmp_path):
    model = _folder(tmp_path)
    checkpoint = vit.load(tmp_path, device="cpu")
    wrapped = checkpoint.model
    assert checkpoint.road == "library" and wrapped.num_layers == 1 and wrapped.layout.grid == (3, 3)
    image = Image.fromarray((torch.rand(96, 96, 3, generator=torch.Generator().manual_seed(4)) * 255).byte().numpy())
    pixels = preprocess([image], checkpoint.preprocessing)
    seen = []
    handle = model.visual.attnpool.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    try:
        with torch.no_grad():
            model.visual(pixels)
            own = _own_attention(model.visual.attnpool, seen[0])
    finally:
        handle.remove()
    _, recorded = wrapped.run(pixels, layers=[0])
    torch.testing.assert_close(recorded[0], own, atol=1e-5, rtol=0)
    explanation = vit.explain(checkpoint, image, "attention", layer=0, head=1, query=0)
    row = own[0, 1, 0, 1:]  # the mean token's row over the 3x3 cells
    torch.testing.assert_close(torch.from_numpy(explanation.map), row.reshape(3, 3), atol=1e-6, rtol=0)
    assert not torch.allclose(torch.from_numpy(explanation.map), row.reshape(3, 3).T, atol=1e-6, rtol=0)
