"""The phenomena of the residual stream and the attention: high-norm tokens (Darcet et al. 2023), massive
activations (Sun et al. 2024, locuslab/massive-activations ``main_vit.py``), attention sinks, and register neurons
with test-time registers (nickjiang2378/test-time-registers).

Each runs the model's own forward and reads or edits it at its hook points, as ``vit.explain.mechanism.components``
does, with its checks and shapes: hidden states ``(B, L + 1, T, D)``, layers and heads counted from 0.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from vit.explain.mechanism.forward_reads import (
    MechanismError,
    _dims,
    check_budget,
    check_one_grid,
    check_supported,
    grid_of,
)
from vit.explain.methods.chunked import LayerInputs
from vit.explain.methods.hidden import layout_problem
from vit.model import ViT


def token_norms(states: Tensor) -> Tensor:
    """The L2 norm of every token in every layer: hidden states ``(B, L + 1, T, D)`` -> ``(B, L + 1, T)``."""
    return states.float().norm(dim=-1)


def high_norm_rate(norms: Tensor, threshold: float, num_prefix_tokens: int) -> tuple[Tensor, Tensor]:
    """Share of patch tokens over ``threshold`` per layer ``(B, L + 1)``, and the mask ``(B, L + 1, T)`` of every
    token over it (Darcet et al. 2023's artefacts are the patches among them)."""
    mask = norms > threshold
    return mask[..., num_prefix_tokens:].float().mean(dim=-1), mask


def massive_activations(states: Tensor | Sequence[Tensor]) -> Tensor:
    """Per image and block ``(B, L, 4)``: the top 3 of |block output| over all tokens and channels, then their
    median (locuslab/massive-activations ``main_vit.py --exp2``, before its mean over images). ``states``: hidden
    states ``(B, L + 1, T, D)``, or a model with stages' block outputs, each ``(B, T_l, D_l)`` on its own grid."""
    outputs = states[:, 1:].unbind(1) if isinstance(states, Tensor) else states
    stats = []
    for output in outputs:
        flat = output.abs().flatten(1)  # (B, T*D): one block's output
        stats.append(torch.cat([flat.topk(3, dim=-1).values, flat.median(dim=-1).values[:, None]], dim=-1))
    return torch.stack(stats, dim=1)


@dataclass
class Sinks:
    """Per image, layer and head: the key token that receives the most attention (averaged over queries), the
    share of attention it receives, and the norm of its value vector in that head."""

    token: Tensor  # (B, L, H) long
    mass: Tensor  # (B, L, H) in [0, 1]
    value_norm: Tensor  # (B, L, H)


def sink_stats(model: ViT, states: Tensor, grid: tuple[int, int] | None = None) -> Sinks:
    """Attention sinks from the hidden states ``(B, L + 1, T, D)`` on the patch ``grid`` (needed by models with
    rotary positions or an attention layout): each layer's attention summed over queries in head and query chunks
    (``LayerInputs.chunks``: the layer's own, bias and windows included), never a whole ``H x T x T`` layer."""
    check_supported(model)
    check_one_grid(model, "attention sinks")
    if grid is None and model.config.rope != "none":
        raise MechanismError("this model turns q and k by rotary positions, so the patch grid must be given")
    if grid is None and layout_problem(model):
        raise MechanismError(f"this model {layout_problem(model)}, so the patch grid must be given")
    B, S, T, D = states.shape
    L, H, hd = _dims(model)
    inputs = LayerInputs(model, states, grid)
    tokens, masses, norms = [], [], []
    with torch.no_grad():
        for layer in range(L):
            v = inputs.values(layer)  # (B, H, T, hd)
            received = torch.zeros(B, H, T, dtype=torch.float32, device=v.device)  # attention each key gets
            # the layer's own chunks: with its bias, and a windowed layer's rows placed from their windows
            for hs, _, probs in inputs.chunks(layer):  # probs (B, h, t, T)
                received[:, hs] += probs.to(v.device).sum(dim=2)
            mass, token = (received / T).max(dim=-1)  # (B, H): averaged over queries
            value_norm = v.norm(dim=-1).gather(-1, token[..., None])[..., 0]  # (B, H)
            tokens.append(token), masses.append(mass), norms.append(value_norm)
    return Sinks(torch.stack(tokens, 1), torch.stack(masses, 1), torch.stack(norms, 1))


def _check_plain_mlp(model: ViT) -> None:
    check_supported(model)
    check_one_grid(model, "register neurons and test-time registers")
    c = model.config
    if c.gated_mlp or c.mlp_norm or c.activation != "gelu" or any(
            not (hasattr(b.mlp, "fc1") and hasattr(b.mlp, "fc2")) for b in model.blocks):
        raise MechanismError("register neurons need an fc1-GELU-fc2 MLP; this model's MLP is another kind")
    if c.rope != "none":
        raise MechanismError("test-time registers are tokens appended after the patches, where rotary positions "
                             "would turn them as patches; this model has rotary positions")


def register_neuron_scores(model: ViT, images: Tensor, threshold: float, detect_layer: int = -1
                           ) -> tuple[Tensor, int]:
    """Jiang et al. 2025's register-neuron scores ``(L, mlp)`` and how many images had outliers.

    As nickjiang2378/test-time-registers ``shared/algorithms.py`` ``find_register_neurons`` (no sparsity
    filter): per image, the outlier positions are the tokens whose norm after block ``detect_layer`` is over
    ``threshold``; each MLP neuron scores its mean |post-GELU activation| there; images without outliers are
    skipped and the scores are averaged over the others. Refuses a model whose MLP is not fc1-GELU-fc2.
    """
    _check_plain_mlp(model)
    L = len(model.blocks)
    scores, used = torch.zeros(L, model.config.mlp_size), 0
    names = [f"blocks.{layer}.{point}" for layer in range(L) for point in ("mlp.hook_post", "hook_resid_post")]
    with torch.no_grad():
        for image in images.split(1):
            T = model.num_prefix_tokens + math.prod(grid_of(model, image))
            check_budget(L * T * model.config.mlp_size, "keeping every layer's MLP activations")
            _, cache = model.run_with_cache(image, names)
            acts = [cache[f"blocks.{layer}.mlp.hook_post"][0] for layer in range(L)]  # each (T, mlp): post-GELU
            outputs = [cache[f"blocks.{layer}.hook_resid_post"][0] for layer in range(L)]  # each (T, D)
            where = outputs[detect_layer].norm(dim=-1) > threshold  # (T,)
            if not bool(where.any()):
                continue
            scores += torch.stack([a[where].abs().mean(dim=0) for a in acts]).float().cpu()
            used += 1
    if used == 0:
        raise MechanismError(f"no token's norm exceeds {threshold:g} in any image; lower the threshold")
    return scores / used, used


def find_register_neurons(model: ViT, images: Tensor, threshold: float, detect_layer: int = -1,
                          top_k: int = 10) -> list[tuple[int, int, float]]:
    """The ``top_k`` register neurons ``(layer, neuron, score)`` (from 0), best first."""
    scores, _ = register_neuron_scores(model, images, threshold, detect_layer)
    values, order = scores.flatten().sort(descending=True)
    width = scores.shape[1]
    return [(int(i) // width, int(i) % width, float(v)) for v, i in zip(values[:top_k], order[:top_k], strict=True)]


def _sign_max(values: Tensor) -> Tensor:
    """test-time-registers' ``sign_max`` per image: the entry of largest magnitude over all but the batch axis."""
    flat = values.flatten(1)
    top, bottom = flat.max(dim=1).values, flat.min(dim=1).values
    return torch.where(top.abs() > bottom.abs(), top, bottom)


def with_test_time_registers(model: ViT, images: Tensor, neurons: dict[int, Sequence[int]], num_registers: int = 1,
                             output_attentions: bool = False, contexts: list[Tensor] | None = None
                             ) -> tuple[Tensor | None, tuple[Tensor, ...] | None, Tensor]:
    """``model(images)`` with Jiang et al.'s test-time registers: ``num_registers`` zero tokens appended after the
    patches, and in each layer's MLP the register neurons ``neurons[layer]`` (from ``find_register_neurons``)
    zeroed on the patches and set on the new tokens to the signed maximum of their activations (their
    ``activate_on_registers`` with ``normal_values="zero"``). Returns the logits (read without the new tokens),
    the attentions ``(B, H, T + R, T + R)`` when asked, and the last block's output ``(B, T + R, D)``. A
    ``contexts`` list receives each layer's per-head context ``(B, T + R, H, hd)`` (what mean ablation averages).
    """
    _check_plain_mlp(model)
    if layout_problem(model):
        raise MechanismError(f"test-time registers are tokens appended after the patches, and this model "
                             f"{layout_problem(model)}, which has no place for them")
    if isinstance(num_registers, bool) or not isinstance(num_registers, int) or num_registers < 1:
        raise MechanismError(f"give at least one test-time register, got {num_registers!r}")
    L, R, P = len(model.blocks), num_registers, model.num_prefix_tokens
    for layer, chosen in neurons.items():
        if not 0 <= layer < L or any(not 0 <= n < model.config.mlp_size for n in chosen):
            raise MechanismError(f"register neuron(s) {list(chosen)} of layer {layer + 1} do not exist: the model has "
                                 f"{L} layers of {model.config.mlp_size} MLP neurons")

    def registers_on(hidden: Tensor, hook, idx: list[int]) -> Tensor:  # (B, T + R, mlp)
        value = _sign_max(hidden[:, :, idx])  # (B,)
        hidden = hidden.clone()
        hidden[:, -R:, idx] = value[:, None, None].to(hidden.dtype)
        hidden[:, P:-R, idx] = 0
        return hidden

    x = model.embed(images)
    x = torch.cat([x, x.new_zeros(x.shape[0], R, x.shape[2])], dim=1)  # (B, T + R, D)
    hooks = [(f"blocks.{layer}.mlp.hook_post", functools.partial(registers_on, idx=list(chosen)))
             for layer, chosen in neurons.items() if chosen]
    if contexts is not None:  # each layer's per-head context, in layer order: what mean ablation averages
        hooks += [(f"blocks.{layer}.attn.hook_z", lambda z, hook: contexts.append(z)) for layer in range(L)]
    with model.hooks(hooks):
        x, attentions = model.run_blocks(x, None, 0, None, output_attentions)
    return model.classify(x[:, :-R]), attentions, x
