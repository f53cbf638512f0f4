"""Classify images with a checkpoint: ``python -m vit.predict CHECKPOINT IMAGE [IMAGE ...]``.

Prints a JSON list with one object per readable image: ``{"image": PATH, "predictions":
[{"label": ..., "probability": ...}, ...]}``, most probable first. With ``--save-maps DIR``
each image also gets, named after its file (``photo.jpg`` -> ``photo``; a second
``photo.png`` -> ``photo-1``), and listed under ``"maps"`` in its object:

  DIR/<stem>.npz          raw attentions ``layer_0`` .. ``layer_{L-1}``, each (heads, T, T),
                          with ``probabilities``, ``logits`` and ``class_names`` when the
                          model has a classifier (feature models such as DINO have none), and the
                          geometry: ``grid`` (rows, cols), ``patch_size``, ``prefix_tokens``,
                          ``input_size`` (height, width) and ``input_box`` (x0, y0, x1, y1: the
                          part of the original image the model saw; a centre crop for
                          preprocessing that crops, as HF DINOv2's and timm's ``crop_pct``; past the
                          image's right or bottom edge for SAM's padding)
  DIR/<stem>_cls.png      the last layer's CLS attention averaged over heads, over that part
  DIR/<stem>_rollout.png  attention rollout over all layers (mean over heads), over that part

Both overlays are at the image's own resolution. The ``.npz`` is written layer by layer (uncompressed, so its
size is known before: it is printed on stderr first), each layer's attention computed in chunks from the
layer's input, so memory stays bounded at any ``--size``; ``--maps-dtype float16`` halves the file. An image
whose maps would exceed ``--max-maps-mb`` (default 4096, or env VIT_MAX_MAPS_MB) is refused before any work.
Until it is complete the ``.npz`` has no name (on Linux), so a killed command leaves no part of it behind.

Asking a CLIP, SigLIP or dino.txt in words: ``--labels "a dog,a cat"`` (commas, semicolons or line breaks
between labels) prints the zero-shot predictions in the same shape, ``label`` being the typed label; each label is
filled into ``--template`` (default "a photo of a {}."; "{}" uses the labels verbatim; "imagenet" averages
open_clip's 80 ImageNet templates). CLIP's and dino.txt's probabilities are a softmax over the labels, SigLIP's
each label's own sigmoid. With ``--save-maps`` the ``.npz`` also holds ``prompt_<method>`` (labels, rows, cols): every
label's map by each method that applies (rollout, legrad, attnlrp, grad_eclip, the similarity the target; the
training-free sclip, naclip, clearclip, maskclip, clipsurgery and dino.txt's dinotxt, the similarity itself),
with ``class_names`` the labels and ``probability_kind``; each map is also drawn as
``<stem>_<method>_<i>.png`` (i: the label's place, from 0), listed under ``"maps"`` → ``"prompts"``.

A video model (VideoMAE) takes clips instead: each IMAGE is a video file (MP4, WebM, MKV, MOV, AVI, MPEG: PyAV), an
animated GIF or a folder of frames, sampled uniformly to the model's ``num_frames``; with ``--save-maps`` its
``<stem>.npz`` holds ``layer_i`` (heads, T, T) over the tubelet tokens (time-major: token ``n`` is tubelet
``(n // (rows*cols), n // cols % rows, n % cols)``), ``grid`` (tubelets, rows, cols), ``tubelet`` (frames per
token) and ``frames`` (the sampled frame indices). TimeSformer's divided layers are saved as its blocks compute them:
``layer_i`` (frames, heads, 1 + P, 1 + P), each frame's spatial attention with the CLS copied in front (HF's
``output_attentions``), and ``temporal_i`` (P, heads, frames, frames), each patch position ``row*cols + col`` over its
frames; P = rows*cols.

Asking a vision-language model (LLaVA, LLaVA-NeXT, Qwen2.5-VL, Qwen3-VL, PaliGemma, Gemma 3, InternVL; its folder
saved whole with its processor): ``--ask "what is this?"`` prints ``{"image", "question", "answer", "tokens",
"pieces"}`` per image, the question through the model's chat template and the answer transformers' greedy
``generate``, at most ``--max-new-tokens`` (default 32). With ``--save-maps`` its ``<stem>.npz`` holds ``attention``
(answer tokens, layers, heads, rows, cols): each answer token's attention to the image tokens, from the query that
predicted it, placed on the tower's patch grid (each patch holds its image token's: Qwen-VL's 2 x 2 merge units,
LLaVA's patches), written a token and a layer at a time; an image the processor cut into tiles (InternVL, LLaVA-NeXT)
on the tiles' canvas, and ``overview_attention`` on its one view of the whole image (InternVL's thumbnail, NeXT's base
image); ``image_share`` (answer tokens, layers, heads): the share of each row on the image; ``tokens``, ``pieces``,
``answer``, ``grid``, ``patch_size``, ``unit``; ``tam`` (answer tokens, rows, cols): each token's Token Activation
Map (``VLMAnswer.tam``); with ``--lm-method`` (the explorer's ``lm_method`` names: attention, gradxattn,
gradxattn_rollout, tam, attnlrp; default attention tam) also ``gradxattn`` (answer tokens, layers, rows, cols) and
``gradxattn_rollout`` (answer tokens, rows, cols), each token's gradient x attention from one forward and backward
(``VLMAnswer.relevance``), and ``attnlrp`` (answer tokens, rows, cols), each token's AttnLRP to the pixels
(``VLMAnswer.relevance(i, method="attnlrp")``, signed); a tiled image's as ``overview_<name>`` too; ``lens`` writes
``logit_lens`` (answer tokens, layers + 1), each token's probability read at every language-model layer
(``VLMAnswer.logit_lens``). Its largest size is refused before any work past ``--max-maps-mb``, and the last token's
relevance past the memory limit.

Segmenting with a whole SAM, SAM 2 or SAM 3 tracker (an HF ``SamModel`` / ``Sam2Model`` / ``Sam3TrackerModel``
folder or Hub id): ``--points x,y[,label] ...`` (label 1 on the object, the default; 0 off it) and / or ``--box
x0,y0,x1,y1``, in each image's own pixels,
print per image its three masks' predicted IoU (``"scores"``), their areas on the image in pixels and the best one
(``"mask"``); a second image is encoded once, every prompt on it runs the decoder alone. ``--mask N`` (from 0)
chooses the mask the maps explain (default the best), ``--token mask|iou`` the decoder token whose attention is
drawn, ``--relevance gradient_x_input|attnlrp|legrad`` adds which input pixels made the mask (gradient x input,
AttnLRP with lxt's rules through the decoder, the neck and the encoder, or LeGrad on SAM's encoder; summed over it, or
at ``--at x,y``; its memory checked first). With ``--save-maps`` each image gets ``<stem>.npz``
(``vit.Segmentation.save``: scores, mask_logits, masks, the prompt, ``attention/<module>`` (heads, rows, cols) of
each decoder cross-attention, ``map/<method>``), ``<stem>_mask<i>.png`` (each mask over the image) and
``<stem>_<module>.png`` (each cross-attention, its heads averaged, over the pixels the model saw).

``--ablate 2.3,4.1`` zero-ablates those heads
(LAYER.HEAD, counted from 1) for everything above: their outputs are zeroed before the output projection.
``--size N`` (at most 4096) runs the model on an N-px square
instead of its training size (``--keep-aspect``: the long side at N px, the other in proportion),
rounded to whole patches with the position embeddings interpolated. Exit status: 0 when every image was
classified; 1 when some could not be read (each is named on stderr, one line, and the
others are still classified); 2 for a missing or damaged checkpoint, images none of which exists, or invalid
arguments (a missing path is reported before torch loads).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

# Only what parsing needs: torch and the rest load in run(), after the arguments are read (--help answers at once).
from vit.core.cli import (  # noqa: F401 (the other commands import the shared pieces from here too)
    MAX_INPUT_SIDE,
    OneLineParser,
    UsageError,
    add_size_arguments,
    check_folder,
    command_name,
    input_side,
    one_line,
    positive_int,
    run_cli,
)

if TYPE_CHECKING:
    import torch

    from vit.checkpoint import Checkpoint
    from vit.core.inference import InputSize

PROG = "vit.predict"
# A SAM prompt's pixel maps, vit.explain.methods.segment.SEGMENT_METHODS' (written here: parsing loads no torch; a test
# holds the two lists equal)
PROMPT_MAPS = ("gradient_x_input", "attnlrp", "legrad")
MAPS_DTYPES = ("float32", "float16")
MAX_MAPS_MB = 4096  # one image's .npz: ViT-B/16 at 448 px (785 tokens) is 355 MB in float32, at 1,024 px 9.7 GB
MAX_MAPS_ENV = "VIT_MAX_MAPS_MB"
# --ask --save-maps's maps per answer token: vit.explain.language.vlm_answer.MAP_METHODS (the explorer's lm_method),
# named here so that parsing loads no torch (a test holds them equal); TAM, one cheap forward per token, by default
ANSWER_MAP_METHODS = ("attention", "gradxattn", "gradxattn_rollout", "tam", "attnlrp")
DEFAULT_ANSWER_MAPS = ("attention", "tam")
ANSWER_READINGS = ("lens",)  # not maps: each token's logit lens over the language model's layers


def resolve_device(spec: str) -> torch.device:
    """``auto`` (a GPU when there is one), ``cpu`` or ``cuda``; UsageError for a GPU that is not there."""
    import torch

    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda was asked for but no CUDA GPU is available; use --device cpu")
    return torch.device(spec)


def check_model_path(text: str) -> None:
    """UsageError ``checkpoint not found: TEXT``, before torch loads, when ``text`` is no file or folder here and
    cannot name a Hub model either (``vit.sources.hub_names``: a Hub id is left to the Hub)."""
    from vit.sources.hub_names import looks_like_name

    if not Path(text).expanduser().exists() and not looks_like_name(text):
        raise UsageError(f"checkpoint not found: {text}")


def check_paths(args: argparse.Namespace) -> None:
    """Before torch loads: the model exists (or is a Hub id) and so does one image at least (the others are named
    as they are read, the rest classified)."""
    check_model_path(args.checkpoint)
    if not any(Path(image).exists() for image in args.images):
        more = f" and {len(args.images) - 3} more" if len(args.images) > 3 else ""
        raise UsageError(f"no such image file: {', '.join(args.images[:3])}{more}")


# What a model opened as its library builds it (a family with no port: ``vit.load``'s library road) does work with
LIBRARY_WORKS = ("vit-predict and vit-evaluate classify with it, and the notebook API (vit.load) draws its maps "
                 "(vit.explain) and dense views (vit.pca, vit.similarity)")


def open_checkpoint(path: str, device: torch.device, arch: str | None = None, library_road: bool = False,
                    port_only: str | None = None) -> Checkpoint:
    """Any model ``vit.sources.open.open_source`` reads (our .pt, HF/timm folders, timm/torchvision weights). With
    ``library_road``, a model no port reads opens as its library builds it (``Checkpoint.road == "library"``), as
    ``vit.load`` opens it. Without, such a model is refused in one line: ``port_only`` (what the command does that
    needs our own ViT) and what does work with it (``LIBRARY_WORKS``), told by opening it on the meta device."""
    from vit.checkpoint import CheckpointError
    from vit.sources.open import open_source  # imported here: it pulls in the HF/timm/torchvision mappings

    try:
        return open_source(path, arch, map_location=device, library_road=library_road)
    except CheckpointError as e:
        if not library_road and port_only is not None and _opens_by_library(path, arch):
            raise UsageError(library_refusal(port_only)) from None
        raise UsageError(str(e)) from None


def _opens_by_library(path: str, arch: str | None) -> bool:
    """Whether ``path`` opens as its library builds it (no port reads it): opened on the meta device, no weight
    read."""
    from vit.checkpoint import CheckpointError
    from vit.sources.open import open_source

    try:
        return open_source(path, arch, map_location="meta", library_road=True).road == "library"
    except CheckpointError:
        return False


def library_refusal(port_only: str) -> str:
    """The one line of a command that needs our own ViT, given a model opened as its library builds it."""
    return f"{port_only}; a model opened as its library builds it has no port to run that on: {LIBRARY_WORKS}"


def check_library_arguments(checkpoint: Checkpoint, args: argparse.Namespace) -> None:
    """A model opened as its library builds it runs at its own input size, on its own weights and classes:
    UsageError in one line for the options that ask otherwise (those vit.predict and vit.evaluate share)."""
    if checkpoint.road != "library":
        return
    asked = {"--size": args.size, "--keep-aspect": getattr(args, "keep_aspect", False),
             "--labels": getattr(args, "labels", None), "--zero-shot": getattr(args, "zero_shot", False),
             "--template": getattr(args, "template", None), "--ablate": getattr(args, "ablate", None),
             "--save-maps": getattr(args, "save_maps", None), "--points": getattr(args, "points", None),
             "--box": getattr(args, "box", None)}
    given = [flag for flag, value in asked.items() if value not in (None, False)]
    if given:
        raise UsageError(f"{given[0]} is for a model with a port; {args.checkpoint} opens as its library builds it "
                         f"({checkpoint.metadata.get('architecture', 'its own model')}), which runs at its own input "
                         f"size ({checkpoint.preprocessing.size_text}) and predicts its own classes; its maps are "
                         "drawn by vit.explain (vit.load)")


def build_parser() -> argparse.ArgumentParser:
    summary, details = __doc__.split("\n\n", 1)
    p = OneLineParser(prog=command_name(PROG), description=summary, epilog=details,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a .pt checkpoint (vit.train, vit.convert) or vit.train run folder, a Hugging "
                                      "Face or timm model folder, timm / torchvision weights, or a Hub id "
                                      "(ORG/NAME[@REVISION], hf-hub:ORG/NAME, "
                                      "a timm name), downloaded into the HF cache when needed")
    p.add_argument("--arch", metavar="LIB:NAME", help="architecture of bare weights: timm:NAME, torchvision:NAME, "
                   "dinov3:NAME, open_clip:quickgelu|gelu, scratch:num_heads=N or vit_pytorch:heads=N,...")
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files (jpg, png, webp, bmp, gif, tiff)")
    p.add_argument("--top-k", type=positive_int, default=5,
                   help="how many labels to list per image (default 5; at most the number of classes)")
    p.add_argument("--save-maps", metavar="DIR", help="also write attention arrays and overlays into DIR")
    p.add_argument("--maps-dtype", choices=MAPS_DTYPES, default="float32",
                   help="with --save-maps: the .npz's attention precision (float16 halves the file)")
    p.add_argument("--max-maps-mb", type=positive_int, metavar="MB",
                   help=f"with --save-maps: refuse an image whose .npz would be larger (default {MAX_MAPS_MB}, or "
                        f"env {MAX_MAPS_ENV})")
    p.add_argument("--max-tokens", type=positive_int, metavar="N",
                   help="refuse an input of more patches per image (default 16384, or env VIT_MAX_TOKENS; the "
                        "model's CLS and register tokens come on top): attention's work grows with their square")
    p.add_argument("--batch-size", type=positive_int, default=64, help="images per forward pass (default 64)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where the model runs (default auto: a GPU when there is one)")
    p.add_argument("--labels", metavar="TEXT",
                   help="zero-shot labels for a CLIP or SigLIP, e.g. 'a dog,a cat' (at most 64, each at most 200 "
                        "characters)")
    p.add_argument("--template", metavar="TEXT",
                   help="with --labels: where each label goes, '{}' marking it (default 'a photo of a {}.'; "
                        "'{}' for the labels as typed; 'imagenet' for open_clip's 80-template ensemble)")
    p.add_argument("--ablate", metavar="L.H,...",
                   help="zero-ablate these heads (layer.head counted from 1, e.g. 2.3,4.1) before predicting")
    p.add_argument("--ask", metavar="QUESTION",
                   help="ask a vision-language model (its folder) this question about each image")
    p.add_argument("--max-new-tokens", type=positive_int, default=32, metavar="N",
                   help="with --ask: the answer's most tokens (default 32)")
    p.add_argument("--pan-and-scan", action="store_true",
                   help="with --ask, a Gemma 3: its processor's pan-and-scan, a long image cut into crops beside the "
                        "whole, each crop's maps placed where it was cut")
    p.add_argument("--lm-method", nargs="+", choices=ANSWER_MAP_METHODS + ANSWER_READINGS, metavar="METHOD",
                   help=f"with --ask and --save-maps: each answer token's maps to write, of "
                        f"{', '.join(ANSWER_MAP_METHODS)} (default {' '.join(DEFAULT_ANSWER_MAPS)}; gradxattn, "
                        "gradxattn_rollout and attnlrp run the model forward and backward once per token), or lens: "
                        "each token's logit lens, its probability at every language-model layer (logit_lens)")
    p.add_argument("--points", nargs="+", type=prompt_point, metavar="X,Y[,LABEL]",
                   help="a SAM / SAM 2's point prompt in the image's pixels (label 1 on the object, default; 0 off it)")
    p.add_argument("--box", type=prompt_box, metavar="X0,Y0,X1,Y1", help="a SAM / SAM 2's box prompt in the "
                                                                          "image's pixels")
    p.add_argument("--mask", type=int, metavar="N", help="with a prompt: the mask (0-2) the maps explain (default "
                                                         "the best scored)")
    p.add_argument("--token", choices=("mask", "iou"), default="mask",
                   help="with a prompt: the decoder token whose attention is drawn (default mask)")
    p.add_argument("--relevance", choices=PROMPT_MAPS,
                   help="with a prompt and --save-maps: which input pixels made the mask")
    p.add_argument("--at", type=prompt_pixel, metavar="X,Y",
                   help="with --relevance: explain the mask's logit at this image pixel (default: summed over it)")
    add_size_arguments(p, keep_aspect=True)
    return p


def _numbers(text: str, counts: tuple[int, ...], what: str) -> list[float]:
    import math

    parts = text.split(",")
    try:
        values = [float(v) for v in parts]
    except ValueError:
        values = []
    if len(parts) not in counts or len(values) != len(parts) or not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return values


def prompt_point(text: str) -> tuple:
    """argparse type: ``x,y`` or ``x,y,label`` (label 1 or 0)."""
    values = _numbers(text, (2, 3), "a point x,y or x,y,label (label 1 on the object, 0 off it)")
    if len(values) == 3 and values[2] not in (0, 1):
        raise argparse.ArgumentTypeError(f"a point's label must be 1 (on the object) or 0 (off it), got {text!r}")
    return (values[0], values[1], int(values[2])) if len(values) == 3 else (values[0], values[1])


def prompt_box(text: str) -> tuple:
    """argparse type: ``x0,y0,x1,y1``."""
    return tuple(_numbers(text, (4,), "a box x0,y0,x1,y1"))


def prompt_pixel(text: str) -> tuple:
    """argparse type: ``x,y``."""
    return tuple(_numbers(text, (2,), "a pixel x,y"))


def ablated(checkpoint: Checkpoint, heads: str) -> Checkpoint:
    """``checkpoint`` whose model is a copy with ``heads`` (``--ablate``'s text) zero-ablated in its weights
    (``mechanism.ablated_copy``: their columns of the output projection zero), so that its predictions and every
    saved map are the ablated model's, computed as the model's own (in chunks, with progress); UsageError when
    unusable (TimeSformer: a block's two attentions)."""
    from vit.explain.mechanism.components import MechanismError, parse_heads
    from vit.explain.views.mechanism_views import ablated_checkpoint
    from vit.explain.views.video import is_divided

    if is_divided(checkpoint):
        raise UsageError("--ablate: TimeSformer's blocks attend twice (over time, then within a frame), and a head "
                         "names one attention of one; ablate heads of a model with one attention per block")
    model = checkpoint.model
    try:
        chosen = parse_heads(heads, len(model.blocks), [block.attn.num_heads for block in model.blocks])
        return ablated_checkpoint(checkpoint, chosen)  # the explorer's own
    except MechanismError as e:
        raise UsageError(f"--ablate: {e}") from None


def templates(text: str | None) -> list[str]:
    """``--template``'s templates: the default, the ImageNet ensemble ('imagenet'), or the one given."""
    from vit.explain.language.prompts import DEFAULT_TEMPLATE, check_template, imagenet_templates

    if text is None:
        return [DEFAULT_TEMPLATE]
    if text.strip().lower() == "imagenet":
        return imagenet_templates()
    return [check_template(text)]


def asked(checkpoint: Checkpoint, labels: str, template: str | None):
    """``checkpoint`` as a classifier over ``labels`` (``--labels``' text) and the prompts; UsageError when the
    model has no text side or the text is out of bounds."""
    from vit.checkpoint import CheckpointError
    from vit.explain.language.prompts import PromptError, ask, prompt_checkpoint
    from vit.sources.vlm.text_tower import open_text_tower, split_labels

    try:
        prompts = ask(open_text_tower(checkpoint), split_labels(labels), templates(template))
    except (CheckpointError, PromptError) as e:
        raise UsageError(str(e)) from None
    except ValueError as e:
        raise UsageError(f"--labels: {e}") from None
    return prompt_checkpoint(checkpoint, prompts), prompts


def input_size(args: argparse.Namespace) -> InputSize:
    """The ``InputSize`` that ``--size`` and ``--keep-aspect`` ask for."""
    from vit.core.inference import InputSize

    return InputSize(args.size, getattr(args, "keep_aspect", False))


def unique_stem(path: Path, taken: set[str]) -> str:
    """The file name without extension, numbered when an earlier image already took it."""
    stem, n = path.stem, 0
    while (stem if n == 0 else f"{stem}-{n}") in taken:
        n += 1
    name = stem if n == 0 else f"{stem}-{n}"
    taken.add(name)
    return name


def maps_limit_mb(args: argparse.Namespace) -> int:
    """``--max-maps-mb``, else env VIT_MAX_MAPS_MB, else ``MAX_MAPS_MB``."""
    if args.max_maps_mb is not None:
        return args.max_maps_mb
    text = os.environ.get(MAX_MAPS_ENV)
    if not text:
        return MAX_MAPS_MB
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError as e:
        raise UsageError(f"{MAX_MAPS_ENV}: {e}") from None


def most_patches(checkpoint: Checkpoint, size: InputSize) -> tuple[int, int]:
    """``(side, patches)``: the input side ``size`` asks for and the most patches an image can have there (the
    square of that side bounds every image: ``--keep-aspect`` only shortens a side)."""
    side, grid = most_grid(checkpoint, size)
    return side, grid[0] * grid[1]


def most_grid(checkpoint: Checkpoint, size: InputSize) -> tuple[int, tuple[int, int]]:
    """``(side, grid)``: the input side ``size`` asks for and the largest patch grid an image can have there."""
    from vit.core.inference import InputSize

    model, p = checkpoint.model, checkpoint.preprocessing
    side = size.side or max(p.image_hw)  # the long side of a rectangular training size
    shape = p.image_hw if size == InputSize() else InputSize(side).shape((side, side), p, model.config.patch_size)
    return side, model.patch_grid(*shape)


def most_tokens(checkpoint: Checkpoint, size: InputSize) -> tuple[int, int]:
    """``(side, tokens)``: ``most_patches`` with the model's prefix tokens added."""
    side, patches = most_patches(checkpoint, size)
    return side, checkpoint.model.num_prefix_tokens + patches


def check_tokens_fit(checkpoint: Checkpoint, size: InputSize, max_tokens: int | None) -> None:
    """UsageError, before any work, when an image at ``size`` could have more patches than the gate
    (``--max-tokens``, else env VIT_MAX_TOKENS, else ``bounds.MAX_TOKENS``; the prefix tokens come on top): one
    line with the work it implies and how to allow it."""
    from vit.costs.bounds import MAX_TOKENS_ENV, TooManyTokens, check_tokens
    from vit.costs.bounds import max_tokens as gate

    side, patches = most_patches(checkpoint, size)
    try:
        check_tokens(checkpoint.model.config, patches, f"A {side} px input (--size)", gate(max_tokens),
                     f"allow it with --max-tokens {patches} (or env {MAX_TOKENS_ENV})")
    except (TooManyTokens, ValueError) as e:
        raise UsageError(str(e)) from None


def check_forward_fits(checkpoint: Checkpoint, size: InputSize) -> None:
    """UsageError, before any work, when one image's forward at ``size`` (the square of its side bounds every
    image, as ``most_patches`` says) would hold more than the memory limit per image: the cost model's answer
    (``vit.costs.plan.forward``: its costliest block, the input and what its attention layouts form), one line."""
    from vit.costs import plan

    side, grid = most_grid(checkpoint, size)
    try:
        plan.decide(plan.forward(checkpoint.model, grid, f"A {side} px input (--size)"))
    except ValueError as e:  # TooManyTokens; or windows that do not tile the grid (the model's own)
        raise UsageError(str(e).splitlines()[0]) from None


def check_maps_fit(checkpoint: Checkpoint, size: InputSize, dtype: str, limit_mb: int) -> None:
    """UsageError, before any work, when one image's ``.npz`` could exceed ``limit_mb`` (at ``most_tokens``)."""
    from vit.explain.views.map_files import maps_bytes

    config = checkpoint.model.config
    side, tokens = most_tokens(checkpoint, size)
    need = maps_bytes(config.num_layers, config.num_heads, tokens, dtype)
    if need > limit_mb * 2**20:
        half = "" if dtype == "float16" else ", --maps-dtype float16 (half)"
        raise UsageError(f"--save-maps at {side} px would write up to {need / 2**20:,.0f} MB per image "
                         f"({config.num_layers} layers x {config.num_heads} heads x {tokens:,}² {dtype}), over the "
                         f"{limit_mb:,} MB limit; raise --max-maps-mb (or env {MAX_MAPS_ENV}), or use a smaller "
                         f"--size{half}")


def run(args: argparse.Namespace) -> int:
    if args.ask is not None:
        return run_ask(args)
    if args.lm_method:
        raise UsageError("--lm-method chooses the maps of a VLM's answer; it goes with --ask and --save-maps")
    if args.pan_and_scan:
        raise UsageError("--pan-and-scan is how a Gemma 3 reads the image it is asked about; it goes with --ask")
    prompted = args.points is not None or args.box is not None
    if not prompted:
        for flag, value in (("--mask", args.mask), ("--relevance", args.relevance), ("--at", args.at)):
            if value is not None:
                raise UsageError(f"{flag} goes with a SAM prompt (--points or --box)")
    checkpoint = open_checkpoint(args.checkpoint, resolve_device(args.device), args.arch, library_road=True)
    from vit.sources.sam_prompts import architecture

    if prompted and (checkpoint.road != "library" or architecture(checkpoint)):  # SAM 3 tracker's library road too
        return run_prompts(checkpoint, args)
    if checkpoint.road == "library":  # the library's own model: its own logits, at its own input size
        check_library_arguments(checkpoint, args)
        records, failed = predicted(checkpoint, args, None, input_size(args), None, checkpoint, False)
        print(json.dumps(records, indent=2))
        return 1 if failed else 0
    if checkpoint.model.config.tubelet_size:
        return run_clips(checkpoint, args)
    size = input_size(args)
    check_tokens_fit(checkpoint, size, args.max_tokens)
    check_forward_fits(checkpoint, size)  # the image model's own, before the text tower or any image runs
    prompts, tower = None, checkpoint
    if args.labels is not None:
        if args.ablate is not None and args.save_maps:
            raise UsageError("prompt maps of an ablated model are not drawn; drop --ablate or --save-maps")
        checkpoint, prompts = asked(checkpoint, args.labels, args.template)
    elif args.template is not None:
        raise UsageError("--template goes with --labels (the labels to fill into it)")
    if args.ablate is not None:
        checkpoint = ablated(checkpoint, args.ablate)
    maps_dir = Path(args.save_maps) if args.save_maps else None
    if maps_dir is not None:
        check_maps_fit(checkpoint, size, args.maps_dtype, maps_limit_mb(args))
        try:
            maps_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"cannot create --save-maps folder {maps_dir} ({e.strerror or e})") from None
    from vit.core.progress import ForwardProgress
    from vit.model import ViT  # our ViT's maps are computed in chunks by save_maps; a wrapped model's come whole

    whole = maps_dir is not None and not isinstance(checkpoint.model, ViT)
    model = checkpoint.model
    with contextlib.ExitStack() as stack:
        if isinstance(model, ViT):  # another model has no hook points to report from
            progress = stack.enter_context(ForwardProgress(len(model.blocks), prog=PROG))
            stack.enter_context(model.hooks(progress.hooks()))
        records, failed = predicted(checkpoint, args, maps_dir, size, prompts, tower, whole)
    print(json.dumps(records, indent=2))
    return 1 if failed else 0


def save_answer_maps(answer, path: Path, dtype: str, patch_size: tuple[int, int],
                     methods: tuple[str, ...] = DEFAULT_ANSWER_MAPS) -> None:
    """``answer``'s maps by ``methods`` as ``--ask --save-maps`` writes them: ``attention`` (tokens, layers, heads,
    rows, cols) streamed a token and a layer at a time, each computed then from the KV cache; ``gradxattn``
    (tokens, layers, rows, cols), ``gradxattn_rollout`` and ``tam`` (tokens, rows, cols), each token's from one
    run of the model, its image tokens' values kept (``tokens x (layers + 1) x image tokens``) and placed as they
    stream. An image read as tiles: on their canvas, and ``overview_<method>`` on the overview's grid.
    ``image_share`` (tokens, layers, heads) and the answer's tokens and geometry beside."""
    import numpy as np

    from vit.explain.language.vlm_tam import on_layout
    from vit.explain.views.overlay import write_npz_streamed

    n, L, H = len(answer.tokens), answer.layers, answer.heads
    shares = np.array([[answer.image_rows(i, layer).sum(-1).numpy() for layer in range(L)] for i in range(n)],
                      dtype=np.float32)  # (n, L, H)
    layers = (*(range(L) if "gradxattn" in methods else ()), *((None,) if "gradxattn_rollout" in methods else ()))
    relevance = [answer.image_relevance(i, layers) for i in range(n)] if layers else []  # (len(layers), K) each
    tam = [answer.image_tam(i) for i in range(n)] if "tam" in methods else []  # (K,) each
    readings = {"logit_lens": np.stack([answer.logit_lens(i) for i in range(n)])} if "lens" in methods else {}

    def pieces(method: str, view, overview: bool):  # each token's maps on ``view`` (layers, heads, gh, gw) or less
        for i in range(n):
            if method == "attention":  # a layer at a time, each computed now from the KV cache
                for layer in range(L):
                    yield np.stack([answer.attention(i, layer, h, overview=overview) for h in range(H)])
            elif method == "tam":
                yield on_layout(tam[i], view)
            elif method == "attnlrp":  # a run of the model to the pixels per token (and per view: tiles, overview)
                yield answer.relevance(i, overview=overview, method="attnlrp")
            else:
                yield view.place(relevance[i][:L] if method == "gradxattn" else relevance[i][-1:]).numpy()

    each = {"attention": (L, H), "gradxattn": (L,), "gradxattn_rollout": (), "tam": (), "attnlrp": ()}
    views = [("", answer.layout)] + ([("overview_", answer.layout.overview)] if answer.layout.overview else [])
    streamed = [(f"{prefix}{method}", (n, *each[method], *view.grid), dtype, pieces(method, view, bool(prefix)))
                for prefix, view in views for method in ANSWER_MAP_METHODS if method in methods]
    write_npz_streamed(path, streamed, image_share=shares, **readings,
                       tokens=np.array(answer.tokens, dtype=np.int64), pieces=np.array(answer.pieces),
                       answer=np.str_(answer.text), grid=np.array(answer.grid), patch_size=np.array(patch_size),
                       unit=np.array(answer.layout.unit))


def check_answer_maps(vlm, prepared, source, methods: tuple[str, ...], dtype: str, limit: int) -> None:
    """Refused in one line (ValueError) before the answer is generated: ``methods``' maps of the longest answer
    over ``limit`` bytes (``--max-maps-mb``), or the last token's gradient x attention over the memory limit."""
    import numpy as np

    need = prepared.maps_bytes(np.dtype(dtype).itemsize, tuple(m for m in methods if m in ANSWER_MAP_METHODS))
    if need > limit:
        (gh, gw), overview = prepared.layout.grid, prepared.layout.overview
        patches = f"{gh}x{gw}" + (f" + {overview.grid[0]}x{overview.grid[1]}" if overview is not None else "")
        layers, heads = prepared.text.layers, prepared.text.heads
        each = {"attention": f"{layers} layers x {heads} heads", "gradxattn": f"{layers} layers"}
        maps = " + ".join(f"{m} {each.get(m, 1)}" for m in methods)
        raise ValueError(f"--save-maps would write up to {need / 2**20:,.0f} MB for {source} "
                         f"({prepared.max_new_tokens} tokens x ({maps}) maps x {patches} patches), over the "
                         f"{limit // 2**20:,} MB limit; raise --max-maps-mb (or env {MAX_MAPS_ENV}), or ask for "
                         "fewer --max-new-tokens or --lm-method maps")
    if {"gradxattn", "gradxattn_rollout"} & set(methods):
        from vit.explain.language.vlm_relevance import check, check_rollout

        if "gradxattn_rollout" in methods:  # a hybrid's linear layers have no attention to roll out
            check_rollout(vlm)
        check(vlm, prepared, prepared.max_new_tokens - 1)  # the last token's run is the largest
    if "attnlrp" in methods:
        from vit.explain.language import vlm_attnlrp

        vlm_attnlrp.check(vlm, prepared, prepared.max_new_tokens - 1)
    if "lens" in methods:
        from vit.explain.language import vlm_lens

        vlm_lens.check(vlm, prepared, prepared.max_new_tokens - 1, lens=True)


def run_ask(args: argparse.Namespace) -> int:
    """``run`` with ``--ask``: the VLM's answer about each image, one line on stderr for an image that cannot be read
    or asked about; with ``--save-maps`` each answer token's maps by ``--lm-method`` (attention at every layer and
    head, TAM by default), their size and the relevance's memory counted before the answer is generated."""
    from vit.checkpoint import CheckpointError
    from vit.core.images import ImageError, open_image
    from vit.explain.language.vlm_answer import generate_answer, prepare
    from vit.explain.language.vlm_attention import cross_attending
    from vit.sources.vlm.whole_vlm import open_whole_vlm

    for flag, value in (("--labels", args.labels), ("--template", args.template), ("--ablate", args.ablate),
                        ("--size", args.size), ("--keep-aspect", args.keep_aspect)):
        if value:
            raise UsageError(f"{flag} does not go with --ask: the VLM's processor sizes the image")
    try:
        vlm = open_whole_vlm(args.checkpoint, resolve_device(args.device), pan_and_scan=args.pan_and_scan)
    except CheckpointError as e:
        raise UsageError(str(e)) from None
    if args.lm_method and not args.save_maps:
        raise UsageError("--lm-method chooses the maps --save-maps writes; add --save-maps DIR")
    methods = tuple(dict.fromkeys(args.lm_method or DEFAULT_ANSWER_MAPS))
    if cross_attending(vlm.language_model):  # Llama 3.2 Vision, Florence-2: no image tokens in the sequence
        kept = ("attention",) if vlm.model.config.is_encoder_decoder else ("attention", "lens", "attnlrp")
        if set(methods) - set(kept) and args.lm_method:
            raise UsageError(f"{vlm.model_type} reads the image through cross-attention layers: --lm-method "
                             f"{' or '.join(kept)}")
        methods = tuple(m for m in methods if m in kept)
    if "attnlrp" in methods and args.save_maps:
        from vit.explain.language.vlm_attnlrp import check_rules

        try:  # before any answer: a model whose modules take no rule here is refused once
            check_rules(vlm)
        except ValueError as e:
            raise UsageError(str(e)) from None
    maps_dir, limit = (Path(args.save_maps), maps_limit_mb(args) * 2**20) if args.save_maps else (None, 0)
    if maps_dir is not None:
        try:
            maps_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"cannot create --save-maps folder {maps_dir} ({e.strerror or e})") from None
    records, failed, taken = [], 0, set()
    for source in args.images:
        try:
            prepared = prepare(vlm, open_image(source), args.ask, max_new_tokens=args.max_new_tokens)
            if maps_dir is not None:  # before the answer is generated
                check_answer_maps(vlm, prepared, source, methods, args.maps_dtype, limit)
            answer = generate_answer(vlm, prepared)
        except (ImageError, ValueError) as e:
            print(f"{PROG}: skipped {source}: {str(e).splitlines()[0]}", file=sys.stderr)
            failed += 1
            continue
        record = {"image": str(source), "question": args.ask, "answer": answer.text, "tokens": list(answer.tokens),
                  "pieces": list(answer.pieces)}
        if maps_dir is not None:
            path = maps_dir / f"{unique_stem(Path(source), taken)}.npz"
            save_answer_maps(answer, path, args.maps_dtype, vlm.patch_hw, methods)
            record["maps"] = {"npz": str(path)}
        records.append(record)
    print(json.dumps(records, indent=2))
    return 1 if failed else 0


def run_clips(checkpoint: Checkpoint, args: argparse.Namespace) -> int:
    """``run`` for a video model: each IMAGE a clip (a video, a GIF or a folder of frames), one line on stderr for one
    that cannot be read; with ``--save-maps`` every layer's attention over the tubelet tokens."""
    import numpy as np

    from vit.core.clips import ClipError, read_clip
    from vit.explain.views.overlay import npz_array_bytes, write_npz_streamed
    from vit.explain.views.video import analyse_clip, saved_layers, saved_pieces

    for flag, value in (("--labels", args.labels), ("--size", args.size), ("--keep-aspect", args.keep_aspect),
                        ("--template", args.template)):
        if value:
            raise UsageError(f"{flag} is for image models; a video model takes its own clip size")
    if args.ablate is not None:
        checkpoint = ablated(checkpoint, args.ablate)
    maps_dir = Path(args.save_maps) if args.save_maps else None
    c = checkpoint.model.config
    saved = saved_layers(checkpoint)  # the model's own clip size: every clip's maps are this size
    if maps_dir is not None:
        need, limit_mb = sum(npz_array_bytes(shape, args.maps_dtype) for _, shape in saved), maps_limit_mb(args)
        if need > limit_mb * 2**20:  # before any clip is decoded or any file written
            half = "" if args.maps_dtype == "float16" else ", or --maps-dtype float16 (half)"
            raise UsageError(f"--save-maps would write {need / 2**20:,.0f} MB per clip ({len(saved)} arrays of "
                             f"{args.maps_dtype}), over the {limit_mb:,} MB limit; raise --max-maps-mb (or env "
                             f"{MAX_MAPS_ENV}){half}")
        maps_dir.mkdir(parents=True, exist_ok=True)
    records, failed, taken = [], 0, set()
    for source in args.images:
        try:
            sampled = read_clip(source, c.num_frames)
            clip = analyse_clip(checkpoint, sampled.frames, args.top_k, args.max_tokens, "pass a larger --max-tokens")
        except (ClipError, ValueError) as e:
            print(f"{PROG}: skipped: {str(e).splitlines()[0]}", file=sys.stderr)
            failed += 1
            continue
        prediction = clip.analysis.prediction
        record = {"clip": str(source), "predictions": [{"label": label, "probability": p}
                                                       for label, p in prediction.top_k]}
        if maps_dir is not None:
            path = maps_dir / f"{unique_stem(Path(source), taken)}.npz"
            extra = dict(probabilities=prediction.probabilities, logits=prediction.logits,
                         class_names=np.array(checkpoint.class_names)) if checkpoint.class_names else {}
            # one layer at a time (TimeSformer: each layer's two attentions, as its blocks compute them)
            write_npz_streamed(path, ((name, shape, args.maps_dtype, saved_pieces(clip, name))
                                      for name, shape in saved), **extra, grid=np.array(clip.grid),
                               tubelet=np.array(clip.tubelet), patch_size=np.array(c.patch_hw),
                               frames=np.array(sampled.indices))
            record["maps"] = {"npz": str(path)}
        records.append(record)
    print(json.dumps(records, indent=2))
    return 1 if failed else 0


def run_prompts(checkpoint: Checkpoint, args: argparse.Namespace) -> int:
    """``run`` for a SAM / SAM 2 prompt: each image's masks (``vit.segment``), with ``--save-maps`` its arrays and
    pictures; one line on stderr for an image that cannot be read or a prompt outside it."""
    from vit.api import segment
    from vit.core.images import ImageError, open_image
    from vit.costs.bounds import TooManyTokens
    from vit.explain.methods.segment import PromptError, segmenter
    from vit.explain.views.overlay import write_png
    from vit.sources.sam_prompts import PromptHalfError, open_prompt_half

    for flag, value in (("--labels", args.labels), ("--template", args.template), ("--ablate", args.ablate),
                        ("--size", args.size), ("--keep-aspect", args.keep_aspect)):
        if value:
            raise UsageError(f"{flag} does not go with a SAM prompt: SAM runs at its own size")
    if args.at is not None and args.relevance is None:
        raise UsageError("--at goes with --relevance (the map it places)")
    if args.relevance is not None and not args.save_maps:
        raise UsageError("--relevance draws a map: give --save-maps DIR too")
    try:
        segmenter(checkpoint, open_prompt_half)  # the prompt half read (or refused) before any image
    except PromptHalfError as e:
        raise UsageError(str(e)) from None
    maps_dir = Path(args.save_maps) if args.save_maps else None
    if maps_dir is not None:
        maps_dir.mkdir(parents=True, exist_ok=True)
    records, failed, taken = [], 0, set()
    for source in args.images:
        try:
            image = open_image(source)
            done = segment(checkpoint, image, args.points, args.box, mask=args.mask, token=args.token,
                           methods=(args.relevance,) if args.relevance else (), at=args.at)
        except TooManyTokens as e:  # the model's own size: every image would be refused alike
            raise UsageError(str(e)) from None
        except (ImageError, PromptError, OSError) as e:
            print(f"{PROG}: skipped {source}: {str(e).splitlines()[0]}", file=sys.stderr)
            failed += 1
            continue
        record = {"image": str(source), "scores": [float(s) for s in done.scores],
                  "areas": [int(m.sum()) for m in done.masks], "mask": done.mask}
        if maps_dir is not None:
            stem = unique_stem(Path(source), taken)
            saved = {"npz": str(done.save(maps_dir / f"{stem}.npz"))}
            for i in range(len(done.scores)):
                path = maps_dir / f"{stem}_mask{i}.png"
                write_png(path, done.picture(i))
                saved[f"mask{i}"] = str(path)
            for name in (*done.attention, *done.maps):
                path = maps_dir / f"{stem}_{name}.png"
                write_png(path, done.overlay(name))
                saved[name] = str(path)
            record["maps"] = saved
        records.append(record)
    print(json.dumps(records, indent=2))
    return 1 if failed else 0


def predicted(checkpoint: Checkpoint, args: argparse.Namespace, maps_dir: Path | None, size: InputSize, prompts,
              tower: Checkpoint, whole: bool) -> tuple[list[dict], int]:
    """Every image's record (with its maps, given ``maps_dir``) and how many could not be read."""
    from vit.core.inference import predict_files
    from vit.explain.views.map_files import save_maps

    records, failed, taken = [], 0, set()
    for result in predict_files(checkpoint, args.images, args.top_k, output_attentions=whole,
                                batch_size=args.batch_size, size=size):
        if result.prediction is None:
            print(f"{PROG}: skipped: {result.error}", file=sys.stderr)
            failed += 1
            continue
        record = result.to_dict()
        if maps_dir is not None:
            record["maps"] = save_maps(result, checkpoint, maps_dir, unique_stem(result.path, taken), size,
                                       prompts, tower, args.maps_dtype, PROG)
        records.append(record)
    return records, failed


def main(argv: list[str] | None = None) -> int:
    return run_cli(PROG, build_parser(), run, argv, check_paths)


def command() -> None:
    """The console command (pyproject.toml) and ``python -m``: ``main()``'s status, with a fast, quiet exit."""
    from vit.core.cli import run_command

    run_command(main)


if __name__ == "__main__":
    command()
