"""The explorer's "Ask the VLM" (issue 80), without Streamlit: what a visitor may ask, the map of a clicked answer
token, every answer token's share of attention on the image, and what their captions and the export say.

The maps are the notebook API's own (``VLMAnswer.attention``, ``VLMAnswer.image_share``): a notebook given the same
folder, image and question gets the map drawn here. The question and the answer's tokens are data: every caption
escapes them (Markdown), the labels make their control characters visible.
"""

from __future__ import annotations

import numpy as np

from vit.core.text import escape_markdown, visible
from vit.explain.language.answer_maps import TITLES
from vit.explain.language.vlm_answer import MAP_METHODS, MAX_NEW_TOKENS, Prepared, VLMAnswer, generate_answer
from vit.explain.views.overlay import DIVERGING_COLORMAP

DEFAULT_NEW_TOKENS = 16
# A visitor who may not read the server's files (no token) asks within these: an answer of at most this many tokens
# about an image of at most this many patches (the processor's own resize decides them: Qwen-VL's grows with the
# image). Each token of the answer is a forward of the whole language model; each patch a token of the prompt.
VISITOR_NEW_TOKENS = 32
VISITOR_PATCHES = 1024
FUSION_LABELS = {"mean": "mean over heads", "max": "max over heads"}
METHOD_LABELS = {method: TITLES[method] for method in MAP_METHODS}  # the refusals name them so too
SIGNED = ("attnlrp",)  # relevance for and against the token: a diverging colour map around 0


def max_new_tokens(may_open: bool) -> int:
    """The longest answer this visitor may ask for: ``MAX_NEW_TOKENS`` with access to the server's files, else
    ``VISITOR_NEW_TOKENS``."""
    return MAX_NEW_TOKENS if may_open else VISITOR_NEW_TOKENS


def check_visitor(prepared: Prepared, may_open: bool) -> None:
    """ValueError (one line) when a visitor without access asks beyond ``VISITOR_NEW_TOKENS`` or about an image (or
    images) of more than ``VISITOR_PATCHES`` patches (every tile's, where the processor cuts it); nothing for a
    visitor with access (the cost model bounds every one)."""
    if may_open:
        return
    layout = prepared.layout
    if prepared.max_new_tokens > VISITOR_NEW_TOKENS:
        raise ValueError(f"an answer of {prepared.max_new_tokens} tokens is more than the {VISITOR_NEW_TOKENS} a "
                         "visitor may ask for here; ask for fewer (with a token, entered on the Train page, more)")
    layouts = prepared.layouts or (layout,)
    if len(layouts) > 1 and sum(one.patches for one in layouts) > VISITOR_PATCHES:
        what = "this clip's" if prepared.clip else "these"
        raise ValueError(f"the model's processor makes {what} {len(layouts)} {'slices' if prepared.clip else 'images'} "
                         f"{sum(one.patches for one in layouts):,} patches in all, more than the {VISITOR_PATCHES:,} "
                         "a visitor may ask about here; ask about fewer or smaller "
                         f"{'frames' if prepared.clip else 'images'} (with a token, entered on the Train page, more)")
    if layout.patches > VISITOR_PATCHES:
        (gh, gw), views = layout.view_grid or layout.grid, layout.views
        made = f"{gh}x{gw}" if views == 1 else f"{views} tiles of {gh}x{gw}"
        raise ValueError(f"the model's processor makes this image {made} = {layout.patches:,} patches, more than "
                         f"the {VISITOR_PATCHES:,} a visitor may ask about here; upload a smaller image (with a "
                         "token, entered on the Train page, larger)")


def generate(vlm, prepared: Prepared, work) -> VLMAnswer:
    """The answer for the page's long work (``vit.app.work.Work``): streamed, the answer so far in ``work.so_far``
    (plain text, the page draws it under the progress) as each token is chosen; stopped, the answer keeps the
    tokens so far and their maps (``generate_answer``)."""
    def show(tokens: tuple[int, ...], text: str) -> None:
        work.so_far = f"Answer so far ({len(tokens)} of {prepared.max_new_tokens} tokens at most): {visible(text)}"

    return generate_answer(vlm, prepared, work, show)


def token_label(answer: VLMAnswer, i: int) -> str:
    """Answer token ``i`` as a clickable label shows it, Markdown-escaped: its text with its blanks and control
    characters visible ('·' for a leading space), or its id for a token without text."""
    piece = answer.pieces[i]
    if not piece.strip():
        return f"#{answer.tokens[i]}" if not piece else escape_markdown(visible(piece.replace(" ", "·")))
    return escape_markdown(visible(piece.replace(" ", "·", 1) if piece.startswith(" ") else piece))


def token_labels(answer: VLMAnswer) -> list[str]:
    """Each answer token's clickable label (``token_label``), a label that several tokens share followed by the
    token's position from 1 ("the (1)", "the (4)"): a widget knows its options by their labels, and two alike
    would be one (Streamlit 1.67 reads the last of them back after any other widget changes)."""
    labels = [token_label(answer, i) for i in range(len(answer.tokens))]
    suffixed: set[int] = set()
    while True:
        seen: dict[str, list[int]] = {}
        for i, label in enumerate(labels):
            seen.setdefault(label, []).append(i)
        shared = [i for group in seen.values() if len(group) > 1 for i in group if i not in suffixed]
        if not shared:
            return labels
        for i in shared:
            labels[i] += " " + escape_markdown(f"({i + 1})")  # escaped as the label's own text: alike compare alike
            suffixed.add(i)


def token_map(answer: VLMAnswer, i: int, layer: int, head: int | None, fusion: str = "mean",
              method: str = "attention", overview: bool = False, image: int = 0, sinks=None) -> np.ndarray:
    """(gh, gw): answer token ``i``'s attention to the image at ``layer`` (from 0), ``head`` (from 0) or the heads
    fused by ``fusion`` (``VLMAnswer.attention``); ``method`` "gradxattn": its gradient x attention at ``layer``,
    "gradxattn_rollout": rolled out over every layer (``VLMAnswer.relevance``; heads averaged by the rule); "tam":
    its Token Activation Map (``VLMAnswer.tam``, no layer or head); "attnlrp": AttnLRP through every layer to the
    pixels, signed (``VLMAnswer.relevance(method="attnlrp")``). An image read as tiles: on the tiles' canvas, or,
    ``overview``, on the model's one view of the whole image. ``image``: which of the question's images (TAM and
    AttnLRP are drawn for a question about one image: ValueError, one line, for more). ``sinks``
    (``VLMAnswer.sinks``'s): the attention map without them (``VLMAnswer.attention(..., sinks=)``)."""
    if method == "tam":
        return answer.tam(i, overview=overview)
    if method == "attnlrp":
        return answer.relevance(i, overview=overview, method="attnlrp")
    if method == "gradxattn":
        return answer.relevance(i, layer, overview=overview, image=image)
    if method == "gradxattn_rollout":
        return answer.relevance(i, overview=overview, image=image)
    return answer.attention(i, layer, head, fusion, overview=overview, image=image, sinks=sinks)


def colours(method: str, map2d: np.ndarray, colormap: str) -> tuple[str, float | None, float | None]:
    """``(colour map, vmin, vmax)`` the map of ``method`` is drawn with: a signed map (``SIGNED``) with the diverging
    colour map, symmetric around 0; any other with the page's ``colormap`` on its own range (None, None)."""
    if method not in SIGNED:
        return colormap, None, None
    bound = float(np.abs(map2d).max()) or 1.0
    return DIVERGING_COLORMAP, -bound, bound


def tiled(answer: VLMAnswer, image: int = 0) -> bool:
    """Whether the processor cut the question's ``image``-th image into tiles beside an overview (InternVL,
    LLaVA-NeXT, LLaVA-OneVision)."""
    return answer.layouts[image].overview is not None


def seen_pixels(answer: VLMAnswer, overview: bool = False, image: int = 0) -> np.ndarray | None:
    """(H, W, 3) uint8: the pixels a map is drawn over, as the model read them, where the processor says: a tiled
    image's (the tiles' canvas, or the overview's view), a clip's slice's (its first frame); None for an image read
    in one view (its pixels are the tower's preprocessing)."""
    layout = answer.layouts[image]
    return layout.view(overview).pixels if tiled(answer, image) else layout.pixels


def slice_frames(answer: VLMAnswer, frames: int, k: int) -> tuple[int, int]:
    """(first, last), from 1: the sampled frames of a clip of ``frames`` that its ``k``-th temporal slice reads
    (Qwen-VL's and GLM's two at a time, the last repeated where their count is odd; LLaVA-NeXT-Video's one)."""
    depth = -(-frames // len(answer.layouts))
    return k * depth + 1, min((k + 1) * depth, frames)


def slice_label(answer: VLMAnswer, frames: int, k: int) -> str:
    """The time slider's label of a clip's ``k``-th slice: its sampled frames."""
    first, last = slice_frames(answer, frames, k)
    return f"frame {first}" if first == last else f"frames {first}–{last}"


def image_shares(answer: VLMAnswer, layer: int, image: int | None = None) -> list[float]:
    """Each answer token's share of its attention at ``layer`` on the image tokens (``image`` None: of every image
    of the question; an int: of that one), mean over heads: how much it looked at the image
    (``VLMAnswer.image_share``)."""
    return [answer.image_share(i, layer, image) for i in range(len(answer.tokens))]


def describe(answer: VLMAnswer, i: int, layer: int, head: int | None, fusion: str, method: str = "attention",
             overview: bool = False, image: int = 0, frames: int | None = None) -> str:
    """The map's caption, as Markdown (the token escaped): which token, layer and head, what a patch holds, for a
    question about several images on which, about a clip of ``frames`` on which slice, and for an image read as
    tiles on which of the model's views."""
    if answer.clip:
        first, last = slice_frames(answer, frames, image)
        read = f"its sampled frame {first}" if first == last else f"its sampled frames {first}–{last}"
        return (_describe(answer, i, layer, head, fusion, method, image) + f" On slice {image + 1} of the clip's "
                f"{len(answer.layouts)} ({read}), drawn over frame {first} as the processor prepared it.")
    layout = answer.layouts[image]
    view = "" if not tiled(answer, image) else (
        " On the model's one view of the whole image (its overview)." if overview
        else f" On the canvas of the {layout.views - 1} tiles the processor cut the image into, as the model read "
             "them.")
    several = f" On image {image + 1} of the question's {len(answer.layouts)}." if len(answer.layouts) > 1 else ""
    return _describe(answer, i, layer, head, fusion, method, image) + several + view


def _describe(answer: VLMAnswer, i: int, layer: int, head: int | None, fusion: str, method: str,
              image: int = 0) -> str:
    heads = f"head {head + 1}" if head is not None else FUSION_LABELS[fusion]
    side = answer.layouts[image].unit
    unit = "one patch" if side == 1 else f"the {side}×{side} patches of its unit"
    if method == "tam":
        first = (" For the first answer token the authors' code gives the map of the class the model predicts at the "
                 "question's first word, which is drawn here as theirs.") if i == 0 else ""
        return (f"**Answer token {i + 1} “{token_label(answer, i)}”**, TAM (Li et al., ICCV 2025): each patch holds, "
                f"for the image token covering it ({unit}), the language-model head's logit of this token on that "
                "image token's last hidden state, the earlier words' maps removed (estimated causal inference), "
                "normalised with the text's and smoothed by the rank Gaussian filter." + first)
    if method == "attnlrp":
        return (f"**Answer token {i + 1} “{token_label(answer, i)}”**, AttnLRP (Achtibat et al. 2024, lxt's rules) "
                "of the token's logit through every layer of the language model, the projector and the vision tower "
                "to the pixels: each patch holds its pixels' relevance (input × modified gradient, summed over the "
                "colour channels), red for the token, blue against it.")
    if method != "attention":
        where = "rolled out over every layer of the language model" if method == "gradxattn_rollout" else \
            f"at layer {layer + 1} of the language model"
        return (f"**Answer token {i + 1} “{token_label(answer, i)}”**, gradient × attention {where} (Chefer et "
                f"al. 2021b): each patch holds, for the image token covering it ({unit}), the positive part of the "
                f"token's logit's gradient times the attention of the query that predicted it, mean over heads.")
    share = answer.image_share(i, layer, image if len(answer.layouts) > 1 else None)
    return (f"**Answer token {i + 1} “{token_label(answer, i)}”**, layer {layer + 1} of the language model, {heads}: "
            f"each patch holds the attention of the query that predicted this token to the image token covering "
            f"it ({unit}), as transformers' eager attention forms it. At this layer the token's attention on the "
            f"image is {share:.1%} of its row (mean over heads); the rest went to the text.")


def settings(question: str, answer: VLMAnswer, new_tokens: int, i: int, layer: int, head: int | None,
             fusion: str, method: str = "attention", overview: bool = False, image: int = 0,
             frames: int | None = None) -> dict[str, str]:
    """The view's settings for the exported page: label -> value, as plain text (the export escapes them)."""
    shown = _settings(question, answer, new_tokens, i, layer, head, fusion, method)
    if answer.stopped is not None:
        shown["Answer"] = f"{answer.text} (stopped after {len(answer.tokens)} tokens: {answer.stopped})"
    if answer.clip:
        shown["Clip frames (sampled uniformly)"] = str(frames)
        shown["Slice of the clip shown"] = (f"{image + 1} of {len(answer.layouts)} "
                                            f"({slice_label(answer, frames, image)})")
    elif len(answer.layouts) > 1:
        shown["Image of the question shown"] = f"{image + 1} of {len(answer.layouts)}"
    if tiled(answer, image):
        shown["Image view"] = "the overview" if overview else f"the {answer.layouts[image].views - 1} tiles' canvas"
    return shown


def _settings(question: str, answer: VLMAnswer, new_tokens: int, i: int, layer: int, head: int | None,
              fusion: str, method: str) -> dict[str, str]:
    if method != "attention":
        return {"Question": question, "Answer": answer.text, "Answer length (tokens at most)": str(new_tokens),
                "Answer token": f"{i + 1}: {visible(answer.pieces[i])}", "Map": METHOD_LABELS[method],
                **({"Layer": str(layer + 1)} if method == "gradxattn" else {})}
    return {"Question": question, "Answer": answer.text, "Answer length (tokens at most)": str(new_tokens),
            "Answer token": f"{i + 1}: {visible(answer.pieces[i])}", "Layer": str(layer + 1),
            "Head": "all" if head is None else str(head + 1),
            **({"Head fusion": fusion} if head is None else {})}

