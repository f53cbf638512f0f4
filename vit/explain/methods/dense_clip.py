"""Training-free dense text maps of a CLIP: every patch token read in the joint image-text embedding after the last
block(s) are changed without training, and its similarity with each typed label is the map.

Each change is an ``AttentionVariant`` the one block forward computes (``vit.model.blocks``), so these maps walk the
same modules, hook points and weights as every other map; each equals its authors' segmentor output before its
post-processing (bilinear upsampling, the softmax over labels, PAMR, argmax):

- SCLIP (wangf3014/SCLIP ``clip/model.py`` ``custom_attn(csa=True)``, ``CLIPForSegmentation.forward_feature``): the
  last block's attention is ``softmax(q qᵀ) + softmax(k kᵀ)`` (correlative self-attention), its residual and MLP kept;
- NACLIP (sinahmr/NACLIP ``clip/model.py``, arch ``reduced``, attention ``naclip``, ``gaussian_std=5``): the last
  block's attention is ``softmax(k kᵀ + a Gaussian of the patches' distance on the grid)``, and that attention is the
  block's whole output (no residual, no MLP);
- ClearCLIP (mc-lan/ClearCLIP's open_clip ``VisionTransformer.forward``, ``custom_attn(model_type="ClearCLIP")``
  with ``ignore_residual``): the last block's output is its attention ``softmax(q qᵀ)`` alone (no residual, no MLP);
- CLIP Surgery (xmed-lab/CLIP_Surgery ``clip/clip_surgery_model.py``, ``clip_feature_surgery``): beside the model's
  own forward a second path starts at the input of the last six blocks and adds each one's ``softmax(v vᵀ)``
  attention of the model's own stream (no MLP); its CLS token is the model's; then feature surgery: each
  token-label product minus its mean over the labels, weighted by the labels' softmax at CLS (``2 cos``), or for one
  label the label's embedding minus the empty text's (the authors' single-text case);
- MaskCLIP (chongzhou96/MaskCLIP's mmseg fork, ``VisionTransformer`` with ``return_qkv`` and ``MaskClipHead``,
  ``vit=True``): the last block's attention skipped, each token's value embedding through the attention's output
  projection, its residual and MLP kept (``v += x; v = ffn(norm2(v), identity=v)``).

Then each token goes through the final norm and the projection (``ln_post @ proj``), is L2-normalised and compared
with each label's normalised text embedding. The maps are ``(gh, gw)`` cosines (surgery: surgery-weighted), on the
patch grid. They need a tower that maps each token to the joint embedding (a CLIP: a projection after CLS or
average pooling); a SigLIP pools through an attention head, so its tokens have no such reading, and a windowed or
staged model has no global last block to change.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

from vit import registry
from vit.model import AttentionVariant, ViT

# The maps by key, as the app and the .npz files name them; the order is the menu's.
METHODS = {m.name: m.title for m in registry.BUILTIN_METHODS if m.module == __name__}  # the registry's, its order
NACLIP_STD = 5.0  # NACLIP's gaussian_std default, in patches
VARIANTS = {  # each method's last block
    "sclip": AttentionVariant(("qq", "kk")),
    "naclip": AttentionVariant(("kk",), NACLIP_STD, residual=False, mlp=False),
    "clearclip": AttentionVariant(("qq",), residual=False, mlp=False),
    "maskclip": AttentionVariant(()),  # no q-k attention: each token's own value, the residual and the MLP
}
SURGERY_BRANCH = AttentionVariant(("vv",), residual=False, mlp=False)  # what each surgery block adds to its path
SURGERY_BLOCKS = 6  # "apply architecture surgery on the last 6 blocks"
SURGERY_TEMPERATURE = 2.0  # clip_feature_surgery's ``(prob * 2).softmax(-1)``


class DenseMapError(ValueError):
    """A model or labels a dense text map is not defined for; the message says why and what to use."""


def refusal(model: ViT, method: str) -> str | None:
    """Why ``method`` (a key of ``METHODS``) is not defined for ``model``, in one line; None where it is."""
    if method not in METHODS:
        return f"unknown dense text map {method!r}; choose one of {', '.join(METHODS)}"
    c, name = model.config, METHODS[method]
    if model.projection is None or c.pooling not in ("cls", "avg"):
        return (f"{name} reads every token in the joint image-text embedding through the tower's projection, which "
                "this model does not have (a SigLIP pools its tokens through an attention head)")
    if c.stage_depths or c.window_size or c.rel_pos != "none" or c.attention != "dot":
        return f"{name} changes a global attention layer; this model's last layers attend in windows or stages"
    if method == "clipsurgery" and not c.class_token:
        return f"{name} weighs the labels by the CLS token's similarity; this model has no CLS token"
    if method == "clipsurgery" and len(model.blocks) < SURGERY_BLOCKS:
        return f"{name} changes the last {SURGERY_BLOCKS} blocks; this model has {len(model.blocks)}"
    return None


def check(model: ViT, method: str) -> None:
    """``DenseMapError`` (one line) where ``method`` is not defined for ``model``."""
    why = refusal(model, method)
    if why is not None:
        raise DenseMapError(why)


def dense_features(model: ViT, images: Tensor, method: str) -> Tensor:
    """``images`` (B, C, H, W) -> every token in the joint embedding, ``(B, T, E)`` unnormalised: the final norm and
    the projection of the last block's output with ``method``'s change (the authors' ``encode_image(...,
    return_all=True)``; CLIP Surgery: of its second path, CLS from the model's own)."""
    check(model, method)
    grid = model.patch_grid(images.shape[2], images.shape[3])
    with torch.no_grad():
        x = model.embed(images)  # (B, T, D)
        if method == "clipsurgery":
            first = len(model.blocks) - SURGERY_BLOCKS
            x, _ = model.run_blocks(x, grid, 0, first)
            path = x  # the second path starts from the first changed block's input
            for i in range(first, len(model.blocks)):
                with qkv_once(model.blocks[i].attn):  # both paths read the same q, k, v of the model's stream
                    branch, _ = model.run_blocks(x, grid, i, i + 1, variant=SURGERY_BRANCH)  # from the model's stream
                    path = path + branch
                    x, _ = model.run_blocks(x, grid, i, i + 1)
            tokens = torch.cat([x[:, :1], path[:, 1:]], dim=1)  # x[0, :, :] = x_ori[0, :, :]
        else:
            tokens, _ = model.run_blocks(x, grid, variant=VARIANTS[method])
        return model.projection(model.norm(tokens))  # (B, T, E)


@contextlib.contextmanager
def qkv_once(attention):
    """Within it, ``attention``'s q, k, v are computed once for an input equal to the one before (CLIP Surgery's
    branch and the model's own block read the same normalised stream: its authors' ``Attention`` forms q, k, v once
    for both paths, and forming them twice here cost 8 % over their CPU time). The block's forward is not touched:
    its projection is what is kept, its hooks still see each path's q, k, v."""
    compute, last = attention.queries_keys_values, []

    def once(x: Tensor, rope=None):
        if last and last[0][1] is rope and last[0][0].shape == x.shape and torch.equal(last[0][0], x):
            return last[0][2]  # the same normalised stream (its norm formed again, bit for bit)
        last[:] = [(x, rope, compute(x, rope))]
        return last[0][2]

    attention.queries_keys_values = once
    try:
        yield
    finally:
        del attention.queries_keys_values  # the class's method again


def feature_surgery(features: Tensor, texts: Tensor, blank: Tensor | None = None) -> Tensor:
    """CLIP Surgery's ``clip_feature_surgery``: normalised tokens ``features`` (B, T, E) and labels ``texts`` (n, E)
    -> ``(B, T, n)``. With ``blank`` (E,), the empty text's embedding, ``features · (text - blank)``; else each
    token-label product weighted by ``w`` (the labels' softmax of ``2 cos`` at CLS, over its mean) minus its mean over
    the labels, summed over channels: ``w_j cos_tj - mean_i(w_i cos_ti)``, the authors' sum in ``O(T n)`` memory
    rather than their ``(T, n, E)`` products."""
    if blank is not None:
        return features @ (texts - blank).T
    if texts.shape[0] < 2:
        raise DenseMapError("CLIP Surgery's feature surgery takes each label against the others: ask two labels or "
                            "more, or give the empty text's embedding for one")
    cosines = features @ texts.T  # (B, T, n)
    prob = (SURGERY_TEMPERATURE * cosines[:, :1]).softmax(dim=-1)  # (B, 1, n): the labels at CLS
    weighted = cosines * (prob / prob.mean(dim=-1, keepdim=True))  # (B, T, n)
    return weighted - weighted.mean(dim=-1, keepdim=True)


def dense_text_maps(model: ViT, images: Tensor, texts: Tensor, method: str, blank: Tensor | None = None) -> Tensor:
    """``(B, n, gh, gw)``: each label's map of each image by ``method`` (a key of ``METHODS``); ``texts`` (n, E) the
    labels' L2-normalised text embeddings, ``blank`` (E,) the empty text's (CLIP Surgery with one label)."""
    check(model, method)
    width = model.config.projection_dim
    if texts.dim() != 2 or texts.shape[1] != width:
        raise DenseMapError(f"text embeddings of shape {tuple(texts.shape)} do not fit this image tower's {width}-d "
                            "embedding: the text side belongs to another model")
    features = dense_features(model, images, method)  # (B, T, E)
    features = features / features.norm(dim=-1, keepdim=True)
    texts = texts.to(features)
    if method == "clipsurgery":
        similarity = feature_surgery(features, texts, None if blank is None else blank.to(features))  # (B, T, n)
    else:
        similarity = features @ texts.T  # (B, T, n)
    grid = model.patch_grid(images.shape[2], images.shape[3])
    patches = similarity[:, model.num_prefix_tokens:]  # (B, gh*gw, n)
    return patches.transpose(1, 2).reshape(images.shape[0], texts.shape[0], *grid)
