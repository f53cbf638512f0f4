"""The explorer's view in its URL (issue 50): what decides the view ⇄ query parameters, and those settings in the
sidebar's words (``describe``, for the exported view).

``decode`` checks every parameter on its own (its type and range); ``fit`` checks those whose range depends on the
model (layers, heads, tokens, classes) once it is loaded. A bad or stale parameter is dropped with one line naming it,
never an error: a link someone sent must open. A model or SAE given by path on the server passes the access rule
(``vit.runs.access``) exactly as a typed path does: a visitor who may not read the server's files by path gets a
note, never the file.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from vit import registry
from vit.app import sam_prompt_view as sam_prompts
from vit.app import vlm_inside
from vit.app.drawing import COLORMAPS, COLOUR_SCALES, class_option, head_option, size_option, token_option
from vit.app.vlm_words import KINDS as WORD_KINDS
from vit.app.vlm_words import TARGETS
from vit.core.clips import MAX_FPS
from vit.core.inference import MAX_INPUT_SIDE
from vit.core.text import visible
from vit.explain.language.prompts import PROMPT_METHODS
from vit.explain.language.vlm_answer import FUSIONS, MAP_METHODS, MAX_CLIP_FRAMES, MAX_IMAGES, MAX_NEW_TOKENS
from vit.explain.methods.attention import HEAD_FUSIONS
from vit.explain.methods.captum_maps import options_text, parse_options
from vit.explain.methods.segment import MAP_LABELS
from vit.explain.views.attention_maps import CAM_KINDS, MAP_KINDS, method_of
from vit.explain.views.overlay import UPSAMPLE_MODES
from vit.explain.views.video import CLIP_KIND_LABELS

MAX_VALUE_CHARS = 2000  # longer values (a pasted essay as labels) are refused before they are parsed
MAX_HEADS = 256  # heads switched off in one link: more than any catalogue model has
MIN_FPS = 0.01  # a zip of frames' rate, at least (the page's field and a link keep two decimals)
MAX_WHOLE = 999_999  # a whole number's bound where a parameter has no tighter one (a class, a query, an instance)
STEP = 0.05  # the sliders' step: opacity, discard ratio, mass share
_DIGEST = re.compile(r"[0-9a-f]{64}")  # sha256 of an upload's bytes
_HEAD = re.compile(r"([1-9][0-9]{0,3})\.([1-9][0-9]{0,3})")  # layer.head from 1, as the page labels them
_PATCH = re.compile(r"([1-9][0-9]{0,3})\.([1-9][0-9]{0,3})\.([1-9][0-9]{0,3})")  # a clip's frame.row.col from 1
PATH_REFUSED = ("is a path on the server, which a link opens only for a visitor who may read the server's files "
                "(with a token: enter it on the Train page)")
DEFAULT_OPENED = "the default model opened instead"


class ShareError(ValueError):
    """One parameter that cannot be used; its message says why, in one line."""


@dataclass(frozen=True)
class Model:
    """The model a link names: ``kind`` "name" (a catalogue entry's name: ``path`` is its path), "hub" (a Hub id,
    opened as typed into "Open from the Hub") or "path" (a path on the server)."""

    kind: str
    text: str
    path: str | None = None


def _flag(text: str) -> bool:
    if text not in ("0", "1"):
        raise ShareError("give 0 or 1")
    return text == "1"


def _whole(low: int, high: int = MAX_WHOLE) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not re.fullmatch(r"[0-9]{1,7}", text) or not low <= int(text) <= high:
            raise ShareError(f"give a whole number from {low} to {high}")  # the bound named, as every refusal
        return int(text)
    return parse


def _steps(low: float, high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ShareError(f"give a number from {low:g} to {high:g}") from None
        if not low - 1e-9 <= value <= high + 1e-9:  # NaN and infinities fail here too
            raise ShareError(f"give a number from {low:g} to {high:g}")
        steps = round(value / STEP)
        if abs(steps * STEP - value) > 1e-6:
            raise ShareError(f"give a number from {low:g} to {high:g} in steps of {STEP:g}")
        return round(steps * STEP, 2)  # the slider's own value, so the widget accepts it
    return parse


def _one_of(choices) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ShareError(f"give one of {', '.join(choices)}")
        return text
    return parse


def _map(text: str) -> str:
    """A map: an image's (the registry's methods, the plugins' included), a VLM tower's word map or a clip's."""
    names = tuple(dict.fromkeys((*(m.name for m in registry.methods() if m.group != "words"), *WORD_KINDS,
                                 *CLIP_KIND_LABELS)))
    return _one_of(names)(text)


def _sample(text: str) -> str:
    if "/" in text or "\\" in text or text in ("", ".", "..") or visible(text) != text:
        raise ShareError("give a sample image's file name")
    return text


def _digest(text: str) -> str:
    if not _DIGEST.fullmatch(text):
        raise ShareError("give the 64 hexadecimal digits of an upload's SHA-256")
    return text


def _digests(text: str) -> tuple[str, ...]:
    """A question's more images: the SHA-256s of uploads, comma-separated, at most ``MAX_IMAGES`` - 1 (the page's
    image is the first)."""
    digests = tuple(text.split(","))
    if len(digests) > MAX_IMAGES - 1 or not all(_DIGEST.fullmatch(d) for d in digests):
        raise ShareError(f"give at most {MAX_IMAGES - 1} uploads' SHA-256s (64 hexadecimal digits each), separated by "
                         "commas")
    return digests


def _heads(text: str) -> tuple[str, ...]:
    labels = tuple(text.split(","))
    if len(labels) > MAX_HEADS or not all(_HEAD.fullmatch(label) for label in labels):
        raise ShareError("give heads as LAYER.HEAD (from 1), separated by commas")
    return tuple(dict.fromkeys(labels))


def _patch(text: str) -> tuple[int, int, int]:
    found = _PATCH.fullmatch(text)
    if found is None:
        raise ShareError("give a clip's query patch as FRAME.ROW.COL (from 1)")
    return tuple(int(v) for v in found.groups())


def _rate(text: str) -> float:
    """A zip of frames' rate: frames a second from ``MIN_FPS`` to ``MAX_FPS``, at most two decimals (the page's
    field keeps no more, so a link restores it as written)."""
    if not re.fullmatch(r"[0-9]{1,4}(?:\.[0-9]{1,2})?", text) or not MIN_FPS <= float(text) <= MAX_FPS:
        raise ShareError(f"give a number of frames a second from {MIN_FPS:g} to {MAX_FPS}, at most two decimals")
    return float(text)


def _prompt_part(parse: Callable[[str], object]) -> Callable[[str], object]:
    """A SAM prompt's part (``vit.app.sam_prompt_view``' parsers), its ValueError as this module's."""
    def read(text: str) -> object:
        try:
            return parse(text)
        except ValueError as e:
            raise ShareError(str(e)) from None
    return read


def _options(text: str) -> tuple[tuple[str, float | int], ...]:
    try:
        return parse_options(text)
    except ValueError as e:
        raise ShareError(str(e)) from None


def _text(text: str) -> str:
    if not text.strip():
        raise ShareError("give some text")
    return text


# Every parameter a link may hold, in the order the URL lists them, and how its value is read. Those decided by the
# model (layer, head, query, class, end, feature, sae_layer) get their upper bound in ``fit``.
PARSERS: dict[str, Callable[[str], object]] = {
    "model": str,  # checked by ``model`` against the catalogue and the access rule
    "sample": _sample, "upload": _digest,
    "size": _whole(0, MAX_INPUT_SIDE), "aspect": _flag, "invert": _flag,
    "map": _map,  # an image's, a word's, a clip's
    "registers": _one_of(("hidden",)),
    "class": _whole(0), "query": _whole(0), "layer": _whole(1), "head": _whole(1), "fusion": _one_of(HEAD_FUSIONS),
    "end": _whole(1), "discard": _steps(0.0, 0.95),
    "attr": _options,  # captum's and RISE's settings that differ from their defaults: n_steps=20,baselines=0.5
    "opacity": _steps(0.0, 1.0), "cmap": _one_of(COLORMAPS), "scale": _one_of(tuple(COLOUR_SCALES)),
    "upsample": _one_of(UPSAMPLE_MODES), "grid": _flag, "mass": _steps(0.05, 0.95),
    # "Ask in words": a port's prompt maps, or a library-road tower's class maps (each model's checked on its page)
    "labels": _text, "wlabel": _text, "wminus": _text, "wmethod": _one_of((*PROMPT_METHODS, *MAP_KINDS)),
    "space": _flag, "word": _text, "target": _one_of(tuple(TARGETS)),
    "sae": _text, "sae_layer": _whole(1), "feature": _whole(0), "ablate": _heads,
    "frame": _whole(1), "patch": _patch,  # a clip's shown sampled frame, its query patch
    # "Ask the VLM": the question, the answer's length, the clicked answer token and the language model's layer and
    # head (from 1), head fusion and the map's method
    "question": _text, "answer_length": _whole(1, MAX_NEW_TOKENS), "answer_token": _whole(1), "lm_layer": _whole(1),
    "lm_head": _whole(1), "lm_fusion": _one_of(FUSIONS), "lm_method": _one_of(MAP_METHODS), "lm_overview": _flag,
    "lm_lens": _flag, "more": _digests, "lm_image": _whole(1),  # the question's more images (uploads), the one shown
    "lm_clip": _digest, "lm_frames": _whole(1, MAX_CLIP_FRAMES),  # or a clip (an upload), its frames sampled
    "lm_fps": _rate,  # a zip of frames' rate, which its file does not say
    # inside the language model (issue 115): the map without the visual sinks, the knockout curve over windows of
    # this many layers (to this box of patches, else the whole image), the grounding heads' grid
    "lm_sinks": _flag, "lm_knockout": _whole(1), "lm_kbox": _prompt_part(vlm_inside.parse_box), "lm_heads": _flag,
    # a SAM's prompt (its points and box in the image's pixels, checked against the image where it is shown), the
    # decoder's output token and attention drawn, and its head (0: their mean)
    "points": _prompt_part(sam_prompts.parse_points), "box": _prompt_part(sam_prompts.parse_box),
    "token": _one_of(tuple(sam_prompts.TOKENS)), "dattn": _prompt_part(sam_prompts.parse_attention),
    "dhead": _whole(0), "smap": _one_of(tuple(MAP_LABELS)),  # the pixel map of the mask
    "sat": _prompt_part(sam_prompts.parse_at),  # the pixel map of the mask's logit at this pixel, not summed over it
    # SAM 3: the concept (a noun phrase), its exemplar box, the score threshold, the instance explained and its
    # decoder layer and head (from 1; head 0: their mean)
    "concept": _text, "cbox": _prompt_part(sam_prompts.parse_box), "cthreshold": _steps(0.0, 0.95),
    "instance": _whole(1), "clayer": _whole(1), "chead": _whole(0),
    "cmethod": _one_of(("gradient_x_input", "attnlrp")),  # which pixels made the instance's mask (default: attention)
}


# What the page calls each setting a link holds, for the exported view's settings table. The sidebar's input-size,
# map and overlay widgets take their labels from here, so that the two say the same.
LABELS = {
    "size": "Input size", "aspect": "Keep the aspect ratio (long side at that size)",
    "invert": "Invert (for dark strokes on a light background)",
    "map": "Map", "registers": "Hide the register/extra prefix tokens",
    "class": "Class", "query": "Query token", "layer": "Layer", "head": "Head", "fusion": "Head fusion",
    "end": "Up to layer", "discard": "Discard ratio", "attr": "Attribution settings",
    "opacity": "Opacity", "cmap": "Colour map", "scale": "Colour scale", "upsample": "Upsampling",
    "grid": "Show the patch grid", "mass": "Share of the mass",
    "labels": "Labels", "wlabel": "Map for", "wminus": "Minus", "wmethod": "Method",
    "space": "Read each word after a space", "word": "Word", "target": "Target",
    "sae": "SAE folder", "sae_layer": "Block it reads", "feature": "Feature",
    "ablate": "Heads switched off in every map",
    "frame": "Frame", "patch": "Query patch",
    "question": "Question", "answer_length": "Answer length (tokens at most)", "answer_token": "Answer token",
    "lm_layer": "Language model layer", "lm_head": "Language model head", "lm_fusion": "Language model head fusion",
    "lm_method": "Answer token's map", "lm_overview": "The whole image's view (a tiled image's overview)",
    "lm_lens": "The clicked token read at every layer (logit lens)",
    "more": "More images in the question (uploads)", "lm_image": "Image of the question shown (a clip's slice)",
    "lm_clip": "Clip in the question (an upload)", "lm_frames": "Clip frames (sampled uniformly)",
    "lm_fps": "Frame rate of the zip's frames (frames a second)",
    "lm_sinks": "The map without the visual sinks", "lm_knockout": "Knockout curve, layers per window",
    "lm_kbox": "Knockout box (top, left, bottom, right, in patches)", "lm_heads": "The grounding heads' grid",
    "points": "Points (x, y in the image's pixels)", "box": "Box (x0, y0, x1, y1)", "token": "Output token",
    "dattn": "Decoder attention", "dhead": "Decoder head", "smap": "Which pixels made the mask",
    "sat": "Explained at pixel (x, y)",
    "concept": "Concept", "cbox": "Exemplar box", "cthreshold": "Score threshold", "instance": "Instance",
    "clayer": "Decoder layer", "chead": "Decoder head (0: the mean)", "cmethod": "Which pixels made the mask",
}


def end_label(kind: str | None) -> str:
    """The sidebar's label of map ``kind``'s end layer: "Layer" for a CAM, which reads that one block, "Up to layer"
    for the maps that run through the layers up to it (rollout, flow, the class map, LRP)."""
    return LABELS["layer"] if kind in CAM_KINDS else LABELS["end"]


def describe(values: Mapping[str, object], *, size_label: str, grid: tuple[int, int], num_prefix_tokens: int,
             prefix_names: Sequence[str], class_names: Sequence[str], predicted: int = 0,
             own_size: str = "") -> dict[str, str]:
    """The view's settings (``decode``'s values, the model's and the image's left out) as the sidebar shows them:
    its label -> the option it shows. ``head`` 0 and ``class`` -1 stand for the pickers' first options, which a
    link leaves out: every head fused, the ``predicted`` class. ``size_label``: ``Preprocessing.size_label``;
    ``own_size``: its ``own_size_rule``."""
    words: dict[str, Callable[[object], str]] = {
        "size": lambda v: size_option(v, size_label, own_size),
        "map": lambda v: WORD_KINDS.get(v) or CLIP_KIND_LABELS.get(v) or method_of(v).title,
        "patch": lambda v: f"frame {v[0]}, row {v[1]}, col {v[2]}",
        "target": TARGETS.get, "wmethod": lambda v: PROMPT_METHODS.get(v) or MAP_KINDS.get(v),
        "class": lambda v: class_option(v, class_names, predicted),
        "query": lambda v: token_option(v, grid, num_prefix_tokens, prefix_names),
        "head": lambda v: head_option(v - 1),  # a link counts heads from 1, the picker from 0
        "scale": lambda v: COLOUR_SCALES[v], "registers": lambda v: "yes", "ablate": ", ".join,
        "points": lambda v: "; ".join(f"({x:g}, {y:g}) {'on' if label else 'off'} the object" for x, y, label in v),
        "box": lambda v: ", ".join(f"{c:g}" for c in v), "token": sam_prompts.TOKENS.get,
        "attr": lambda v: options_text(v).replace(",", ", "),
        "dattn": lambda v: sam_prompts.attention_label(sam_prompts.attention_name(v)),
        "dhead": lambda v: "the mean of the heads" if v == 0 else f"head {v}", "smap": MAP_LABELS.get,
        "sat": lambda v: f"({v[0]:g}, {v[1]:g})",
        "more": lambda v: f"{len(v)} upload{'s' if len(v) > 1 else ''} after the page's image",
    }
    described = {}
    for name in PARSERS:
        value = values.get(name)
        if value is None or name in ("model", "sample", "upload"):
            continue
        if name == "layer" and values.get("map") in CAM_KINDS:  # no slider of its own: a CAM's layer is "end"
            continue
        if isinstance(value, bool):
            text = "yes" if value else "no"
        elif isinstance(value, float):
            text = f"{value:g}"
        else:
            text = words.get(name, str)(value)
        described[end_label(values.get("map")) if name == "end" else LABELS[name]] = text
    return described


def dropped(name: str, value: str, why: str) -> str:
    """The one line that says a link's parameter was not used."""
    shown = visible(value if len(value) <= 60 else value[:57] + "…")
    return f"The link's {name}={shown} was not used: {why}."


def model(text: str, names: Mapping[str, str], may_open: bool) -> Model:
    """The model ``text`` names: a catalogue entry's name (``names``: name -> path), else a Hub id, else a path on
    the server that exists, which only a visitor ``may_open`` (the access rule) gets. ShareError (one line, saying
    that the default model opened instead) otherwise: the rest of the link still applies to that model."""
    from vit.sources import hub

    if text in names:
        return Model("name", text, names[text])
    try:
        if hub.parse_name(text) is not None:
            return Model("hub", text)
    except hub.HubError as e:
        raise ShareError(f"{str(e).rstrip('.')}; {DEFAULT_OPENED}") from None
    if not may_open:  # whether such a path exists is not for this visitor to learn
        raise ShareError(f"it names no model of this server's catalogue nor a Hub id; {PATH_REFUSED}; "
                         f"{DEFAULT_OPENED}")
    if not text.strip() or not Path(text).exists():  # Path("") is the working folder
        raise ShareError(f"this server has no model of that name or path, and it is no Hub id; {DEFAULT_OPENED}")
    return Model("path", text, text)


def decode(params: Mapping[str, str], names: Mapping[str, str], may_open: bool) -> tuple[dict[str, object], list[str]]:
    """The view ``params`` (``st.query_params``) describe, as ``{parameter: value}``, and one line per parameter
    dropped (unknown, malformed, or refused by the access rule). ``names``: the catalogue's model names -> paths."""
    values: dict[str, object] = {}
    notes: list[str] = []
    for name, text in params.items():
        text = str(text)
        if name not in PARSERS:
            notes.append(dropped(name, text, "this explorer has no such setting"))
            continue
        try:
            if len(text) > MAX_VALUE_CHARS:
                raise ShareError(f"longer than {MAX_VALUE_CHARS:,} characters")
            if name == "model":
                values[name] = model(text, names, may_open)
            elif name == "sae" and not may_open:  # the Features section opens SAEs under the rule of "Open a path"
                raise ShareError("an SAE opens from the server's files, which this visitor may not read (with a "
                                 "token: enter it on the Train page)")
            else:
                values[name] = PARSERS[name](text)
        except ShareError as e:
            notes.append(dropped(name, text, str(e)))
    if "sample" in values and "upload" in values:
        notes.append(dropped("sample", str(values.pop("sample")), "the link's upload is shown instead"))
    return values, notes


def fit(values: Mapping[str, object], *, layers: int, heads: int, tokens: int, classes: int,
        features: int | None = None, clip: tuple[int, int, int] | None = None) -> tuple[dict[str, object], list[str]]:
    """``values`` without the settings this model cannot show (a layer past its last, a query past its tokens…),
    and one line for each dropped. ``clip``: a clip's (sampled frames, rows, columns), which bound its frame and
    query patch."""
    bounds = {"layer": (layers, f"this model has {layers} layers"), "end": (layers, f"this model has {layers} layers"),
              "sae_layer": (layers, f"this model has {layers} layers"),
              "head": (heads, f"this model has {heads} heads per layer"),
              "query": (tokens - 1, f"this input has {tokens} tokens, 0 to {tokens - 1}"),
              "class": (classes - 1, f"this model has {classes} classes" if classes else "this model has no classes")}
    if features is not None:
        bounds["feature"] = (features - 1, f"this SAE has {features:,} features")
    kept, notes = dict(values), []
    for name, (high, why) in bounds.items():
        if name in kept and kept[name] > high:
            notes.append(dropped(name, str(kept.pop(name)), why))
    if clip is not None:
        frames, rows, cols = clip
        if kept.get("frame", 0) > frames:
            notes.append(dropped("frame", str(kept.pop("frame")), f"this clip has {frames} sampled frames"))
        patch = kept.get("patch")
        if patch is not None and not (patch[0] <= frames and patch[1] <= rows and patch[2] <= cols):
            notes.append(dropped("patch", ".".join(map(str, kept.pop("patch"))),
                                 f"this clip has {frames} frames of {rows} x {cols} patches"))
    if "ablate" in kept:
        outside = [h for h in kept["ablate"] if not (int(h.split(".")[0]) <= layers and int(h.split(".")[1]) <= heads)]
        if outside:
            notes.append(dropped("ablate", ",".join(kept.pop("ablate")),
                                 f"this model has {layers} layers of {heads} heads"))
    return kept, notes


def encode(values: Mapping[str, object]) -> dict[str, str]:
    """The query parameters of a view (``decode``'s values; None and absent settings are left out), in the order
    of ``PARSERS``."""
    params = {}
    for name in PARSERS:
        value = values.get(name)
        if value is None or value is False and name == "registers":
            continue
        if isinstance(value, Model):
            params[name] = value.text
        elif isinstance(value, bool):
            params[name] = "1" if value else "0"
        elif isinstance(value, float):
            params[name] = f"{round(value, 2):g}"
        elif name == "attr":
            params[name] = options_text(value)
        elif name == "points":
            params[name] = sam_prompts.points_text(value)
        elif name in ("box", "cbox", "lm_kbox"):
            params[name] = sam_prompts.box_text(value)
        elif name == "sat":
            params[name] = sam_prompts.at_text(value)
        elif isinstance(value, tuple):
            params[name] = ".".join(map(str, value)) if name == "patch" else ",".join(value)
        else:
            params[name] = str(value)
    return params


def model_names(entries) -> dict[str, str]:
    """name -> path of the models a link may name (catalogue entries: ``.name``, ``.path``, ``.source``): the first
    of a name wins, and a model opened by path is named by its path, not its name."""
    names: dict[str, str] = {}
    for entry in entries:
        if entry.source != "file":
            names.setdefault(entry.name, str(entry.path))
    return names


def model_text(path: str, name: str, names: Mapping[str, str]) -> str:
    """What a link writes for the model at ``path`` called ``name``: its name where that names it, else its path."""
    return name if names.get(name) == path else path
