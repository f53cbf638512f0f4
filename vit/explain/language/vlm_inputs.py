"""What the processor is given for a question (issue 113's split of ``vlm_answer``): the prompt through the model's
chat template, the processor's own layout, or raw text with its image placeholder; a clip's frames through the
template's video entry; the processor's work counted before it runs (``vit.costs.processors``) and its floating
inputs put in the model's dtype.
"""

from __future__ import annotations

import inspect
import traceback
from collections.abc import Sequence
from contextlib import contextmanager

import numpy as np
import torch
from PIL import Image

from vit.costs.processors import check_processor
from vit.explain.language.vlm_read_layout import reads_image_alone

MAX_QUESTION_CHARS = 2000

# model_type of the families whose checkpoints carry no chat template because their processor lays the prompt out
# itself: PaliGemma's puts its image tokens, bos, the question and a newline (big_vision's prefix)
PROCESSOR_PROMPTS = frozenset({"paligemma", "florence2"})


def prompt_inputs(vlm, image: Image.Image | Sequence[Image.Image], question: str | None, prompt: str | None,
                  clip: Sequence[Image.Image] | None = None, metadata: dict | None = None):
    """The processor's inputs for ``image`` (one, or several in order) and ``question`` through the model's chat
    template (or, for a family without one, ``PROCESSOR_PROMPTS``, the processor's own prompt layout), or ``prompt``
    as raw text holding the processor's image placeholder once per image (the template bypassed); ``clip``: its
    frames instead of images, one video entry, the frames as given (no sampling), ``metadata`` their
    ``VideoMetadata`` (``SampledClip.metadata``: their times, which the processor writes into the prompt)."""
    if clip is not None:
        if prompt is not None:
            raise ValueError("a clip is asked about through the model's chat template; give question=, not prompt=")
        return _clip_inputs(vlm, clip, question, metadata)
    images = list(image) if isinstance(image, (list, tuple)) else [image]
    processor = vlm.processor
    if (question is None) == (prompt is None):
        raise ValueError("give a question (through the model's chat template) or prompt= (raw text), not both")
    text = question if prompt is None else prompt
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_QUESTION_CHARS:
        raise ValueError(f"a question must be text of 1 to {MAX_QUESTION_CHARS} characters, got {str(text)[:40]!r}")
    from vit.explain.language.chat_template import folder_template, render

    if reads_image_alone(vlm):  # the question is the decoder's prompt (Pix2Struct's, Donut's)
        check_processor(getattr(processor, "image_processor", None), [one.size for one in images], video=False)
        return _in_model_dtype(vlm, decoder_prompted(vlm, images, text))
    if prompt is None and not getattr(processor, "chat_template", None) and vlm.model_type in PROCESSOR_PROMPTS:
        # the processor adds the rest of its prompt (Florence-2's its image tokens too, and its task prompts)
        text = (processor.image_token * len(images) if vlm.model_type == "paligemma" else "") + question
    elif prompt is None:
        if not getattr(processor, "chat_template", None):
            # no template: the question as it is, where the processor itself puts the image's tokens in the prompt
            # (BLIP-2's and InstructBLIP's before the text, Kosmos-2's between its image markers)
            laid = _laid_out_by_processor(vlm, images, question)
            if laid is not None:
                return laid
            if not folder_template(processor):  # else the folder's, on its tokenizer (Chameleon's)
                raise ValueError(f"{vlm.folder}'s processor has no chat template and puts no image token in a "
                                 "plain question; give prompt= with the model's image placeholder instead")
        messages = [{"role": "user", "content": [*({"type": "image"} for _ in images),
                                                 {"type": "text", "text": question}]}]
        text = render(processor, messages)  # the folder's own code: rendered under a time and size bound
    else:
        placeholder = image_placeholder(processor)
        if placeholder and text.count(placeholder) != len(images):
            laid = _laid_out_by_processor(vlm, images, text) if not text.count(placeholder) else None
            if laid is not None:  # the processor puts the image tokens itself (BLIP-2's before the text)
                return laid
            times = "once" if len(images) == 1 else f"{len(images)} times (once per image)"
            raise ValueError(f"prompt= must hold the model's image placeholder {placeholder!r} {times}, got "
                             f"{text.count(placeholder)}")
    # what the processor makes of these images, counted before it touches them
    check_processor(getattr(processor, "image_processor", None), [one.size for one in images], video=False)
    return _in_model_dtype(vlm, processed(vlm, images=images, text=text))


def processed(vlm, **given):
    """The processor's tensors for what is ``given``; where the model's forward reads ``mm_token_type_ids`` (an
    M-RoPE model's image and video positions) and the processor did not give them by default, asked for as
    transformers' processor builds them (``return_mm_token_type_ids``), as ``generate`` needs them."""
    import inspect

    inputs = vlm.processor(**given, return_tensors="pt")
    if "mm_token_type_ids" not in inputs and "mm_token_type_ids" in inspect.signature(
            vlm.model.forward).parameters:
        inputs = vlm.processor(**given, return_tensors="pt", return_mm_token_type_ids=True)
    return inputs


def image_placeholder(processor) -> str | None:
    """The processor's image placeholder as text (BLIP-2's processor keeps an ``AddedToken``), or None."""
    placeholder = getattr(processor, "image_token", None)
    return getattr(placeholder, "content", placeholder)


def _laid_out_by_processor(vlm, images, text: str):
    """The processor's inputs for ``text`` without an image placeholder where the processor itself puts the image's
    tokens in the prompt (read from its output: the image token's id in its ``input_ids``), else None."""
    from vit.explain.language.vlm_attention import image_positions

    check_processor(getattr(vlm.processor, "image_processor", None), [one.size for one in images], video=False)
    try:
        inputs = processed(vlm, images=images, text=text)
    except ValueError:  # its own refusal of a prompt without placeholders
        return None
    from vit.explain.language.vlm_read_layout import reads_tower_states

    # or where no prompt token marks the image: read through cross-attention or joined before it (GIT's, BLIP's)
    return _in_model_dtype(vlm, inputs) if len(image_positions(vlm, inputs)) or reads_tower_states(vlm) else None


def _in_model_dtype(vlm, inputs):
    """``inputs`` with their floating tensors in the model's dtype, as transformers' examples pass them: Llama 4's
    processor gives bfloat16 pixels (its authors' rescaling), which a float32 model cannot multiply. PaliGemma's
    processor's ``labels`` (kept by transformers for backward compatibility) are dropped: no reading wants a loss, and
    a forward over the prompt and the answer would compare the logits with the prompt's labels alone."""
    inputs.pop("labels", None)
    dtype = getattr(vlm.model, "dtype", None)
    return inputs.to(dtype=dtype) if isinstance(dtype, torch.dtype) and dtype.is_floating_point else inputs


def _clip_inputs(vlm, frames: Sequence[Image.Image], question: str | None, metadata: dict | None = None):
    """The processor's inputs for a clip of ``frames`` and ``question`` through the chat template's video entry;
    ``metadata``: the frames' ``VideoMetadata`` (None: transformers' default, the frames taken as consecutive)."""
    from vit.explain.language.chat_template import clip_inputs, render

    if not isinstance(question, str) or not question.strip() or len(question) > MAX_QUESTION_CHARS:
        raise ValueError(f"a question must be text of 1 to {MAX_QUESTION_CHARS} characters, got {str(question)[:40]!r}")
    if not getattr(vlm.processor, "chat_template", None):
        raise ValueError(f"{vlm.folder}'s processor has no chat template to ask about a clip with")
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": question}]}]
    # what the processor makes of these frames, counted before they are stacked and it touches them
    check_processor(getattr(vlm.processor, "video_processor", None), [frame.size for frame in frames], video=True)
    text = render(vlm.processor, messages)
    video = np.stack([np.asarray(frame.convert("RGB")) for frame in frames])  # (T, H, W, 3)
    timing = {"video_metadata": [dict(metadata)]} if metadata else {}
    return _in_model_dtype(vlm, clip_inputs(vlm.processor, text, run=lambda **given: processed(vlm, **given),
                                            videos=[video], do_sample_frames=False, **timing))


def decoder_prompted(vlm, images, text: str):
    """The processor's inputs for ``images`` and the question ``text`` of a model whose encoder reads the image
    alone: the question is the decoder's prompt, as the processor gives it (Pix2Struct's ``decoder_input_ids``),
    else the tokenizer's ids of it without special tokens (Donut's documented prompting of its decoder) beside the
    processor's pixels alone, where it makes the text training ``labels`` or ``input_ids`` (a TrOCR or Donut
    processor's) or takes none (PP-FormulaNet's);
    ``generate`` puts the decoder's start token before it where the model wants one."""
    if "text" in inspect.signature(vlm.processor.__call__).parameters:
        inputs = processed(vlm, images=images, text=text)
        if "decoder_input_ids" in inputs:
            return inputs
    inputs = processed(vlm, images=images)  # the encoder's alone: a text of the processor's would be labels or ids
    ids = vlm.processor.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    if ids.shape[-1]:
        inputs["decoder_input_ids"] = ids
    return inputs


@contextmanager
def library_errors(model: torch.nn.Module):
    """The last resort for a folder whose processor and model disagree in a way its declared sizes do not show (a
    patch or merge size of a type no layout names): an error transformers' own code raises inside the model's forward
    (its innermost frame outside torch is in a model's code of transformers) becomes one line saying so. Any other
    error, ours above all (the recording attention runs inside that forward), passes unchanged."""
    try:
        yield
    except (RuntimeError, ValueError, IndexError, TypeError) as error:
        where = next((frame.filename.replace("\\", "/") for frame in reversed(traceback.extract_tb(error.__traceback__))
                      if "/torch/" not in frame.filename.replace("\\", "/")), "")
        if "/transformers/models/" not in where:  # a model's code, not generate's own checks
            raise
        said = str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
        raise ValueError(f"transformers' {type(model).__name__} failed on what the folder's processor gave it "
                         f"({type(error).__name__}: {said}): the processor's settings (its patch, merge or frame "
                         "sizes) disagree with the model's config; save the processor the model was made with into "
                         "the folder") from error
