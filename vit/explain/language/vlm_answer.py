"""Where a vision-language model looked when it said each word: each answer token's attention to the image tokens,
through the language model, in bounded memory.

The model answers with transformers' own greedy ``generate`` (``vit.sources.vlm.whole_vlm``). Its language model's
attention runs through one more attention function (``vit.explain.language.vlm_attention``, registered with
transformers' ``AttentionInterface``): the model's own implementation (sdpa, or the eager function of its modelling
file) computes the output, and beside it the last query row of each call is kept, after RoPE (M-RoPE for Qwen), as
the attention gets it: ``(H, d)`` per layer per answer token. Answer token ``i`` was predicted by the last query of
generation step ``i`` (the prompt's last token at step 0), the row ``generate(output_attentions=True)`` returns at
step ``i``. Each token is handed on as soon as ``generate`` chooses it (a stopping criterion, ``_Steps``: the answer
streamed), and a ``vit.core.progress.Stop`` raised by the progress there ends the generation with the tokens so far,
their rows and cache kept.

No layer's ``T x T`` attention is ever held. A row is computed when asked, from the keys the KV cache already holds:
``softmax(q_i K[:t_i]^T * scaling + mask)`` over the ``t_i`` keys that step saw (Gemma's soft cap where the model
has one), ``H x T`` per row, as the eager attention forms it. Its image tokens' share is placed on the tower's patch
grid through the model's own token layout (``visual_lens.on_patch_grid``: LLaVA's patches with or without CLIP's CLS,
Qwen-VL's 2 x 2 merge units, InternVL's pixel-shuffle units, Gemma 3's pooled 4 x 4), the order the projector hands
them to the language model; an image cut into tiles on the tiles' canvas (InternVL's crops, LLaVA-NeXT's and
OneVision's unpadded crops and newline tokens, OneVision's shrunk past ``anyres_max``, Gemma 3's pan-and-scan
crops), its one view of the whole image (InternVL's thumbnail, NeXT's and OneVision's base image, Gemma 3's
original image) as the overview. What this holds is counted before the work (``vit.costs.plan.vlm_answer``).

A sliding-window layer (Gemma 2's and 3's, beside their global ones) has a cache that keeps only its last keys: once
an answer may outgrow the window, its keys are kept beside the cache as each call hands them over (``_Recorder``), and
its row is the eager attention's, the keys inside the window read and the others 0, for every token and any cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from vit.core.clips import SampledClip
from vit.core.progress import Progress, Stop
from vit.explain.language.answer_maps import either
from vit.explain.language.vlm_attention import attention_layers, cross_attending, recording
from vit.explain.language.vlm_cache import cache_sources, cache_windows, latent_layers, text_shape
from vit.explain.language.vlm_inputs import (  # noqa: F401 - importable from here, as before the split
    MAX_QUESTION_CHARS,
    PROCESSOR_PROMPTS,
    _clip_inputs,
    _in_model_dtype,
    _laid_out_by_processor,
    image_placeholder,
    library_errors,
    prompt_inputs,
)
from vit.explain.language.vlm_layouts import (
    CLIP_FAMILIES,
    MAX_CLIP_FRAMES,
    MAX_IMAGES,
    ONE_IMAGE,
    ImageLayout,
    clip_layouts,
    image_layouts,
)
from vit.explain.language.vlm_read_layout import (
    encoder_layout,
    image_states,
    prefixes_tower_states,
    prompt_length,
    reads_prompt_unmarked,
    reads_tower_states,
    settled,
    with_decoder_prompt,
)
from vit.registry import VLM_ARCHITECTURES

MAX_NEW_TOKENS = 512  # an answer, not an essay: each token's query rows are kept, and each step is a forward
FUSIONS = ("mean", "max")  # how ``VLMAnswer.attention`` fuses the heads when no head is chosen
# An answer token's maps: its attention row at a layer and head, gradient x attention at a layer, or rolled out over
# every layer, AttnLRP to the pixels (``VLMAnswer.relevance``), or its Token Activation Map (``VLMAnswer.tam``)
MAP_METHODS = ("attention", "gradxattn", "gradxattn_rollout", "tam", "attnlrp")
RELEVANCE_METHODS = ("gradxattn", "attnlrp")  # ``VLMAnswer.relevance``'s



@dataclass
class _Recorder:
    """What the recording attention keeps of each call, per layer: the last query row, where the keys it read begin
    and end in the sequence, its mask row over them (None: causal alone) and the scaling and soft cap it was given.

    A sliding-window layer's cache keeps only its last keys (transformers' ``DynamicSlidingWindowLayer``,
    ``StaticSlidingWindowLayer``): where the answer may outgrow the window (``tokens``: the prompt's and the answer's
    most), that layer's keys are kept here as each call hands them over, from the first the prompt's last query reads
    (PaliGemma's prefix reads all of it), so that every answer token's row is formed from the keys it read."""

    layers: dict[torch.nn.Module, int]  # the language model's attention modules -> layer
    tokens: int = 0  # the most positions an answer's calls reach (prompt + new tokens); 0: no window is outgrown
    queries: list[list[torch.Tensor]] = field(default_factory=list)  # [layer][step] (H, d) float32
    seen: list[list[int]] = field(default_factory=list)  # [layer][step] positions read: the query's own and before
    starts: list[list[int]] = field(default_factory=list)  # [layer][step] the position of the call's first key
    # [layer][step] (1 or H, seen - start) additive: one row for every head, or each head's (a sparse top-k mask)
    masks: list[list[torch.Tensor | None]] = field(default_factory=list)
    scaling: list[float] = field(default_factory=list)
    softcap: list[float | None] = field(default_factory=list)
    # [layer] a sliding layer's keys kept here, (Hkv, n, d) chunks in the model's dtype, from position ``kept_from``;
    # None: the layer's cache holds every key its rows read
    keys: list[list[torch.Tensor] | None] = field(default_factory=list)
    kept_from: list[int] = field(default_factory=list)
    # [layer] the decoder layer whose cache holds its keys (a hybrid model's attention layers are not every decoder
    # layer: ``vlm_attention.attention_layers``); None: layer k is decoder layer k
    cache_layers: list[int] | None = None
    # [layer] the window its cache keeps (``cache_windows``), for a model whose attention is not told of it (Llama 4's
    # chunked layers); None: every layer's attention is told (``sliding_window``) or keeps every key
    windows: list[int | None] | None = None
    # the layers whose keys are the tower's states, not the sequence's (Llama 3.2 Vision's cross-attention): each call
    # reads every key, its mask over them (the tiles the text may see)
    cross: bool = False
    # [layer] the key of the last call's query's own position (Hkv, d), to check the cache keeps the keys it read
    own_keys: list[torch.Tensor | None] = field(default_factory=list)
    # the layers whose cache keeps other keys than their attention reads (``vlm_cache.latent_layers``): kept here too
    latent: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        n = len(self.layers)
        self.own_keys = [None] * n
        self.queries, self.seen, self.starts = [[] for _ in range(n)], [[] for _ in range(n)], [[] for _ in range(n)]
        self.masks, self.keys, self.kept_from = [[] for _ in range(n)], [None] * n, [0] * n
        self.scaling, self.softcap = [1.0] * n, [None] * n

    def keep(self, layer: int, query, key, value, attention_mask, kwargs: dict) -> None:
        """Keep ``layer``'s last query row of this call, before the attention runs. (B, H, q, d), B = 1.

        The call's keys (B, Hkv, kv, d) are the cache's as its ``update`` returned them, key ``j`` at position
        ``start + j``: a growing cache's every key (``start`` 0), a sliding one's last ``kv`` (``start`` = positions
        read - kv), a static one's whole buffer, whose places past the query are the future, masked."""
        seen = key.shape[-2] if self.cross else (self.seen[layer][-1] if self.seen[layer] else 0) + query.shape[-2]
        start = max(seen - key.shape[-2], 0)
        self.queries[layer].append(query[0, :, -1].detach().float().cpu())
        if 0 < seen - start <= key.shape[-2]:  # a cross layer's: its last key, to check the cache keeps them too
            self.own_keys[layer] = key[0, :, seen - start - 1].detach().float().cpu()
        self.seen[layer].append(seen)
        self.starts[layer].append(start)
        mask = None if attention_mask is None else _additive(attention_mask[0, :, -1, :seen - start])
        self.masks[layer].append(mask)
        scaling = kwargs.get("scaling")
        self.scaling[layer] = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
        self.softcap[layer] = kwargs.get("softcap")
        read = start if mask is None else start + int((mask > _UNREAD).any(0).nonzero()[0])  # its first key read
        window = kwargs.get("sliding_window")
        if window is None and self.windows is not None:
            window = self.windows[layer]
        if len(self.seen[layer]) == 1 and (layer in self.latent or window is not None and window < self.tokens):
            # a latent layer's every key (a sparse mask's later queries read keys its first did not)
            self.keys[layer], self.kept_from[layer] = [], start if layer in self.latent else read
        if self.keys[layer] is not None:  # the positions not kept yet, up to the query's own
            if read < self.kept_from[layer]:  # a window moves forward: no later query reads an earlier key
                raise RuntimeError(f"layer {layer}'s query at position {seen - 1} reads position {read}, before the "
                                   f"kept keys' first ({self.kept_from[layer]})")
            have = self.kept_from[layer] + sum(chunk.shape[-2] for chunk in self.keys[layer])
            # a copy: a static cache rolls its buffer in place, and a view would hold a sliding call's every key
            self.keys[layer].append(key[0, :, have - start:seen - start].detach().clone())

    def keys_read(self, layer: int, step: int, cache) -> tuple[torch.Tensor, int]:
        """``(keys, first)``: the keys (Hkv, n, d) of positions ``first`` to the query's own that ``step``'s call read
        at ``layer``, from what this recorder kept of a sliding layer, else from the layer's ``cache``."""
        seen, start = self.seen[layer][step], self.starts[layer][step]
        kept = self.keys[layer]
        if kept is None:
            decoder = layer if self.cache_layers is None else self.cache_layers[layer]
            if self.cross:  # an encoder-decoder's cache keeps the encoder's keys apart (EncoderDecoderCache)
                cache = getattr(cache, "cross_attention_cache", cache)
            kept_layer = cache.layers[decoder]
            keys = kept_layer.keys[0]  # (Hkv, keys, d)
            prefill = getattr(kept_layer, "prefill_keys", None)  # a reference sliding window (R-SWA) keeps the
            if prefill is not None and prefill.numel():  # prompt's keys apart from its window's (Unlimited-OCR)
                keys = torch.cat([prefill[0], keys], dim=-2)
            if start or keys.shape[-2] < seen:  # a window the attention was not told of (no sliding_window)
                raise ValueError(f"layer {layer}'s cache keeps {keys.shape[-2]} keys from a sliding window, not the "
                                 f"{seen} answer token {step} read; choose another layer")
            return keys[:, :seen], 0
        if len(kept) > 1:
            kept[:] = [torch.cat(kept, dim=-2)]
        first = max(start, self.kept_from[layer])
        return kept[0][:, first - self.kept_from[layer]:seen - self.kept_from[layer]], first

    def output(self, layer: int, output: torch.Tensor) -> None:
        """``layer``'s attention output (B, q, H, d), as the model's attention returns it: not needed here
        (``vit.explain.language.vlm_relevance`` reads it)."""


# Below it a mask's value masks its key, whatever the mask's dtype (an eager mask holds its dtype's lowest, -65504 in
# float16; sdpa's boolean mask becomes -inf here)
_UNREAD = torch.finfo(torch.float16).min / 2


def _additive(mask_row: torch.Tensor) -> torch.Tensor:
    """A mask row as the eager attention adds it: 0 where a key is read, -inf where not (a boolean mask's False)."""
    if mask_row.dtype == torch.bool:
        return torch.zeros(mask_row.shape, dtype=torch.float32).masked_fill(~mask_row.cpu(), float("-inf"))
    return mask_row.detach().float().cpu()


class VLMAnswer:
    """A VLM's answer to a question about an image: ``tokens`` (the generated ids, as ``generate`` returns them),
    ``text``, ``pieces`` (each token's text) and, for each answer token, its attention to the image
    (``attention``), computed when asked from the kept query rows and the KV cache. ``stopped``: why the generation
    was stopped before its end (its tokens are the first ones of the whole answer), or None."""

    def __init__(self, tokens: tuple[int, ...], text: str, pieces: tuple[str, ...],
                 layout: ImageLayout | tuple[ImageLayout, ...], recorder: _Recorder, cache, prompt_tokens: int,
                 source: tuple | None = None, stopped: str | None = None) -> None:
        self.tokens, self.text, self.pieces = tokens, text, pieces
        self.stopped = stopped  # why the generation was stopped before its end (None: it ended by itself)
        # every image's layout in the prompt's order (a question about several images); ``layout``: the first's
        self.layouts = tuple(layout) if isinstance(layout, tuple) else (layout,)
        self.clip = False  # a question about a clip: ``layouts`` (``image=``) are its temporal slices
        self.layout, self.prompt_tokens = self.layouts[0], prompt_tokens
        self._recorder, self._cache = recorder, cache
        self._source = source  # (vlm, Prepared): what the relevance runs the model on again
        self._lens: dict[int, np.ndarray] = {}  # each token's logit lens once read ((L + 1,) floats each)
        self.layers = len(recorder.queries)
        self.heads = recorder.queries[0][0].shape[0] if self.layers and recorder.queries[0] else 0

    @property
    def grid(self) -> tuple[int, int]:
        """The tower's patch grid the maps are on."""
        return self.layout.grid

    def _token(self, i: int) -> int:
        if isinstance(i, bool) or not isinstance(i, int) or not -len(self.tokens) <= i < len(self.tokens):
            raise ValueError(f"answer token {i} does not exist: the answer has {len(self.tokens)} tokens, numbered 0 "
                             f"to {len(self.tokens) - 1}")
        return i % len(self.tokens)

    def _layer(self, layer: int) -> int:
        if isinstance(layer, bool) or not isinstance(layer, int) or not -self.layers <= layer < self.layers:
            raise ValueError(f"layer {layer} does not exist: the language model has {self.layers} layers, numbered 0 "
                             f"to {self.layers - 1} (or -1 for the last)")
        return layer % self.layers

    def row(self, i: int, layer: int) -> torch.Tensor:
        """Answer token ``i``'s whole attention row at ``layer``: (H, t_i) over every position up to the query that
        predicted it, as the eager attention forms it (float32); at a sliding-window layer the keys outside its
        window hold 0, as in transformers' eager attention."""
        i, layer = self._token(i), self._layer(layer)
        r = self._recorder
        if getattr(r, "rows_kept", False):  # the module's own probabilities, as it computed them (``vlm_attention``)
            return r.queries[layer][i].clone()
        q, seen, start, mask = r.queries[layer][i], r.seen[layer][i], r.starts[layer][i], r.masks[layer][i]  # (H, d)
        keys, first = r.keys_read(layer, i, self._cache)  # (Hkv, seen - first, d)
        keys = keys.float().cpu().repeat_interleave(q.shape[0] // keys.shape[0], dim=0)  # (H, t, d): per query head
        logits = torch.einsum("hd,htd->ht", q, keys) * r.scaling[layer]  # (H, t)
        if r.softcap[layer] is not None:
            logits = torch.tanh(logits / r.softcap[layer]) * r.softcap[layer]
        if mask is not None:
            logits = logits + mask[:, first - start:]  # (1 or H, t)
        row = torch.full((q.shape[0], seen), float("-inf"))  # the keys before the call's (or its kept) first: unread
        row[:, first:] = logits
        return row.softmax(dim=-1)

    def _image(self, image: int) -> ImageLayout:
        """The layout of the question's ``image``-th image; ValueError (one line) for one it does not have."""
        if isinstance(image, bool) or not isinstance(image, int) or not 0 <= image < len(self.layouts):
            raise ValueError(f"image {image} does not exist: the question has {len(self.layouts)} image"
                             f"{'s' if len(self.layouts) > 1 else ''}, numbered 0 to {len(self.layouts) - 1}")
        return self.layouts[image]

    def _in_sequence(self, what: str) -> None:
        """ValueError (one line) for a map that reads the image's tokens in the language model's sequence, asked of
        a model that reads the image through cross-attention layers (``vlm_attention.cross_attending``)."""
        if cross_attending((self._source or self._model())[0].language_model):  # (rows alone: no run refused)
            raise ValueError(f"{what} reads the image's tokens in the language model's sequence, and this model reads "
                             "the image through its cross-attention layers instead: ask its attention")

    @staticmethod
    def _decoder_only(vlm, what: str) -> None:
        """ValueError (one line) for what runs a decoder-only language model (an intervention at its input, AttnLRP
        through it, captum's forward of the prompt and the answer) asked of an encoder-decoder (Florence-2: its image
        tokens are the encoder's, its answer the decoder's input)."""
        if getattr(vlm.model.config, "is_encoder_decoder", False):
            raise ValueError(f"{what} runs a decoder-only language model here, and this model's answer is written by "
                             f"an encoder-decoder's decoder: ask its {either('attention', 'gradxattn')}")

    def _one_image(self, what: str) -> None:
        if self.clip:
            raise ValueError(f"{what} is drawn for a question about one image; this one is about a clip: use "
                             f"{either('attention', 'gradxattn')}, per slice")
        if len(self.layouts) > 1:
            raise ValueError(f"{what} is drawn for a question about one image; this one has {len(self.layouts)}: "
                             f"use {either('attention', 'gradxattn')}, per image")

    def image_rows(self, i: int, layer: int, image: int = 0) -> torch.Tensor:
        """(H, lead + N): answer token ``i``'s attention to each image token of ``image`` at ``layer``, per head."""
        return self.row(i, layer)[:, self._image(image).positions]

    def attention(self, i: int, layer: int = -1, head: int | None = None, fusion: str = "mean",
                  overview: bool = False, image: int = 0, sinks=None) -> np.ndarray:
        """(gh, gw) float32: answer token ``i``'s attention to the image tokens at ``layer``, each patch holding the
        attention to the image token whose unit covers it; ``head`` None: the heads fused by ``fusion`` ("mean" or
        "max", each image token's own). An image read as tiles: on the tiles' canvas, or, ``overview``, on the
        model's one view of the whole image beside them (InternVL's thumbnail). ``image``: which of the question's
        images (each on its own patch grid, ``layouts[image].grid``). ``sinks`` (``VLMAnswer.sinks``'s): the map
        without them, each head's row renormalised over the image's other tokens (``inside.sinks.Sinks.removed``)."""
        layout = self._image(image).view(overview)
        if fusion not in FUSIONS:
            raise ValueError(f"fusion must be one of {', '.join(FUSIONS)}, got {fusion!r}")
        rows = self.image_rows(i, layer, image)  # (H, lead + N)
        if sinks is not None:
            rows = sinks.removed(rows, self._layer(layer), self._image(image).positions)
        if head is None:
            rows = rows.mean(0, keepdim=True) if fusion == "mean" else rows.amax(0, keepdim=True)
        else:
            if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < rows.shape[0]:
                raise ValueError(f"head {head} does not exist: the language model has {rows.shape[0]} heads, "
                                 f"numbered 0 to {rows.shape[0] - 1}")
            rows = rows[head:head + 1]
        return layout.place(rows)[0].numpy()

    def sinks(self, dims=None, tau: float = 20.0):
        """``vit.explain.language.inside.sinks.Sinks``: the prompt's visual sink tokens at each layer, as Kang et al.
        (ICLR 2025) find them (``dims``: the sink dimensions, None: found; ``tau``: the authors' threshold)."""
        from vit.explain.language.inside.sinks import find_sinks

        self._in_sequence("the visual sinks")
        return find_sinks(self, dims, tau)

    def grounding_heads(self, i: int = 0, image: int = 0):
        """``vit.explain.language.inside.heads.HeadScores``: every head's attention sum and spatial entropy over the
        image at answer token ``i``'s query, the localization heads ranked (Kang et al., CVPR 2025)."""
        from vit.explain.language.inside.heads import localization_heads

        self._in_sequence("the localization heads")
        return localization_heads(self, self._token(i), image)

    def visual_heads(self, hits, image: int = 0, overview: bool = False) -> np.ndarray:
        """(L, H): SparseMM's visual score of every head over ``hits``, ``(answer token, box)`` pairs
        (``vit.explain.language.inside.heads.visual_scores``)."""
        from vit.explain.language.inside.heads import visual_scores

        self._in_sequence("the visual heads")
        return visual_scores(self, [(self._token(i), box) for i, box in hits], image, overview)

    def image_share(self, i: int, layer: int = -1, image: int | None = None) -> float:
        """The share of answer token ``i``'s attention at ``layer`` on the image tokens, mean over heads: how much it
        looked at the image (``image`` None: at every image of the question; an int: at that one)."""
        if image is not None:
            return float(self.image_rows(i, layer, image).sum(-1).mean())
        positions = torch.cat([layout.positions for layout in self.layouts])
        return float(self.row(i, layer)[:, positions].sum(-1).mean())

    def relevance(self, i: int, layer: int | None = None, overview: bool = False,
                  method: str = "gradxattn", image: int = 0) -> np.ndarray:
        """(gh, gw) float32: answer token ``i``'s relevance over the image for the logit of token ``i`` at the query
        that predicted it, on the tower's patch grid. ``method`` "gradxattn": gradient x attention over the image
        tokens (Chefer et al. 2021b), ``layer`` an int: that language-model layer's ``mean_h (dy/dA * A)^+`` row of
        the query; None: the rule's rollout over every layer, ``R = prod_l (I + mean_h (dy/dA_l * A_l)^+)``, its
        query row (``vit.explain.language.vlm_relevance``, counted first by ``vit.costs.plan.vlm_relevance``).
        "attnlrp":
        AttnLRP (Achtibat et al. 2024, lxt's rules) from the logit through every language-model layer, the projector
        and the tower to the pixels, signed, each patch holding its pixels' input x gradient summed over the
        channels (``layer`` None: the rules run through every layer; ``vit.explain.language.vlm_attnlrp``, counted first
        by ``vit.costs.plan.vlm_attnlrp``). One forward and backward of the model over the prompt and the answer's first
        ``i`` tokens. ``overview``: as ``attention``'s."""
        if method == "attnlrp":  # from the logit to the pixels: through a cross-attention as through any attention
            self._decoder_only(self._model()[0], "AttnLRP")
        elif layer is None:
            self._in_sequence("the rollout of gradient x attention")
        if method not in RELEVANCE_METHODS:
            raise ValueError(f"method must be one of {', '.join(RELEVANCE_METHODS)}, got {method!r}")
        if method == "attnlrp":
            from vit.explain.language.vlm_attnlrp import attnlrp

            if layer is not None:
                raise ValueError("AttnLRP runs from the logit through every layer to the pixels; ask it without a "
                                 "layer")
            self._one_image("AttnLRP")
            self._image(0).view(overview)  # an overview asked of an image read in one view: one line
            vlm, prepared = self._model()
            return attnlrp(vlm, prepared, self.tokens, self._token(i), overview).numpy()
        layout = self._image(image).view(overview)
        return layout.place(self.image_relevance(i, (layer,), image))[0].numpy()

    def image_relevance(self, i: int, layers, image: int = 0) -> torch.Tensor:
        """(len(layers), lead + N): answer token ``i``'s gradient x attention over ``image``'s tokens for each of
        ``layers`` (an int: that layer's row; None: the rollout), all from one forward and backward (``relevance``'s,
        counted first)."""
        vlm = self._model()[0]
        if None in layers:
            self._in_sequence("the rollout of gradient x attention")
        from vit.explain.language.vlm_relevance import relevances

        positions = self._image(image).positions
        vlm, prepared = self._model()
        i, layers = self._token(i), tuple(None if layer is None else self._layer(layer) for layer in layers)
        return relevances(vlm, prepared, self.tokens, i, layers, recording)[:, positions]

    def logit_lens(self, i: int) -> np.ndarray:
        """(L + 1,) float32: answer token ``i``'s probability read at the query that predicted it from the stream the
        first decoder layer receives and from each of the language model's ``L`` decoder layers, through its final
        norm and head (the logit lens; the last entry is the model's own prediction): the first layer that "knows"
        the word (``vit.explain.language.vlm_lens``, counted first by ``vit.costs.plan.vlm_lens``)."""
        if getattr(self._model()[0].model.config, "is_encoder_decoder", False):
            raise ValueError("the logit lens reads a decoder-only language model's stream, and this model's answer is "
                             "written by an encoder-decoder's decoder: ask its attention")
        from vit.explain.language.vlm_lens import logit_lens

        i = self._token(i)
        if i not in self._lens:  # kept: the explorer asks again on every rerun while its table is shown
            vlm, prepared = self._model()
            self._lens[i] = logit_lens(vlm, prepared, self.tokens, i).numpy()
        return self._lens[i].copy()

    def ablate(self, i: int, box: tuple[int, int, int, int], overview: bool = False, how: str = "zero",
               image: int = 0):
        """``vit.explain.language.vlm_lens.Ablation``: answer token ``i``'s logit and probability at the query that
        predicted it, with the image tokens that cover ``box`` = ``(top, left, bottom, right)`` patches of the map's
        grid (``overview``: the overview's; ``image``: of the question's ``image``-th image) ablated (``how``: "zero",
        or "mean" of the image's tokens) and without; two forwards of transformers' model (counted first). Llama 3.2
        Vision's are the tower's states its cross-attention layers read."""
        from vit.explain.language.vlm_lens import ablate, region_tokens

        vlm, prepared = self._model()
        self._decoder_only(vlm, "a region's ablation")
        layout = self._image(image)
        return ablate(vlm, prepared, self.tokens, self._token(i), region_tokens(layout.view(overview), box), how,
                      layout)

    def patch(self, i: int, box: tuple[int, int, int, int], source: Image.Image, overview: bool = False,
              image: int = 0, layer: int | None = None, head: int | None = None, at: str | None = None):
        """Activation patching of a region (TransformerLens' and nnsight's view, on the image): answer token ``i``'s
        logit and probability at the query that predicted it with the image tokens that cover ``box`` (as
        ``ablate``'s; ``image``: of the question's ``image``-th image) replaced by those ``source`` gives at the same
        places, and without (``vit.explain.language.vlm_lens.Ablation``: its ``ablated_*`` the patched run's). The
        source goes through the processor with the same question; it must be laid out as the asked image is (its
        size, for a model that keeps the aspect), else ValueError in one line. Three forwards (counted first).
        ``layer`` (or ``head``, ``at``): inside the language model instead, TransformerLens's ``run_with_hooks``
        way, at the positions ``box`` names (a box, "image", "question", "last" or token indices, as
        ``knockout``'s): ``at`` "residual" (the default) the stream after that layer, "attention" its attention
        output before the output projection, ``head``'s alone if given (``vit.explain.language.inside.patching``)."""
        from vit.explain.language.vlm_lens import ablate, check, region_tokens, source_states

        vlm, prepared = self._model()
        self._decoder_only(vlm, "a region's patching")
        if self.clip:
            raise ValueError("patching takes a source image for an image asked about; this question is about a "
                             "clip: ablate a slice (ablate_image) instead")
        if not isinstance(source, Image.Image):
            raise ValueError(f"source must be a PIL image, got {type(source).__name__}")
        layout, i = self._image(image), self._token(i)
        question, prompt = prepared.asked
        shown = list(prepared.images)
        shown[image] = source.convert("RGB")
        if layer is not None or head is not None or at is not None:
            from vit.explain.language.inside.knockout import positions
            from vit.explain.language.inside.patching import patch_layer

            self._in_sequence("patching inside the language model")
            if layer is None:
                raise ValueError("patching inside the language model needs layer=, the layer to patch at")
            where = positions(self, box, i, "box", overview, image)
            return patch_layer(self, i, where, prompt_inputs(vlm, shown if len(shown) > 1 else shown[0], question,
                                                             prompt), layer, head, at or "residual")
        tokens = region_tokens(layout.view(overview), box)
        check(vlm, prepared, i, lens=False)  # before the source's run too
        states = source_states(vlm, prepared, prompt_inputs(vlm, shown if len(shown) > 1 else shown[0], question,
                                                            prompt))
        return ablate(vlm, prepared, self.tokens, i, tokens, layout=layout, source=states)

    def knockout(self, i: int, source=None, target="image", layers=None, heads=None, windows: int | None = None,
                 overview: bool = False, image: int = 0):
        """``vit.explain.language.inside.knockout.Knockout``: answer token ``i``'s probability with the language model's
        attention edges from ``source`` (None: the query that predicted it) to ``target`` (an image box, "image",
        "question", "last" or token indices) blocked in ``layers`` (``windows=k``: each window of k of them) at
        ``heads``, and without."""
        from vit.explain.language.inside.knockout import knockout

        return knockout(self, i, source, target, layers, heads, windows, overview, image)

    def segments(self, grid: tuple[int, int] | None = None, masks=None, method: str = "ablation", samples: int = 8,
                 baseline: tuple[int, int, int] = (255, 255, 255)):
        """``vit.explain.language.vlm_segments.SegmentAttribution``: captum 0.9's own ``LLMAttribution`` of this
        answer to segments of the image (a ``grid`` of ``(rows, cols)`` cells, or ``masks``: segment ids or
        ``vit.segment``'s boolean masks), by feature ablation or Shapley value sampling (``method``), each segment
        made absent in the baseline colour and the image through the processor again; its forwards counted and
        bounded first."""
        from vit.explain.language.vlm_segments import segments

        self._one_image("captum's segment attribution")
        vlm, prepared = self._model()
        self._decoder_only(vlm, "captum's segment attribution")  # its forward appends the answer to the prompt
        question, prompt = prepared.asked
        return segments(vlm, prepared, self.tokens, prepared.images[0],
                        lambda shown: prompt_inputs(vlm, shown, question, prompt), grid=grid, masks=masks,
                        method=method, samples=samples, baseline=baseline)

    def ablate_image(self, i: int, image: int, how: str = "zero"):
        """``ablate`` of every image token of the question's ``image``-th image: what that image does to answer token
        ``i`` (a question about several images)."""
        from vit.explain.language.vlm_lens import ablate

        layout = self._image(image)
        vlm, prepared = self._model()
        self._decoder_only(vlm, "an image's ablation")
        return ablate(vlm, prepared, self.tokens, self._token(i), torch.arange(len(layout.positions)), how, layout)

    def _model(self) -> tuple:
        if getattr(self._recorder, "rows_kept", False):  # (``vlm_attention._LastRows``'s reason)
            raise ValueError("this reading runs the language model again, which is read here through transformers' "
                             f"attention interface, and {self._recorder.rows_kept}: ask its attention")
        if self._source is None:
            raise ValueError("this answer keeps no model to run again; ask it with vit.ask_vlm")
        return self._source

    def tam(self, i: int, overview: bool = False) -> np.ndarray:
        """(gh, gw) float32 in [0, 1]: answer token ``i``'s Token Activation Map (Li et al., ICCV 2025; the authors'
        ``TAM`` in xmed-lab/TAM): its class's logit-lens activation over the image tokens, the earlier text tokens'
        maps removed by estimated causal inference, normalised with the text's activations and smoothed by the rank
        Gaussian filter, each patch holding its image token's value. One forward of the model over the prompt and
        the answer's first ``i`` tokens, counted first (``vit.costs.plan.vlm_tam``; ``vit.explain.language.vlm_tam``,
        where the authors' choices for token 0 are told). ``overview``: as ``attention``'s."""
        self._in_sequence("TAM")
        from vit.explain.language.vlm_tam import on_layout

        self._one_image("TAM")
        layout = self.layout.view(overview)
        return on_layout(self.image_tam(i), layout)

    def image_tam(self, i: int) -> np.ndarray:
        """(lead + N,) float32: answer token ``i``'s TAM over the image tokens before the rank Gaussian filter (which
        ``tam`` applies on a view's grid): one forward, counted first
        (``vit.explain.language.vlm_tam.image_values``)."""
        self._in_sequence("TAM")
        from vit.explain.language.vlm_tam import image_values

        vlm, prepared = self._model()
        return image_values(vlm, prepared, self.tokens, self._token(i))

    def held(self) -> tuple[torch.Tensor, ...]:
        """The tensors the answer holds (its query rows and masks, a sliding layer's kept keys, the KV cache), as
        ``vit.core.cache.nbytes`` counts them."""
        r = self._recorder
        rows = [t for layer in (*r.queries, *r.masks, *(k for k in r.keys if k is not None)) for t in layer
                if t is not None]
        caches = [getattr(self._cache, name) for name in ("self_attention_cache", "cross_attention_cache")
                  if hasattr(self._cache, name)] or [self._cache]  # an encoder-decoder's two
        cached = [t for cache in caches for layer in cache.layers
                  for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if t is not None]
        return (*rows, *cached)

    def __repr__(self) -> str:
        stopped = "" if self.stopped is None else ", stopped"
        return f"VLMAnswer({self.text!r}, {len(self.tokens)} tokens{stopped}, {self.grid[0]}x{self.grid[1]} patches)"


@dataclass(frozen=True)
class Prepared:
    """A question about an image, through the processor, counted and allowed to run: what ``generate_answer``
    reads."""

    inputs: object  # the processor's BatchFeature
    layout: ImageLayout
    prompt_tokens: int
    max_new_tokens: int
    text: object  # TextShape: the language model's sizes
    words: str | None = None  # the question's words (a raw prompt's text after the image placeholder), for TAM
    layouts: tuple[ImageLayout, ...] = ()  # every image's layout, in the prompt's order (``layout``: the first's)
    clip: bool = False  # a question about a clip: ``layouts`` are its temporal slices
    images: tuple = field(default=(), compare=False, repr=False)  # the images asked about (PIL), for captum's segments
    asked: tuple = (None, None)  # (question, prompt) as given: the processor's run again for another image

    def tower(self) -> tuple[int, tuple[int, int] | None]:
        """``(views, view_grid)`` the cost model counts for the tower's forward over every image (or slice) of the
        question (``ImageLayout.counted``): one image's own, or every image's passes at the largest one's grid (a
        bound for images of other sizes)."""
        if len(self.layouts) == 1:
            return self.layouts[0].counted
        counted = [lay.counted for lay in self.layouts]
        grids = [grid or lay.grid for lay, (_, grid) in zip(self.layouts, counted, strict=True)]
        return sum(views for views, _ in counted), max(grids, key=lambda g: g[0] * g[1])

    def __post_init__(self) -> None:
        if not self.layouts:
            self.layouts = (self.layout,)

    def maps_per_token(self, method: str) -> int:
        """How many maps each answer token has by ``method`` (one of ``MAP_METHODS``): attention one per layer and
        head, gradient x attention one per layer, its rollout, TAM and AttnLRP one."""
        layers, heads = self.text.layers, self.text.heads
        per_token = {"attention": layers * heads, "gradxattn": layers, "gradxattn_rollout": 1, "tam": 1, "attnlrp": 1}
        return per_token[method]

    def maps_bytes(self, itemsize: int = 4, methods: tuple[str, ...] = ("attention",)) -> int:
        """Bytes of every answer token's maps by ``methods`` at most (``new x maps_per_token x gh x gw``), and as
        many on the overview's grid for an image read as tiles."""
        patches = sum(layout.grid[0] * layout.grid[1] + (layout.overview.grid[0] * layout.overview.grid[1]
                                                         if layout.overview is not None else 0)
                      for layout in self.layouts)
        maps = sum(self.maps_per_token(method) for method in set(methods))
        return self.max_new_tokens * maps * patches * itemsize


def prepare(vlm, image: Image.Image | Sequence[Image.Image] | None, question: str | None = None, *,
            prompt: str | None = None, max_new_tokens: int = 32,
            clip: Sequence[Image.Image] | SampledClip | None = None) -> Prepared:
    """``question`` (or ``prompt``) about ``image`` (one, or several in order: at most ``MAX_IMAGES``) through the
    model's processor, its image tokens' layout found (each image's) and what the answer holds counted
    (``vit.costs.plan.vlm_answer``: every image's tower forward): refused in one line over the limit, before any
    forward."""
    from vit.costs.plan import decide, vlm_answer

    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
            or not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise ValueError(f"max_new_tokens must be a whole number from 1 to {MAX_NEW_TOKENS}, got {max_new_tokens!r}")
    metadata = None
    if isinstance(clip, SampledClip):  # a video's frames with their times, which the processor writes in the prompt
        metadata, clip = clip.metadata(), clip.frames
    if clip is not None:
        if image is not None:
            raise ValueError("ask about images or a clip, not both")
        if not 1 <= len(clip) <= MAX_CLIP_FRAMES:
            raise ValueError(f"a clip is asked about in 1 to {MAX_CLIP_FRAMES} frames, got {len(clip)}")
        if vlm.model_type not in CLIP_FAMILIES:
            clip_layouts(vlm, None)  # its one-line refusal, before the processor runs
        inputs = prompt_inputs(vlm, None, question, prompt, clip, metadata)
        layouts = clip_layouts(vlm, inputs)
    else:
        images = list(image) if isinstance(image, (list, tuple)) else [image]
        if not 1 <= len(images) <= MAX_IMAGES:
            raise ValueError(f"ask about 1 to {MAX_IMAGES} images at once, got {len(images)}")
        if len(images) > 1 and vlm.model_type in ONE_IMAGE:  # before its processor refuses them in its own words
            raise ValueError(f"a {vlm.model_type} model reads one image per question; ask about one image")
        wrong = reads_prompt_unmarked(vlm)
        if wrong:  # before its processor runs (UDOP's wants an OCR engine)
            raise ValueError(wrong)
        inputs = prompt_inputs(vlm, images, question, prompt)
        if reads_tower_states(vlm):  # an encoder's states over the image alone (Pix2Struct's), a tower's (Idefics')
            layouts = (encoder_layout(vlm, inputs),)
        elif vlm.model_type in VLM_ARCHITECTURES:
            layouts = image_layouts(vlm, inputs, images)
        else:  # a type no layout here names: read from the processor's outputs and the config
            from vit.explain.language.vlm_read_layout import read_layouts

            layouts = read_layouts(vlm, inputs, images)
    layout = layouts[0]
    prompt_tokens, text = prompt_length(inputs, layout), text_shape(vlm)
    words = question if prompt is None else prompt.split(image_placeholder(vlm.processor) or "\0")[-1]
    prepared = Prepared(inputs, layout, prompt_tokens, max_new_tokens, text, words.strip() or None, layouts,
                        clip is not None, tuple(images) if clip is None else (), (question, prompt))
    # the tokens its language model attends over: a tower's states joined before the prompt too (GIT's)
    attended = prompt_tokens + (image_states(layout) if prefixes_tower_states(vlm) else 0)
    decide(vlm_answer(vlm.tower_shape, layout.grid, text, attended, max_new_tokens, *prepared.tower()))
    return prepared


class _Steps:
    """A ``generate`` stopping criterion that hands each answer token, as soon as it is chosen, to ``on_token`` (the
    answer so far: its ids and text) and reports it to ``progress(done, total)``. A ``Stop`` that ``progress`` raises
    ends the generation at once, the token just chosen kept: stopped after ``k`` tokens, the answer has ``k``."""

    def __init__(self, prompt_tokens: int | None, total: int, tokenizer, progress: Progress | None,
                 on_token: Callable[[tuple[int, ...], str], None] | None) -> None:
        self.prompt_tokens, self.total, self.tokenizer = prompt_tokens, total, tokenizer
        self.progress, self.on_token = progress, on_token
        self.stopped: Stop | None = None

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        """(B, T) the prompt and the answer so far -> (B,) bool: whether to stop now. ``prompt_tokens`` None: the
        prompt is what precedes the first token (a decoder's prompt as generate made it, its start token or not)."""
        if self.prompt_tokens is None:
            self.prompt_tokens = input_ids.shape[1] - 1
        tokens = tuple(input_ids[0, self.prompt_tokens:].tolist())  # one copy from the device per step
        if self.on_token is not None:
            self.on_token(tokens, self.tokenizer.decode(list(tokens), skip_special_tokens=True))
        if self.progress is not None and self.stopped is None:
            try:
                self.progress(len(tokens), self.total)
            except Stop as e:  # the tokens so far are kept: generate ends after this step
                self.stopped = e
        return torch.full((input_ids.shape[0],), self.stopped is not None, dtype=torch.bool, device=input_ids.device)


def generate_answer(vlm, prepared: Prepared, progress: Progress | None = None,
                    on_token: Callable[[tuple[int, ...], str], None] | None = None) -> VLMAnswer:
    """transformers' greedy ``generate`` on ``prepared``, each language-model layer's last query row recorded.
    Streamed: ``on_token(tokens, text)`` is given the answer so far (its ids, its text) as soon as each token is
    chosen, and ``progress(done, total)`` told each token done; a ``vit.core.progress.Stop`` it raises ends the
    generation there, the answer (``stopped``: why) keeping the tokens so far and every map of theirs. A ``Stop`` before
    the first token propagates: there is nothing to keep."""
    from transformers import StoppingCriteriaList

    tokenizer = vlm.processor.tokenizer
    if progress is not None:
        progress(0, prepared.max_new_tokens)
    # where the answer begins in generate's sequences: after the prompt, or an encoder-decoder's decoder prompt (its
    # start token, and the processor's decoder_input_ids: Pix2Struct's question), seen at the first step
    decoder = getattr(vlm.model.config, "is_encoder_decoder", False)
    begins = 1 if decoder and "decoder_input_ids" not in prepared.inputs else None if decoder or hasattr(
        type(vlm.model), "generate") and "generate" in vars(type(vlm.model)) else prepared.prompt_tokens  # a generate
    # of its own (BLIP's drops the prompt's last token): the prompt is what precedes the first token
    steps = _Steps(begins, prepared.max_new_tokens, tokenizer, progress, on_token)
    attending = attention_layers(vlm.language_model)
    decoder_layers = [n for n, _ in attending]
    latent, new_tokens = frozenset(), prepared.max_new_tokens
    stopping = [steps] if progress or on_token or begins is None else []
    while True:  # again, silently, where a layer's cache keeps latents: their keys then kept as each call hands them
        recorder = _Recorder({module: k for k, (_, module) in enumerate(attending)},
                             prepared.prompt_tokens + prepared.max_new_tokens, cache_layers=cache_sources(attending),
                             windows=cache_windows(vlm, decoder_layers), cross=cross_attending(vlm.language_model),
                             latent=latent)
        with recording(vlm, recorder), torch.inference_mode(), library_errors(vlm.model):
            # with its cache, whatever its folder's generation config says (Pix2Struct's use_cache false): the
            # same greedy tokens, and the rows read the cache's keys
            out = vlm.model.generate(**prepared.inputs.to(vlm.device), max_new_tokens=new_tokens, do_sample=False,
                                     num_beams=1, return_dict_in_generate=True, use_cache=True,
                                     stopping_criteria=StoppingCriteriaList(stopping))
        tokens = tuple(int(t) for t in out.sequences[0, steps.prompt_tokens:])
        if latent or not (latent := latent_layers(recorder, out.past_key_values)):
            break
        new_tokens = len(tokens)  # the tokens already streamed: the same greedy answer, recorded again
        stopping = [] if steps.prompt_tokens is not None else stopping
    steps_kept = {len(q) for q in recorder.queries}
    if steps_kept != {len(tokens)}:  # one query row per layer per generated token, or the rows do not match the tokens
        raise RuntimeError(f"recorded {sorted(steps_kept)} steps per layer for {len(tokens)} answer tokens")
    prepared = settled(prepared, recorder)  # an encoder's states over the image, counted now it has run
    if decoder:  # the decoder's prompt as generate made it, which a reading's forward appends the answer to
        prepared = with_decoder_prompt(prepared, out.sequences[:, :steps.prompt_tokens])
    text = tokenizer.decode(list(tokens), skip_special_tokens=True)
    pieces = tuple(tokenizer.decode([t]) for t in tokens)
    answered = VLMAnswer(tokens, text, pieces, prepared.layouts, recorder, out.past_key_values,
                         prepared.prompt_tokens, (vlm, prepared), None if steps.stopped is None else str(steps.stopped))
    answered.clip = prepared.clip
    return answered


def answer(vlm, image: Image.Image | Sequence[Image.Image] | None, question: str | None = None, *,
           prompt: str | None = None, max_new_tokens: int = 32,
           on_token: Callable[[tuple[int, ...], str], None] | None = None,
           clip: Sequence[Image.Image] | SampledClip | None = None) -> VLMAnswer:
    """``vlm``'s greedy answer to ``question`` about ``image`` (``generate``'s tokens), its query rows recorded:
    ``prepare`` (counted first, refused in one line over the limit), then ``generate_answer`` (``on_token``: given
    the answer so far as each token is chosen)."""
    return generate_answer(vlm, prepare(vlm, image, question, prompt=prompt, max_new_tokens=max_new_tokens,
                                        clip=clip), on_token=on_token)
