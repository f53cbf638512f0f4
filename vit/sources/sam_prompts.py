"""SAM's and SAM 2's prompt half — the neck, the prompt encoder and the mask decoder — read from the HF folder the
image encoder was opened from (``SamModel`` / ``Sam2Model``) and run by transformers' own modules on this
project's image encoder's output.

The image encoder is ours (``vit.sources.ports.families.import_sam`` / ``import_hiera``, equal to the library's to
1e-5); what follows it is transformers' code with the folder's weights: the library's model class built from the
folder's config on the meta device, its image encoder's blocks left out, every other tensor read from the folder's
weights (no code from the folder). Its masks and IoU scores are the library's for the same image embedding by
construction; ``tests/test_sam_prompts.py`` checks them against the library's whole model on the same pixels.

The half is built with ``attn_implementation="eager"``, so its attention modules return their weights
(``vit.explain.methods.segment`` runs it, reads them and maps the prompts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vit.checkpoint import CheckpointError

# the HF architectures whose prompt half opens; SAM 3 tracker's opens by the library road, whole: its own vision
# encoder is the image encoder
ARCHITECTURES = {"SamModel": "sam", "Sam2Model": "sam2", "Sam3TrackerModel": "sam3_tracker"}
# the HF architectures whose image encoder opens but whose prompt half does not, and why (one line each)
REFUSED = {"SamHQModel": "SAM-HQ's mask decoder also reads its image encoder's global layers' outputs (its "
                         "intermediate embeddings), which vit.segment does not hand it; its image encoder's maps are "
                         "drawn, and prompts segment on SAM, SAM 2 and SAM 3 tracker"}


class PromptHalfError(CheckpointError):
    """A model whose prompt encoder and mask decoder cannot be read; the message says what to do."""


@dataclass
class PromptHalf:
    """transformers' ``SamModel`` / ``Sam2Model`` without its image encoder's blocks (``library``), for the image
    encoder opened from the same folder; ``family`` is ``"sam"`` or ``"sam2"``. SAM 3 tracker's (``"sam3_tracker"``)
    is the whole ``Sam3TrackerModel`` the library road opened, its vision encoder the image encoder."""

    family: str
    library: torch.nn.Module
    folder: Path
    _positional: torch.Tensor | None = field(default=None, init=False, repr=False)

    def image_positional_embeddings(self) -> torch.Tensor:
        """The library's positional encoding of the image embedding's grid, ``(1, C, gh, gw)``
        (``get_image_wide_positional_embeddings``): it depends on the weights alone, so it is made once here, where
        the library's forward makes it again (SAM ViT-B: 64 x 64 x 256 sines and cosines) at every prompt. Made
        outside inference mode, so a gradient's graph may read it too."""
        if self._positional is None:
            with torch.inference_mode(False), torch.no_grad():
                self._positional = self.library.get_image_wide_positional_embeddings()
        return self._positional

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


def _library_half(checkpoint, folder: Path) -> PromptHalf:
    """SAM 3 tracker's prompt half: the ``Sam3TrackerModel`` the library road opened (``checkpoint.model.model``),
    every module the library's; its mask decoder's attention made eager, so its modules return their weights."""
    library = getattr(checkpoint.model, "model", None)
    if getattr(checkpoint, "road", None) != "library" or type(library).__name__ != "Sam3TrackerModel":
        raise PromptHalfError(f"{folder}: SAM 3 tracker's prompts run on the model the library road opens; open it "
                              "with vit.load(folder)")
    library.mask_decoder.config._attn_implementation = "eager"  # its weights returned, not fused away
    return PromptHalf("sam3_tracker", library, folder)


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
    source = checkpoint.metadata.get("source", {}) if isinstance(checkpoint.metadata, Mapping) else {}
    refused = REFUSED.get(str(source.get("architecture", "")).removeprefix("hf:"))
    if refused:
        raise PromptHalfError(refused)
    if name is None:
        shown = checkpoint.metadata.get("architecture", "this model") if isinstance(checkpoint.metadata, Mapping) \
            else "this model"
        raise PromptHalfError(f"{shown} has no prompt encoder or mask decoder here; open a whole SAM or SAM 2 "
                          "(an HF SamModel / Sam2Model folder or Hub id) to segment with prompts")
    family = ARCHITECTURES[name]
    folder = Path(checkpoint.metadata["source"]["path"])
    if family == "sam3_tracker":
        return _library_half(checkpoint, folder)
    model_class, config_class = _library_class(family)
    from vit.sources.files import library_error_line, library_errors

    try:
        config = config_class.from_pretrained(folder)
    except library_errors() as e:
        raise PromptHalfError(f"{folder}: {library_error_line(e)}") from None
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
    expected = library.state_dict()  # shapes only (meta): torch's own refusal is a multi-line RuntimeError
    wrong = [k for k, t in state.items() if k in expected and tuple(t.shape) != tuple(expected[k].shape)]
    if wrong:
        more = f" and {len(wrong) - 1:,} more" if len(wrong) > 1 else ""
        raise PromptHalfError(f"{folder}: the {name} weights do not match its config.json (size mismatch for "
                              f"{wrong[0]}: {tuple(state[wrong[0]].shape)} in the weights, "
                              f"{tuple(expected[wrong[0]].shape)} in the config{more}); give the folder the "
                              "config.json saved with these weights (save_pretrained writes both)")
    missing, unexpected = library.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        what = f"lacks {missing[0]}" if missing else f"has {unexpected[0]}, which its config does not build"
        raise PromptHalfError(f"{folder}: the {name} weights do not match its config.json ({what}); the prompt half "
                          "cannot be read")
    empty = [n for n, t in (*library.named_parameters(), *library.named_buffers()) if t.is_meta]
    if empty:
        raise PromptHalfError(f"{folder}: {name}'s {empty[0]} is not in its weights; the prompt half cannot be read")
    parameter = next(checkpoint.model.parameters())
    library = library.to(device=parameter.device, dtype=parameter.dtype).eval().requires_grad_(False)
    half = PromptHalf(family, library, folder)
    return half
