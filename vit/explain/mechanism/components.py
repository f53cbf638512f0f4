"""Which component does what: logit lens, direct logit attribution, head ablation and activation patching (the
high-norm / massive-activation / sink phenomena and the registers: ``vit.explain.mechanism.phenomena``).

Every function runs the model's own forward and reads or edits it at its hook points (``vit.model.HookPoint``):
a head's output is ``blocks.{l}.attn.hook_z`` (its context before the output projection), read, zeroed, replaced
or patched there; an intervention at layer ``l`` runs only the layers after it (``ViT.run_blocks``) from the
hidden states, with the interventions in the batch dimension. Nothing here writes the block again, so every
family the model expresses (RoPE, SwiGLU, layer scale, attention pooling) is analysed by the same code.

Shapes: images ``(B, C, H, W)``; ``T = prefix + gh * gw`` tokens; ``L`` layers, ``H`` heads, ``D`` width.
Layers and heads are counted from 0 here; the CLI and the app show them from 1.

Memory: a function keeps at most one layer's per-head outputs, ``B x H x T x D`` floats, next to the hidden
states ``B x (L + 1) x T x D``; the grids run ``chunk`` copies of one image through the remaining layers at a
time. ``check_budget`` refuses work past ``MAX_ELEMENTS`` floats (2 GiB of float32) in one line.

References: TransformerLens ``ActivationCache.apply_ln_to_stack`` (the final norm linearised at the final
residual: centre each component, divide by the final residual's scale), and the "head_mask" that HF transformers
applied to the attention probabilities before v5 (equivalently a head's context zeroed before the output
projection).

The module reads: the logit lens and direct logit attribution. What they stand on (the forward read at its hook
points, the refusals) is ``vit.explain.mechanism.forward_reads``'s; the interventions (ablation, each head's effect,
patching) are ``vit.explain.mechanism.interventions``'; every name of either is importable from here too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vit.explain.mechanism.forward_reads import (  # noqa: F401 (every name importable from here, as before)
    MAX_ELEMENTS,
    MechanismError,
    Progress,
    _dims,
    _keep,
    check_budget,
    check_one_grid,
    check_supported,
    class_indices,
    grid_of,
    hidden_states,
)
from vit.explain.mechanism.interventions import (  # noqa: F401 (every name importable from here, as before)
    ABLATION_MODES,
    PROGRESS_FLOPS,
    MeanAblatedProj,
    Means,
    Patching,
    ablate_heads,
    ablated_copy,
    ablation_grid,
    block_inputs,
    check_ablation,
    mean_contexts,
    parse_heads,
    patch_heads,
    patch_residuals,
)
from vit.model import ViT

# --- logit lens -----------------------------------------------------------------------------------

def _check_linear_pooling(model: ViT, what: str) -> None:
    """Direct logit attribution reads tokens through the pooling as a linear map: CLS, mean, or both."""
    if model.config.pooling == "map":
        raise MechanismError(f"{what} reads tokens through the pooling, and this model pools by attention (MAP), "
                             "which is not linear in its tokens; the logit lens, ablation, patching and the "
                             "phenomena still apply")


def token_readout(model: ViT, tokens: Tensor) -> Tensor:
    """The model's final norm and head on every token ``(..., T, D)`` -> logits ``(..., T, classes)``: what the
    model would output if every token equalled this one (so avg, cls+avg, fc_norm, DeiT's two heads and an
    attention-pooling probe all read it the way they read the pooled vector)."""
    if model.config.pooling == "map":  # the probe over one token reads that token (its softmax is 1)
        D = tokens.shape[-1]
        return model.classify(tokens.reshape(-1, 1, D)).reshape(*tokens.shape[:-1], -1)
    x = model.norm(tokens)
    pooled = torch.cat([x, x], dim=-1) if model.config.pooling == "cls+avg" else x
    if model.fc_norm is not None:
        pooled = model.fc_norm(pooled)
    logits = model.head(pooled)
    if model.head_dist is not None:
        logits = (logits + model.head_dist(x)) / 2
    return logits


@dataclass
class LogitLens:
    """The logit lens of a batch: per read layer (``layers``) each token's probability of its image's class, and
    the pooled read-out's logits."""

    token_probs: Tensor  # (B, S, T) probability of ``classes[b]`` read from each token
    pooled_logits: Tensor  # (B, S, classes): model.classify on each read layer's tokens
    classes: Tensor  # (B,)
    layers: tuple[int, ...]  # (S,): the block whose output each row reads, -1 for the embedding


def _last_width(model: ViT) -> int:
    """The width of the last stage's tokens (``hidden_size`` is the first stage's in a model with stages)."""
    return model.config.stage_width(model.config.num_stages - 1)


def last_stage(model: ViT) -> int:
    """The first block of the model's last stage (0 for a model of one stage): the blocks from it on write tokens
    of the grid and width the final norm, the pooling and the head read."""
    config = model.config
    return config.stage_start(config.num_stages - 1) if config.stage_depths else 0


def _last_stage_outputs(model: ViT, images: Tensor) -> Tensor:
    """The outputs of the last stage's blocks ``(B, S, T, D)`` on its grid, read at their hook points."""
    first, L = last_stage(model), len(model.blocks)
    grid = model.layer_layouts(grid_of(model, images))[-1].grid
    check_budget(images.shape[0] * (L - first) * math.prod(grid) * _last_width(model),
                 "keeping the last stage's tokens")
    names = [f"blocks.{layer}.hook_resid_post" for layer in range(first, L)]
    cache: dict[str, Tensor] = {}
    with model.hooks([(name, _keep(cache)) for name in names]):
        model.tokens(images)
    return torch.stack([cache[name] for name in names], dim=1)


def logit_lens(model: ViT, images: Tensor, classes: Tensor | int | None = None) -> LogitLens:
    """The final norm and head applied to every token after every layer (``classes`` default: the predicted).

    A model with stages (Swin, Hiera: final norm, average pooling, head, all linear in the tokens but the norm)
    is read on its last stage only: the outputs of that stage's blocks (``LogitLens.layers``). Earlier stages'
    tokens have another grid and width, which the final norm and head do not read.
    """
    check_supported(model, needs_head=True)
    if model.config.stage_depths:
        with torch.no_grad():
            states = _last_stage_outputs(model, images)  # (B, S, T, D)
        layers = tuple(range(last_stage(model), len(model.blocks)))
    else:
        states = hidden_states(model, images)  # (B, L + 1, T, D)
        layers = tuple(range(-1, len(model.blocks)))
    B, S, T, D = states.shape
    num_classes = model.config.num_classes  # the head's outputs (typed labels for a prompt head)
    check_budget(B * T * num_classes, "reading every token through the head")
    pooled = torch.stack([model.classify(states[:, i]) for i in range(S)], dim=1)  # (B, S, classes)
    classes = class_indices(pooled[:, -1], classes)
    token_probs = torch.stack([token_readout(model, states[:, i]).softmax(dim=-1)
                               .gather(-1, classes[:, None, None].expand(B, T, 1))[..., 0]
                               for i in range(S)], dim=1)  # (B, S, T)
    return LogitLens(token_probs, pooled, classes, layers)



# --- direct logit attribution ---------------------------------------------------------------------

def _linear_readout(model: ViT, final: Tensor) -> Callable[[Tensor, bool], Tensor]:
    """``classify`` with every LayerNorm (or RMSNorm) frozen at its scale on the final residual ``final`` ``(B, T, D)``.

    The returned ``readout(component (..., B, T, D), with_bias)`` -> ``(..., B, classes)`` is linear in the
    component when ``with_bias`` is False: each norm centres the component and divides by the scale the final
    residual had there (TransformerLens's ``apply_ln_to_stack``), then multiplies by its weight. The biases
    (norm offsets, head biases) come in once, through ``readout(zeros, True)``.
    """
    def scale(x: Tensor, norm: nn.LayerNorm | nn.RMSNorm) -> Tensor:
        if isinstance(norm, nn.RMSNorm):  # AIMv2: the root mean square, about zero
            return (x.pow(2).mean(dim=-1, keepdim=True) + norm.eps).sqrt()
        return (x.var(dim=-1, unbiased=False, keepdim=True) + norm.eps).sqrt()

    def frozen(x: Tensor, norm: nn.Module, s: Tensor | None, bias: bool) -> Tensor:
        if isinstance(norm, nn.RMSNorm):  # no centring and no offset: linear as it is once its scale is fixed
            return x / s * norm.weight
        if not isinstance(norm, nn.LayerNorm):  # nn.Identity when fc_norm replaces the token norm
            return x
        x = (x - x.mean(dim=-1, keepdim=True)) / s * norm.weight
        return x + norm.bias if bias else x

    _check_linear_pooling(model, "direct logit attribution")
    if not isinstance(model.head, nn.Linear):
        raise MechanismError("direct logit attribution splits a linear head; this model's head is not linear "
                             "(a cosine to typed labels)")
    p = model.num_prefix_tokens
    pooling = model.config.pooling
    s_norm = scale(final, model.norm) if isinstance(model.norm, (nn.LayerNorm, nn.RMSNorm)) else None  # (B, T, 1)

    def pool(x: Tensor) -> Tensor:
        if pooling == "cls":
            return x[..., 0, :]
        if pooling == "avg":
            return x[..., p:, :].mean(dim=-2)
        return torch.cat([x[..., 0, :], x[..., p:, :].mean(dim=-2)], dim=-1)

    normed_final = model.norm(final)
    s_fc = scale(pool(normed_final), model.fc_norm) if model.fc_norm is not None else None  # (B, 1)

    def readout(component: Tensor, with_bias: bool) -> Tensor:
        x = frozen(component, model.norm, s_norm, with_bias)
        pooled = pool(x)
        if model.fc_norm is not None:
            pooled = frozen(pooled, model.fc_norm, s_fc, with_bias)
        logits = F.linear(pooled, model.head.weight, model.head.bias if with_bias else None)
        if model.head_dist is not None:
            logits = (logits + F.linear(x[..., 1, :], model.head_dist.weight,
                                        model.head_dist.bias if with_bias else None)) / 2
        return logits

    return readout


@dataclass
class DirectLogitAttribution:
    """Each component's direct contribution to one class logit per image; the parts sum to ``logit``. Layer ``i``
    of ``heads``, ``attn_biases`` and ``mlps`` is block ``first_layer + i``."""

    heads: Tensor  # (B, L, H): each head's output (times layer scale) through the frozen final norm and head
    attn_biases: Tensor  # (B, L): each attention output projection's bias (times layer scale)
    mlps: Tensor  # (B, L): each MLP's output (times layer scale)
    embed: Tensor  # (B,): the stream entering block ``first_layer`` (the token embedding with positions at 0)
    bias: Tensor  # (B,): the final norms' offsets and the head bias
    logit: Tensor  # (B,): the model's logit for the class
    classes: Tensor  # (B,)
    first_layer: int = 0  # a model with stages: its last stage's first block (``last_stage``)

    def total(self) -> Tensor:
        return self.heads.sum((1, 2)) + self.attn_biases.sum(1) + self.mlps.sum(1) + self.embed + self.bias


def direct_logit_attribution(model: ViT, images: Tensor, classes: Tensor | int | None = None
                             ) -> DirectLogitAttribution:
    """Split each image's class logit (default: the predicted class) into heads, MLPs, embedding and biases.

    Exact: the final norm is linear once its scale is fixed at the final residual, so the parts sum to the
    logit (up to float rounding). Peak memory: one layer's ``B x H x T x D`` head outputs (each layer is read out
    before the next is split, so high-resolution inputs do not hold ``L`` of them).

    A model with stages (Swin, Hiera) is split on its last stage only: the stream entering it (after its patch
    merging or query pooling, one term in ``embed``) plus each of its blocks' heads and MLP. The merge and the
    pooling before it are not sums of what earlier blocks wrote; ``first_layer`` says where the split starts.
    """
    check_supported(model, needs_head=True)
    _check_linear_pooling(model, "direct logit attribution")
    if model.config.post_norm or model.config.res_post_norm:
        raise MechanismError("direct logit attribution splits the last residual stream into the sum of what each "
                             "head and MLP wrote, and this model's post-norm blocks normalise that sum (or each "
                             "branch) after every block; the logit lens and head ablation still apply")
    with torch.no_grad():
        first, L = last_stage(model), len(model.blocks)
        H, hd = model.blocks[first].attn.num_heads, model.blocks[first].attn.head_dim
        opening = model.blocks[first]
        entry = (f"blocks.{first}.hook_merged" if getattr(opening, "hook_merged", None) is not None
                 else f"blocks.{first}.hook_resid_pre")
        names = [entry, f"blocks.{L - 1}.hook_resid_post"] + [
            f"blocks.{layer}.{point}" for layer in range(first, L)
            for point in ("attn.hook_z", "hook_attn_out", "hook_mlp_out")]
        cache: dict[str, Tensor] = {}
        layouts = model.layer_layouts(grid_of(model, images))
        B, T = images.shape[0], model.num_prefix_tokens + layouts[-1].num_tokens
        D = _last_width(model)
        check_budget(4 * B * H * T * D, "splitting a layer into its heads")
        check_budget(B * (L - first) * T * (2 * D + H * hd), "keeping every layer's head contexts")
        with model.hooks([(name, _keep(cache)) for name in names]):
            model.tokens(images)
        embed, x = cache[entry], cache[f"blocks.{L - 1}.hook_resid_post"]
        readout = _linear_readout(model, x)
        logits = model.classify(x)
        classes = class_indices(logits, classes)

        def pick(values: Tensor) -> Tensor:  # (..., B, classes) -> (..., B)
            return values.gather(-1, classes.view(*([1] * (values.dim() - 2)), B, 1)
                                 .expand(*values.shape[:-1], 1))[..., 0]

        heads, attn_biases, mlps = [], [], []  # per layer (H, B), (B,), (B,): one layer's heads held at a time
        for layer in range(first, L):
            block = model.blocks[layer]
            context = cache.pop(f"blocks.{layer}.attn.hook_z")  # (B, T, H, hd), or (B * nw, w*w, H, hd) windowed
            w = block.attn.proj.weight.view(D, H, hd)  # columns of proj grouped by head
            per_head = torch.einsum("bthe,dhe->hbtd", context, w)  # (H, B, T, D) or (H, B * nw, w*w, D)
            if per_head.shape[1:3] != (B, T):  # windows (Swin's, Hiera's mask units): back to the grid's tokens
                lay = layouts[layer]
                per_head = lay.join(per_head.flatten(0, 1).contiguous()).view(H, B, T, D)
            if block.ls1 is not None:
                per_head = per_head * block.ls1
            # What the branch added beyond its heads: proj's bias (and a mean-ablated copy's means), times ls1.
            bias = cache[f"blocks.{layer}.hook_attn_out"] - per_head.sum(0)
            heads.append(pick(readout(per_head, False)))
            attn_biases.append(pick(readout(bias, False)))
            mlps.append(pick(readout(cache[f"blocks.{layer}.hook_mlp_out"], False)))
        return DirectLogitAttribution(
            heads=torch.stack(heads, dim=0).permute(2, 0, 1),  # (B, L, H)
            attn_biases=torch.stack(attn_biases, dim=1),
            mlps=torch.stack(mlps, dim=1),
            embed=pick(readout(embed, False)),
            bias=pick(readout(torch.zeros_like(x), True)),
            logit=pick(logits), classes=classes, first_layer=first)

