"""Segmenting with SAM's and SAM 2's prompts, and the maps of one mask: what the mask decoder attended to, and which
pixels made the mask.

The image encoder is this project's model; the neck, the prompt encoder and the mask decoder are transformers' own
modules with the folder's weights (the prompt half, ``vit.sources.sam_prompts``), fed our image embedding: the masks
and IoU scores are the library's by construction (``tests/test_sam_prompts.py`` checks them against its whole
model). Prompts are in the image's own pixels and mapped as the library's processors map them (``prompt_scale``):
SamProcessor's to the longer side resized to ``longest_edge`` (before the padding), Sam2Processor's to its square.

- ``decoder_attention``: each two-way block's token-to-image and image-to-token cross-attention and the final
  token-to-image attention, per head, of one output token (a mask token or the IoU token): its row over the image
  embedding's grid (token-to-image), or every image position's weight on it (image-to-token). The weights are
  those the library's eager attention returns, read from its attention modules' outputs by a forward hook
  (``decoder_attentions``): the library records only each two-way block's attention output, not its weights.
- ``gradient_x_input``: the input's gradient times the input, summed over the channels, of the chosen mask's
  logits (summed where the mask is, logit > 0, or at one pixel), back through the decoder, the neck and the image
  encoder: plain autograd through the same modules, so equal to autograd on the library's whole model.
- ``attnlrp``: AttnLRP (Achtibat et al. 2024) of the same number, as input x modified gradient: the image encoder
  under its own rules (``relevance.AttnLRPRules``), the library's neck and decoder with lxt's rules hooked onto their
  modules for the one backward (``library_rules``): the uniform rule on the decoder's attention (q and k's gradient
  divided by 4, v's by 2, as lxt's ``wrap_attention_forward`` divides them at the attention function), the identity
  rule on every LayerNorm's scale (lxt's ``layer_norm_forward``; the channels-first ``SamLayerNorm`` /
  ``Sam2LayerNorm`` of the neck and the upscaling too: they call ``nn.LayerNorm.forward``, which lxt patches on the
  class) and on every activation
  (GELU, ReLU: lxt's ``non_linear_forward``), and the uniform rule on the one product of two image-dependent factors
  lxt's attention rule does not reach, the hypernetwork's ``hyper_in @ upscaled_embedding`` that makes the masks
  (half each, as lxt's ``gated_mlp_forward`` splits SwiGLU's product). Everything else (the convolutions, the
  projections, the positional encodings, the additions) is linear and keeps its plain gradient. Equal to lxt's rules
  patched into transformers' whole SamModel / Sam2Model (``tests/test_sam_attnlrp_lxt.py``).
- ``legrad``: LeGrad (Bousselham et al. 2024) on SAM's image encoder: the neck and the decoder read each of its last
  two layers' output, as the authors read CLIP's ``ln_post`` at each layer; the patch grid
  (``tests/test_sam_legrad.py``). SAM 2's FPN neck reads every stage at once: refused.

A ``Segmenter`` keeps the image embeddings of the last images it saw (as SAM's predictor keeps its image's), so a new
prompt on the same image costs the decoder alone.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from vit.core.images import resized_size
from vit.core.threads import at_most, this_thread_only
from vit.costs import plan
from vit.explain.methods.relevance import AttnLRPRules, divide_gradient, identity_rule, legrad_of_readout
from vit.model import use_rules

# Each two-way block's attention modules as the library names them, then the final token-to-image attention.
BLOCK_ATTENTIONS = ("self_attn", "cross_attn_token_to_image", "cross_attn_image_to_token")
FINAL_ATTENTION = "final_attn_token_to_image"
LABELS = {1: "positive", 0: "negative"}  # SAM's point labels (1: on the object, 0: off it)


class PromptError(ValueError):
    """A prompt the mask decoder cannot take; the message says what to do."""


def distinct_methods(methods: Sequence[str]) -> tuple[str, ...]:
    """``methods`` each once, in the order first given: the same map asked a thousand times is one map (it was a
    thousand backward passes). PromptError (one line) for a name that is not text."""
    odd = next((m for m in methods if not isinstance(m, str)), None)
    if odd is not None:
        raise PromptError(f"a method is a name (text), got a {type(odd).__name__}")
    return tuple(dict.fromkeys(methods))


# The maps of a mask, by name (what a registry of methods lists): each one's one-line description.
SEGMENT_METHODS = {
    "decoder_attention": "the mask decoder's cross-attention of one output token, per head, on the image embedding's "
                         "grid (each two-way block's token-to-image and image-to-token, and the final token-to-image)",
    "gradient_x_input": "gradient x input of the mask's logits (summed over the mask, or at one pixel) through the "
                        "mask decoder and the image encoder, summed over the channels",
    "attnlrp": "AttnLRP (Achtibat et al. 2024) of the mask's logits (summed over the mask, or at one pixel) through "
               "the mask decoder, the neck and the image encoder, lxt's rules: the input's relevance summed over the "
               "channels",
    "legrad": "LeGrad (Bousselham et al. 2024) of the mask on SAM's image encoder: at each of its last layers the "
              "neck and the mask decoder read that layer's output, and the positive gradient of the mask's logits "
              "(summed over the mask, or at one pixel) with respect to that layer's attention, averaged over heads "
              "and queries, is summed over the layers, on the patch grid",
}
MAP_LABELS = {"gradient_x_input": "Gradient x input", "attnlrp": "AttnLRP", "legrad": "LeGrad"}  # in words
SIGNED_MAPS = ("gradient_x_input", "attnlrp")  # drawn on a diverging scale around 0 (LeGrad's are >= 0)
# the families each map applies to: SAM 2's FPN neck reads every Hiera stage at once, so LeGrad has no one layer's
# output for the neck to read; SAM 3 tracker's encoder is the library's own (no port): plain autograd reaches it, this
# program's AttnLRP rules and LeGrad's read-out do not
MAP_FAMILIES = {"gradient_x_input": ("sam", "sam2", "sam3_tracker"), "attnlrp": ("sam", "sam2"), "legrad": ("sam",)}
# why a map does not reach a family, where it is not the general reason (``Segmenter.segment``'s refusal)
MAP_REFUSALS = {("legrad", "sam2"): "LeGrad of the mask reads the neck at each layer, and SAM 2's neck reads every "
                                    "Hiera stage at once; choose attnlrp or gradient_x_input"}
TOKENS = ("mask", "iou")  # the output tokens whose attention is drawn
CROSS_ATTENTIONS = ("cross_attn_token_to_image", "cross_attn_image_to_token", FINAL_ATTENTION)
LEGRAD_START = -2  # LeGrad's first explained layer (the authors' wrapper's default: the last two)
KEPT_EMBEDDINGS = 4  # images whose embedding a Segmenter keeps (SAM ViT-H's: 4 MB each)
# torch threads for a prompt's mask decoder: ~250 small ops (SAM ViT-B's largest, a 4096 x 256 -> 128
# projection, is ~1 ms on one core), so a second thread saves little and costs a barrier per op, which waits for a
# descheduled thread whenever other work shares the cores: on 2 shared cores, transformers' own SAM ViT-B decoder
# took 0.12 CPU s on one thread and 0.49 on two, with bitwise equal results (bench/bench_sam_decoder.py).
DECODER_THREADS = 1


def check_grid(half, grid: tuple[int, int]) -> None:
    """PromptError unless the image embedding's grid is the one the prompt encoder was built for."""
    if tuple(grid) != half.embedding_grid:
        raise PromptError(f"the image embedding is {grid[0]}x{grid[1]} and this model's prompt encoder expects "
                          f"{half.embedding_grid[0]}x{half.embedding_grid[1]}; segment at the model's own size")


def stage_ends(config) -> list[int]:
    """The last block of each stage (a plain ViT's one stage: its last block)."""
    depths = config.stage_depths or (config.num_layers,)
    return [sum(depths[:i + 1]) - 1 for i in range(len(depths))]


def image_embedding(half, model, pixels: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
    """What the library's decoder takes as ``image_embeddings`` for ``pixels`` ``(B, C, H, W)``, from our image
    encoder: SAM's ``(B, C, gh, gw)`` (the neck on the last block); SAM 2's list, high resolution first, as
    ``Sam2Model.get_image_embeddings`` makes it (the FPN neck on each stage's output, the two finer levels through
    the decoder's ``conv_s0`` / ``conv_s1``, the empty memory added to the coarsest); SAM 3 tracker's the same list
    from its own vision encoder (``tracker_embedding``). In the autograd graph when gradients are on."""
    if half.family == "sam3_tracker":
        return tracker_embedding(half, pixels)
    ends = stage_ends(model.config)
    names = [f"blocks.{i}.hook_resid_post" for i in ends]
    _, cache = model.run_with_cache(pixels, names)
    grids = model.layer_grids(model.patch_grid(*pixels.shape[-2:]))
    B = pixels.shape[0]
    states = [cache[n].reshape(B, *grids[i], -1) for n, i in zip(names, ends, strict=True)]  # (B, h, w, C) each
    library = half.library
    if half.family == "sam":
        check_grid(half, grids[-1])
        return library.vision_encoder.neck(states[-1])  # (B, C, gh, gw)
    fpn, _ = library.vision_encoder.neck(states)
    maps = list(fpn[-library.num_feature_levels:][::-1])  # high resolution first, as Sam2VisionModel returns them
    maps[0] = half.decoder.conv_s0(maps[0])
    maps[1] = half.decoder.conv_s1(maps[1])
    maps[-1] = maps[-1] + library.no_memory_embedding.reshape(1, -1, 1, 1)  # (1, 1, C) on (HW, B, C) in the library
    check_grid(half, tuple(maps[-1].shape[-2:]))
    return maps


def tracker_embedding(half, pixels: torch.Tensor) -> list[torch.Tensor]:
    """SAM 3 tracker's ``image_embeddings`` for ``pixels`` ``(B, C, H, W)``, as ``Sam3TrackerModel.forward`` makes
    them: its own ``get_image_features`` (the vision encoder, the FPN neck, the decoder's ``conv_s0`` / ``conv_s1``),
    the empty memory added to the coarsest level, each level ``(B, C, h, w)`` on its ``backbone_feature_sizes``."""
    library = half.library
    maps = list(library.get_image_features(pixels, return_dict=True).fpn_hidden_states)  # (h*w, B, C) each
    maps[-1] = maps[-1] + library.no_memory_embedding
    B = pixels.shape[0]
    embedding = [m.permute(1, 2, 0).reshape(B, -1, *size) for m, size in zip(maps, library.backbone_feature_sizes,
                                                                              strict=False)]
    check_grid(half, tuple(embedding[-1].shape[-2:]))
    return embedding


def prompt_scale(image_size: tuple[int, int], preprocessing) -> tuple[float, float]:
    """``(sx, sy)``: an image pixel ``(x, y)`` is at ``(x * sx, y * sy)`` of the input the model sees, as the
    library's processor maps it (SamProcessor: ``new_w / old_w``, ``new_h / old_h`` of the longer side resized to
    ``longest_edge``; Sam2Processor: of its square)."""
    width, height = image_size
    p = preprocessing
    if p.resize_size is None or p.resize_mode == "square":
        target = p.image_hw if p.resize_size is None else (p.resize_size if isinstance(p.resize_size, tuple)
                                                            else (p.resize_size, p.resize_size))
        return target[1] / width, target[0] / height
    if p.resize_mode == "longest_edge_pad":
        new_w, new_h = resized_size(image_size, p.resize_size, p.resize_mode)
        return new_w / width, new_h / height
    raise PromptError(f"prompts need SAM's own preprocessing (its longest edge resized and padded, or SAM 2's square); "
                      f"this model's is {p.resize_mode}")


@dataclass(frozen=True)
class Prompt:
    """Points ``((x, y, label), ...)`` and a box ``(x0, y0, x1, y1)``, in the image's own pixels."""

    points: tuple[tuple[float, float, int], ...] = ()
    box: tuple[float, float, float, float] | None = None


def _number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise PromptError(f"{what} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise PromptError(f"{what} must be a finite number, got {value!r}")
    return number


# The points one prompt may hold in the API and the CLI (the explorer's link holds 32): each is a token of the
# decoder's every attention, ~0.3 MB at SAM ViT-B's 64 x 64 embedding (10,000 points took 3 GB, issue 95).
MAX_POINTS = 256


def make_prompt(points: Sequence | None, box: Sequence | None, image_size: tuple[int, int]) -> Prompt:
    """A checked ``Prompt``: each point ``(x, y)`` or ``(x, y, label)`` (label 1 on the object, the default; 0 off
    it), at most ``MAX_POINTS``, and the box inside the image ``image_size = (width, height)``; at least one of them.
    PromptError in one line."""
    width, height = image_size
    if points is not None and hasattr(points, "__len__") and len(points) > MAX_POINTS:
        raise PromptError(f"give at most {MAX_POINTS:,} points in one prompt, got {len(points):,}")
    kept = []
    for i, point in enumerate(points or ()):
        if not isinstance(point, (tuple, list)) or len(point) not in (2, 3):
            raise PromptError(f"point {i} must be (x, y) or (x, y, label), got {point!r}")
        x, y = _number(point[0], f"point {i}'s x"), _number(point[1], f"point {i}'s y")
        label = point[2] if len(point) == 3 else 1
        if isinstance(label, bool) or label not in LABELS:
            raise PromptError(f"point {i}'s label must be 1 (on the object) or 0 (off it), got {label!r}")
        if not (0 <= x <= width and 0 <= y <= height):
            raise PromptError(f"point {i} ({x:g}, {y:g}) is outside the {width}x{height} image; give (x, y) in its "
                              "pixels, x from the left, y from the top")
        kept.append((x, y, int(label)))
    shown = None
    if box is not None:
        if not isinstance(box, (tuple, list)) or len(box) != 4:
            raise PromptError(f"the box must be (x0, y0, x1, y1), got {box!r}")
        x0, y0, x1, y1 = (_number(v, f"the box's {n}") for v, n in zip(box, ("x0", "y0", "x1", "y1"), strict=True))
        if not (0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height):
            raise PromptError(f"the box ({x0:g}, {y0:g}, {x1:g}, {y1:g}) must lie in the {width}x{height} image "
                              "with x0 < x1 and y0 < y1")
        shown = (x0, y0, x1, y1)
    if not kept and shown is None:
        raise PromptError("give at least one point (x, y[, label]) or a box (x0, y0, x1, y1)")
    return Prompt(tuple(kept), shown)


def prompt_tensors(half, prompt: Prompt, scale: tuple[float, float], device: torch.device | None = None
                   ) -> dict[str, torch.Tensor]:
    """The library's ``input_points (1, 1, n, 2)``, ``input_labels (1, 1, n)`` and ``input_boxes (1, 1, 4)`` for one
    image and one mask, in the input's pixels, as the family's processor gives them: scaled in float64, kept in
    float64 by SamProcessor (NumPy's), made float32 by Sam2Processor; the prompt encoder's arithmetic follows."""
    sx, sy = scale
    dtype = torch.float64 if half.family == "sam" else torch.float32
    tensors = {}
    if prompt.points:
        xy = torch.tensor([[x * sx, y * sy] for x, y, _ in prompt.points], dtype=torch.float64)  # (n, 2): x, y
        tensors["input_points"] = xy.to(device=device, dtype=dtype)[None, None]
        tensors["input_labels"] = torch.tensor([label for *_, label in prompt.points], dtype=torch.long,
                                               device=device)[None, None]
    if prompt.box is not None:
        x0, y0, x1, y1 = prompt.box
        box = torch.tensor([x0 * sx, y0 * sy, x1 * sx, y1 * sy], dtype=torch.float64)
        tensors["input_boxes"] = box.to(device=device, dtype=dtype)[None, None]
    return tensors


def decode(half, embedding, prompt_inputs: Mapping[str, torch.Tensor], multimask: bool = True):
    """The library's forward from the image embedding on: ``(iou_scores (1, 1, M), pred_masks (1, 1, M, 4gh, 4gw))``,
    M = 3 with ``multimask`` (SAM's three masks) else 1. SAM's runs its prompt encoder and mask decoder as
    ``SamModel.forward`` calls them, with the grid's positional encoding made once (``image_positional_embeddings``)
    rather than at every prompt; SAM 2's whole forward (its decoder reads more than one level) runs as it is."""
    if half.family == "sam":
        library = half.library
        sparse, dense = library.prompt_encoder(input_points=prompt_inputs.get("input_points"),
                                               input_labels=prompt_inputs.get("input_labels"),
                                               input_boxes=prompt_inputs.get("input_boxes"), input_masks=None)
        masks, scores = half.decoder(image_embeddings=embedding,
                                     image_positional_embeddings=half.image_positional_embeddings(),
                                     sparse_prompt_embeddings=sparse, dense_prompt_embeddings=dense,
                                     multimask_output=multimask)
        return scores, masks
    out = half.library(image_embeddings=embedding, multimask_output=multimask, **prompt_inputs)
    return out.iou_scores, out.pred_masks


def attention_modules(half) -> dict[str, torch.nn.Module]:
    """The decoder's attention modules by name: ``layers.{i}.{self_attn | cross_attn_token_to_image |
    cross_attn_image_to_token}`` then ``final_attn_token_to_image``."""
    transformer = half.decoder.transformer
    named = {f"layers.{i}.{kind}": getattr(block, kind) for i, block in enumerate(transformer.layers)
             for kind in BLOCK_ATTENTIONS}
    named[FINAL_ATTENTION] = getattr(transformer, FINAL_ATTENTION)
    return named


# What the decoder's attention modules record, and for whom: the ``decoder_attentions`` block running in this thread
# (each thread, each server session, its own context). The modules are every session's: a hook on them fires for any
# session's forward, so it writes only into the dict of the block that this very forward runs in.
_RECORDING: contextvars.ContextVar[dict[str, Tensor] | None] = contextvars.ContextVar("sam_decoder_attentions",
                                                                                       default=None)
_HOOKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # an attention module -> its recording hook
_HOOKING = threading.Lock()


def _record(name: str, module, args, output) -> None:
    recorded = _RECORDING.get()
    if recorded is not None:
        recorded[name] = output[1]


@contextlib.contextmanager
def decoder_attentions(half) -> Iterator[dict[str, torch.Tensor]]:
    """For the ``with`` block, every decoder attention module's weights as the library's eager attention returns
    them (post-softmax ``(B * masks, heads, queries, keys)``), by ``attention_modules`` name: those of the forwards
    this thread runs inside the block, never another session's on the same model (issue 95: two sessions prompting
    one model at once got each other's maps). Each module gets one hook, once, that writes to the block now running
    in the forward's own context."""
    with _HOOKING:
        for name, module in attention_modules(half).items():
            if module not in _HOOKED:
                _HOOKED[module] = module.register_forward_hook(functools.partial(_record, name))
    recorded: dict[str, torch.Tensor] = {}
    token = _RECORDING.set(recorded)
    try:
        yield recorded
    finally:
        _RECORDING.reset(token)


def output_token(half, token: str, mask: int) -> int:
    """The place among the decoder's tokens of ``token``: ``"mask"`` (multimask output ``mask``, from 0) or
    ``"iou"``."""
    if token not in TOKENS:
        raise PromptError(f"token must be one of {', '.join(TOKENS)}, got {token!r}")
    # SAM's multimask outputs are mask tokens 1..3 (token 0 is the single-mask output)
    return half.iou_token if token == "iou" else half.first_mask_token + 1 + mask


def attention_views(recorded: Mapping[str, Tensor], half, position: int) -> dict[str, Tensor]:
    """Each cross-attention of the decoder's token ``position`` on the image embedding's grid: ``{name: (heads, gh,
    gw)}`` for ``layers.{i}.cross_attn_token_to_image`` (the token's row), ``layers.{i}.cross_attn_image_to_token``
    (each image position's weight on the token) and ``final_attn_token_to_image``; of the first image and mask."""
    gh, gw = half.embedding_grid
    views = {}
    for name in attention_modules(half):
        if not name.endswith(CROSS_ATTENTIONS):
            continue
        weights = recorded[name][0]  # (heads, queries, keys)
        rows = weights[:, :, position] if name.endswith("image_to_token") else weights[:, position, :]  # (heads, N)
        views[name] = rows.reshape(-1, gh, gw)
    return views


def mask_score(pred_masks: Tensor, mask: int, cell: tuple[int, int] | None) -> Tensor:
    """The explained number: mask ``mask``'s low-resolution logits summed where it is (logit > 0), or its logit at
    ``cell = (row, col)``. PromptError for an empty mask without a cell."""
    logits = pred_masks[0, 0, mask]  # (4gh, 4gw)
    if cell is not None:
        return logits[cell]
    inside = logits.detach() > 0
    if not bool(inside.any()):
        raise PromptError(f"mask {mask} is empty (no logit above 0); give a pixel of the image to explain instead")
    return logits[inside].sum()


@dataclass
class Segmented:
    """One prompt's answer on one image, tensors on the CPU: ``scores (M,)`` (``iou_scores``), ``mask_logits (M,
    4gh, 4gw)`` (``pred_masks``), ``masks (M, H, W)`` on the image, ``attention`` by module (``(heads, gh, gw)``
    each) of output ``token`` of mask ``mask``, ``maps`` by method (``(H_in, W_in)`` over the input's pixels)."""

    scores: Tensor
    mask_logits: Tensor
    masks: Tensor
    mask: int
    token: str
    attention: dict[str, Tensor]
    maps: dict[str, Tensor] = field(default_factory=dict)
    embedding_reused: bool = False


class Segmenter:
    """A checkpoint's prompt half (``vit.sources.sam_prompts.open_prompt_half``) and the embeddings of the last
    ``KEPT_EMBEDDINGS`` inputs it encoded, shared by every session that prompts the model (a lock keeps that list
    whole).

    It holds its model weakly: ``segmenter``'s registry is keyed by the model, and a strong reference from the value
    would keep the model, its prompt half and the kept embeddings alive after every checkpoint of it is gone."""

    def __init__(self, checkpoint, half) -> None:
        self._model = weakref.ref(checkpoint.model)
        self.preprocessing = checkpoint.preprocessing
        self.half = half
        self.embeddings: OrderedDict[str, object] = OrderedDict()
        self._lock = threading.Lock()  # the kept embeddings: one server's sessions prompt the same model at once
        self.encoded = 0  # how many times the image encoder ran without a graph (a test reads it)

    @property
    def model(self):
        """The image encoder (``vit.model.ViT``) this prompt half serves."""
        model = self._model()
        if model is None:  # only through a Segmenter kept past its model, which segmenter() never hands out
            raise RuntimeError("the model this Segmenter served is gone; call segmenter() with its checkpoint")
        return model

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def pixels(self, image) -> Tensor:
        """``image`` (PIL) through the checkpoint's own preprocessing: ``(1, C, H, W)`` on the model's device."""
        from vit.core.inference import preprocess

        return preprocess([image], self.preprocessing).to(self.device)

    def embedding(self, image) -> tuple[object, tuple[int, int], bool]:
        """The image embedding of ``image`` (PIL), the input's ``(H, W)``, and whether it was kept from before: a
        kept image is neither preprocessed nor encoded again (its pixels' hash is the key)."""
        key = hashlib.sha256(f"{image.mode} {image.size}".encode() + image.tobytes()).hexdigest()
        with self._lock:
            kept = self.embeddings.get(key)
            if kept is not None:
                self.embeddings.move_to_end(key)
                return (*kept, True)
        pixels = self.pixels(image)  # outside the lock: another session's prompt on a kept image need not wait
        with torch.inference_mode():
            embedding = image_embedding(self.half, self.model, pixels)
        with self._lock:
            self.encoded += 1
            self.embeddings[key] = embedding, tuple(pixels.shape[-2:])
            while len(self.embeddings) > KEPT_EMBEDDINGS:
                self.embeddings.popitem(last=False)
        return embedding, tuple(pixels.shape[-2:]), False

    def check_gradient_fits(self, grid: tuple[int, int], method: str = "gradient_x_input") -> None:
        """The cost model's answer for ``method``'s gradient through the encoder and the decoder at ``grid``, asked
        first. AttnLRP's is gradient x input's count: its rules change what the backward multiplies by, not what
        the graph keeps (the identity rule keeps a ratio where GELU kept its input; LayerNorm's scale is kept
        either way). LeGrad's is LeGrad's own (in chunks) beside the decoder."""
        decoder = self.half.decoder
        sizes = (decoder.hidden_size, len(decoder.transformer.layers), self.half.embedding_grid)
        if method == "legrad":
            plan.decide(plan.mask_legrad(self.model, grid, *sizes, LEGRAD_START))
        else:
            plan.decide(plan.mask_gradient(self.model, grid, *sizes, f"{MAP_LABELS[method]} of the mask"))

    def segment(self, image, prompt: Prompt, mask: int | None = None, token: str = "mask",
                methods: tuple[str, ...] = (), at: tuple[float, float] | None = None) -> Segmented:
        """The masks of ``prompt`` (in the pixels of ``image``, a PIL image), the decoder attention of ``token`` of
        mask ``mask`` (default: the best scored) and the ``methods`` maps of that mask (at image pixel ``at``, or
        summed over the mask)."""
        methods = distinct_methods(methods)
        unknown = [m for m in methods if m not in SEGMENT_METHODS or m == "decoder_attention"]
        if unknown:
            raise PromptError(f"unknown map {unknown[0]!r}; choose from {', '.join(m for m in SEGMENT_METHODS)}")
        family = self.half.family
        outside = [m for m in methods if family not in MAP_FAMILIES[m]]
        if outside:
            reaches = [m for m, families in MAP_FAMILIES.items() if family in families]
            raise PromptError(MAP_REFUSALS.get((outside[0], family)) or (
                f"{outside[0]} of the mask runs through SAM's and SAM 2's image encoders as this program ports them; "
                f"{family}'s runs as transformers builds it: choose {' or '.join(reaches)}"))
        p, image_size = self.preprocessing, image.size
        inputs = prompt_tensors(self.half, prompt, prompt_scale(image_size, p), self.device)
        embedding, input_hw, reused = self.embedding(image)
        with torch.inference_mode(), decoder_attentions(self.half) as recorded, at_most(DECODER_THREADS):
            scores, logits = decode(self.half, embedding, inputs)
        count = scores.shape[-1]
        if mask is None:
            mask = int(scores[0, 0].argmax())
        elif isinstance(mask, bool) or not isinstance(mask, int) or not 0 <= mask < count:
            raise PromptError(f"mask must be a whole number from 0 to {count - 1} (SAM's {count} masks), "
                              f"got {mask!r}")
        position = output_token(self.half, token, mask)
        attention = {k: v.float().cpu() for k, v in attention_views(recorded, self.half, position).items()}
        cell = None if at is None else low_res_cell(at, image_size, p, input_hw, tuple(logits.shape[-2:]))
        maps = {}
        for method in methods:  # every map's memory asked before any is made
            self.check_gradient_fits(self.model.patch_grid(*input_hw), method)
        if methods:
            pixels = self.pixels(image)
        makers = {"gradient_x_input": gradient_x_input, "attnlrp": attnlrp,  # read at the call: a test replaces one
                  "legrad": legrad}
        for method in methods:
            maps[method] = makers[method](self.half, self.model, pixels, inputs, mask, cell).cpu()
        logits = logits[0, 0].float().cpu()
        masks = masks_on_image(self.half, logits, image_size, p)  # two large resizes: worth every thread
        return Segmented(scores[0, 0].float().cpu(), logits, masks, mask, token, attention, maps, reused)


_SEGMENTERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a model -> its Segmenter, while it lives


def segmenter(checkpoint, open_half: Callable) -> Segmenter:
    """``checkpoint``'s ``Segmenter``, made once per model: its prompt half read once by ``open_half(checkpoint)``
    (``vit.sources.sam_prompts.open_prompt_half``; this wing reads no folder itself)."""
    found = _SEGMENTERS.get(checkpoint.model)
    if found is None:
        found = _SEGMENTERS[checkpoint.model] = Segmenter(checkpoint, open_half(checkpoint))
    return found


def low_res_cell(at: tuple[float, float], image_size: tuple[int, int], preprocessing, input_hw: tuple[int, int],
                 mask_hw: tuple[int, int]) -> tuple[int, int]:
    """``(row, col)`` of the low-resolution mask logit over image pixel ``at = (x, y)``: the low-resolution masks
    cover the whole input (SAM's padding included)."""
    x, y = at
    width, height = image_size
    if not (0 <= x <= width and 0 <= y <= height):
        raise PromptError(f"the pixel to explain ({x:g}, {y:g}) is outside the {width}x{height} image")
    sx, sy = prompt_scale(image_size, preprocessing)
    rows, cols = mask_hw
    return (min(int(y * sy * rows / input_hw[0]), rows - 1), min(int(x * sx * cols / input_hw[1]), cols - 1))


def _kept_rows(size: int, out: int, kept_out: int) -> int:
    """How many of ``size`` input rows a bilinear resize (align_corners=False) from ``size`` to ``out = f * size``
    (f a whole number) reads for its first ``kept_out`` output rows, with rows after the last read kept so the
    resize of those rows alone to ``f * rows`` weighs each output row exactly as the whole resize does (its scale
    ``rows / (f * rows)`` is the same float as ``size / out``; only the last input row is treated as an edge)."""
    if out % size or kept_out >= out:
        return size
    last = math.floor(max((kept_out - 0.5) * size / out - 0.5, 0.0))  # the last input row read (rounded down)
    return min(size, last + 3)  # one row more than needed: a float rounding of the source row cannot reach the edge


def mask_logits_on_image(half, logits: Tensor, image_size: tuple[int, int], preprocessing) -> Tensor:
    """``(M, H, W)`` float: the low-resolution ``logits (M, h, w)`` resized onto the image as the processor's
    ``post_process_masks`` resizes them (SAM: up to the padded input, its padding cut, then to the image; SAM 2:
    straight to the image; bilinear). SAM's first resize is computed for the kept part alone: its padding (a
    quarter of the input for a 4:3 photo) is never resized, and the values kept are the same floats."""
    width, height = image_size
    masks = logits[None].float()  # (1, M, h, w)
    if half.family == "sam":
        new_w, new_h = resized_size(image_size, preprocessing.resize_size, preprocessing.resize_mode)
        (h, w), (out_h, out_w) = masks.shape[-2:], preprocessing.image_hw
        rows, cols = _kept_rows(h, out_h, new_h), _kept_rows(w, out_w, new_w)
        size = (out_h * rows // h, out_w * cols // w)  # the same scale as the whole resize's
        masks = F.interpolate(masks[..., :rows, :cols], size, mode="bilinear", align_corners=False)
        masks = masks[..., :new_h, :new_w]
    return F.interpolate(masks, (height, width), mode="bilinear", align_corners=False)[0]


def masks_on_image(half, logits: Tensor, image_size: tuple[int, int], preprocessing) -> Tensor:
    """``(M, H, W)`` bool: the low-resolution ``logits (M, h, w)`` on the image, as the processor's
    ``post_process_masks`` makes them (``mask_logits_on_image``, logit > 0)."""
    return mask_logits_on_image(half, logits, image_size, preprocessing) > 0


def _input_x_gradient(half, model, pixels: Tensor, inputs: Mapping[str, Tensor], mask: int,
                      cell: tuple[int, int] | None, rules: bool) -> Tensor:
    """``(H, W)``: the gradient of ``mask_score`` with respect to ``pixels (1, C, H, W)`` times the pixels, summed
    over the channels, back through the decoder, the neck and our image encoder; with ``rules``, AttnLRP's
    modified gradient (the encoder's rules and ``library_rules``)."""
    rule_contexts = (use_rules(AttnLRPRules()), library_rules(half)) if rules else ()
    with torch.inference_mode(False), torch.enable_grad(), contextlib.ExitStack() as stack:
        for context in rule_contexts:
            stack.enter_context(context)
        x = pixels.detach().clone().requires_grad_(True)
        _, logits = decode(half, image_embedding(half, model, x), inputs)
        [grad] = torch.autograd.grad(mask_score(logits, mask, cell), x)
    return (x.detach() * grad).sum(dim=1)[0]  # (H, W)


def gradient_x_input(half, model, pixels: Tensor, inputs: Mapping[str, Tensor], mask: int,
                     cell: tuple[int, int] | None = None) -> Tensor:
    """``(H, W)``: the gradient of ``mask_score`` with respect to ``pixels (1, C, H, W)`` times the pixels, summed
    over the channels, back through the decoder, the neck and our image encoder."""
    return _input_x_gradient(half, model, pixels, inputs, mask, cell, rules=False)


def attnlrp(half, model, pixels: Tensor, inputs: Mapping[str, Tensor], mask: int,
            cell: tuple[int, int] | None = None) -> Tensor:
    """``(H, W)``: AttnLRP of ``mask_score``, the relevance of each input pixel summed over the channels: input x
    gradient under the image encoder's rules and the library's (``library_rules``). Signed: positive pixels speak
    for the mask's logits, negative against."""
    return _input_x_gradient(half, model, pixels, inputs, mask, cell, rules=True)


def legrad(half, model, pixels: Tensor, inputs: Mapping[str, Tensor], mask: int,
           cell: tuple[int, int] | None = None, start_layer: int = LEGRAD_START) -> Tensor:
    """``(gh, gw)``: LeGrad (Bousselham et al. 2024) of the mask on SAM's image encoder's patch grid. As the authors
    read CLIP's ``ln_post`` at every layer, the neck and the mask decoder read each layer's output from
    ``start_layer`` on (the last two by default), and the positive gradient of the mask's logits there, summed over
    the mask (its region where the last layer's logits are > 0, the same region at every layer) or at ``cell``,
    with respect to that layer's attention is averaged over heads and queries and summed over the layers
    (``relevance.legrad_of_readout``: in chunks, a windowed layer's keys back on their tokens). SAM 2's FPN neck
    reads every stage at once, so there is no one layer's output to read: PromptError."""
    if half.family not in MAP_FAMILIES["legrad"]:
        raise PromptError(MAP_REFUSALS.get(("legrad", half.family)) or f"LeGrad of the mask does not reach "
                          f"{half.family}'s image encoder")
    grid = model.patch_grid(*pixels.shape[-2:])
    region = None

    def mask_at(out: Tensor) -> Tensor:  # the last layer is read first: its mask is the region at every layer
        nonlocal region
        embedding = half.library.vision_encoder.neck(out.reshape(out.shape[0], *grid, -1))  # (1, C, gh, gw)
        _, logits = decode(half, embedding, inputs)
        if cell is not None:
            return mask_score(logits, mask, cell)
        if region is None:
            mask_score(logits, mask, None)  # PromptError for an empty mask
            region = logits[0, 0, mask].detach() > 0
        return logits[0, 0, mask][region].sum()

    return legrad_of_readout(model, pixels, mask_at, start_layer)[0]


def _is_activation(module: torch.nn.Module) -> bool:
    """An element-wise activation module: torch's GELU / ReLU / SiLU or one of transformers' ``ACT2FN`` classes."""
    return (isinstance(module, (torch.nn.GELU, torch.nn.ReLU, torch.nn.SiLU))
            or type(module).__module__ == "transformers.activations")


def _norm_rule(module, args, output) -> Tensor:
    """A LayerNorm's output with its scale held constant (``AttnLRPRules.layer_norm``, lxt's ``layer_norm_forward``);
    SAM's channels-first LayerNorm permuted to channels-last and back, as its own forward does."""
    x = args[0]
    if getattr(module, "data_format", "channels_last") == "channels_first":  # (B, C, H, W): normed over C
        return AttnLRPRules().layer_norm(x.permute(0, 2, 3, 1), module).permute(0, 3, 1, 2)
    return AttnLRPRules().layer_norm(x, module)


def _activation_rule(module, args, output) -> Tensor:
    """An activation module's output under the identity rule (lxt's ``non_linear_forward``)."""
    return identity_rule(args[0], module.forward)


def _attention_rule(factor: float) -> Callable:
    """A hook dividing a decoder attention's projected q, k or v gradient by ``factor`` (lxt's
    ``wrap_attention_forward``: 4, 4, 2)."""
    return lambda module, args, output: divide_gradient(output, factor)


def _masks_rule(module, args, output) -> tuple:
    """The decoder's masks ``hyper_in @ upscaled_embedding``, a product of two image-dependent factors, under the
    uniform rule: half the relevance to each, which is the masks' gradient halved."""
    return (divide_gradient(output[0], 2.0), *output[1:])


@contextlib.contextmanager
def library_rules(half) -> Iterator[None]:
    """For the ``with`` block, lxt's AttnLRP rules on the prompt half's modules (transformers' neck, prompt encoder
    and mask decoder), as forward hooks that give the same values (to float rounding) with the rule's backward:
    every LayerNorm (``_norm_rule``), every activation module (``_activation_rule``), each decoder attention's
    projected q, k and v (``_attention_rule``: lxt divides them as they enter the attention function; the head split
    between is a reshape, which the division passes through) and the decoder's masks (``_masks_rule``). Module
    hooks on modules every session shares, each acting in this thread only (``this_thread_only``): a concurrent
    prompt's forward and gradients are its own."""
    handles = []
    try:
        for module in half.library.modules():
            if isinstance(module, torch.nn.LayerNorm):
                handles.append(module.register_forward_hook(this_thread_only(_norm_rule)))
            elif _is_activation(module):
                handles.append(module.register_forward_hook(this_thread_only(_activation_rule)))
        for attention in attention_modules(half).values():
            for name, factor in (("q_proj", 4.0), ("k_proj", 4.0), ("v_proj", 2.0)):
                rule = this_thread_only(_attention_rule(factor))
                handles.append(getattr(attention, name).register_forward_hook(rule))
        handles.append(half.decoder.register_forward_hook(this_thread_only(_masks_rule)))
        yield
    finally:
        for handle in handles:
            handle.remove()
