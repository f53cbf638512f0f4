"""AttnLRP of a VLM's answer token to the pixels, through the language model, the projector and the tower (Achtibat et
al. 2024, "AttnLRP: Attention-Aware Layer-Wise Relevance Propagation for Transformers", ICML; the efficient rules of
rachtibat/LRP-eXplains-Transformers, ``lxt/efficient``).

The target is ``y``, the logit of answer token ``i`` at the query that predicted it, from one forward of transformers'
whole model over the prompt and the answer's first ``i`` tokens (``vit.explain.language.vlm_relevance``'s). The forward
is the model's own; under the rules its elementary operations take lxt's rules in the gradient x input framework, and
the map is ``pixel_values * dy/dpixel_values`` summed over the channels and over each patch of the tower:

- every RMSNorm (the language model's, its q / k norms, Qwen's tower and merger) and every LayerNorm holds its scale
  constant (the identity rule: lxt's ``rms_norm_forward``, ``layer_norm_forward``; Gemma's ``_norm`` as lxt's
  ``gemma3`` map patches it, its ``1 + weight`` outside the rule);
- every gated MLP (``gate_proj``, ``up_proj``, ``down_proj``, ``act_fn``: the language model's SwiGLU or GeGLU,
  Qwen's tower's; or one ``gate_up_proj`` split in halves, GLM-4.1V's language model's) takes the identity rule on
  its activation and the uniform rule on its product (lxt's ``gated_mlp_forward``, which its ``qwen2``, ``llama`` and
  ``gemma3`` maps patch);
- every other element-wise activation module (the towers' and the projectors' GELU) takes the identity rule (lxt's
  ``non_linear_forward``);
- every attention call, the tower's and the language model's, divides the gradients of its q and k by 4 and of its v
  by 2 (the uniform rule on both matmuls: lxt's ``wrap_attention_forward``), at the recording attention function of
  ``vit.explain.language.vlm_attention`` that the model's attention already runs through;
- everything else keeps its plain gradient (the epsilon rule): the projections, the embeddings and the image
  features' scatter into them, RoPE and M-RoPE (lxt's maps leave ``apply_rotary_pos_emb`` unpatched), the softmax,
  the pixel shuffle and pooling of the projectors, Gemma's soft caps.

The rules are the ones ``vit.explain.methods.relevance.AttnLRPRules`` applies to this project's towers (its autograd
functions are used here); they are put on transformers' modules once, each module's own computation kept where no
rule is current, and made current for one forward by a context variable, so an answer generated meanwhile in
another thread runs the plain model. What the forward and backward hold is counted first
(``vit.costs.plan.vlm_attnlrp``).
"""

from __future__ import annotations

import contextlib
import functools
import types

import torch

from vit.explain.language.answer_maps import either
from vit.explain.language.vlm_attention import RULES, route_attention, use_recording_attention
from vit.explain.language.vlm_layouts import NEXT_TILES
from vit.explain.methods.relevance import AttnLRPRules, _IdentityRule

_RULED = "_vit_attnlrp_ruled"  # set on a module whose forward the rules reach


def _hf_rms_norm(module, x: torch.Tensor) -> torch.Tensor:
    """transformers' RMSNorm (``variance_epsilon``) with its scale held constant: lxt's ``rms_norm_forward``."""
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + module.variance_epsilon).detach()
    return module.weight * x.to(dtype)


def _gemma_norm(module, x: torch.Tensor) -> torch.Tensor:
    """Gemma's ``_norm`` with its scale held constant: lxt's ``gemma3_norm`` (``forward`` adds ``1 + weight``)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + module.eps).detach()


def _layer_norm(module, x: torch.Tensor) -> torch.Tensor:
    """LayerNorm with its scale held constant: ``AttnLRPRules.layer_norm`` (lxt's ``layer_norm_forward``)."""
    mean = x.mean(dim=-1, keepdim=True)
    y = (x - mean) / ((x - mean) ** 2).mean(dim=-1, keepdim=True).add(module.eps).sqrt().detach()
    if module.weight is not None:
        y = y * module.weight
    # contiguous as torch's LayerNorm returns it: element-wise ops keep the input's strides, and a residual stream
    # begun as a transposed patch embedding (Idefics3's) would reach a .view() (its pixel shuffle) that cannot take them
    return (y + module.bias if module.bias is not None else y).contiguous()


def _gated_mlp(module, x: torch.Tensor) -> torch.Tensor:
    """``down(act(gate(x)) * up(x))``: the identity rule on the activation, the uniform rule on the product (lxt's
    ``gated_mlp_forward``; ``AttnLRPRules.product``)."""
    gate = _IdentityRule.apply(module.gate_proj(x), module.act_fn)
    return module.down_proj(RULES.get().product(gate, module.up_proj(x)))


def _fused_gated_mlp(module, x: torch.Tensor) -> torch.Tensor:
    """``down(up * act(gate))`` whose gate and up projections are one linear split in halves (``gate_up_proj``,
    ``activation_fn``: GLM-4.1V's language model's, Phi-3's): the gated MLP's rules on its two halves."""
    gate, up = module.gate_up_proj(x).chunk(2, dim=-1)
    gate = _IdentityRule.apply(gate, module.activation_fn)
    return module.down_proj(RULES.get().product(gate, up))


def _activation(module, x: torch.Tensor) -> torch.Tensor:
    """An element-wise activation with the identity rule: lxt's ``non_linear_forward``."""
    return _IdentityRule.apply(x, functools.partial(type(module).forward, module))


def _activation_classes() -> tuple[type, ...]:
    from transformers import activations

    return tuple(c for c in vars(activations).values()
                 if isinstance(c, type) and issubclass(c, torch.nn.Module) and c.__module__ == activations.__name__)


def _rule_of(module: torch.nn.Module, activations: tuple[type, ...]):
    """``(method name, rule(module, x))`` of a module whose computation takes a rule, else None."""
    if isinstance(module, torch.nn.LayerNorm):
        return "forward", _layer_norm
    if hasattr(module, "variance_epsilon") and hasattr(module, "weight"):
        return "forward", _hf_rms_norm
    if callable(getattr(module, "_norm", None)) and hasattr(module, "eps"):
        return "_norm", _gemma_norm
    if all(hasattr(module, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn")):
        return "forward", _gated_mlp
    if all(hasattr(module, name) for name in ("gate_up_proj", "down_proj", "activation_fn")):
        return "forward", _fused_gated_mlp
    if isinstance(module, (*activations, torch.nn.GELU, torch.nn.SiLU, torch.nn.Tanh)):
        return "forward", _activation
    return None


def _put(module: torch.nn.Module, name: str, rule) -> None:
    """``module.name`` (its ``forward``, Gemma's ``_norm``) made to apply ``rule`` while rules are current, its
    class's own method otherwise; bound as a method of the module, so that a copy of the model calls its own. A
    module accelerate placed (``device_map``: its ``_hf_hook`` wraps ``forward``) still runs the hook around it,
    which brings an offloaded module's weights in before and takes them out after."""
    def method(self, x, *args, **kwargs):
        hook = getattr(self, "_hf_hook", None) if name == "forward" else None
        if hook is not None:
            (x, *args), kwargs = hook.pre_forward(self, x, *args, **kwargs)
        if RULES.get() is None or args or kwargs:
            out = getattr(type(self), name)(self, x, *args, **kwargs)
        else:
            out = rule(self, x)
        return hook.post_forward(self, out) if hook is not None else out
    setattr(module, name, types.MethodType(method, module))
    setattr(module, _RULED, True)


def tower_of(vlm) -> torch.nn.Module:
    """transformers' vision tower inside the VLM (``vision_tower``, Qwen's ``visual``)."""
    inner = getattr(vlm.model, "model", vlm.model)  # Llama 4 keeps its parts on the generating model itself
    tower = getattr(inner, "vision_tower", None) or getattr(inner, "visual", None) or getattr(inner, "vision_model",
                                                                                               None)
    if tower is None:
        raise ValueError(f"{type(vlm.model).__name__} keeps its vision tower under no name known here")
    return tower


def use_rules(vlm) -> None:
    """Put the rules on ``vlm``'s modules (once): each computes as its class does unless ``RULES`` holds rules; the
    tower's attention, as the language model's, runs through the recording attention function, which applies the
    attention's rule."""
    use_recording_attention(vlm)
    route_attention(tower_of(vlm))
    put_rules(vlm.model)


def put_rules(root: torch.nn.Module) -> None:
    """Put the rules on every module of ``root`` whose computation takes one (once each): the norms, the gated MLPs
    and the activations compute as their classes do unless ``RULES`` holds rules. The attention's rule is the
    recording attention function's, which ``root``'s attention must already run through (a VLM's, or a model
    opened by the library road)."""
    activations = _activation_classes()
    for module in root.modules():
        if getattr(module, _RULED, False):
            continue
        found = _rule_of(module, activations)
        if found is not None:
            _put(module, *found)


def unruled_norms(root: torch.nn.Module) -> list[str]:
    """The class names of ``root``'s normalisation modules no rule reaches (a name with "Norm" that is not a
    LayerNorm, an RMSNorm with ``variance_epsilon`` or Gemma's ``_norm``): AttnLRP would pass their plain gradient,
    which is not lxt's identity rule."""
    activations = _activation_classes()
    return sorted({type(m).__name__ for m in root.modules()
                   if "Norm" in type(m).__name__ and _rule_of(m, activations) is None})


def unruled_gates(root: torch.nn.Module) -> list[str]:
    """The class names of ``root``'s gated modules no rule reaches (a ``gate_proj`` or ``gate_up_proj`` outside the
    gated MLPs above: a mixture of experts' stacked expert weights): AttnLRP would pass their product's plain
    gradient, which is not lxt's uniform rule (lxt's maps have no rule for experts or their router)."""
    activations = _activation_classes()
    return sorted({type(m).__name__ for m in root.modules()
                   if any(hasattr(m, name) for name in ("gate_proj", "gate_up_proj"))
                   and _rule_of(m, activations) is None})


def check_rules(vlm) -> None:
    """ValueError (one line) when a module of ``vlm`` takes no rule here (``unruled_norms``, ``unruled_gates``, a
    hybrid's linear attention): its AttnLRP would not be lxt's."""
    from vit.explain.language.vlm_attention import linear_layers

    unruled = unruled_norms(vlm.model) + unruled_gates(vlm.model) + linear_layers(vlm.language_model)
    if unruled:
        raise ValueError(f"AttnLRP is not drawn for this {vlm.model_type} model: its {', '.join(unruled)} take no "
                         "AttnLRP rule here (lxt has none for a mixture of experts or a linear attention), so the "
                         f"map would not be AttnLRP's; use {either('gradxattn', 'tam')}")


@contextlib.contextmanager
def rules_current(rules: AttnLRPRules):
    """Within it, the ruled modules and the recording attention apply ``rules``."""
    token = RULES.set(rules)
    try:
        yield rules
    finally:
        RULES.reset(token)


def _patch_sums(relevance: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(n, C, H, W) input x gradient -> (n, gh, gw): summed over the channels and each patch."""
    n, _, H, W = relevance.shape
    gh, gw = grid
    return relevance.sum(1).reshape(n, gh, H // gh, gw, W // gw).sum((2, 4))


def on_grid(vlm, prepared, relevance: torch.Tensor, overview: bool) -> torch.Tensor:
    """The input x gradient of ``prepared``'s ``pixel_values`` (their shape) summed over the channels and each patch,
    on the answer's patch grid as the other maps are placed: Qwen-VL's flattened patches (merge unit after merge
    unit, each unit's patches row-major) row-major; InternVL's and Idefics3's crops on their canvas, the thumbnail
    or global image (the last tile) as the overview; Gemma 3's pan-and-scan crops on theirs, its original image (the
    first) as the overview; LLaVA-NeXT's and OneVision's crops on their canvas unpadded, the base image (the first)
    as the overview."""
    layout = prepared.layout
    if vlm.model_type == "molmo2":  # (crops, patches, pixels): its crops overlap, their margins on no canvas patch
        raise ValueError("AttnLRP's pixels are not placed on Molmo 2's overlapping crops here; use "
                         f"{either('gradxattn', 'tam')}")
    if relevance.dim() == 2:  # Qwen-VL: (gh * gw, C x frames x patch x patch) in merge-unit order
        (gh, gw), m = layout.grid, layout.unit
        return relevance.sum(-1).reshape(gh // m, gw // m, m, m).permute(0, 2, 1, 3).reshape(gh, gw)
    if layout.overview is None and vlm.model_type != "mllama":
        return _patch_sums(relevance.reshape(1, *relevance.shape[-3:]), layout.grid)[0]
    vh, vw = layout.view_grid
    if vlm.model_type in ("internvl", "gemma3", "idefics3", "smolvlm", "llama4", "mllama"):
        # (rows x cols + 1, vh, vw): InternVL's thumbnail and Idefics3's and Llama 4's global image last, Gemma 3's
        # original first; Llama 3.2 Vision's tile slots, the canvas's tiles first, no overview
        rows, cols = layout.grid[0] // vh, layout.grid[1] // vw
        tiles = _patch_sums(relevance.reshape(-1, *relevance.shape[-3:]), (vh, vw))
        whole, crops = ((None, tiles[:rows * cols]) if vlm.model_type == "mllama"
                        else (tiles[0], tiles[1:]) if vlm.model_type == "gemma3" else (tiles[-1], tiles[:-1]))
        if overview:
            return whole
        return crops.reshape(rows, cols, vh, vw).permute(0, 2, 1, 3).reshape(rows * vh, cols * vw)
    # A canvas read from a processor's code (vlm_read_layout.CANVASES: Perception LM's, Granite 4 Vision's,
    # Unlimited-OCR's): its layout places each image token on the canvas (``index``), but not which of the processor's
    # pixel views, and which pixels of it, a canvas patch was read from (a thumbnail's, a downsampled crop's, a 64-px
    # step of SAM's convolutions); AttnLRP's relevance is on those pixels, so it is not laid here
    if vlm.model_type not in NEXT_TILES:
        raise ValueError("AttnLRP's relevance is on the processor's pixel views, and this model's canvas places its "
                         "image tokens but not which view's pixels each canvas patch was read from; use "
                         f"{either('gradxattn', 'tam')}")
    from transformers.models.llava_next.modeling_llava_next import get_anyres_image_grid_shape

    config = vlm.model.config
    tiles = _patch_sums(relevance[0], (vh, vw))  # (1 + rows x cols, vh, vw), the base image first
    if overview:
        return tiles[0]
    rows, cols = get_anyres_image_grid_shape(prepared.inputs["image_sizes"][0], config.image_grid_pinpoints,
                                             config.vision_config.image_size)
    canvas = tiles[1:rows * cols + 1].reshape(rows, cols, vh, vw).permute(0, 2, 1, 3).reshape(rows * vh, cols * vw)
    height, width = layout.grid  # unpad_image keeps the middle rows or columns
    top, left = (rows * vh - height) // 2, (cols * vw - width) // 2
    return canvas[top:top + height, left:left + width]


def check(vlm, prepared, i: int) -> None:
    """Refused in one line (``TooManyTokens``) when answer token ``i``'s AttnLRP would hold more than the memory
    limit (``vit.costs.plan.vlm_attnlrp``); the last answer token's is the largest."""
    from vit.costs.plan import decide, vlm_attnlrp

    implementation = vlm.language_model.config._attn_implementation
    views, view_grid = prepared.tower()  # Llama 3.2 Vision's: one pass over every tile slot at once
    decide(vlm_attnlrp(vlm.tower_shape, prepared.layout.grid, prepared.text, prepared.prompt_tokens + i, i,
                       fused="eager" not in implementation, views=views, view_grid=view_grid))


def attnlrp(vlm, prepared, answer: tuple[int, ...], i: int, overview: bool = False) -> torch.Tensor:
    """(gh, gw) float32, signed: AttnLRP of answer token ``i``'s logit (at the query that predicted it) to the pixels
    the tower read, input x gradient summed over the channels and each patch (``on_grid``); see the module's
    docstring. Counted first (``vit.costs.plan.vlm_attnlrp``)."""
    from vit.explain.language.vlm_relevance import answer_run

    check_rules(vlm)
    check(vlm, prepared, i)
    use_rules(vlm)
    # Relevance needs autograd even where the caller (the app) runs under inference_mode
    with torch.inference_mode(False), torch.enable_grad(), rules_current(AttnLRPRules()), \
            answer_run(vlm, prepared, answer, i) as inputs:
        pixels = inputs["pixel_values"].detach().clone().requires_grad_(True)
        inputs["pixel_values"] = pixels
        out = vlm.model(**inputs, use_cache=False, logits_to_keep=1)
        [grad] = torch.autograd.grad(out.logits[0, -1, answer[i]], pixels)
    return on_grid(vlm, prepared, (pixels.detach() * grad).float().cpu(), overview)
