"""An encoder-decoder whose encoder reads the image alone (issue 113): its question, and where its image tokens
sit: Pix2Struct's, PP-FormulaNet's, a ``VisionEncoderDecoderModel``'s (Donut, TrOCR, a ViT under BERT); and a
decoder whose cross-attention layers read a tower's states (Idefics'). Its decoder writes the answer
and reads the image through its cross-attention over the encoder's states, which are the image's tokens and nothing
else: answer token ``i``'s cross-attention row at a decoder layer is its attention over the image.

Where each state sits on the image is read from what the processor gives, never from the model's name:
Pix2Struct's ``flattened_patches`` carry each patch's row and column (its first two features, 1-based; 0 for the
padding past the image's patches), so the patch grid and each state's place come from them; a pixel tensor of one
view gives the patch grid over the tower's patch, and the count of the encoder's states (known once it has run: the
keys its decoder's cross-attention reads) gives the patches each covers (a hierarchical tower's last stage, Swin's
merges: a whole number of patches a side) and the tokens before them that cover none (a ViT's CLS, DeiT's
distillation token). What no whole unit gives is laid out as one list over the states, ``unplaced`` naming why.

An encoder that reads the prompt too (Florence-2's, the image's tokens among the prompt's, found by the image token)
is laid out as a decoder-only model's prompt is; one that joins them otherwise (UDOP's patches merged with the
words' boxes) is refused in one line (``reads_prompt_unmarked``).
"""

from __future__ import annotations

import inspect
from dataclasses import replace

import torch

from vit.explain.language.vlm_layouts import ImageLayout

MAX_UNIT = 32  # patches a side one encoder state covers: Donut-Swin's last stage is 8, deeper pyramids 32
LEADS = (0, 1, 2)  # states before the patches' that cover none: none, a CLS, a CLS and a distillation token
PENDING = "its encoder's states are counted when it runs"  # a layout settled once the encoder has run (``settle``)


def reads_image_alone(vlm) -> bool:
    """Whether ``vlm`` is an encoder-decoder whose encoder reads the image alone: the encoder its model names
    (``get_encoder``) takes no prompt (no ``input_ids``: Pix2Struct's reads ``flattened_patches``, PP-FormulaNet's and
    a VisionEncoderDecoder's ``pixel_values``); Florence-2's BART encoder reads the prompt, the image's tokens in
    it."""
    if not getattr(vlm.model.config, "is_encoder_decoder", False) or not hasattr(vlm.model, "get_encoder"):
        return False
    encoder = vlm.model.get_encoder()
    return encoder is not None and "input_ids" not in inspect.signature(encoder.forward).parameters


def reads_tower_states(vlm) -> bool:
    """Whether ``vlm``'s answer reads the image through cross-attention over states that are the image's alone: an
    encoder-decoder's encoder over the image (``reads_image_alone``), or the tower's states (or its resampler's
    latents) a decoder's cross-attention layers read (Idefics' gated layers), for a model no layout here names
    (Llama 3.2 Vision's tiles are ``vlm_layouts``')."""
    from vit.explain.language.vlm_attention import cross_attending
    from vit.registry import VLM_ARCHITECTURES

    return reads_image_alone(vlm) or (vlm.model_type not in VLM_ARCHITECTURES
                                      and cross_attending(vlm.language_model))


def decoder_prompted(vlm, images, text: str):
    """The processor's inputs for ``images`` and the question ``text`` of a model whose encoder reads the image
    alone: the question is the decoder's prompt, as the processor gives it (Pix2Struct's ``decoder_input_ids``),
    else the tokenizer's ids of it without special tokens (Donut's documented prompting of its decoder) beside the
    processor's pixels alone, where it makes the text training ``labels`` or ``input_ids`` (a TrOCR or Donut
    processor's) or takes none (PP-FormulaNet's);
    ``generate`` puts the decoder's start token before it where the model wants one."""
    from vit.explain.language.vlm_inputs import processed

    if "text" in inspect.signature(vlm.processor.__call__).parameters:
        inputs = processed(vlm, images=images, text=text)
        if "decoder_input_ids" in inputs:
            return inputs
    inputs = processed(vlm, images=images)  # the encoder's alone: a text of the processor's would be labels or ids
    ids = vlm.processor.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    if ids.shape[-1]:
        inputs["decoder_input_ids"] = ids
    return inputs


def reads_prompt_unmarked(vlm) -> str | None:
    """Why an encoder-decoder whose encoder reads the prompt beside the image cannot be asked, or None: neither its
    config nor its processor names an image token, so nothing says where the image's states sit among the
    encoder's (UDOP's joins its patches with the words' boxes)."""
    from vit.explain.language.vlm_attention import image_token_id

    if not getattr(vlm.model.config, "is_encoder_decoder", False) or reads_image_alone(vlm):
        return None
    if image_token_id(vlm.model.config) is not None or getattr(vlm.processor, "image_token_id", None) is not None:
        return None
    return (f"its encoder ({type(vlm.model).__name__}) reads the prompt and the image together, and neither its "
            "config nor its processor names an image token that says where the image's states sit among the "
            "encoder's")


def encoder_layout(vlm, inputs) -> ImageLayout:
    """The layout of the image read by an encoder that reads it alone (``reads_image_alone``): Pix2Struct's flattened
    patches placed where their row and column say, else a pixel tensor's patch grid, its states counted once the
    encoder has run (``settle``). ValueError (one line) for a processor that gives neither."""
    patches = inputs.get("flattened_patches")
    if isinstance(patches, torch.Tensor) and patches.dim() == 3 and patches.shape[0] == 1:
        return flattened_layout(patches[0], inputs.get("attention_mask"))
    pixels = inputs.get("pixel_values")
    if isinstance(pixels, torch.Tensor) and pixels.dim() == 5 and pixels.shape[:2] == (1, 1):  # (1, images, C, H, W)
        pixels = pixels[0]
    if not isinstance(pixels, torch.Tensor) or pixels.dim() != 4 or pixels.shape[0] != 1:
        shape = tuple(pixels.shape) if isinstance(pixels, torch.Tensor) else None
        raise ValueError(f"its processor gave pixel_values of shape {shape}, not one view of the image; its "
                         "encoder's states cannot be placed")
    ph, pw = vlm.patch_hw
    # the patches the encoder reads: a side the patch does not divide is padded to a whole patch (Swin's)
    grid = (-(-pixels.shape[-2] // ph), -(-pixels.shape[-1] // pw))
    missing = getattr(vlm.tower, "missing", "")  # its states cover no patch (Idefics' perceiver latents)
    return ImageLayout(torch.zeros(0, dtype=torch.long), grid, 1, 0,
                       unplaced=PENDING + (f": {missing}" if missing else ""))


def flattened_layout(patches: torch.Tensor, mask: torch.Tensor | None = None) -> ImageLayout:
    """(P, 2 + d) flattened patches, each row's first two values its patch's row and column (1-based, 0 for padding)
    -> the layout of the encoder's states over them: state ``k`` over the patch its row names (``index``), the
    padding's states over none."""
    rows, cols = patches[:, 0].round().long(), patches[:, 1].round().long()
    real = (rows > 0) & (cols > 0)
    if mask is not None:
        real &= mask.reshape(-1)[:len(real)].bool()
    kept = real.nonzero()[:, 0]  # (N,) the states over the image's patches
    if not len(kept):
        raise ValueError("its processor's flattened patches hold no patch of the image")
    grid = (int(rows[kept].max()), int(cols[kept].max()))
    index = torch.full(grid, -1, dtype=torch.long)
    index[rows[kept] - 1, cols[kept] - 1] = torch.arange(len(kept))
    if (index < 0).any():
        raise ValueError(f"its processor's flattened patches leave places of their {grid[0]}x{grid[1]} grid "
                         "without a patch; its encoder's states cannot be placed")
    return ImageLayout(kept, grid, 1, 0, index=index)


def settle(layout: ImageLayout, states: int) -> ImageLayout:
    """A pending layout (``encoder_layout`` of a pixel tensor) once the encoder has run over ``states`` states: the
    whole unit of patches a side (1 to ``MAX_UNIT``) and the leading states (``LEADS``) that give their count over
    its grid, its states row-major (a ViT's, a Swin's last stage: a side its merges do not divide padded past the
    image's last patch, so its last units cover the patches left); else one list over the states, ``unplaced``
    naming the counts. A layout not pending is returned as it is."""
    if not (layout.unplaced or "").startswith(PENDING):
        return layout
    gh, gw = layout.grid
    positions = torch.arange(states)
    missing = layout.unplaced[len(PENDING) + 2:]
    if missing:
        return replace(layout, positions=positions, grid=(1, states),
                       unplaced=f"its image tokens are not placed on the image: {missing}")
    for unit in range(1, MAX_UNIT + 1):
        rows, cols = -(-gh // unit), -(-gw // unit)  # a merge pads an odd side (Swin's): its last unit part padding
        lead = states - rows * cols
        if lead not in LEADS:
            continue
        if gh % unit == 0 and gw % unit == 0:
            return replace(layout, positions=positions, unit=unit, lead=lead, unplaced=None)
        r, c = torch.arange(gh)[:, None], torch.arange(gw)[None, :]
        return replace(layout, positions=positions, unit=unit, lead=lead, unplaced=None,
                       index=lead + (r // unit) * cols + c // unit)  # (gh, gw) the state over each patch
    return replace(layout, positions=positions, grid=(1, states), unplaced=(
        f"its image tokens are not placed on the image: its encoder's {states} states are not whole units of "
        f"patches over its {gh}x{gw} patch grid"))


def settled(prepared, recorder):
    """``prepared`` (``vlm_answer.Prepared``) with its pending layout settled on the count of the encoder's states
    its decoder's cross-attention read (the keys of the first recorded call)."""
    if not (prepared.layout.unplaced or "").startswith(PENDING):
        return prepared
    layout = settle(prepared.layout, recorder.seen[0][0])
    return replace(prepared, layout=layout, layouts=(layout,))


def prompt_length(inputs, layout: ImageLayout) -> int:
    """The prompt's tokens as the answer's cost counts them: the prompt's ``input_ids``, or, for an encoder that
    reads the image alone, its states over the image (every patch and a few before them: a bound until it has run)
    and the decoder's prompt."""
    if "input_ids" in inputs:
        return int(inputs["input_ids"].shape[1])
    decoder = inputs.get("decoder_input_ids")
    pending = (layout.unplaced or "").startswith(PENDING)
    states = layout.grid[0] * layout.grid[1] + max(LEADS) if pending else len(layout.positions)
    return states + 1 + (int(decoder.shape[1]) if isinstance(decoder, torch.Tensor) else 0)


def decoder_prompt(vlm, inputs) -> torch.Tensor:
    """(1, n) the decoder's prompt before the answer, as ``generate`` made it: the inputs' ``decoder_input_ids``
    (``with_decoder_prompt`` keeps generate's own there), else its start token alone (Florence-2's)."""
    given = inputs.get("decoder_input_ids") if hasattr(inputs, "get") else None
    if isinstance(given, torch.Tensor):
        return given
    return torch.tensor([[vlm.model.generation_config.decoder_start_token_id]], dtype=torch.long)


def with_decoder_prompt(prepared, sequence: torch.Tensor):
    """``prepared`` whose inputs hold the decoder's prompt as ``generate`` made it (``sequence``, (1, n): its start
    token put before the processor's ``decoder_input_ids`` where the model wants one), its mask ones over it: what a
    reading's forward over the prompt and the answer's first tokens appends them to."""
    inputs = type(prepared.inputs)({**prepared.inputs, "decoder_input_ids": sequence.cpu()})
    if "decoder_attention_mask" in inputs:
        inputs["decoder_attention_mask"] = torch.ones_like(inputs["decoder_input_ids"])
    return replace(prepared, inputs=inputs)
