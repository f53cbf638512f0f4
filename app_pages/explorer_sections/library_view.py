"""The explorer for a model opened by the library road (issue 91): a transformers, timm or open_clip model no port
reads, run as its library builds it with its attention recorded (``Checkpoint.road == "library"``). The page's other
sections read our own ViT; this one is smaller: an image (an upload or a sample), a map among those the road draws
(``library_maps.method_names``: read from its list, wings included), the controls that map reads
(``LibraryMethod.reads``: layer, head, query, class), the map over exactly the pixels the model saw, each head's map
of an attention map, a classifier's top-5 prediction and the map's caption. Every map is ``vit.explain``'s, so what
the page shows is what the notebook API gives; a refusal (the cost model's, a map that does not apply) is one line."""

from functools import partial
from pathlib import Path

import streamlit as st
from PIL import Image

import vit
from app_pages.explorer_sections import (
    ask_in_words,
    library_words,
    map_settings,
    sam_prompts,
    share_view,
    view_link,
)
from app_pages.explorer_sections.concept_view import sidebar_image
from vit.app import catalog, drawing, share
from vit.app import library_view as view
from vit.app.export import PromptView
from vit.checkpoint import Checkpoint
from vit.core.images import ImageError
from vit.core.inference import input_shape
from vit.core.text import escape_markdown, file_name_part, visible
from vit.explain.methods.rise import FIRST_LOOK_MASKS
from vit.explain.views.library import road_maps as library_maps
from vit.explain.views.overlay import to_png_bytes

METHOD_KEY = "library_method"
PICKER_KEY = "library_map_picker"
PREDICTED = -1  # the class picker's "the predicted class"
MEAN = -1  # the head picker's "the heads' mean"
# kept by the page while not drawn (a rejected upload stops it before the map's controls); opacity: the page's
KEPT = (METHOD_KEY, "library_layer-", "library_head-", "library_query-", "library_class-")
HINT = "Upload an image in the sidebar to see what the model attends to."


def _one_line(error: Exception) -> str:
    return escape_markdown(visible(str(error).splitlines()[0] if str(error) else repr(error)))


def _pick_query(key: str, num_prefix_tokens: int) -> None:
    """A click on the map made that patch's token the query."""
    token = drawing.token_from_selection(st.session_state[PICKER_KEY].selection, num_prefix_tokens)
    if token is not None:
        st.session_state[key] = token


def _take_link(checkpoint: Checkpoint, model_key: str, names: list[str]) -> None:
    """A link's map, class, layer, head (from 1) and query as the sidebar's values, checked against the model (one
    line for each dropped); its opacity is the page's own widget's (``share_view.read_link`` set it)."""
    pending = st.session_state.pop(share_view.PENDING_KEY, None)
    if not pending:
        return
    model = checkpoint.model
    values, notes = share.fit(pending, layers=model.num_layers, heads=model.num_heads, tokens=2**31,
                              classes=len(checkpoint.class_names))
    if "map" in values and values["map"] not in names:
        notes.append(share.dropped("map", values.pop("map"), f"this model's maps are {', '.join(names)}"))
    if "map" in values:
        st.session_state[METHOD_KEY] = values["map"]
    for name, key, value in (("class", "library_class-", values.get("class")),
                             ("layer", "library_layer-", values.get("layer")),
                             ("head", "library_head-", None if "head" not in values else values["head"] - 1),
                             ("query", "library_query-", values.get("query"))):
        if name in values:
            st.session_state[key + model_key] = value
    share_view.note(notes)
    # the query waits for the image's tokens (``_settings``)
    st.session_state[share_view.PENDING_KEY] = {k: v for k, v in values.items() if k == "query"}


def _settings(checkpoint: Checkpoint, model_key: str, image: Image.Image) -> tuple[str, dict]:
    """The sidebar's map and the controls it reads: (its name, ``vit.explain``'s keyword arguments); the query's
    tokens are ``image``'s (its own grid where each image is sized by itself: DPT's keep-aspect resize)."""
    model = checkpoint.model
    layout, classifier = model.layout, bool(checkpoint.class_names)
    try:
        shape = input_shape(image, checkpoint.preprocessing, layout.patch_hw)
    except (ValueError, ImageError) as e:  # a strip too long at its own aspect
        st.error(_one_line(e))
        st.stop()
    grid = (shape[0] // layout.patch_hw[0], shape[1] // layout.patch_hw[1])
    st.sidebar.header("Map")
    names = library_maps.method_names(classifier, model)
    _take_link(checkpoint, model_key, names)
    if st.session_state.get(METHOD_KEY) not in names:
        st.session_state.pop(METHOD_KEY, None)
    method = st.sidebar.selectbox("Map", names, key=METHOD_KEY, format_func=view.method_label,
                                  help="The maps drawn for a model opened as its library builds it.")
    reads = library_maps.methods()[method].reads
    asked: dict = {}
    if "target" in reads and classifier:
        target = st.sidebar.selectbox("Class", [PREDICTED, *range(len(checkpoint.class_names))],
                                      key=f"library_class-{model_key}",
                                      format_func=lambda c: "the predicted class" if c == PREDICTED
                                      else f"{c} · {checkpoint.class_names[c]}")
        asked["target"] = None if target == PREDICTED else target
    if "layer" in reads:
        L = model.num_layers
        st.session_state.setdefault(f"library_layer-{model_key}", L)  # the last layer first, as vit.explain's
        layer = st.sidebar.slider("Layer", 1, L, key=f"library_layer-{model_key}") if L > 1 else 1
        asked["layer"] = layer - 1
    if "head" in reads:
        head = st.sidebar.selectbox("Head", [MEAN, *range(model.num_heads)], key=f"library_head-{model_key}",
                                    format_func=lambda h: "the heads' mean" if h == MEAN else f"head {h + 1}")
        asked["head"] = None if head == MEAN else head
    linked = (st.session_state.pop(share_view.PENDING_KEY, None) or {}).get("query")
    if "query" in reads:
        tokens = view.query_options(grid, layout.num_prefix_tokens)
        if linked is not None and linked not in tokens:
            share_view.note([share.dropped("query", str(linked), f"this input has {len(tokens)} tokens, 0 to "
                                                                  f"{len(tokens) - 1}")])
            st.session_state.pop(f"library_query-{model_key}", None)
        asked["query"] = st.sidebar.selectbox(  # without CLS, vit.explain's default first (None): what it reads
            "Query token", tokens if layout.num_prefix_tokens else [None, *tokens],
            key=f"library_query-{model_key}", placeholder=view.DEFAULT_QUERY,  # what Streamlit shows for None
            format_func=lambda t: view.DEFAULT_QUERY if t is None else
            drawing.token_option(t, grid, layout.num_prefix_tokens),
            help="The token whose map is shown; a click on a patch of the map picks it.")
    if method == "rise":  # a first look, as the port's page opens RISE: the authors' 6,000 masks one call away
        asked["n_masks"] = FIRST_LOOK_MASKS
        st.sidebar.caption(f"RISE: a first look of {FIRST_LOOK_MASKS:,} masks (vit.explain's default is the authors' "
                           "6,000).")
    others = [name for name in reads if name not in ("target", "layer", "head", "query", *asked)]
    if others:
        st.sidebar.caption(escape_markdown(f"{', '.join(others)}: the method's defaults, as vit.explain's."))
    return method, asked


def _export(explained, opacity: float, model_name: str, image_name: str,
            prompted: sam_prompts.PromptTarget | None = None, values: dict | None = None) -> bytes:
    """The view's offline page; with SAM 3 tracker's prompt (``prompted``, the link's ``values``) below it."""
    prompt = None if prompted is None else sam_prompts.export_part(prompted, values or {})
    return view.view_html(explained, opacity, model_name, image_name,
                          prompts=None if prompt is None else PromptView(**prompt)).encode("utf-8")


@st.cache_resource(max_entries=16, show_spinner="Computing the map…")
def _explain(fingerprint: tuple, digest: str, method: str, asked: tuple, _checkpoint: Checkpoint,
             _image: Image.Image):
    """``vit.explain``'s map, once per (model, image, settings)."""
    return vit.explain(_checkpoint, _image, method, **dict(asked))


def link_values(model_text: str, name: str, is_sample: bool, method: str, asked: dict,
                opacity: float) -> dict[str, object]:
    """The view as ``vit.app.share``'s values, as the main page writes them: the layer and head from 1, the query
    and class by their index (left out where the sidebar shows its default: the predicted class, the heads' mean)."""
    values = {"model": model_text,  # the image: a sample by name, an upload by the server's store's SHA-256
              **({"sample": name} if is_sample else {"upload": st.session_state.get(share_view.SHOWN_KEY)}),
              "map": method, "class": asked.get("target"),
              "layer": None if asked.get("layer") is None else asked["layer"] + 1,
              "head": None if asked.get("head") is None else asked["head"] + 1, "query": asked.get("query"),
              "opacity": opacity}
    return {k: v for k, v in values.items() if v is not None}


def library_view(checkpoint: Checkpoint, fingerprint: tuple, entry: catalog.CatalogEntry, entries: dict,
                 model_key: str, model_text: str) -> None:
    """The page for ``checkpoint`` (``road == "library"``), below the sidebar's checkpoint; ``entries``: the
    checkpoints the page lists (their samples); ``model_text``: what a link names the model by."""
    image, name, digest, is_sample = sidebar_image(entry, entries, model_key, hint=HINT, model="the model")
    method, asked = _settings(checkpoint, model_key, image)
    opacity = map_settings.opacity_slider(st.sidebar)  # the main page's widget: a link's opacity sets it
    values = link_values(model_text, name, is_sample, method, asked, opacity)
    # SAM 3 tracker: its points and box through vit.segment, as a whole SAM 2's on the main page (issue 116)
    prompted = sam_prompts.PromptTarget(checkpoint, fingerprint, model_key, image, digest, opacity) \
        if sam_prompts.applies(checkpoint) else None
    if prompted is not None:
        values.update({k: v for k, v in sam_prompts.link_values(prompted).items() if v is not None})
    if library_words.applies(checkpoint):
        values.update(ask_in_words.shared_values())  # the labels asked and their map's label and method
    view_link.follow(values)  # before the map: a reload while it computes (or after a refusal) opens this view
    try:
        explained = _explain(fingerprint, digest, method, tuple(sorted(asked.items())), checkpoint, image)
    except (ValueError, ImageError) as e:  # the cost model's refusal, a map that does not apply here
        st.error(_one_line(e))
        st.stop()
    if explained.prediction is not None:
        st.subheader("Prediction")
        st.plotly_chart(drawing.predictions_figure(explained.prediction), config={"displayModeBar": False})
    st.subheader(view.method_label(method))
    picker = partial(_pick_query, f"library_query-{model_key}", explained.num_prefix_tokens) \
        if "query" in asked else "ignore"
    st.plotly_chart(view.map_picker_figure(explained, opacity), key=PICKER_KEY, on_select=picker,
                    selection_mode="points", config={"displayModeBar": False})
    colormap, low, high, key = view.colour_key(explained)
    st.html(drawing.colorbar_html(low, high, colormap))  # as the main page draws it
    st.caption(f"{escape_markdown(visible(explained.description))} Drawn over the pixels the model saw of "
               f"{escape_markdown(visible(name))}, on its own {explained.grid[0]}×{explained.grid[1]} patch grid. "
               + escape_markdown(key))
    stem = "-".join(part for part in (file_name_part(Path(name).stem) or "image", method,
                                      *(f"{k}{v}" for k, v in sorted(asked.items()) if v is not None)))
    as_link, as_png, as_html = st.columns(3)
    view_link.link_popover(as_link, values)
    as_png.download_button("Overlay (PNG)", data=partial(to_png_bytes, explained.overlay(alpha=opacity)),
                           file_name=f"{stem}-overlay.png", mime="image/png", on_click="ignore",
                           key="library_download_png")
    as_html.download_button("This view, offline (HTML)",
                            data=partial(_export, explained, opacity, entry.name, name, prompted, values),
                            file_name=f"{stem}.html", mime="text/html", on_click="ignore",
                            key="library_download_html",
                            help="One self-contained file: the image, the map with its colour bar and caption, the "
                                 "heads, the prediction and the settings (the model and the image first); it opens "
                                 "without this server.")
    sheet = view.heads_sheet(explained, opacity)
    if sheet is not None:
        st.subheader("Heads")
        st.image(sheet)
        st.caption(view.heads_caption(explained))  # the layer and token's place: no text of the model's
    if prompted is not None:
        sam_prompts.prompt_section(prompted)
    if library_words.applies(checkpoint):  # a CLIP or SigLIP tower: its labels' scores and maps
        library_words.library_words(checkpoint, fingerprint, image, digest, opacity)
