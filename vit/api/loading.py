"""Opening a model and listing what it offers: ``vit.load``, ``vit.shipped``, ``vit.samples``, ``vit.methods``.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from vit import registry
from vit.checkpoint import Checkpoint
from vit.core.runfiles import (
    DEFAULT_CHECKPOINT,
    default_checkpoints_dir,
    images_in,
)
from vit.explain.views import (
    attention_maps,
    image_analysis,
)


def load(source: str | os.PathLike | torch.nn.Module, device: str | torch.device | None = None, *,
         image_size: int | tuple[int, int] | None = None, mean: tuple[float, ...] | None = None,
         std: tuple[float, ...] | None = None, grid: tuple[int, int] | None = None,
         prefix: int | None = None) -> Checkpoint:
    """Open any model the explorer opens: our ``.pt``, an HF / timm / torchvision / open_clip folder or file, or a
    Hub id (``ORG/NAME[@REVISION]``, ``hf-hub:ORG/NAME``, a timm name), downloaded into the HF cache first when
    needed. ``device`` defaults to a GPU when there is one. A transformers vision model whose family has no port
    opens as transformers builds it, a timm architecture the ports refuse as timm builds it (``Checkpoint.road ==
    "library"``: its attention and rollout are drawn). Raises ``CheckpointError`` with a one-line message.

    ``source`` may be a live ``torch.nn.Module`` (the authors' DINOv2, OpenAI's or open_clip's CLIP, a timm model, a
    fine-tune in a class of your own): it opens as it is, on its own device, in eval mode, nothing written or copied
    (``vit.sources.library_road.module_road``), its attention recorded where it is computed. ``image_size`` is the
    input it takes, ``mean`` / ``std`` its normalisation (default: what the object declares), ``grid`` (rows,
    cols) / ``prefix`` (tokens before the patches) where inference cannot place its tokens."""
    if isinstance(source, torch.nn.Module):
        from vit.sources.library_road.module_road import open_module

        if device is not None:
            raise TypeError("a module in hand runs on its own device: move it first (module.to(device)), then "
                            "vit.load(module, ...)")
        return open_module(source, image_size, mean, std, grid, prefix)
    if any(v is not None for v in (image_size, mean, std, grid, prefix)):
        raise TypeError("image_size, mean, std, grid and prefix are for a module in hand (vit.load(module, ...)); "
                        "a folder or Hub id declares its own")
    from vit.sources.open import open_source

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return open_source(source, map_location=device, library_road=True)


def shipped(name: str | None = None) -> Path:
    """The path of a checkpoint shipped with the explorer (``cifar10-cifar-m-gpu``, the default the app opens;
    ``cifar10-cifar-s``, trained on 2 CPU cores; ``mnist-p4``), wherever it is installed."""
    return default_checkpoints_dir() / f"{name or Path(DEFAULT_CHECKPOINT).stem}.pt"


def samples(name: str | None = None) -> list[Path]:
    """The sample images shipped with checkpoint ``name`` (the default checkpoint's without one)."""
    return images_in(default_checkpoints_dir() / "samples" / (name or Path(DEFAULT_CHECKPOINT).stem))


def methods(checkpoint: Checkpoint | None = None) -> dict[str, str]:
    """The maps ``explain`` draws, ``{method: "what it is — which models it applies to"}``, in the explorer's order:
    every one, then the maps of typed labels alone (Grad-ECLIP, the training-free dense maps SCLIP, NACLIP,
    ClearCLIP, MaskCLIP, CLIP Surgery, and dino.txt's, which ``vit.ask(...).explain`` draws); or with ``checkpoint``
    those ``explain`` draws for that model (the explorer's choice for it, its default first; a CLIP's, SigLIP's or
    dino.txt's maps of typed labels are ``vit.ask_methods``). The arguments each reads are in ``explain``'s
    docstring."""
    every = {m.name: m for m in registry.methods()}  # the built-ins, then the plugins'
    kinds = [k for k, m in every.items() if m.group != "words"] if checkpoint is None else _drawn_for(checkpoint)
    drawn = {kind: f"{every[kind].title} — {every[kind].applies_to}" for kind in kinds}
    if checkpoint is None:  # the maps of typed labels, which vit.ask draws: vit.ask_methods(checkpoint) for a model
        drawn.update({m.name: f"{m.title} of a typed label — {m.applies_to}, through "
                              f"vit.ask(checkpoint, image, labels).explain(label, {m.name!r})"
                      for m in every.values() if m.group == "words"})
    return drawn


def _drawn_for(checkpoint: Checkpoint) -> list[str]:
    """The methods ``explain`` draws for ``checkpoint``'s model, as it decides: the explorer's map kinds for the
    model (``attention_maps.map_kinds``), less the class-specific ones without a classifier and Chefer's LRP where its
    rules do not reach."""
    from vit.explain.methods.relevance import lrp_rule_missing

    if not isinstance(checkpoint, Checkpoint):
        raise TypeError(f"vit.methods takes a checkpoint (vit.load(...)), got a {type(checkpoint).__name__}")
    if getattr(checkpoint.model, "takes_clips", False):  # PE video: the registered ones of its clip maps (explain's
        return ["attention", "rollout", "probe"]  # docstring names "temporal" beside them, as TimeSformer's)
    if checkpoint.road == "library":  # transformers' own model: the maps its recorded attention draws so far
        from vit.explain.views.library.road_maps import method_names

        return method_names(bool(checkpoint.class_names), checkpoint.model)
    model = checkpoint.model
    shape = image_analysis.shape_of_input(checkpoint, checkpoint.preprocessing.image_hw)
    kinds = attention_maps.map_kinds(shape, bool(checkpoint.class_names))
    if model.head is None:
        kinds = [k for k in kinds if not attention_maps.is_class_map(k)]
    if not shape.staged and lrp_rule_missing(model.config):
        kinds = [k for k in kinds if k not in ("lrp", "lrp-partial", "lrp-full")]
    if model.cls_token is None:
        kinds = [k for k in kinds if k != "attn-gradcam"]
    return kinds
