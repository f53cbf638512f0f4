"""SAM's and SAM 2's prompt half — the neck, the prompt encoder and the mask decoder — read from the HF folder the
image encoder was opened from (``SamModel`` / ``Sam2Model``) and run by transformers' own modules on this
project's image encoder's output.

The image encoder is ours (``vit.sources.import_sam`` / ``import_hiera``, equal to the library's to 1e-5); what
follows it is transformers' code with the folder's weights: the library's model class built from the folder's
config on the meta device, its image encoder's blocks left out, every other tensor read from the folder's weights
(no code from the folder). Its masks and IoU scores are the library's for the same image embedding by
construction; ``tests/test_sam_prompts.py`` checks them against the library's whole model on the same pixels.

The decoder's attention (``decoder_attentions``) is what the library's attention modules return with the eager
implementation (the half is built with ``attn_implementation="eager"``), read from their outputs by a forward
hook: the library itself records only each two-way block's attention output, not its weights.

Prompts are in the image's own pixels and mapped as the library's processors map them (``prompt_scale``):
SamProcessor's to the longer side resized to ``longest_edge`` (before the padding), Sam2Processor's to its square.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from vit.images import resized_size

ARCHITECTURES = {"SamModel": "sam", "Sam2Model": "sam2"}  # the HF architectures whose prompt half opens
# Each two-way block's attention modules as the library names them, then the final token-to-image attention.
BLOCK_ATTENTIONS = ("self_attn", "cross_attn_token_to_image", "cross_attn_image_to_token")
FINAL_ATTENTION = "final_attn_token_to_image"
LABELS = {1: "positive", 0: "negative"}  # SAM's point labels (1: on the object, 0: off it)


class PromptError(ValueError):
    """A prompt or a model that the mask decoder cannot take; the message says what to do."""


@dataclass
class PromptHalf:
    """transformers' ``SamModel`` / ``Sam2Model`` without its image encoder's blocks (``library``), for the image
    encoder opened from the same folder; ``family`` is ``"sam"`` or ``"sam2"``."""

    family: str
    library: torch.nn.Module
    folder: Path

    @property
    def decoder(self) -> torch.nn.Module:
        return self.library.mask_decoder

    @property
    def first_mask_token(self) -> int:
        """The place of the first mask token among the decoder's tokens: SAM's IoU token comes first, SAM 2's object
        score and IoU tokens."""
        return 1 if self.family == "sam" else 2

    @property
    def iou_token(self) -> int:
        return self.first_mask_token - 1

    @property
    def num_mask_tokens(self) -> int:
        return self.decoder.num_mask_tokens

    @property
    def input_size(self) -> int:
        """The side of the square the prompt encoder places points in (the padded input)."""
        return int(self.library.prompt_encoder.input_image_size)

    @property
    def embedding_grid(self) -> tuple[int, int]:
        """The image embedding's grid the decoder attends over (SAM's 64 x 64 at 1,024 px)."""
        return tuple(int(s) for s in self.library.prompt_encoder.image_embedding_size)


def architecture(checkpoint) -> str | None:
    """The HF architecture of ``checkpoint``'s folder when its prompt half opens, else None."""
    source = checkpoint.metadata.get("source", {}) if isinstance(checkpoint.metadata, Mapping) else {}
    name = str(source.get("architecture", "")).removeprefix("hf:")
    return name if name in ARCHITECTURES and source.get("path") else None


def _library_class(family: str):
    import transformers

    return (transformers.SamModel, transformers.SamConfig) if family == "sam" else \
        (transformers.Sam2Model, transformers.Sam2Config)


def _kept(key: str) -> bool:
    """The folder's tensors the prompt half reads: all but the image encoder's (the neck's kept)."""
    return not key.startswith("vision_encoder.") or key.startswith("vision_encoder.neck.")


def open_prompt_half(checkpoint) -> PromptHalf:
    """The prompt half of ``checkpoint`` (a SAM / SAM 2 opened from an HF ``SamModel`` / ``Sam2Model`` folder), on
    its model's device; PromptError in one line for any other model or a folder whose weights do not fit."""
    from vit.sources.open import read_hf_weights

    name = architecture(checkpoint)
    if name is None:
        shown = checkpoint.metadata.get("architecture", "this model") if isinstance(checkpoint.metadata, Mapping) \
            else "this model"
        raise PromptError(f"{shown} has no prompt encoder or mask decoder here; open a whole SAM or SAM 2 "
                          "(an HF SamModel / Sam2Model folder or Hub id) to segment with prompts")
    family = ARCHITECTURES[name]
    folder = Path(checkpoint.metadata["source"]["path"])
    model_class, config_class = _library_class(family)
    config = config_class.from_pretrained(folder)
    config._attn_implementation = "eager"  # the decoder's attention weights returned, not fused away
    with torch.device("meta"):  # nothing allocated: every tensor kept comes from the folder below
        library = model_class(config)
    encoder = torch.nn.Module()  # the image encoder is ours: only its neck is the library's here
    encoder.neck = library.vision_encoder.neck
    library.vision_encoder = encoder
    state = read_hf_weights(folder, "cpu", _kept)
    for target, source in (getattr(library, "_tied_weights_keys", None) or {}).items():
        if target not in state and source in state:  # saved once, used twice (SAM's positional embedding)
            state[target] = state[source]
    missing, unexpected = library.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        what = f"lacks {missing[0]}" if missing else f"has {unexpected[0]}, which its config does not build"
        raise PromptError(f"{folder}: the {name} weights do not match its config.json ({what}); the prompt half "
                          "cannot be read")
    empty = [n for n, t in (*library.named_parameters(), *library.named_buffers()) if t.is_meta]
    if empty:
        raise PromptError(f"{folder}: {name}'s {empty[0]} is not in its weights; the prompt half cannot be read")
    parameter = next(checkpoint.model.parameters())
    library = library.to(device=parameter.device, dtype=parameter.dtype).eval().requires_grad_(False)
    half = PromptHalf(family, library, folder)
    return half


def check_grid(half: PromptHalf, grid: tuple[int, int]) -> None:
    """PromptError unless the image embedding's grid is the one the prompt encoder was built for."""
    if tuple(grid) != half.embedding_grid:
        raise PromptError(f"the image embedding is {grid[0]}x{grid[1]} and this model's prompt encoder expects "
                          f"{half.embedding_grid[0]}x{half.embedding_grid[1]}; segment at the model's own size")


def stage_ends(config) -> list[int]:
    """The last block of each stage (a plain ViT's one stage: its last block)."""
    depths = config.stage_depths or (config.num_layers,)
    return [sum(depths[:i + 1]) - 1 for i in range(len(depths))]


def image_embedding(half: PromptHalf, model, pixels: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
    """What the library's decoder takes as ``image_embeddings`` for ``pixels`` ``(B, C, H, W)``, from our image
    encoder: SAM's ``(B, C, gh, gw)`` (the neck on the last block); SAM 2's list, high resolution first, as
    ``Sam2Model.get_image_embeddings`` makes it (the FPN neck on each stage's output, the two finer levels through
    the decoder's ``conv_s0`` / ``conv_s1``, the empty memory added to the coarsest). In the autograd graph when
    gradients are on."""
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
    import math

    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise PromptError(f"{what} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise PromptError(f"{what} must be a finite number, got {value!r}")
    return number


def make_prompt(points: Sequence | None, box: Sequence | None, image_size: tuple[int, int]) -> Prompt:
    """A checked ``Prompt``: each point ``(x, y)`` or ``(x, y, label)`` (label 1 on the object, the default; 0 off
    it) and the box inside the image ``image_size = (width, height)``; at least one of them. PromptError in one
    line."""
    width, height = image_size
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


def prompt_tensors(half: PromptHalf, prompt: Prompt, scale: tuple[float, float], device: torch.device | None = None
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


def decode(half: PromptHalf, embedding, prompt_inputs: Mapping[str, torch.Tensor], multimask: bool = True):
    """The library's forward from the image embedding on: ``(iou_scores (1, 1, M), pred_masks (1, 1, M, 4gh, 4gw))``,
    M = 3 with ``multimask`` (SAM's three masks) else 1."""
    out = half.library(image_embeddings=embedding, multimask_output=multimask, **prompt_inputs)
    return out.iou_scores, out.pred_masks


def attention_modules(half: PromptHalf) -> dict[str, torch.nn.Module]:
    """The decoder's attention modules by name: ``layers.{i}.{self_attn | cross_attn_token_to_image |
    cross_attn_image_to_token}`` then ``final_attn_token_to_image``."""
    transformer = half.decoder.transformer
    named = {f"layers.{i}.{kind}": getattr(block, kind) for i, block in enumerate(transformer.layers)
             for kind in BLOCK_ATTENTIONS}
    named[FINAL_ATTENTION] = getattr(transformer, FINAL_ATTENTION)
    return named


@contextlib.contextmanager
def decoder_attentions(half: PromptHalf) -> Iterator[dict[str, torch.Tensor]]:
    """For the ``with`` block, every decoder attention module's weights as the library's eager attention returns
    them (post-softmax ``(B * masks, heads, queries, keys)``), by ``attention_modules`` name."""
    recorded: dict[str, torch.Tensor] = {}
    handles = []
    for name, module in attention_modules(half).items():
        def keep(module, args, output, name=name) -> None:
            recorded[name] = output[1]
        handles.append(module.register_forward_hook(keep))
    try:
        yield recorded
    finally:
        for handle in handles:
            handle.remove()
