"""Ask a CLIP or SigLIP in words: zero-shot scores, and maps whose target is a prompt's similarity.

The text side gives constants: one L2-normalised embedding per prompt (``vit.sources.vlm.text_tower``),
the model's ``exp(logit_scale)`` and SigLIP's bias. ``prompt_model`` turns our image tower into a
classifier over the prompts by giving it a ``PromptHead`` — projection, L2 norm, cosine with each
prompt, scale (+ bias) — so that every class-map method (gradient rollout, AttnLRP, deletion and
insertion curves) explains a prompt exactly as it explains a class, on the same forward.
The methods whose authors read CLIP differently have their own functions here, ported from their code:

- Chefer et al. 2021b on CLIP (hila-chefer/Transformer-MM-Explainability ``CLIP_explainability.ipynb``,
  ``interpret``): gradient rollout of ``logits_per_image`` from ``start_layer`` (default the last layer only);
- LeGrad (WalBouss/LeGrad ``legrad/wrapper.py``): CLIP reads ``ln_post`` of the *mean over all tokens* at
  every layer (``compute_legrad_clip``); SigLIP applies the attention-pooling head to each layer's tokens and
  takes the gradient of its probe's attention, with the "empty prompt" correction (``compute_legrad_siglip``);
- Grad-ECLIP (Cyang-Zhao/Grad-Eclip ``generate_emap.py``, ``clip_encode_dense`` + ``grad_eclip``): the last
  block's attention replaced at its hook point by one head over the full width, as the authors do; the map is
  ``relu(sum_c(dcos/d(attn_output)[CLS] * v * minmax(cos(q_out[CLS], k_out))))`` over the patches;
- the training-free dense maps (SCLIP, NACLIP, ClearCLIP, MaskCLIP, CLIP Surgery:
  ``vit.explain.methods.dense_clip``): each patch token in the joint embedding after the authors' change of the last
  block(s), its similarity with the label;
- dino.txt's patch-text map (facebookresearch/dinov3 ``notebooks/dinotxt_segmentation_inference.ipynb``,
  ``predict_whole``): each patch token against the half of the label's text embedding aligned with the patches.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vit import registry
from vit.checkpoint import Checkpoint
from vit.explain.benchmarks.metrics import perturbation_curves
from vit.explain.methods import dense_clip
from vit.explain.methods.attention import positive_gradient_attention, relevance_rollout_row
from vit.explain.methods.relevance import attnlrp, patch_sums
from vit.model import ViT, current_rules

DEFAULT_TEMPLATE = "a photo of a {}."
MAX_TEMPLATE_CHARS = 200
TEXTS_PER_CALL = 1024  # texts encoded at once (a batch of 77 tokens each)
TEXTS_PER_STEP = 16  # texts encoded at once when the page follows the progress (a stop waits at most one step)


class PromptError(ValueError):
    """Prompts or a model the prompt maps cannot use; the message says what to do."""


# --- prompts and scores -----------------------------------------------------------------------------------

def imagenet_templates() -> list[str]:
    """The 80 templates open_clip (after OpenAI's notebook) ensembles for ImageNet, as ``{}`` strings."""
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES

    return [template("{}") for template in OPENAI_IMAGENET_TEMPLATES]


def check_template(template: str) -> str:
    """A template with exactly one ``{}`` where the label goes; ValueError (one line) otherwise."""
    if len(template) > MAX_TEMPLATE_CHARS:
        raise PromptError(f"the template is {len(template)} characters long; at most {MAX_TEMPLATE_CHARS}")
    if template.count("{}") != 1:
        raise PromptError(f"the template must hold '{{}}' exactly once, where the label goes (e.g. "
                          f"'{DEFAULT_TEMPLATE}', or '{{}}' for the labels as typed)")
    return template


def fill(template: str, label: str) -> str:
    """The template with the label in place of ``{}`` (never ``str.format``: user text is not a format spec)."""
    return template.replace("{}", label)


_ENDS_IN_ARTICLE = re.compile(r"(?:^|\s)(?:a|an|the)\s+$", re.IGNORECASE)  # the template's text before {}
_LEADING_ARTICLE = re.compile(r"^(?:a|an|the)\s+\S", re.IGNORECASE)  # "a dog", not "another dog" or a bare "A"


def doubled_article(template: str, labels: Sequence[str]) -> tuple[str, str] | None:
    """The first label that starts with an article where the template already puts one before ``{}``, and the
    prompt it makes (``("a dog", "a photo of a a dog.")``); None when there is none. Filled as typed all the same:
    open_clip's zero-shot classifiers do so too, and a label may be a whole phrase on purpose."""
    if not _ENDS_IN_ARTICLE.search(template.split("{}", 1)[0]):
        return None
    label = next((label for label in labels if _LEADING_ARTICLE.match(label.strip())), None)
    return None if label is None else (label, fill(template, label))


def prompt_embeddings(encode, labels: Sequence[str], templates: Sequence[str],
                      progress: Callable[[int, int], None] | None = None) -> Tensor:
    """``(n, E)`` normalised embeddings, one per label: with several templates, each label's template embeddings
    (normalised) are averaged and normalised again, as open_clip's ``build_zero_shot_classifier`` does.
    ``encode(texts) -> (len(texts), E)`` normalised embeddings (``TextTower.encode``). With ``progress``, texts
    are encoded ``TEXTS_PER_STEP`` at a time and ``progress(texts done, labels x templates)`` follows each step
    (it may raise to stop there)."""
    templates = [check_template(t) for t in templates]
    if not templates:
        raise PromptError("give at least one template")
    per_call = max(1, TEXTS_PER_CALL // len(templates))  # labels per text-tower call: a dataset's may be many
    step = TEXTS_PER_STEP if progress is not None else TEXTS_PER_CALL
    total, done = len(labels) * len(templates), 0
    if progress is not None:
        progress(0, total)
    parts = []
    for start in range(0, len(labels), per_call):
        chunk = labels[start:start + per_call]
        texts = [fill(t, label) for label in chunk for t in templates]
        encoded = []
        for first in range(0, len(texts), step):
            encoded.append(encode(texts[first:first + step]))
            done += len(encoded[-1])
            if progress is not None:
                progress(done, total)
        parts.append(torch.cat(encoded).reshape(len(chunk), len(templates), -1).mean(dim=1))  # (chunk, E)
    embeddings = torch.cat(parts)  # (n, E)
    return embeddings / embeddings.norm(dim=-1, keepdim=True)


class PromptHead(nn.Module):
    """The pooled vector -> one logit per prompt: ``scale * cos(projection(pooled), prompt) + bias``.

    Its L2 norm runs under the current relevance rules (``Rules.divide_by_norm``): AttnLRP treats the norm's factor
    as a constant in the backward pass, as its rule for LayerNorm treats the scale, so relevance flows through the
    cosine unchanged."""

    def __init__(self, projection: nn.Module | None, prompts: Tensor, scale: float, bias: float) -> None:
        super().__init__()
        self.projection = projection
        self.register_buffer("prompts", prompts.float())  # (n, E), L2-normalised
        self.scale, self.bias = float(scale), float(bias)

    def forward(self, pooled: Tensor) -> Tensor:
        embedding = self.projection(pooled) if self.projection is not None else pooled  # (B, E)
        embedding = current_rules().divide_by_norm(embedding, embedding.norm(dim=-1, keepdim=True))
        return self.scale * embedding @ self.prompts.to(embedding.dtype).T + self.bias  # (B, n)


def prompt_model(model: ViT, prompts: Tensor, scale: float, bias: float = 0.0) -> ViT:
    """``model`` as a classifier over ``prompts`` ``(n, E)`` (normalised text embeddings): its logits are the
    image-text logits CLIP (``bias=0``) or SigLIP reads. Shares every weight with ``model`` (not copied)."""
    if model.head is not None and model.projection is None:
        raise PromptError("this model is a classifier without a joint image-text embedding; asking in words "
                          "needs a CLIP or SigLIP")
    width = model.config.projection_dim or model.config.hidden_size * (2 if model.config.pooling == "cls+avg" else 1)
    if prompts.dim() != 2 or prompts.shape[1] != width:
        raise PromptError(f"text embeddings of shape {tuple(prompts.shape)} do not fit this image tower's "
                          f"{width}-d embedding: the text side belongs to another model")
    wrapped = copy.copy(model)
    wrapped._modules = dict(model._modules)  # a copy of the module table, so the original keeps its own head
    wrapped.config = replace(model.config, num_classes=prompts.shape[0], projection_dim=0, distillation_head=False)
    wrapped.head = PromptHead(model.projection, prompts.to(next(model.parameters()).device), scale, bias)
    wrapped.projection = None
    wrapped.head_dist = None
    return wrapped


def zero_shot(model: ViT, images: Tensor, prompts: Tensor, scale: float, bias: float, kind: str
              ) -> tuple[Tensor, Tensor]:
    """``(logits, probabilities)``, each ``(B, n)``: softmax over the prompts for CLIP (``kind="softmax"``),
    each prompt's own sigmoid for SigLIP (``"sigmoid"``). ``model`` is a port's ``ViT``, or a tower opened on the
    library road whose own output is its image embedding (``tower_embedding``: an open_clip tower)."""
    if kind not in ("softmax", "sigmoid"):
        raise ValueError(f"kind must be softmax or sigmoid, got {kind!r}")
    with torch.inference_mode():
        if isinstance(model, ViT):
            logits = prompt_model(model, prompts, scale, bias)(images)[0].float()
        else:  # the same head on the library's own embedding
            logits = PromptHead(None, prompts, scale, bias)(fitting(tower_embedding(model, images), prompts)).float()
    return logits, logits.softmax(dim=-1) if kind == "softmax" else logits.sigmoid()


def tower_embedding(model: nn.Module, images: Tensor) -> Tensor:
    """``(B, E)``: the image embedding of a tower opened on the library road (``embedding_of`` its forward)."""
    return embedding_of(model.run(images)[0]).float()


def embedding_of(out) -> Tensor:
    """``(B, E)``: the image embedding in a library-road forward's output ``out``, its library's own (open_clip's
    ``encode_image`` before its normalisation: a timm trunk's tower, CoCa's pooled query, a ResNet's attention pool).
    PromptError (one line) for a model whose output is not one vector an image."""
    embedding = getattr(out, "image_embeds", None)
    if not isinstance(embedding, Tensor) or embedding.dim() != 2:
        raise PromptError("this model's output is no image embedding (one vector an image): asking in words needs "
                          "a CLIP or SigLIP whose image tower gives one")
    return embedding


def fitting(embedding: Tensor, prompts: Tensor) -> Tensor:
    """``embedding (B, E)`` where ``prompts (n, E)`` fit it; PromptError (one line) where the text side is
    another model's."""
    if prompts.dim() != 2 or prompts.shape[1] != embedding.shape[1]:
        raise PromptError(f"text embeddings of shape {tuple(prompts.shape)} do not fit this image tower's "
                          f"{embedding.shape[1]}-d embedding: the text side belongs to another model")
    return embedding


def _grad_context():
    return torch.inference_mode(False), torch.enable_grad()


def _index(index: int | Tensor, batch: int, n: int) -> Tensor:
    index = torch.as_tensor(index).long()
    index = index.expand(batch) if index.dim() == 0 else index
    if index.shape != (batch,) or bool(((index < 0) | (index >= n)).any()):
        raise ValueError(f"prompt index {index.tolist()} is out of range for {n} prompts")
    return index


def _targets(index: int | Tensor, images: Tensor, n: int) -> Tensor:
    """The prompt of each map: ``(B,)``, one per image, or ``(k,)`` for one image ``(1, C, H, W)`` asked ``k``
    prompts."""
    index = torch.as_tensor(index)
    one_image = images.shape[0] == 1 and index.dim() == 1
    return _index(index, index.numel() if one_image else images.shape[0], n)


def _prompt_gradients(scores: Tensor, inputs: Sequence[Tensor], batch: int) -> list[Tensor]:
    """``d scores[i] / d inputs``, each ``(k, ...)``, for ``scores (k,)`` read from a forward of ``batch`` images:
    one backward when each score has its own image, else (one image, ``k`` prompts) one backward per prompt from
    the shared forward, as the authors' Grad-ECLIP does: each backward stops at ``inputs``, so ``k`` of them cost
    less than ``k - 1`` more forwards."""
    if scores.shape[0] == batch:
        return list(torch.autograd.grad(scores.sum(), inputs, retain_graph=True))
    per_prompt = [torch.autograd.grad(score, inputs, retain_graph=True) for score in scores]
    return [torch.cat(grads) for grads in zip(*per_prompt, strict=True)]


def _need_class_token(model: ViT, method: str) -> None:
    if not model.config.class_token or model.config.pooling != "cls":
        raise PromptError(f"{method} reads the CLS token, which this model does not pool (SigLIP reads its tokens "
                          "through an attention-pooling head); use LeGrad or the attention-pooling map")


# --- Chefer et al. 2021b on CLIP -------------------------------------------------------------------------------

def prompt_rollout(model: ViT, images: Tensor, prompts: Tensor, scale: float, index: int | Tensor,
                   start_layer: int = -1, bias: float = 0.0) -> Tensor:
    """Gradient rollout of the prompt's logit (``interpret`` of Transformer-MM-Explainability's CLIP notebook):
    layers before ``start_layer`` are skipped (-1: the last layer only, the notebook's default).
    Returns ``(B, gh, gw)``: ``R[:, 0, 1:]`` over the patch grid; for one image ``(1, C, H, W)`` and ``k`` indices,
    ``(k, gh, gw)`` from one forward."""
    _need_class_token(model, "gradient rollout")
    L = len(model.blocks)
    first = L - 1 if start_layer == -1 else start_layer
    if not 0 <= first < L:
        raise ValueError(f"start_layer {start_layer} is out of range for {L} layers")
    wrapped = prompt_model(model, prompts, scale, bias)
    idx = _targets(index, images, prompts.shape[0])
    grid = model.patch_grid(images.shape[2], images.shape[3])
    inference, grad_mode = _grad_context()
    with inference, grad_mode:
        names = [f"blocks.{i}.attn.hook_pattern" for i in range(first, L)]  # the layers before run fused
        cache: dict[str, Tensor] = {}

        def keep(t: Tensor, hook) -> None:
            cache[hook.name] = t

        x = images.detach().clone().requires_grad_(True)  # a graph even where the weights are frozen
        with wrapped.hooks([(name, keep) for name in names]):  # the last block for CLS alone: what the map reads
            out, _ = wrapped.run_blocks(wrapped.embed(x), grid, queries=1)  # (B, 1, D)
        logits = wrapped.classify(out)  # (B, n)
        scores = logits.expand(len(idx), -1).gather(1, idx[:, None].to(logits.device))[:, 0]  # (k,)
        attentions = [cache[name] for name in names]  # (B, nh, T, T); the last (B, nh, 1, T)
        gradients = _prompt_gradients(scores, attentions, images.shape[0])
        terms = [positive_gradient_attention(a.detach().expand_as(g), g.detach())
                 for a, g in zip(attentions, gradients, strict=True)]  # (k, T, T); the last (k, 1, T)
    T = terms[-1].shape[-1]
    last = terms[-1].new_zeros(len(idx), T, T)
    last[:, :1] = terms[-1]  # the CLS row of R reads no other row of the last layer's term
    R = relevance_rollout_row([*terms[:-1], last], 0)  # (k, T): R[:, 0]
    return R[:, model.num_prefix_tokens:].reshape(-1, *grid)


# --- LeGrad ----------------------------------------------------------------------------------------------------

def _min_max(maps: Tensor) -> Tensor:
    """LeGrad's ``min_max`` per map over its last two dimensions."""
    flat = maps.reshape(maps.shape[0], -1)
    low, high = flat.min(dim=-1)[0], flat.max(dim=-1)[0]
    return (maps - low[:, None, None]) / (high - low)[:, None, None]


def prompt_legrad(model: ViT, images: Tensor, prompts: Tensor, index: int | Tensor, start_layer: int = -2,
                  empty: Tensor | None = None, correction_threshold: float = 0.8) -> Tensor:
    """LeGrad for a prompt, with the authors' CLIP or SigLIP readout (see the module docstring): ``(B, gh, gw)``
    min-max normalised as ``compute_legrad`` returns it (before its bilinear upsampling); for one image
    ``(1, C, H, W)`` and ``k`` indices, ``(k, gh, gw)`` from one forward.

    ``empty`` (the normalised embedding of 'a photo of a') switches on SigLIP's correction: patches whose
    map for the empty prompt exceeds ``correction_threshold`` are zeroed (the authors' default)."""
    L = len(model.blocks)
    if not -L <= start_layer < L:
        raise ValueError(f"start_layer {start_layer} is out of range for {L} layers")
    first = start_layer % L
    siglip = model.config.pooling == "map"
    if not siglip and (model.config.pooling != "cls" or not model.config.class_token or model.projection is None):
        raise PromptError("LeGrad's CLIP readout needs a CLIP image tower (CLS token, ln_post and projection)")
    grid = model.patch_grid(images.shape[2], images.shape[3])
    inference, grad_mode = _grad_context()
    with inference, grad_mode:
        x = images.detach().clone().requires_grad_(True)  # a graph even where the weights are frozen
        B = x.shape[0]
        idx = _targets(index, x, prompts.shape[0])
        k = len(idx)
        target = prompts[idx].to(x.dtype)  # (k, E)
        names = [f"blocks.{i}.{point}" for i in range(first, L) for point in ("hook_resid_post", "attn.hook_pattern")]
        _, cache = model.run_with_cache(x, names)
        maps, empty_maps = 0, 0
        for i in range(first, L):
            h, probs = cache[f"blocks.{i}.hook_resid_post"], cache[f"blocks.{i}.attn.hook_pattern"]
            if siglip:  # the pooling head on this layer's tokens, no final norm (compute_legrad_siglip)
                pooled, probe = model.attn_pool(h)  # (B, D), (B, nh, 1, T)
                feature = F.normalize(pooled, dim=-1)
                wrt = probe
            else:  # ln_post of the mean over every token, then proj (compute_legrad_clip)
                feature = F.normalize(model.projection(model.norm(h.mean(dim=1))), dim=-1)
                wrt = probs
            [grad] = _prompt_gradients((feature.expand(k, -1) * target).sum(-1), [wrt], B)
            grad = grad.clamp(min=0)
            relevance = grad.mean(dim=1)[:, 0] if siglip else grad.mean(dim=1).mean(dim=1)  # (k, T)
            maps = maps + relevance[:, model.num_prefix_tokens:].reshape(k, *grid).detach()
            if siglip and empty is not None:
                [grad_empty] = torch.autograd.grad((feature @ empty.to(x.dtype).reshape(-1, 1)).sum(), [wrt],
                                                   retain_graph=True)
                empty_maps = empty_maps + grad_empty.clamp(min=0).mean(dim=1)[:, 0].reshape(B, *grid).detach()
    if siglip and empty is not None:
        maps = maps.masked_fill(_min_max(empty_maps) > correction_threshold, 0.0)
    return _min_max(maps)


# --- Grad-ECLIP ------------------------------------------------------------------------------------------------

def grad_eclip(model: ViT, images: Tensor, prompts: Tensor, index: int | Tensor) -> Tensor:
    """Grad-ECLIP (Zhao et al. 2024) for a prompt: ``(B, gh, gw)``, not normalised (the authors min-max it
    for display); for one image ``(1, C, H, W)`` and ``k`` indices, ``(k, gh, gw)`` from one forward, as the
    authors compute every prompt's map. The last block's attention is replaced, at its ``attn.hook_z``, by one
    head over the full width computed from its ``hook_q/k/v``, as in the authors' ``clip_encode_dense``; the
    cosine between the model's (projected CLS) embedding and the prompt is the target."""
    _need_class_token(model, "Grad-ECLIP")
    if model.projection is None:
        raise PromptError("Grad-ECLIP needs a CLIP image tower with its projection to the joint embedding")
    c = model.config
    if c.rope != "none" or c.gated_mlp or c.mlp_norm or not c.key_bias:
        raise PromptError("Grad-ECLIP is defined for CLIP's plain blocks; this model's blocks differ")
    grid = model.patch_grid(images.shape[2], images.shape[3])
    inference, grad_mode = _grad_context()
    with inference, grad_mode:
        x = images.detach()
        B = x.shape[0]
        idx = _targets(index, x, prompts.shape[0])
        last = f"blocks.{len(model.blocks) - 1}.attn."
        attn = model.blocks[-1].attn
        cache: dict[str, Tensor] = {}

        def keep(t: Tensor, hook) -> None:
            cache[hook.name] = t.detach()

        def one_head(z: Tensor, hook) -> Tensor:
            # The authors' clip_encode_dense: the last block's attention with one head over all D channels.
            q, k, v = (cache[last + f"hook_{n}"].transpose(1, 2).flatten(2) for n in "qkv")  # (B, 1 | T, D)
            scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)  # (B, 1, T): CLS's query
            cache["attn_output"] = scores.softmax(dim=-1) @ v  # (B, 1, D)
            cache["attn_output"].requires_grad_(True)
            cache["q"], cache["k"], cache["v"] = q, k, v
            return cache["attn_output"].view_as(z)  # (B, T, H, hd)

        hooks = [(last + "hook_q", keep), (last + "hook_k", keep), (last + "hook_v", keep), (last + "hook_z", one_head)]
        with model.hooks(hooks):  # the last block for the CLS token alone: all of it that the map reads
            out, _ = model.run_blocks(model.embed(x), grid, queries=1)  # (B, 1, D)
        embedding = F.normalize(model.projection(model.pool(out)[0]), dim=-1)  # (B, E): projection of CLS
        cosines = (embedding.expand(len(idx), -1) * prompts[idx].to(embedding.dtype)).sum(-1)  # (k,)
        [grad] = _prompt_gradients(cosines, [cache["attn_output"]], B)  # (k, 1, D)
        q, k, v = cache["q"], cache["k"], cache["v"]
        with torch.no_grad():  # q_out, k_out: q and k through out_proj, as clip_encode_dense computes them
            q_out, k_out = F.linear(q, attn.proj.weight, attn.proj.bias), F.linear(k, attn.proj.weight, attn.proj.bias)
            q_cls = F.normalize(q_out[:, :1], dim=-1)  # (B, 1, D)
            k_patch = F.normalize(k_out[:, 1:], dim=-1)  # (B, N, D)
            cosine_qk = (q_cls * k_patch).sum(-1)  # (B, N)
            low, high = cosine_qk.min(dim=-1, keepdim=True)[0], cosine_qk.max(dim=-1, keepdim=True)[0]
            cosine_qk = (cosine_qk - low) / (high - low)
            emap = F.relu((grad[:, :1] * v[:, 1:] * cosine_qk[..., None]).sum(-1))  # (k, N)
    return emap.reshape(len(idx), *grid).detach()


# --- dino.txt --------------------------------------------------------------------------------------------------

def is_dinotxt(model: ViT) -> bool:
    """Whether ``model`` is a DINOv3 with its dino.txt vision head (``import_dinotxt``): pool blocks and their norm,
    read as CLS beside the patch mean."""
    c = model.config
    return c.pooling == "cls+avg" and bool(c.pool_layers) and c.pool_norm


def dinotxt_maps(model: ViT, images: Tensor, texts: Tensor) -> Tensor:
    """``(B, n, gh, gw)``: dino.txt's patch-text map of each label, as its authors' zero-shot segmentation computes
    it (``predict_whole`` before its upsampling): the cosine of each patch token with the label's patch-aligned text
    embedding ``texts`` (n, C), normalised (``Prompts.patch``). The patch tokens are those the notebook's
    ``encode_image`` reads, ``get_class_and_patch_tokens``'s third output: the backbone's last layer after its final
    norm, not the vision head's (facebookresearch/dinov3#355 asks whether that is meant)."""
    if not is_dinotxt(model):
        raise PromptError("dino.txt's patch-text map needs a DINOv3 with its dino.txt head")
    width = model.config.hidden_size
    if texts.dim() != 2 or texts.shape[1] != width:
        raise PromptError(f"patch-aligned text embeddings of shape {tuple(texts.shape)} do not fit this backbone's "
                          f"{width}-d patch tokens: the text side belongs to another model")
    grid = model.patch_grid(images.shape[2], images.shape[3])
    with torch.no_grad():
        x, _ = model.tokens(images)  # (B, T, D): the backbone's last layer
        patches = F.normalize(model.norm(x)[:, model.num_prefix_tokens:], dim=-1)  # (B, gh*gw, D)
        similarity = patches @ texts.to(patches).T  # (B, gh*gw, n)
    return similarity.transpose(1, 2).reshape(images.shape[0], texts.shape[0], *grid)


def map_difference(a: Tensor, b: Tensor) -> Tensor:
    """Two prompts' maps, each min-max normalised to [0, 1], subtracted: ``(..., gh, gw)`` in [-1, 1]
    (positive where the first prompt's map is the stronger)."""
    def unit(m: Tensor) -> Tensor:
        flat = m.reshape(*m.shape[:-2], -1).float()
        low, high = flat.min(dim=-1)[0][..., None, None], flat.max(dim=-1)[0][..., None, None]
        return (m.float() - low) / (high - low).clamp_min(torch.finfo(torch.float32).tiny)

    if a.shape != b.shape:
        raise ValueError(f"maps of shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be compared")
    return unit(a) - unit(b)


# --- one entry point for the CLIs and the app ------------------------------------------------------------------

# Each method's name as the app and the .npz files show it; the order is the menu's.
PROMPT_METHODS = {"rollout": "gradient rollout (Chefer et al. 2021b)", "legrad": "LeGrad", "attnlrp": "AttnLRP",
                  **{m.name: m.title for m in registry.BUILTIN_METHODS if m.group == "words"}}  # Grad-ECLIP, dense
EMPTY_PROMPT = "a photo of a"  # LeGrad's SigLIP correction compares every map with this prompt's


@dataclass
class Prompts:
    """Typed labels made into the constants a prompt map needs (``ask``)."""

    labels: list[str]  # as typed: the prediction's label
    templates: list[str]
    embeddings: Tensor  # (n, E) normalised, one per label (templates ensembled)
    scale: float
    bias: float
    kind: str  # "softmax" (CLIP) or "sigmoid" (SigLIP): how probabilities are read
    empty: Tensor | None = None  # (E,) the empty prompt's embedding, for LeGrad's SigLIP correction
    blank: Tensor | None = None  # (E,) the empty text in the templates, for CLIP Surgery of a single label
    patch: Tensor | None = None  # (n, C) dino.txt: each label's patch-aligned half, normalised and ensembled


def ask(tower, labels: Sequence[str], templates: Sequence[str] = (DEFAULT_TEMPLATE,),
        progress: Callable[[int, int], None] | None = None) -> Prompts:
    """``labels`` through ``tower`` (a ``vit.sources.vlm.text_tower.TextTower``), each filled into every template;
    ``progress`` as ``prompt_embeddings``'s."""
    embeddings = prompt_embeddings(tower.encode, labels, templates, progress)
    empty = tower.encode([EMPTY_PROMPT])[0] if tower.kind == "sigmoid" else None
    # CLIP Surgery's feature surgery weighs a label against the others; one label is weighed against the empty
    # text, in the same templates (the authors' demo: encode_text_with_prompt_ensemble(model, [""]))
    blank = prompt_embeddings(tower.encode, [""], templates)[0] if len(labels) == 1 else None
    # dino.txt's segmentation notebook: each text's patch-aligned half normalised, averaged over the templates and
    # normalised again (the halves of the texts encoded above, cached)
    channels = getattr(tower, "patch_channels", 0)
    patch = prompt_embeddings(lambda texts: F.normalize(tower.encode(texts)[:, -channels:], dim=-1), labels,
                              templates) if channels else None
    return Prompts(list(labels), list(templates), embeddings, tower.logit_scale, tower.logit_bias, tower.kind, empty,
                   blank, patch)


def prompt_checkpoint(checkpoint: Checkpoint, prompts: Prompts) -> Checkpoint:
    """``checkpoint`` as a classifier over the typed labels: everything that predicts, explains or scores a
    checkpoint (``vit.core.inference.predict``, the class maps, deletion/insertion curves) then does so for the
    prompts, with SigLIP's probabilities read per label (``metadata["probabilities"] = "sigmoid"``)."""
    model = prompt_model(checkpoint.model, prompts.embeddings, prompts.scale, prompts.bias)
    return replace(checkpoint, model=model, class_names=list(prompts.labels), training_state=None,
                   metadata={**checkpoint.metadata, "probabilities": prompts.kind})


def methods_for(model: ViT) -> dict[str, str]:
    """The prompt-map methods that apply to ``model``, by key: rollout and Grad-ECLIP read the CLS token;
    LeGrad a CLIP's or SigLIP's readout; AttnLRP (its attention rules on SigLIP's pooling probe too) every model; the
    dense maps a CLIP's tokens in the joint embedding (``dense_clip.refusal`` says why not elsewhere); dino.txt's
    map a DINOv3 with its dino.txt head."""
    if not isinstance(model, ViT):  # a tower on the library road: its maps are the road's (``words.methods``)
        return {}
    cls = model.config.class_token and model.config.pooling == "cls"
    legrad = cls or model.config.pooling == "map"  # its CLIP and SigLIP readouts (not dino.txt's CLS + patch mean)
    keep = {"rollout": cls, "legrad": legrad, "attnlrp": True, "grad_eclip": cls, "dinotxt": is_dinotxt(model),
            **{key: dense_clip.refusal(model, key) is None for key in dense_clip.METHODS}}
    return {key: name for key, name in PROMPT_METHODS.items() if keep[key]}


def prompt_curves(model: ViT, images: Tensor, prompts: Prompts, maps: Tensor, index: int | Tensor,
                  replacement: str = "blur", steps: int | None = None, batch_size: int = 256,
                  progress: Callable[[int, int], None] | None = None) -> tuple:
    """Deletion and insertion curves of each image's prompt ``index`` ranked by ``maps (B, gh, gw)``, scoring the
    cosine similarity of image and prompt (what every prompt map explains) instead of a class probability:
    ``(fractions (S,), deletion (B, S), insertion (B, S))`` as ``perturbation_curves`` returns them."""
    cosine = prompt_model(model, prompts.embeddings, 1.0, 0.0)  # scale 1, no bias: the logits are the cosines
    index = _index(index, images.shape[0], prompts.embeddings.shape[0]).to(images.device)
    return perturbation_curves(cosine, images, maps, index, replacement, steps, batch_size,
                               score=lambda logits: logits, progress=progress)


# the methods whose prompts share one forward of an image (the dense maps: every prompt's from one forward)
ONE_FORWARD = ("rollout", "legrad", "grad_eclip", "dinotxt", *dense_clip.METHODS)


def prompt_maps(model: ViT, image: Tensor, prompts: Prompts, method: str, chunk: int = 8) -> Tensor:
    """``(n, gh, gw)``: every prompt's map of one image ``(1, C, H, W)``, ``chunk`` prompts at a time (what bounds
    the gradients held at once, each ``(nh, T, T)`` for rollout and LeGrad): for the methods of ``ONE_FORWARD`` one
    forward of the image per chunk and a backward per prompt that stops inside the model, else a forward and a
    backward of the image repeated ``chunk`` times (AttnLRP's backward reaches the pixels); the dense maps, no
    backward, every prompt from one forward."""
    if method in dense_clip.METHODS or method == "dinotxt":
        return prompt_map(model, image, prompts, torch.arange(len(prompts.labels)), method)
    return torch.cat([prompt_map(model, image if method in ONE_FORWARD else image.expand(len(part), -1, -1, -1),
                                 prompts, part, method) for part in torch.arange(len(prompts.labels)).split(chunk)])


def prompt_map(model: ViT, images: Tensor, prompts: Prompts, index: int | Tensor, method: str) -> Tensor:
    """``(B, gh, gw)``: the map of prompt ``index`` by ``method`` (a key of ``PROMPT_METHODS``), each as its
    authors compute it (rollout from the last layer as the notebook, LeGrad with its readout and, for SigLIP,
    its correction; AttnLRP's pixel relevances summed per patch). For ``ONE_FORWARD``'s methods, one image
    ``(1, C, H, W)`` and ``k`` indices give ``(k, gh, gw)``."""
    if method not in methods_for(model):
        why = dense_clip.refusal(model, method) if method in dense_clip.METHODS else None
        raise PromptError(f"{why or PROMPT_METHODS.get(method, method) + ' does not apply to this model'}; use one "
                          f"of {', '.join(methods_for(model).values())}")
    e, s, b = prompts.embeddings, prompts.scale, prompts.bias
    if method in dense_clip.METHODS or method == "dinotxt":  # every prompt's map from one forward, then those asked
        if method == "dinotxt" and prompts.patch is None:
            raise PromptError("dino.txt's patch-text map reads the labels' patch-aligned text embeddings: ask them "
                              "through the model's own dino.txt text tower")
        maps = (dinotxt_maps(model, images, prompts.patch) if method == "dinotxt" else
                dense_clip.dense_text_maps(model, images, e, method, prompts.blank))  # (B, n, gh, gw)
        idx = _targets(index, images, e.shape[0]).to(maps.device)
        return maps[0, idx] if images.shape[0] == 1 else maps[torch.arange(images.shape[0]), idx]
    if method == "rollout":
        return prompt_rollout(model, images, e, s, index, bias=b)
    if method == "legrad":
        return prompt_legrad(model, images, e, index, empty=prompts.empty)
    if method == "grad_eclip":
        return grad_eclip(model, images, e, index)
    pixels = attnlrp(prompt_model(model, e, s, b), images, _index(index, images.shape[0], e.shape[0]))  # (B, H, W)
    return patch_sums(pixels, model.patch_grid(images.shape[2], images.shape[3]))
