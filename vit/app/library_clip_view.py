"""What the explorer's clip view says and asks for a video model opened by the library road (PE video: a timm trunk per
frame, then a temporal encoder over the CLS and one token a frame; ``vit.sources.library_road.pe_video``): its maps
(``vit.explain.views.video.LIBRARY_CLIP_KINDS``) in words, the layers and heads each reads, the temporal tokens' names
and the caption of the map drawn. The maps themselves are ``vit.explain``'s; nothing here computes one."""

from __future__ import annotations

from vit.explain.views.video import LIBRARY_CLIP_KINDS

KIND_LABELS = {"attention": "Attention within each frame (the frames' trunk)",
               "rollout": "Rollout within each frame (the frames' trunk, Abnar & Zuidema 2020)",
               "temporal": "Temporal attention (the CLS and one token a frame)",
               "probe": "Pooling probe (what each frame's vector reads)"}
PATCH_KINDS = ("attention", "rollout")  # the maps whose query is each frame's CLS or one frame's patch


def map_kinds(model) -> tuple[str, ...]:
    """The maps the page offers for ``model`` (``PeVideoLibraryModel``), as ``vit.explain`` draws them: the probe only
    where its trunk has an attention-pooling head."""
    return tuple(kind for kind in LIBRARY_CLIP_KINDS if kind != "probe" or model.pool is not None)


def layer_count(model, kind: str) -> int:
    """The layers map ``kind`` picks among: the temporal encoder's, the trunk's, none for the probe."""
    return {"temporal": model.num_layers, "probe": 0}.get(kind, model.num_frame_layers)


def head_count(model, kind: str) -> int:
    """The heads map ``kind`` picks among: the temporal encoder's, the pooling head's, the trunk's; none for rollout
    (it averages them)."""
    if kind == "temporal":
        return model.num_heads
    if kind == "probe":
        return model.pool.num_heads
    return 0 if kind == "rollout" else model.frames.num_heads


def temporal_token(token: int) -> str:
    """A temporal layer's token in words: 0 'the CLS', ``1 + f`` 'frame f + 1' (sampled frames counted from 1)."""
    return "the CLS" if token == 0 else f"frame {token}"


def describe(kind: str, layer: int | None, layers: int, head: int | None,
             query: int | tuple[int, int, int] | None) -> str:
    """The map's caption: its kind, ``layer`` (from 1) of ``layers``, ``head`` (from 0; None the heads' mean) and
    ``query`` (a patch ``(frame, row, col)`` from 0, a temporal token, None each frame's CLS)."""
    what = KIND_LABELS[kind]
    if kind == "rollout":
        what += f", layers 1–{layer}"
    elif layer is not None:
        what += f", layer {layer} of {layers}"
    if kind != "rollout":
        what += ", the mean over its heads" if head is None else f", head {head + 1}"
    if kind == "temporal":
        what += f", the row of {temporal_token(query or 0)} over the frames"
    elif isinstance(query, tuple):
        what += f", query frame {query[0] + 1}, row {query[1] + 1}, col {query[2] + 1} (its own frame's patches)"
    elif kind in PATCH_KINDS:
        what += ", query each frame's CLS (over its own patches)"
    return what


def explain_arguments(kind: str, layer: int | None, head: int | None,
                      query: int | tuple[int, int, int] | None) -> dict:
    """``vit.explain``'s keyword arguments for the page's choice (``layer`` from 1, ``head`` and ``query`` from 0):
    each left out where the map does not read it, so the API's own defaults and checks apply."""
    asked = {"layer": None if layer is None or kind == "probe" else layer - 1,
             "head": None if kind == "rollout" else head,
             "query": None if kind == "probe" else query}
    return {k: v for k, v in asked.items() if v is not None}
