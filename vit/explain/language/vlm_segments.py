"""Image segments as features of a VLM's answer (issue 92, item 4): captum 0.9's own ``LLMAttribution`` over an
``ImageMaskInput`` (a dependency, not a port), run on transformers' model with the answer as the target: each
segment (a grid cell, or a mask of ``vit.segment``'s) is made absent (painted the baseline colour, captum's
``ImageMaskInput``) and the image goes through the processor again with the question, as the answer's did
(``vlm_answer.prompt_inputs``); the attribution of a segment is the change of the answer's probability (feature
ablation) or its Shapley value, estimated by sampling (Shapley value sampling), for the whole answer and for each of
its tokens. captum runs every forward; the number of forwards, each one a forward of the VLM over the prompt and the
answer (captum's sequence-level forward), is counted and bounded before the first (``MAX_FORWARDS``,
``vit.costs.plan.vlm_lens`` per forward).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

SEGMENT_METHODS = ("ablation", "shapley")
MAX_SEGMENTS = 256  # features: a 16 x 16 grid, or SAM's masks of an image
MAX_FORWARDS = 4096  # forwards of the whole VLM one attribution may run


@dataclass(frozen=True)
class SegmentAttribution:
    """captum's attribution of the answer to each image segment: ``seq`` (F,) for the whole answer, ``tokens``
    (n, F) for each answer token, over the segments of ``mask`` (H, W) ints, the image's pixels (-1: no segment;
    with overlapping masks, the last segment that covers a pixel); ``map()`` each pixel its segment's value."""

    seq: np.ndarray
    tokens: np.ndarray
    mask: np.ndarray
    method: str

    def map(self, token: int | None = None) -> np.ndarray:
        """(H, W) float32 on the image's pixels: each pixel its segment's attribution, for the whole answer
        (``token`` None) or for one answer token; 0 where no segment is."""
        values = self.seq if token is None else self.tokens[token]
        drawn = np.zeros(self.mask.shape, dtype=np.float32)
        inside = self.mask >= 0
        drawn[inside] = values[self.mask[inside]]
        return drawn


def grid_mask(size: tuple[int, int], rows: int, cols: int) -> torch.Tensor:
    """(H, W) int32 of an image of ``size`` (width, height): ``rows x cols`` cells, numbered row-major."""
    width, height = size
    r = (torch.arange(height) * rows // height)[:, None]
    c = (torch.arange(width) * cols // width)[None, :]
    return (r * cols + c).to(torch.int32)


def forwards(method: str, features: int, samples: int) -> int:
    """The forwards captum runs, each over the prompt and the whole answer: feature ablation one per feature and the
    whole, Shapley value sampling ``samples`` permutations of ``features + 1`` each."""
    return features + 1 if method == "ablation" else samples * (features + 1)


def segments(vlm, prepared, answer: tuple[int, ...], image: Image.Image, inputs_of, *,
             grid: tuple[int, int] | None = None,
             masks: Sequence[np.ndarray] | np.ndarray | None = None, method: str = "ablation", samples: int = 8,
             baseline: tuple[int, int, int] = (255, 255, 255)) -> SegmentAttribution:
    """captum's attribution of ``answer`` (its tokens, the target) to segments of ``image`` (``inputs_of(image)``:
    the processor's inputs for another image with the question as asked, ``vlm_answer.prompt_inputs``): a ``grid`` of
    ``(rows, cols)`` cells, or ``masks`` (an (H, W) int array of segment ids, or a list of (H, W) boolean masks, as
    ``vit.segment`` gives them). ``method``: "ablation" (captum's ``FeatureAblation``) or "shapley"
    (``ShapleyValueSampling``, ``samples`` permutations). ValueError (one line) for a wrong segmentation or past
    ``MAX_SEGMENTS`` / ``MAX_FORWARDS``, before any forward."""
    from captum.attr import FeatureAblation, ImageMaskInput, LLMAttribution, ShapleyValueSampling

    from vit.explain.language.vlm_attention import cross_attending
    from vit.explain.language.vlm_lens import check, handed_states
    from vit.explain.language.vlm_relevance import extended

    if cross_attending(vlm.language_model):  # its run again over another image extends inputs generate's way
        handed_states(vlm, "captum's segment attribution")

    if method not in SEGMENT_METHODS:
        raise ValueError(f"method must be one of {', '.join(SEGMENT_METHODS)}, got {method!r}")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be a whole number of at least 1, got {samples!r}")
    shape = (image.height, image.width)
    mask, mask_list = _segmentation(shape, image.size, grid, masks)
    features = len(mask_list) if mask_list is not None else len(torch.unique(mask))
    if not 1 <= features <= MAX_SEGMENTS:
        raise ValueError(f"{features} segments; attribute the answer to 1 to {MAX_SEGMENTS}")
    need = forwards(method, features, samples)
    if need > MAX_FORWARDS:
        raise ValueError(f"{method} over {features} segments runs the model {need:,} times, past {MAX_FORWARDS:,}; "
                         "choose fewer segments or samples")
    check(vlm, prepared, len(answer) - 1, lens=False)  # each forward's memory: the longest run's
    def processor_fn(shown: Image.Image):  # the image through the processor again, as the answer's was
        inputs = dict(inputs_of(shown).to(vlm.device))
        # captum extends input_ids and the attention mask by the answer, not the other per-token inputs: the
        # processor's modality types (Qwen-VL's and GLM's mm_token_type_ids, which their M-RoPE needs), Gemma 3's
        # token types, Llama 3.2 Vision's cross-attention mask, extended here as generate extends them
        return extended(vlm, inputs, len(answer))

    attribution = (FeatureAblation if method == "ablation" else ShapleyValueSampling)(vlm.model)
    llm = LLMAttribution(attribution, vlm.processor.tokenizer)
    inp = ImageMaskInput(image=image, mask=mask, mask_list=mask_list, baseline=baseline, processor_fn=processor_fn)
    kwargs = {"n_samples": samples} if method == "shapley" else {}
    with torch.inference_mode(False), torch.no_grad():
        # one forward per perturbation over the prompt and the whole answer (captum's sequence-level forward): its
        # token-by-token one hands the model the ids alone after the first step, and a VLM's image then reads nowhere
        result = llm.attribute(inp, target=torch.tensor(answer), forward_in_tokens=False, **kwargs)
    ids = _segment_ids(shape, mask, mask_list)
    return SegmentAttribution(result.seq_attr.detach().float().cpu().numpy(),
                              result.token_attr.detach().float().cpu().numpy(), ids, method)


def _segmentation(shape: tuple[int, int], size: tuple[int, int], grid, masks):
    """``(mask, mask_list)`` as captum's ``ImageMaskInput`` takes them, from a grid or the caller's masks."""
    if (grid is None) == (masks is None):
        raise ValueError("give grid=(rows, cols) or masks=, one of them")
    if grid is not None:
        if (len(grid) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in grid)
                or grid[0] * grid[1] > MAX_SEGMENTS):
            raise ValueError(f"grid must be (rows, cols) whole numbers, at most {MAX_SEGMENTS} cells, got {grid}")
        return grid_mask(size, *grid), None
    if isinstance(masks, np.ndarray) and masks.ndim == 2:
        if masks.shape != shape or not np.issubdtype(masks.dtype, np.integer):
            raise ValueError(f"masks as one array must be (H, W) = {shape} segment ids (integers), got "
                             f"{masks.shape} {masks.dtype}")
        return torch.as_tensor(masks.astype(np.int64)), None
    listed = list(masks)
    if not 1 <= len(listed) <= MAX_SEGMENTS or any(np.asarray(m).shape != shape for m in listed):
        raise ValueError(f"masks as a list must be 1 to {MAX_SEGMENTS} boolean masks of (H, W) = {shape}")
    return None, [torch.as_tensor(np.asarray(m, dtype=bool)) for m in listed]


def _segment_ids(shape, mask, mask_list) -> np.ndarray:
    """(H, W) int: each pixel's feature index (captum's order: the mask's sorted ids, or the list's), -1 on none."""
    if mask_list is None:
        ids = mask.numpy()
        values = np.unique(ids)
        return np.searchsorted(values, ids).astype(np.int64)
    out = np.full(shape, -1, dtype=np.int64)
    for index, m in enumerate(mask_list):
        out[m.numpy()] = index
    return out
