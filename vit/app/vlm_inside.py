"""Inside the language model on the explorer's "Ask the VLM" (issue 115, item 4): for the clicked answer token, the
knockout curve over windows of layers (the edges from its query to the whole image, or to a box of it, blocked:
``VLMAnswer.knockout``), the grid of the heads that ground it (``VLMAnswer.grounding_heads``, Kang et al., CVPR 2025)
and the map without the visual sinks (``VLMAnswer.sinks``, ``VLMAnswer.attention(..., sinks=)``). Plain functions
the page calls; what they return is the notebook API's, laid out as the page's tables and the export's lines."""

from __future__ import annotations

import re

from vit.explain.language.inside.heads import HeadScores
from vit.explain.language.inside.knockout import Knockout

DEFAULT_WINDOW = 1  # layers blocked at a time: one layer per point of the curve (the papers use 9 of LLaMA's 32)


def parse_box(text: str) -> tuple[int, int, int, int]:
    """``(top, left, bottom, right)`` from "top,left,bottom,right": whole patches of the map's grid (the box ends
    exclusive, as ``VLMAnswer.ablate``'s). ValueError (one line) for anything else."""
    found = re.fullmatch(r"\s*(\d{1,4})\s*,\s*(\d{1,4})\s*,\s*(\d{1,4})\s*,\s*(\d{1,4})\s*", str(text))
    if found is None:
        raise ValueError("a box is four whole numbers of patches, top,left,bottom,right (e.g. 0,0,2,3)")
    top, left, bottom, right = (int(v) for v in found.groups())
    if bottom <= top or right <= left:
        raise ValueError(f"the box {top},{left},{bottom},{right} is empty: its bottom must be below its top and its "
                         "right past its left")
    return top, left, bottom, right


def box_text(box: tuple[int, int, int, int]) -> str:
    """``parse_box``'s text of ``box``."""
    return ",".join(map(str, box))


def knockout_curve(answer, i: int, window: int, box: tuple[int, int, int, int] | None = None, image: int = 0,
                   overview: bool = False) -> Knockout:
    """Answer token ``i``'s probability with the edges from its query to ``box`` of the image (None: every token
    of ``image``) blocked in each window of ``window`` consecutive layers, and without (one forward each)."""
    return answer.knockout(i, None, "image" if box is None else box, None, None, windows=window, overview=overview,
                           image=image)


def window_label(span: tuple[int, ...]) -> str:
    """A window of layers (from 0) as the page names it, from 1: "layer 3" or "layers 2–4"."""
    return f"layer {span[0] + 1}" if len(span) == 1 else f"layers {span[0] + 1}–{span[-1] + 1}"


def curve_rows(knockout: Knockout) -> list[dict[str, object]]:
    """The curve's table: each window's layers, the token's probability with its edges blocked (%) and the change
    from the baseline (%, the papers' y axis)."""
    return [{"layers": window_label(span), "probability": 100 * float(p), "change": 100 * float(c)}
            for span, p, c in zip(knockout.windows, knockout.probability, knockout.change, strict=True)]


def knockout_lines(knockout: Knockout, where: str) -> dict[str, str]:
    """The export's lines of the curve: label -> plain text."""
    return {"Knockout": f"the edges from the token's query to {where} blocked, layer window by window; the token's "
                        f"probability without: {knockout.baseline:.4%}",
            **{f"Knockout, {row['layers']}": f"{row['probability'] / 100:.4%} ({row['change']:+.2f}%)"
               for row in curve_rows(knockout)}}


def heads_rows(scores: HeadScores) -> list[dict[str, object]]:
    """The heads grid: a row per layer (from 1), a column per head, each cell the head's attention sum on the image
    (% of its row: Kang et al.'s first criterion)."""
    return [{"layer": str(layer + 1), **{f"head {h + 1}": 100 * float(v) for h, v in enumerate(sums)}}
            for layer, sums in enumerate(scores.attention_sum)]


def ranked_text(scores: HeadScores, most: int = 5) -> str:
    """The localization heads, best first (at most ``most``): "layer 3 head 2 (entropy 0.41)", ...; "none"."""
    return ", ".join(f"layer {layer + 1} head {head + 1} (entropy {scores.spatial_entropy[layer, head]:.3g})"
                     for layer, head in scores.ranked[:most]) or "none"


def heads_lines(scores: HeadScores) -> dict[str, str]:
    """The export's lines of the grid: label -> plain text."""
    return {"Grounding heads (ranked)": ranked_text(scores),
            **{f"Heads' attention on the image, layer {row['layer']}":
               ", ".join(f"{v:.2f}%" for k, v in row.items() if k != "layer") for row in heads_rows(scores)}}


def head_at(cell: tuple[int, str] | None) -> tuple[int, int] | None:
    """``(layer, head)`` from 0 of a clicked cell of the grid (its row and column name), None for the layer column
    or no cell."""
    if cell is None:
        return None
    row, column = cell
    found = re.fullmatch(r"head (\d+)", str(column))
    return None if found is None else (int(row), int(found.group(1)) - 1)


def sinks_caption(answer, sinks, i: int, layer: int, image: int = 0) -> str:
    """The map's caption's words without the sinks (plain text): how many image tokens are sinks at ``layer`` and,
    when most of the token's row sat on them, ``sink_note``'s line."""
    from vit.explain.language.inside.sinks import sink_note

    count = int(sinks.at(layer, answer.layouts[image].positions).sum())
    said = (f"Without the {count} visual sink token{'s' if count != 1 else ''} of this image at this layer (massive "
            f"activations in dimensions {', '.join(map(str, sinks.dims))}): each head's row renormalised over the "
            "image's other tokens.")
    note = sink_note(answer, sinks, i, layer, image)
    return said if note is None else f"{said} {note}"
