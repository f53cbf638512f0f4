"""Class-specific maps that need the model, not only its attentions: LeGrad, Chefer's LRP, AttnLRP.

Every method runs the model's own forward (``vit/model/``, written once) and reads what it needs at its hook
points, or under relevance rules: AttnLRP and CP-LRP make their ``Rules`` current for a ``with`` block (the
approach of lxt), so that the model's elementary operations — each LayerNorm and RMSNorm, the MLP activation, SwiGLU's
product, the two attention matmuls (of every layer and of SigLIP's pooling probe) and a prompt head's L2
norm — carry their rule while the forward computes its own values. Every other operation of every family is
linear (rotary positions, layer scale, pooling by CLS or mean, the distillation head's mean, the
projections) and takes the epsilon rule, which in the gradient x input framework is the plain gradient. That is
lxt's own treatment of rotary positions: its qwen2 and llama maps leave ``apply_rotary_pos_emb`` unpatched, and its
attention wrapper divides the gradient of the already rotated q and k, which is where ``Rules.attention_inputs``
receives them here (checked on Qwen2.5-VL's and Qwen3-VL's 2D RoPE in ``tests/test_vlm_attnlrp_lxt.py``).

Shapes: images ``(B, C, H, W)``; ``T = prefix + gh * gw`` tokens, patches row-major after the
prefix tokens. References (ported, and checked against in ``tests/test_relevance.py``):

- LeGrad: Bousselham et al. 2024, WalBouss/LeGrad ``legrad/wrapper.py`` (``compute_legrad_clip``).
- Transformer attribution: Chefer, Gur & Wolf 2021a, hila-chefer/Transformer-Explainability
  ``baselines/ViT/ViT_LRP.py`` + ``modules/layers_ours.py`` (``method="transformer_attribution"``).
- AttnLRP: Achtibat et al. 2024, rachtibat/LRP-eXplains-Transformers ``lxt/efficient``
  (identity rule on GELU and on LayerNorm's and RMSNorm's scaling, uniform rule on the attention matmuls and on
  SwiGLU's product, epsilon rule = plain gradient elsewhere; ``cp=True`` gives their ViT default, CP-LRP,
  which treats the attention weights and SwiGLU's gate as constants).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from vit.explain.methods.attention import gradient_rollout, layers_up_to
from vit.explain.methods.chunked import CHUNK_BYTES, context_gradient_chunks, run_block
from vit.model import LayerLayout, Rules, ViT, activate, checkpointed_blocks, use_rules

# Options Chefer et al.'s LRP defines no rule for (their ViT reads CLS through one norm and one head, with plain
# GELU MLPs and learned positions only).
_LRP_DEFAULTS = {"layer_scale": None, "pooling": "cls", "fc_norm": False, "distillation_head": False,
                 "rope": "none", "gated_mlp": False, "mlp_norm": False, "norm": "layer", "embed_norm": False,
                 "qk_norm": False, "attention": "dot"}  # attention: locality self-attention has no rule of theirs


def lrp_rule_missing(config) -> str | None:
    """The first option of ``config`` (a ``ViTConfig``) that Chefer et al.'s LRP has no rule for, as
    ``name=value``; None where every one is the plain ViT's."""
    for name, default in _LRP_DEFAULTS.items():
        if getattr(config, name) != default:
            return f"{name}={getattr(config, name)!r}"
    return None


class UnsupportedModelError(ValueError):
    """The model has an option that relevance propagation does not reproduce yet."""


def check_supported(model: torch.nn.Module) -> None:
    """Raise ``UnsupportedModelError`` unless ``model`` is a ``ViT`` in eval mode with a classifier."""
    if not isinstance(model, ViT):
        raise UnsupportedModelError(f"relevance maps need this project's ViT, got {type(model).__name__}")
    if model.training:
        raise UnsupportedModelError("the model is in training mode (dropout makes maps random); call model.eval()")
    if getattr(model, "head", None) is None:
        raise UnsupportedModelError("the model has no classifier head, so there is no class to explain")


def check_one_grid(model: ViT, what: str, why: str) -> None:
    """``UnsupportedModelError`` for a model with stages (Swin, Hiera), whose layers' grids change at each merge,
    where ``what`` needs one grid (``why``); AttnLRP's rules run through the merges and apply."""
    if getattr(model.config, "stage_depths", ()):
        raise UnsupportedModelError(f"{what} {why}, and this model's stages (Swin, Hiera) change the grid at each "
                                    "patch merging or query pooling; use AttnLRP")


# --- AttnLRP's rules ------------------------------------------------------------------------------

class _IdentityRule(torch.autograd.Function):
    """AttnLRP's identity rule for an element-wise function in the gradient x input framework:
    the backward passes ``grad * f(x) / x``, so relevance ``x * grad`` flows through unchanged."""

    @staticmethod
    def forward(ctx, x: Tensor, fn) -> Tensor:
        y = fn(x)
        ctx.save_for_backward(y / (x + 1e-10))  # lxt's epsilon
        return y

    @staticmethod
    def backward(ctx, grad: Tensor):
        (ratio,) = ctx.saved_tensors
        return ratio * grad, None


class _DivideGradient(torch.autograd.Function):
    """AttnLRP's uniform rule: identity forward, the gradient (relevance) divided by ``factor`` backward."""

    @staticmethod
    def forward(ctx, x: Tensor, factor: float) -> Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad / ctx.factor, None


def identity_rule(x: Tensor, fn) -> Tensor:
    """``fn(x)`` (element-wise) under AttnLRP's identity rule: relevance passes through unchanged (lxt's
    ``identity_rule_implicit``), for an activation outside this project's model (a library module's)."""
    return _IdentityRule.apply(x, fn)


def divide_gradient(x: Tensor, factor: float) -> Tensor:
    """``x`` unchanged, its gradient divided by ``factor`` (lxt's ``divide_gradient``: the uniform rule)."""
    return _DivideGradient.apply(x, factor)


class AttnLRPRules(Rules):
    """lxt's efficient AttnLRP (``cp=False``) or CP-LRP (``cp=True``) as the model's elementary operations."""

    def __init__(self, cp: bool = False) -> None:
        self.cp = cp

    def layer_norm(self, x: Tensor, norm: torch.nn.LayerNorm) -> Tensor:
        """LayerNorm with its scale (1 / std) held constant for the backward pass: the identity rule."""
        mean = x.mean(dim=-1, keepdim=True)
        std = ((x - mean) ** 2).mean(dim=-1, keepdim=True).add(norm.eps).sqrt()
        return (x - mean) / std.detach() * norm.weight + norm.bias

    def rms_norm(self, x: Tensor, norm: torch.nn.RMSNorm) -> Tensor:
        """RMSNorm with its scale (1 / rms) held constant for the backward pass: lxt's ``rms_norm_forward``."""
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + norm.eps).detach() * norm.weight

    def activation(self, x: Tensor, name: str) -> Tensor:
        return _IdentityRule.apply(x, functools.partial(activate, name=name))

    def product(self, a: Tensor, b: Tensor) -> Tensor:
        if self.cp:  # lxt's cp_gated_mlp_forward: no relevance through the gate, all of it to the linear branch
            return a.detach() * b
        return _DivideGradient.apply(a * b, 2.0)  # lxt's gated_mlp_forward: the uniform rule, half to each factor

    def attention_inputs(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if self.cp:  # CP-LRP: no relevance through the attention weights
            return q.detach(), k.detach(), v
        # The uniform rule on both matmuls: q and k get 1/2 of the scores' 1/2, v 1/2 of the output's.
        return _DivideGradient.apply(q, 4.0), _DivideGradient.apply(k, 4.0), _DivideGradient.apply(v, 2.0)

    def divide_by_norm(self, x: Tensor, norm: Tensor) -> Tensor:
        return x / norm.detach()  # a prompt head's cosine: its norm held constant, as LayerNorm's scale

    def logit_bias(self, bias: Tensor) -> Tensor:
        # CP-LRP holds the attention weights constant (lxt stops q and k, "directly connected to the softmax"); SAM's
        # relative positions are the queries' second way in. BEiT's table is a constant of the input either way.
        return bias.detach() if self.cp else bias


def _class_indices(logits: Tensor, class_index: int | Tensor | None) -> Tensor:
    """One class per image: the predicted one (None), one for all, or a ``(B,)`` tensor; checked."""
    B, num_classes = logits.shape
    if class_index is None:
        return logits.argmax(dim=-1)
    index = torch.as_tensor(class_index, device=logits.device).long()
    if index.dim() == 0:
        index = index.expand(B)
    if index.shape != (B,):
        raise ValueError(f"class_index must be one class or one per image ({B}), got shape {tuple(index.shape)}")
    if bool(((index < 0) | (index >= num_classes)).any()):
        raise ValueError(f"class_index {index.tolist()} is out of range for {num_classes} classes")
    return index


def _grad_context():
    # Relevance needs autograd even when the caller (the app, a CLI) runs under inference_mode.
    return torch.inference_mode(False), torch.enable_grad()


def _leaf(images: Tensor) -> Tensor:
    return images.detach().clone().requires_grad_(True)


def _patch_map(token_values: Tensor, grid: tuple[int, int], num_prefix_tokens: int) -> Tensor:
    """``(B, T)`` per-token values -> ``(B, gh, gw)`` over the patches (prefix tokens dropped)."""
    return token_values[:, num_prefix_tokens:].reshape(token_values.shape[0], grid[0], grid[1])


# --- LeGrad -------------------------------------------------------------------------------------

def legrad_from_gradients(gradients: list[Tensor], grid: tuple[int, int], num_prefix_tokens: int = 1) -> Tensor:
    """LeGrad's aggregation: per layer ``relu(dS_l/dA_l)`` averaged over heads and queries, summed over layers.

    ``gradients[l]`` is ``(B, H, T, T)``, the gradient of the class score read at layer ``l``
    with respect to layer ``l``'s attention. Returns ``(B, gh, gw)`` over the patch keys,
    not normalised (LeGrad min-max normalises for display; the overlay does that).
    """
    if not gradients:
        raise ValueError("no layers given to LeGrad")
    total = None
    for grad in gradients:
        if grad.dim() != 4:
            raise ValueError(f"expected gradients of shape (batch, heads, tokens, tokens), got {tuple(grad.shape)}")
        relevance = grad.clamp(min=0).mean(dim=1).mean(dim=1)  # (B, T): heads, then queries (CLS included)
        total = relevance if total is None else total + relevance
    if total.shape[-1] != num_prefix_tokens + grid[0] * grid[1]:
        raise ValueError(f"{total.shape[-1]} tokens do not fit a {grid[0]}x{grid[1]} grid with "
                         f"{num_prefix_tokens} prefix token(s)")
    return _patch_map(total, grid, num_prefix_tokens)


def window_keys_on_tokens(keys: Tensor, layout: LayerLayout, num_prefix_tokens: int = 0) -> Tensor:
    """Per-window key values ``(B * nw, slots)`` of a windowed layer (slots in ``layout.window_tokens()``' order)
    -> ``(B, P + gh*gw)`` on the tokens, row-major after the ``P`` prefix tokens (which no window holds: 0); padding
    slots dropped. Each token is the key of one window, so nothing is summed twice."""
    slots = layout.window_tokens().to(keys.device)  # (nw, slots): each slot's patch, gh*gw at padding
    patches = layout.grid[0] * layout.grid[1]
    B = keys.shape[0] // slots.shape[0]
    out = keys.new_zeros(B, patches + 1)
    out.scatter_add_(1, slots.reshape(1, -1).expand(B, -1), keys.reshape(B, -1))
    return torch.cat([keys.new_zeros(B, num_prefix_tokens), out[:, :patches]], dim=1)


def legrad(model: ViT, images: Tensor, class_index: int | Tensor | None = None, start_layer: int = -2,
           budget: int = CHUNK_BYTES, head_chunk: int | None = None, query_chunk: int | None = None) -> Tensor:
    """LeGrad (Bousselham et al. 2024): ``(B, gh, gw)`` for each image's class (default: the predicted one); a
    video model's clips ``(B, frames, C, H, W)`` give it on their folded grid ``(t*gh, gw)``, time-major.

    At every layer from ``start_layer`` (negative counts from the end; the reference
    wrapper's default is -2, the last two layers) the model's own classifier (final norm,
    head on CLS) reads that layer's output; the gradient of that class score with respect
    to that layer's attention gives the layer's map. The reference scores CLIP's image-text
    similarity; here the score is the class logit, the classifier's equivalent.

    ``A_l`` reaches the score ``S_l`` only through its heads' contexts ``z_l = A_l v_l``, so ``dS_l/dA_l =
    dS_l/dz_l @ v_lᵀ``. One fast forward without a graph runs every block but the last, keeping the inputs of the
    explained ones; each explained block then runs again from its input with ``z_l`` as a leaf, for the tokens the
    classifier reads only (``ViT.readout_tokens``: the other queries' rows of ``dS_l/dA_l`` are zero), and the
    last one gives the logits. No ``T x T`` is held: the gradient's rows are formed in chunks of at most
    ``budget`` bytes (or ``head_chunk`` heads x ``query_chunk`` queries), and the memory is the explained blocks'
    inputs and one block's graph, at 197 tokens as at thousands. A layer that attends in windows (Qwen2.5-VL's, in
    its window order) gives each window's rows, its keys taken back to their tokens (``window_keys_on_tokens``):
    the ``T x T`` matrix zero outside the windows, as ``legrad_layer`` reads a Swin window. A model with stages
    (Swin, Hiera), read out by average pooling, goes to ``stage_legrad``.
    """
    check_supported(model)
    if getattr(model.config, "stage_depths", ()):
        return stage_legrad(model, images, class_index, start_layer)
    index = None

    def class_score(out: Tensor) -> Tensor:  # the last layer is read first: its logits give the predicted class
        nonlocal index
        logits = model.classify(out)  # (B, classes)
        if index is None:
            index = _class_indices(logits, class_index)
        return logits.gather(1, index[:, None].to(logits.device)).sum()  # the images are independent

    return legrad_of_readout(model, images, class_score, start_layer, model.readout_tokens(), budget, head_chunk,
                             query_chunk)


def legrad_of_readout(model: ViT, images: Tensor, score: Callable[[Tensor], Tensor], start_layer: int = -2,
                      readout: int | None = None, budget: int = CHUNK_BYTES, head_chunk: int | None = None,
                      query_chunk: int | None = None) -> Tensor:
    """LeGrad's map ``(B, gh, gw)`` of any read-out: ``score(out)`` is the scalar read from a layer's output ``out
    (B, readout or T, D)`` (``legrad``'s: the class logit; a SAM's mask: the neck and the mask decoder on it), read
    at every layer from ``start_layer``, the last first; ``readout``: the leading tokens it reads (None: all). See
    ``legrad`` for how it is computed in chunks."""
    L = len(model.blocks)
    if not -L <= start_layer < L:
        raise ValueError(f"start_layer {start_layer} is out of range for {L} layers")
    start, grid = start_layer % L, model.input_grid(images)  # a video model's clips: their folded grid
    inputs: list[Tensor] = []  # the input (B, T, D) of each block from start on
    with torch.inference_mode():
        x, _ = model.run_blocks(model.embed(images), grid, 0, start)
        for layer in range(start, L - 1):
            inputs.append(x)
            x, _ = model.run_blocks(x, grid, layer, layer + 1)
        inputs.append(x)
    total = None
    H, T = model.blocks[-1].attn.num_heads, x.shape[1]
    for layer in reversed(range(start, L)):
        with torch.inference_mode(False), torch.enable_grad():
            x = inputs[layer - start].clone()  # a normal tensor: these were made under inference_mode
            out, kept = run_block(model, layer, x, grid, leaf=True, queries=readout)
            [contexts] = torch.autograd.grad(score(out), kept["hook_z"])  # (B, n, H, hd)
        values = kept["hook_v"].detach()  # (B, H, T, hd); a windowed layer's (B * nw, H, slots, hd)
        keys = None
        for _, _, grad in context_gradient_chunks(contexts, values, budget, head_chunk, query_chunk):
            part = grad.clamp(min=0).sum(dim=(1, 2)).double().cpu()  # (B, T) or (B * nw, slots): heads, queries
            keys = part if keys is None else keys + part
        if model.blocks[layer].window:  # each window's keys to their tokens (Qwen2.5-VL's window order undone)
            keys = window_keys_on_tokens(keys, model.blocks[layer].layout(grid), model.num_prefix_tokens)
        total = keys if total is None else total + keys
    relevance = (total / (H * T)).float()  # mean over heads and every query (the unread rows are zero)
    return _patch_map(relevance.to(images.device), grid, model.num_prefix_tokens)


def legrad_layers(model: ViT) -> range:
    """The layers LeGrad can explain: every layer, or in a model with stages (Swin, Hiera) those of the last stage,
    whose tokens have the width the classifier reads (the earlier stages' are narrower, on finer grids)."""
    return range(model.config.stage_start(model.config.num_stages - 1), len(model.blocks))


def stage_legrad(model: ViT, images: Tensor, class_index: int | Tensor | None = None, start_layer: int = -2
                 ) -> Tensor:
    """LeGrad on a model with stages (Swin, Swin V2, Hiera), read out by average pooling: ``(B, gh, gw)`` on the
    image's patch grid for each image's class (default: the predicted one).

    As the authors' own path for a model without a CLS read-out (``compute_legrad_clip`` applies ``ln_post`` to
    each layer's mean token; ``compute_legrad_siglip`` the pooling head to each layer's tokens): at each layer ``l``
    from ``start_layer`` (negative counts from the end; the authors' ``layer_index`` default -2) the model's own
    read-out (``ViT.classify``: final norm, average pooling, fc_norm, head) is applied to layer ``l``'s output, and
    the gradient of that class score with respect to layer ``l``'s attention probabilities (each window's; a
    pooled-query layer's rows are its pooled queries) gives the layer's map on its keys' grid
    (``vit.explain.methods.stage_maps.legrad_layer``), upsampled to the patch grid and summed (``legrad_on_patches``).
    Only the last stage's layers (``legrad_layers``) have the head's width; an earlier ``start_layer`` is refused.
    One forward without a graph runs the layers before ``start_layer``; the explained ones run with autograd and
    keep their windows' probabilities (``H x Tq x nk`` each, never ``T x T``).
    """
    from vit.explain.methods.stage_maps import legrad_layer, legrad_on_patches

    L = len(model.blocks)
    if not -L <= start_layer < L:
        raise ValueError(f"start_layer {start_layer} is out of range for {L} layers")
    start, explained = start_layer % L, legrad_layers(model)
    if start < explained.start:
        raise ValueError(f"LeGrad applies the classifier to each explained layer's tokens, which have its width only "
                         f"in the last stage (layers {explained.start} to {L - 1}); choose start_layer from "
                         f"{explained.start - L} to -1")
    grid = model.patch_grid(images.shape[2], images.shape[3])
    layouts = model.layer_layouts(grid)
    with torch.inference_mode():
        x, _ = model.run_blocks(model.embed(images), grid, 0, start)
    maps = []
    with torch.inference_mode(False), torch.enable_grad():
        x = x.clone().requires_grad_(True)  # a normal tensor (made under inference_mode), in the graph
        outputs, attentions = [], []
        for layer in range(start, L):
            x, (probs,) = model.run_blocks(x, grid, layer, layer + 1, output_attentions=True)
            outputs.append(x)
            attentions.append(probs)
        logits = [model.classify(out) for out in outputs]  # the read-out at each explained layer, (B, classes)
        index = _class_indices(logits[-1], class_index).to(logits[-1].device)
        for layer, logit, probs in zip(range(start, L), logits, attentions, strict=True):
            score = logit.gather(1, index[:, None]).sum()  # the images are independent
            [grad] = torch.autograd.grad(score, probs, retain_graph=layer < L - 1)
            maps.append(legrad_layer(grad.detach(), layouts[layer]))
    return legrad_on_patches(maps, grid)


# --- Chefer et al. 2021a: LRP relevance x gradient, rolled out -------------------------------------

def _safe_divide(a: Tensor, b: Tensor) -> Tensor:
    """The reference's stabilised division: ``a / (b + 1e-9)``, and 0 where ``b`` is 0."""
    den = b.clamp(min=1e-9) + b.clamp(max=1e-9)
    den = den + den.eq(0).type(den.type()) * 1e-9
    return a / den * b.ne(0).type(b.type())


def _linear_relprop(relevance: Tensor, x: Tensor, weight: Tensor, joint: bool = True) -> Tensor:
    """LRP alpha=1, beta=0 through a linear layer (bias ignored), as the reference's ``Linear.relprop``: the
    positive and negative parts share one denominator (``layers_ours``), or each has its own (``joint=False``:
    ``layers_lrp``, the plain LRP of Chefer et al.'s baselines)."""
    px, nx = x.clamp(min=0), x.clamp(max=0)
    pw, nw = weight.clamp(min=0), weight.clamp(max=0)
    if joint:
        s = _safe_divide(relevance, F.linear(px, pw) + F.linear(nx, nw))
        return px * (s @ pw) + nx * (s @ nw)
    return px * (_safe_divide(relevance, F.linear(px, pw)) @ pw) + nx * (_safe_divide(relevance, F.linear(nx, nw)) @ nw)


def _matmul_relprop(relevance: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """LRP through ``a @ b`` (gradient x input on both operands), as the reference's ``einsum.relprop``."""
    s = _safe_divide(relevance, a @ b)
    return a * (s @ b.transpose(-2, -1)), b * (a.transpose(-2, -1) @ s)


def _add_relprop(relevance: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """LRP through ``a + b`` with each branch rescaled to its share of |relevance| (the reference's ``Add.relprop``).

    The reference sums over the whole tensor, which mixes the images of a batch; here the
    sums run per image, which is the same for one image.
    """
    s = _safe_divide(relevance, a + b)
    ra, rb = a * s, b * s

    def total(t: Tensor) -> Tensor:
        return t.sum(dim=tuple(range(1, t.dim())), keepdim=True)  # per image

    sa, sb, sr = total(ra).abs(), total(rb).abs(), total(relevance)
    ra = ra * _safe_divide(_safe_divide(sa, sa + sb) * sr, total(ra))
    rb = rb * _safe_divide(_safe_divide(sb, sa + sb) * sr, total(rb))
    return ra, rb


def _plain_add_relprop(relevance: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """LRP through ``a + b``, each branch its share of the sum (``layers_lrp``'s ``Add``: no rescaling)."""
    s = _safe_divide(relevance, a + b)
    return a * s, b * s


def _conv_relprop(relevance: Tensor, x: Tensor, conv: torch.nn.Conv2d) -> Tensor:
    """LRP through the patch embedding ``conv`` (bias ignored) from ``relevance (B, D, gh, gw)`` to its input ``x
    (B, C, H, W)``, as ``layers_lrp``'s ``Conv2d.relprop``: the z^B rule bounded by each image's lowest and highest
    input value for a 3-channel input, alpha=1, beta=0 (each part its own denominator) otherwise."""
    w, stride, padding = conv.weight, conv.stride, conv.padding
    pw, nw = w.clamp(min=0), w.clamp(max=0)
    gh, gw = relevance.shape[-2:]
    extra = tuple(x.shape[2 + i] - ((g - 1) * stride[i] - 2 * padding[i] + w.shape[2 + i])
                  for i, g in enumerate((gh, gw)))  # the rows and columns the convolution did not reach

    def back(s: Tensor, weight: Tensor) -> Tensor:  # the gradient of the convolution: its input's shape
        return F.conv_transpose2d(s, weight, stride=stride, padding=padding, output_padding=extra)

    def forward(inp: Tensor, weight: Tensor) -> Tensor:
        return F.conv2d(inp, weight, None, stride, padding)

    if x.shape[1] == 3:
        low = torch.zeros_like(x) + x.amin(dim=(1, 2, 3), keepdim=True)  # (B, C, H, W): their L
        high = torch.zeros_like(x) + x.amax(dim=(1, 2, 3), keepdim=True)  # their H
        s = relevance / (forward(x, w) - forward(low, pw) - forward(high, nw) + 1e-9)
        return x * back(s, w) - low * back(s, pw) - high * back(s, nw)
    px, nx = x.clamp(min=0), x.clamp(max=0)
    return (px * back(_safe_divide(relevance, forward(px, pw)), pw)
            + nx * back(_safe_divide(relevance, forward(nx, nw)), nw))


def _clone_relprop(r1: Tensor, r2: Tensor, x: Tensor) -> Tensor:
    """LRP where a tensor fed two branches (the residual and the block): the reference's ``Clone.relprop``."""
    return x * (_safe_divide(r1, x) + _safe_divide(r2, x))


_TRACED = ("hook_resid_pre", "hook_attn_in", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_pattern",
           "attn.hook_z", "hook_attn_out", "hook_resid_mid", "hook_mlp_in", "mlp.hook_post", "hook_mlp_out")


def _attention_relevances(model: ViT, cache: dict[str, Tensor], logits: Tensor, index: Tensor,
                          plain: bool = False, stop: int = 0, inputs: bool = False
                          ) -> tuple[list[Tensor], Tensor | None]:
    """The LRP relevance of the attention probabilities ``(B, H, T, T)`` of each layer from ``stop`` to the last,
    for the classes ``index``, from the forward's tensors at the hook points ``_TRACED`` of those blocks and
    ``hook_normed``; with ``inputs``, also the relevance of block ``stop``'s input ``(B, T, D)`` (else None).
    The rules are ``ViT_LRP.py``'s (``layers_ours``: the transformer attribution), or with ``plain``
    ``ViT_orig_LRP.py``'s (``layers_lrp``: its full and partial LRP baselines)."""
    joint, add = not plain, _plain_add_relprop if plain else _add_relprop
    relevance = F.one_hot(index, logits.shape[-1]).to(logits.dtype)  # (B, classes): the reference's one_hot
    normed = cache["hook_normed"]
    cls = _linear_relprop(relevance, normed[:, 0], model.head.weight, joint)  # (B, D)
    r = torch.zeros_like(normed)
    r[:, 0] = normed[:, 0] * _safe_divide(cls, normed[:, 0])  # index-select (pooling) relprop; norm: identity
    cams: list[Tensor] = []
    for layer in reversed(range(stop, len(model.blocks))):
        block = model.blocks[layer]
        t = {name: cache[f"blocks.{layer}.{name}"] for name in _TRACED}
        B, T, _ = t["hook_resid_pre"].shape
        nh, hd = block.attn.num_heads, block.attn.head_dim  # nh * hd: the attention's width, not always the model's
        # x_out = mid + mlp(norm2(mid))
        r_mid, r_mlp = add(r, t["hook_resid_mid"], t["hook_mlp_out"])
        r_mlp = _linear_relprop(r_mlp, t["mlp.hook_post"], block.mlp.fc2.weight, joint)  # GELU, norm2: identity
        r_mlp = _linear_relprop(r_mlp, t["hook_mlp_in"], block.mlp.fc1.weight, joint)
        r = _clone_relprop(r_mid, r_mlp, t["hook_resid_mid"])
        # mid = x + attn(norm1(x))
        r_x, r_attn = add(r, t["hook_resid_pre"], t["hook_attn_out"])
        r_attn = _linear_relprop(r_attn, t["attn.hook_z"].reshape(B, T, nh * hd), block.attn.proj.weight, joint)
        r_attn = r_attn.view(B, T, nh, hd).transpose(1, 2)  # (B, nh, T, hd)
        r_probs, r_v = _matmul_relprop(r_attn, t["attn.hook_pattern"], t["attn.hook_v"])
        r_probs, r_v = r_probs / 2, r_v / 2
        cams.append(r_probs)
        if layer == stop and not inputs:
            break  # the input relevance of the lowest layer is not needed
        r_q, r_k = _matmul_relprop(r_probs, t["attn.hook_q"], t["attn.hook_k"].transpose(-2, -1))  # softmax: identity
        r_q, r_k = r_q / 2, r_k.transpose(-2, -1) / 2
        r_qkv = torch.stack([r_q, r_k, r_v]).permute(1, 3, 0, 2, 4).reshape(B, T, 3 * nh * hd)  # as qkv's output
        r_n1 = _linear_relprop(r_qkv, t["hook_attn_in"], block.attn.qkv.weight, joint)  # norm1: identity
        r = _clone_relprop(r_x, r_n1, t["hook_resid_pre"])
    return cams[::-1], r if inputs else None


def transformer_attribution(model: ViT, images: Tensor, class_index: int | Tensor | None = None,
                            end_layer: int | None = None, start_layer: int = 0) -> Tensor:
    """Chefer, Gur & Wolf 2021a: each layer's LRP relevance of its attention times its gradient, rolled out.

    Per layer ``Ā = mean_heads(clamp(grad * R_attn, min=0))``, then ``R = Π (I + Ā)`` as in
    ``gradient_rollout``. Returns ``(B, T, T)``; ``token_map(result, 0, grid)`` is the paper's
    map for each image's class (default: the predicted one). ``start_layer``: the first layer rolled out (their
    ``generate_LRP(start_layer=...)``; their benchmark scripts pass 1); ``end_layer`` counts from layer 0.
    """
    check_lrp(model, "lrp")
    names = [f"blocks.{layer}.{name}" for layer in range(len(model.blocks)) for name in _TRACED] + ["hook_normed"]
    inference, grad_mode = _grad_context()
    with inference, grad_mode:
        encoding, cache = model.run_with_cache(_leaf(images), names)
        index = _class_indices(encoding.logits.detach(), class_index)
        score = encoding.logits.gather(1, index[:, None]).sum()
        patterns = [cache[f"blocks.{layer}.attn.hook_pattern"] for layer in range(len(model.blocks))]
        gradients = torch.autograd.grad(score, patterns)
        with torch.no_grad():
            cams, _ = _attention_relevances(model, {k: v.detach() for k, v in cache.items()}, encoding.logits,
                                            index)
    last = len(layers_up_to(cams, end_layer))  # the layers 0..end_layer
    return gradient_rollout(cams[start_layer:last], [g.detach() for g in gradients][start_layer:last])


# Chefer et al.'s three LRP maps (the map kinds' names): what each is called in a refusal, and why it needs one grid
LRP_MAPS = {"lrp": ("Chefer et al.'s LRP", "rolls out T x T relevance matrices of one grid"),
            "lrp-partial": ("Chefer et al.'s partial LRP", "reads the CLS row of a T x T relevance matrix"),
            "lrp-full": ("Chefer et al.'s full LRP", "runs one grid of tokens from the pixels to the class")}


def check_lrp(model: ViT, kind: str) -> None:
    """``UnsupportedModelError`` in one line unless Chefer et al.'s LRP rules for ``kind`` (``LRP_MAPS``) reach every
    operation of ``model``: what the map's own function checks first, for a caller to check before any other cost
    (a model no rule reaches is refused for what it is, never first for its input's size)."""
    what, why = LRP_MAPS[kind]
    check_supported(model)
    check_one_grid(model, what, why)
    missing = lrp_rule_missing(model.config)
    if missing:
        raise UnsupportedModelError(f"{what} has no rule for {missing}; use AttnLRP, LeGrad or the "
                                    "gradient-rollout class map")
    if kind == "lrp-full" and model.patch_norm is not None:
        raise UnsupportedModelError("Chefer et al.'s full LRP has no rule for the patch embedding's norms "
                                    "(patch_norm=True, or shifted patch tokens'); use AttnLRP, which reaches the "
                                    "pixels through them")


def partial_lrp(model: ViT, images: Tensor, class_index: int | Tensor | None = None) -> Tensor:
    """Chefer et al.'s partial LRP baseline (after Voita et al. 2019; ``ViT_orig_LRP.py``'s ``method="last_layer"``):
    plain LRP (``layers_lrp``'s rules) from each image's class (default: the predicted one) to the last layer's
    attention probabilities, their positive part averaged over heads, CLS's row over the patches: ``(B, gh, gw)``.
    Only the last block is propagated through (theirs runs every block's relprop, and reads only the last)."""
    check_lrp(model, "lrp-partial")
    last = len(model.blocks) - 1
    names = [f"blocks.{last}.{name}" for name in _TRACED] + ["hook_normed"]
    with torch.no_grad():
        encoding, cache = model.run_with_cache(images, names)
        index = _class_indices(encoding.logits, class_index)
        [cam], _ = _attention_relevances(model, cache, encoding.logits, index, plain=True, stop=last)
    row = cam.clamp(min=0).mean(dim=1)[:, 0]  # (B, T): heads averaged, CLS's row
    return _patch_map(row, model.patch_grid(images.shape[2], images.shape[3]), model.num_prefix_tokens)


def full_lrp(model: ViT, images: Tensor, class_index: int | Tensor | None = None) -> Tensor:
    """Chefer et al.'s full LRP baseline (``ViT_orig_LRP.py``'s ``method="full"``): plain LRP (``layers_lrp``'s
    rules: alpha=1, beta=0 with separate denominators, additions split by share, norms and GELU passed through)
    from each image's class (default: the predicted one) through every block, the position embedding's addition
    and the patch embedding (z^B rule on a 3-channel input) to the pixels, summed over channels: ``(B, H, W)``,
    signed. ``patch_sums`` gives the patch grid."""
    check_lrp(model, "lrp-full")
    names = [f"blocks.{layer}.{name}" for layer in range(len(model.blocks)) for name in _TRACED]
    with torch.no_grad():
        encoding, cache = model.run_with_cache(images, names + ["hook_embed", "hook_normed"])
        index = _class_indices(encoding.logits, class_index)
        _, r = _attention_relevances(model, cache, encoding.logits, index, plain=True, inputs=True)
        # ln_pre (CLIP's) passes relevance unchanged, as every LayerNorm here; then x = tokens + positions, and the
        # tokens' share of each sum goes to the patches (the prefix tokens' is dropped, as their cam[:, 1:])
        grid = model.patch_grid(images.shape[2], images.shape[3])
        patches = model.patch_embed(images).flatten(2).transpose(1, 2)  # (B, gh*gw, D): before the positions
        P = model.num_prefix_tokens
        r = patches * _safe_divide(r[:, P:], cache["hook_embed"][:, P:])  # (B, gh*gw, D)
        r = r.transpose(1, 2).reshape(r.shape[0], -1, *grid)  # (B, D, gh, gw)
        return _conv_relprop(r, images, model.patch_embed).sum(dim=1)  # (B, H, W)


# --- AttnLRP --------------------------------------------------------------------------------------

def attnlrp(model: ViT, images: Tensor, class_index: int | Tensor | None = None, cp: bool = False,
            checkpointed: bool = False) -> Tensor:
    """AttnLRP (Achtibat et al. 2024): signed relevance of every input pixel, summed over channels: ``(B, H, W)``
    (a video model's clips ``(B, frames, C, H, W)``: ``(B, frames, H, W)``, each frame's pixels their own).

    Computed as input x modified gradient of the class logit (default: the predicted class):
    the relevances of all pixels sum to the logit less what the biases absorb. ``cp=True``
    gives CP-LRP (no relevance through the attention weights or SwiGLU's gate), ``lxt``'s choice for ViTs.
    Positive: evidence for the class; negative: against. Use ``patch_sums`` for the patch grid.
    ``checkpointed``: each block's input alone is kept and the block run again in the backward under the same rules
    (``vit.model.checkpointed_blocks``): one block's attention and gradient held at a time, the same relevance.
    """
    check_supported(model)
    inference, grad_mode = _grad_context()
    with inference, grad_mode:
        x = _leaf(images)
        with use_rules(AttnLRPRules(cp)), checkpointed_blocks() if checkpointed else contextlib.nullcontext():
            logits = model(x)[0]
        index = _class_indices(logits.detach(), class_index)
        score = logits.gather(1, index[:, None]).sum()
        [grad] = torch.autograd.grad(score, x)
    return (x.detach() * grad).sum(dim=-3)  # (B, H, W), a clip's (B, frames, H, W): the channels summed


def patch_sums(pixel_map: Tensor, grid: tuple[int, int]) -> Tensor:
    """Sum a ``(B, H, W)`` pixel map over each patch: ``(B, gh, gw)`` (the patches tile the image exactly)."""
    B, H, W = pixel_map.shape
    gh, gw = grid
    if H % gh or W % gw:
        raise ValueError(f"a {H}x{W} map does not tile into a {gh}x{gw} grid")
    return pixel_map.reshape(B, gh, H // gh, gw, W // gw).sum(dim=(2, 4))
