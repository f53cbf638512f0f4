"""Class-specific maps that need the model, not only its attentions: LeGrad, Chefer's LRP, AttnLRP.

Each method walks our ``ViT``'s own modules (``patch_embed`` -> CLS + positions -> every
block's ``norm1``, ``attn.qkv``/``attn.proj``, ``norm2``, ``mlp.fc1``/GELU/``mlp.fc2`` ->
``norm`` -> ``head`` on CLS) and recomputes what each does, so that relevance rules can be
applied between the layers without changing ``vit/model.py``. The walk equals
``model(x)`` (tests check it); a model with an option the walk does not know raises
``UnsupportedModelError`` instead of silently explaining a different network.

Shapes: images ``(B, C, H, W)``; ``T = prefix + gh * gw`` tokens, patches row-major after the
prefix tokens. References (ported, and checked against in ``tests/test_relevance.py``):

- LeGrad: Bousselham et al. 2024, WalBouss/LeGrad ``legrad/wrapper.py`` (``compute_legrad_clip``).
- Transformer attribution: Chefer, Gur & Wolf 2021a, hila-chefer/Transformer-Explainability
  ``baselines/ViT/ViT_LRP.py`` + ``modules/layers_ours.py`` (``method="transformer_attribution"``).
- AttnLRP: Achtibat et al. 2024, rachtibat/LRP-eXplains-Transformers ``lxt/efficient``
  (identity rule on GELU and on LayerNorm's scaling, uniform rule on the attention matmuls,
  epsilon rule = plain gradient elsewhere; ``cp=True`` gives their ViT default, CP-LRP,
  which treats the attention weights as constants).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from vit.explain.attention import gradient_rollout
from vit.model import ViT, ViTConfig, activate

# ViTConfig fields the walk reproduces; a field added later counts only at its default value.
_KNOWN_FIELDS = {"image_size", "patch_size", "num_channels", "num_classes", "hidden_size", "num_layers",
                 "num_heads", "mlp_size", "dropout", "attention_dropout", "drop_path", "qkv_bias", "layer_norm_eps",
                 "distillation_token", "distillation_head", "num_register_tokens", "layer_scale", "pooling",
                 "fc_norm", "prefix_positions", "pos_embed_antialias", "class_token", "pre_norm", "activation",
                 "projection_dim"}
# Options Chefer et al.'s LRP defines no rule for (their ViT reads CLS through one norm and one head).
_LRP_DEFAULTS = {"layer_scale": None, "pooling": "cls", "fc_norm": False, "distillation_head": False}


class UnsupportedModelError(ValueError):
    """The model has an option that relevance propagation does not reproduce yet."""


def check_supported(model: torch.nn.Module) -> None:
    """Raise ``UnsupportedModelError`` unless ``model`` is a ``ViT`` in eval mode whose every option the walk knows."""
    if not isinstance(model, ViT):
        raise UnsupportedModelError(f"relevance maps need this project's ViT, got {type(model).__name__}")
    if model.training:
        raise UnsupportedModelError("the model is in training mode (dropout makes maps random); call model.eval()")
    config = model.config
    for f in fields(ViTConfig):
        if f.name not in _KNOWN_FIELDS and getattr(config, f.name) != f.default:
            raise UnsupportedModelError(f"relevance maps do not support the model option {f.name}="
                                        f"{getattr(config, f.name)!r} yet; use attention, rollout or the class map")
    if getattr(model, "head", None) is None:
        raise UnsupportedModelError("the model has no classifier head, so there is no class to explain")


# --- the forward walk ---------------------------------------------------------------------------

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


def _lrp_layer_norm(x: Tensor, norm: torch.nn.LayerNorm) -> Tensor:
    """LayerNorm with its scale (1 / std) held constant for the backward pass: AttnLRP's identity rule."""
    mean = x.mean(dim=-1, keepdim=True)
    std = ((x - mean) ** 2).mean(dim=-1, keepdim=True).add(norm.eps).sqrt()
    return (x - mean) / std.detach() * norm.weight + norm.bias


@dataclass
class BlockTrace:
    """What one block computed, for the backward relevance rules: each ``(B, T, ·)`` unless noted."""

    x: Tensor  # block input (B, T, D)
    n1: Tensor  # norm1(x)
    q: Tensor  # (B, nh, T, hd)
    k: Tensor
    v: Tensor
    probs: Tensor  # attention (B, nh, T, T)
    context: Tensor  # probs @ v with the heads merged, the input of attn.proj (B, T, D)
    attn_out: Tensor  # attn.proj(context)
    mid: Tensor  # x + attn_out
    n2: Tensor  # norm2(mid)
    hidden: Tensor  # GELU(fc1(n2)) (B, T, mlp)
    mlp_out: Tensor  # fc2(hidden)
    out: Tensor  # mid + mlp_out


@dataclass
class Walk:
    """The whole forward pass: the token embedding, each block's trace, the final normalised tokens and the logits."""

    tokens: Tensor  # (B, T, D), the input of block 0
    blocks: list[BlockTrace]
    normed: Tensor  # norm(last block output) (B, T, D)
    logits: Tensor  # (B, classes)


def _classify(model: ViT, x: Tensor, norm, lrp: bool = False) -> tuple[Tensor, Tensor]:
    """``ViT.classify`` on tokens ``(B, T, D)`` with ``norm(x, layer)`` applying each LayerNorm -> (normed, logits).

    A copy of ``ViT.classify``'s steps because AttnLRP needs its own LayerNorm rule there
    and Chefer's LRP the normalised tokens; the walk's logits check catches any drift.
    """
    c = model.config
    if isinstance(model.norm, torch.nn.LayerNorm):
        x = norm(x, model.norm)
    patches = x[:, model.num_prefix_tokens:]  # (B, gh*gw, D)
    if c.pooling == "cls":
        pooled = x[:, 0]
    elif c.pooling == "avg":
        pooled = patches.mean(dim=1)
    elif c.pooling == "map":  # SigLIP's attention-pooling probe, walked as the model computes it
        pooled = model.attn_pool(x)[0]
    else:  # "cls+avg"
        pooled = torch.cat([x[:, 0], patches.mean(dim=1)], dim=-1)
    if model.fc_norm is not None:
        pooled = norm(pooled, model.fc_norm)
    # A head with its own relevance rule (the prompt head's L2 norm, vit.explain.prompts) is told to use it.
    logits = model.head(pooled, lrp=True) if lrp and getattr(model.head, "has_lrp_rule", False) else model.head(pooled)
    if model.head_dist is not None:
        logits = (logits + model.head_dist(x[:, 1])) / 2
    return x, logits


def walk(model: ViT, images: Tensor, rules: Literal["none", "attnlrp", "cp"] = "none") -> Walk:
    """Recompute ``model(images)`` layer by layer, keeping every intermediate tensor.

    ``rules="none"`` is the model's own computation (equal to ``model(images)``);
    ``"attnlrp"`` and ``"cp"`` insert AttnLRP's backward rules (the forward values stay the
    same up to float rounding), so that ``input * grad`` is the LRP relevance.
    """
    check_supported(model)
    if rules not in ("none", "attnlrp", "cp"):
        raise ValueError(f"unknown rules {rules!r}; choose none, attnlrp or cp")
    lrp = rules != "none"

    def norm(x: Tensor, layer: torch.nn.LayerNorm) -> Tensor:
        return _lrp_layer_norm(x, layer) if lrp else layer(x)

    if lrp and model.config.pooling == "map":
        raise UnsupportedModelError("AttnLRP has no rule for attention pooling (SigLIP's pooling=\"map\") yet; "
                                    "use LeGrad")
    x = model.embed(images, pre_norm=False)  # (B, T, D); checks the images' shape
    if model.norm_pre is not None:  # CLIP's ln_pre, under the LayerNorm rule like every other norm
        x = norm(x, model.norm_pre)
    tokens, traces = x, []
    act = functools.partial(activate, name=model.config.activation)
    for block in model.blocks:
        attn = block.attn
        B, N, C = x.shape
        n1 = norm(x, block.norm1)
        qkv = attn.qkv(n1).view(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)  # (3, B, nh, N, hd)
        q, k, v = qkv.unbind(0)  # each (B, nh, N, hd)
        if rules == "attnlrp":  # uniform rule on both matmuls: q and k get 1/2 of 1/2, v 1/2
            q, k, v = _DivideGradient.apply(q, 4.0), _DivideGradient.apply(k, 4.0), _DivideGradient.apply(v, 2.0)
        elif rules == "cp":  # CP-LRP: no relevance through the attention weights
            q, k = q.detach(), k.detach()
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(attn.head_dim))  # (B, nh, N, N)
        probs = scores.softmax(dim=-1)
        context = (probs @ v).transpose(1, 2).reshape(B, N, C)  # (B, N, C)
        attn_out = attn.proj(context)
        if block.ls1 is not None:
            attn_out = attn_out * block.ls1
        mid = x + attn_out
        n2 = norm(mid, block.norm2)
        pre = block.mlp.fc1(n2)
        hidden = _IdentityRule.apply(pre, act) if lrp else act(pre)  # (B, N, mlp)
        mlp_out = block.mlp.fc2(hidden)
        if block.ls2 is not None:
            mlp_out = mlp_out * block.ls2
        out = mid + mlp_out
        traces.append(BlockTrace(x, n1, q, k, v, probs, context, attn_out, mid, n2, hidden, mlp_out, out))
        x = out
    normed, logits = _classify(model, x, norm, lrp)
    with torch.no_grad():  # a model change the field checks cannot see must not give a wrong map silently
        expected = model(images.detach())[0]
    if not torch.allclose(logits.detach(), expected, rtol=1e-3, atol=1e-4 * float(expected.abs().max()) + 1e-6):
        raise UnsupportedModelError("recomputing this model layer by layer does not give its own logits: it has "
                                    "an option relevance maps do not reproduce yet; use attention or rollout")
    return Walk(tokens, traces, normed, logits)


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


def legrad(model: ViT, images: Tensor, class_index: int | Tensor | None = None, start_layer: int = -2) -> Tensor:
    """LeGrad (Bousselham et al. 2024): ``(B, gh, gw)`` for each image's class (default: the predicted one).

    At every layer from ``start_layer`` (negative counts from the end; the reference
    wrapper's default is -2, the last two layers) the model's own classifier (final norm,
    head on CLS) reads that layer's output; the gradient of that class score with respect
    to that layer's attention gives the layer's map. The reference scores CLIP's image-text
    similarity; here the score is the class logit, the classifier's equivalent.
    """
    L = len(model.blocks)
    if not -L <= start_layer < L:
        raise ValueError(f"start_layer {start_layer} is out of range for {L} layers")
    first = start_layer % L
    inference, grad_mode = _grad_context()
    with inference, grad_mode:
        w = walk(model, _leaf(images))
        index = _class_indices(w.logits.detach(), class_index)
        gradients = []
        for layer in range(first, L):
            logits = model.classify(w.blocks[layer].out)  # (B, classes): the class read at this layer
            score = logits.gather(1, index[:, None]).sum()  # images are independent: sum = per-image grads
            [grad] = torch.autograd.grad(score, w.blocks[layer].probs, retain_graph=True)
            gradients.append(grad.detach())
    grid = model.patch_grid(images.shape[2], images.shape[3])
    return legrad_from_gradients(gradients, grid, model.num_prefix_tokens)


# --- Chefer et al. 2021a: LRP relevance x gradient, rolled out -------------------------------------

def _safe_divide(a: Tensor, b: Tensor) -> Tensor:
    """The reference's stabilised division: ``a / (b + 1e-9)``, and 0 where ``b`` is 0."""
    den = b.clamp(min=1e-9) + b.clamp(max=1e-9)
    den = den + den.eq(0).type(den.type()) * 1e-9
    return a / den * b.ne(0).type(b.type())


def _linear_relprop(relevance: Tensor, x: Tensor, weight: Tensor) -> Tensor:
    """LRP alpha=1, beta=0 through a linear layer (bias ignored), as the reference's ``Linear.relprop``."""
    px, nx = x.clamp(min=0), x.clamp(max=0)
    pw, nw = weight.clamp(min=0), weight.clamp(max=0)
    s = _safe_divide(relevance, F.linear(px, pw) + F.linear(nx, nw))
    return px * (s @ pw) + nx * (s @ nw)


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


def _clone_relprop(r1: Tensor, r2: Tensor, x: Tensor) -> Tensor:
    """LRP where a tensor fed two branches (the residual and the block): the reference's ``Clone.relprop``."""
    return x * (_safe_divide(r1, x) + _safe_divide(r2, x))


def _attention_relevances(model: ViT, w: Walk, index: Tensor) -> list[Tensor]:
    """Each layer's LRP relevance of its attention probabilities ``(B, H, T, T)`` for the classes ``index``."""
    B = w.logits.shape[0]
    relevance = F.one_hot(index, w.logits.shape[-1]).to(w.logits.dtype)  # (B, classes): the reference's one_hot
    cls = _linear_relprop(relevance, w.normed[:, 0], model.head.weight)  # (B, D)
    r = torch.zeros_like(w.normed)
    r[:, 0] = w.normed[:, 0] * _safe_divide(cls, w.normed[:, 0])  # index-select (pooling) relprop; norm: identity
    cams: list[Tensor] = []
    for block, t in zip(reversed(model.blocks), reversed(w.blocks), strict=True):
        nh, hd = block.attn.num_heads, block.attn.head_dim
        T, D = t.x.shape[1], t.x.shape[2]
        # x_out = mid + mlp(norm2(mid))
        r_mid, r_mlp = _add_relprop(r, t.mid, t.mlp_out)
        r_mlp = _linear_relprop(r_mlp, t.hidden, block.mlp.fc2.weight)  # GELU and norm2: identity
        r_mlp = _linear_relprop(r_mlp, t.n2, block.mlp.fc1.weight)
        r = _clone_relprop(r_mid, r_mlp, t.mid)
        # mid = x + attn(norm1(x))
        r_x, r_attn = _add_relprop(r, t.x, t.attn_out)
        r_attn = _linear_relprop(r_attn, t.context, block.attn.proj.weight)
        r_attn = r_attn.view(B, T, nh, hd).transpose(1, 2)  # (B, nh, T, hd)
        r_probs, r_v = _matmul_relprop(r_attn, t.probs, t.v)
        r_probs, r_v = r_probs / 2, r_v / 2
        cams.append(r_probs)
        if len(cams) == len(w.blocks):
            break  # layer 0's input relevance is not needed
        r_q, r_k = _matmul_relprop(r_probs, t.q, t.k.transpose(-2, -1))  # softmax: identity; scores unscaled
        r_q, r_k = r_q / 2, r_k.transpose(-2, -1) / 2
        r_qkv = torch.stack([r_q, r_k, r_v]).permute(1, 3, 0, 2, 4).reshape(B, T, 3 * D)  # (B, T, 3D) as qkv's output
        r_n1 = _linear_relprop(r_qkv, t.n1, block.attn.qkv.weight)  # norm1: identity
        r = _clone_relprop(r_x, r_n1, t.x)
    return cams[::-1]


def transformer_attribution(model: ViT, images: Tensor, class_index: int | Tensor | None = None,
                            end_layer: int | None = None) -> Tensor:
    """Chefer, Gur & Wolf 2021a: each layer's LRP relevance of its attention times its gradient, rolled out.

    Per layer ``Ā = mean_heads(clamp(grad * R_attn, min=0))``, then ``R = Π (I + Ā)`` as in
    ``gradient_rollout``. Returns ``(B, T, T)``; ``token_map(result, 0, grid)`` is the paper's
    map for each image's class (default: the predicted one).
    """
    check_supported(model)
    for name, default in _LRP_DEFAULTS.items():
        if getattr(model.config, name) != default:
            raise UnsupportedModelError(f"Chefer et al.'s LRP has no rule for {name}={getattr(model.config, name)!r}; "
                                        "use LeGrad, AttnLRP or the gradient-rollout class map")
    inference, grad_mode = _grad_context()
    with inference, grad_mode:
        w = walk(model, _leaf(images))
        index = _class_indices(w.logits.detach(), class_index)
        score = w.logits.gather(1, index[:, None]).sum()
        gradients = torch.autograd.grad(score, [t.probs for t in w.blocks])
        with torch.no_grad():
            cams = _attention_relevances(model, w, index)
    return gradient_rollout(cams, [g.detach() for g in gradients], end_layer)


# --- AttnLRP --------------------------------------------------------------------------------------

def attnlrp(model: ViT, images: Tensor, class_index: int | Tensor | None = None, cp: bool = False) -> Tensor:
    """AttnLRP (Achtibat et al. 2024): signed relevance of every input pixel, summed over channels: ``(B, H, W)``.

    Computed as input x modified gradient of the class logit (default: the predicted class):
    the relevances of all pixels sum to the logit less what the biases absorb. ``cp=True``
    gives CP-LRP (no relevance through the attention weights), ``lxt``'s choice for ViTs.
    Positive: evidence for the class; negative: against. Use ``patch_sums`` for the patch grid.
    """
    inference, grad_mode = _grad_context()
    with inference, grad_mode:
        x = _leaf(images)
        w = walk(model, x, "cp" if cp else "attnlrp")
        index = _class_indices(w.logits.detach(), class_index)
        score = w.logits.gather(1, index[:, None]).sum()
        [grad] = torch.autograd.grad(score, x)
    return (x.detach() * grad).sum(dim=1)  # (B, H, W)


def patch_sums(pixel_map: Tensor, grid: tuple[int, int]) -> Tensor:
    """Sum a ``(B, H, W)`` pixel map over each patch: ``(B, gh, gw)`` (the patches tile the image exactly)."""
    B, H, W = pixel_map.shape
    gh, gw = grid
    if H % gh or W % gw:
        raise ValueError(f"a {H}x{W} map does not tile into a {gh}x{gw} grid")
    return pixel_map.reshape(B, gh, H // gh, gw, W // gw).sum(dim=(2, 4))
