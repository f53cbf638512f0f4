"""A view you can send (issue 50): the URL's parameters set the widgets once per session, the URL follows the
widgets, and the view is offered as a link and as a self-contained HTML file. The codec is ``vit.app.share``."""

from functools import partial
from pathlib import Path

import numpy as np
import streamlit as st

from app_pages.explorer_sections import ask_in_words, ask_vlm, features, mechanism, sam_prompts, view_link, word_lens
from app_pages.explorer_sections.caches import upload_store
from app_pages.explorer_sections.checkpoint_picker import OPEN_HUB
from app_pages.explorer_sections.main_view import map_caption
from app_pages.explorer_sections.map_choice import MainMap
from app_pages.explorer_sections.map_settings import PAGE_FIRST, option_key
from app_pages.explorer_sections.state import Shown
from vit.app import catalog, share, vlm_words
from vit.app import explorer_page as explorer
from vit.app.export import PromptView, View, view_html
from vit.app.uploads import Upload
from vit.core.text import escape_markdown, file_name_part, visible
from vit.explain.methods import captum_maps
from vit.explain.methods.stage_maps import on_patch_grid
from vit.explain.views import attention_maps, image_analysis

READ_KEY, PENDING_KEY = "share_read", "share_pending"
# Every value the link held, as decoded, until a clip's page reads its own widgets' from them (the image page's
# widgets take theirs in ``read_link`` and ``apply_*``), and a clip's values that wait for the clip (frame, patch).
LINKED_KEY, CLIP_PENDING_KEY = "share_linked", "share_clip_pending"
UPLOAD_KEY, SHOWN_KEY = "share_upload", "share_shown_upload"  # the link's upload; the upload shown this run
# The lines on what the link could not use ({"model": the model shown with them, "lines": [...]}), where this run
# draws them, and the Hub id the link named (said when it did not open).
NOTES_KEY, NOTES_PLACE_KEY, LINKED_HUB_KEY = "share_notes", "share_notes_place", "share_linked_hub"
# Parameter -> the widget key it sets, for the settings whose range no model decides.
WIDGETS = {"size": "input_side", "aspect": "keep_aspect", "invert": "invert", "fusion": "fusion",
           "discard": "discard_ratio", "opacity": "opacity", "cmap": "colormap", "scale": "colour_scale",
           "upsample": "upsample", "grid": "show_grid", "labels": ask_in_words.LABELS_KEY,
           "space": word_lens.SPACE_KEY, "target": word_lens.TARGET_KEY, "sae_layer": features.LAYER_KEY}


def note(lines: list[str]) -> None:
    """Adds lines on what the link could not use to those ``show_notes`` draws (at once, once it has drawn them)."""
    if not lines:
        return
    st.session_state.setdefault(NOTES_KEY, {"model": None, "lines": []})["lines"].extend(lines)
    if st.session_state.get(NOTES_PLACE_KEY) is not None:
        _draw_notes(st.session_state[NOTES_PLACE_KEY])


def _draw_notes(place) -> None:
    lines = st.session_state[NOTES_KEY]["lines"]
    place.warning("  \n".join(escape_markdown(line) for line in lines), icon=":material/link_off:")


def show_notes(choice: str) -> None:
    """Right under the page's title, where a link's recipient looks first: one plain line per value of the link
    that was not used (the sidebar is below the fold on a phone and a glance away on a screen). Kept while the model
    the link opened (``choice``) is shown; later notes of the same run (a layer past this model's) join them."""
    hub = st.session_state.pop(LINKED_HUB_KEY, None)
    if hub is not None and not st.session_state.get("explorer_opened_hub"):
        note([share.dropped("model", hub, f"it did not open from this server's Hugging Face cache (the sidebar's "
                                           f"\"{OPEN_HUB}\" says why); {share.DEFAULT_OPENED}")])
    notes = st.session_state.get(NOTES_KEY)
    if notes is not None and notes["model"] is None:  # the notes of the link's first run
        notes["model"] = choice
    elif notes is not None and notes["model"] != choice:  # another model: the link's view is gone, and its notes
        del st.session_state[NOTES_KEY]
        notes = None
    if notes is None and not st.session_state.get(PENDING_KEY):
        return  # nothing to say, and no value of the link left to check against the model (which may add some)
    st.session_state[NOTES_PLACE_KEY] = st.empty()
    if notes is not None:
        _draw_notes(st.session_state[NOTES_PLACE_KEY])


def read_link(may_open: bool) -> None:
    """Once per session, before the widgets are drawn: the URL's parameters as their widgets' values; each bad one
    is dropped with one line (``show_notes``). The settings a model bounds wait in ``PENDING_KEY`` for
    ``apply_model_settings``."""
    st.session_state.pop(NOTES_PLACE_KEY, None)  # the last run's: ``show_notes`` makes this run's
    if st.session_state.get(READ_KEY):
        return
    st.session_state[READ_KEY] = True
    params = st.query_params.to_dict()
    if not params:
        return
    values, notes = share.decode(params, share.model_names(catalog.find_checkpoints()), may_open)
    note(notes)
    found = values.pop("model", None)
    st.session_state[LINKED_KEY] = dict(values)
    if found is not None and found.kind == "hub":
        st.session_state["explorer_open_hub"] = found.text  # its own field: the download rule applies there
        st.session_state[LINKED_HUB_KEY] = found.text  # ``show_notes`` says so when it did not open
    elif found is not None:
        st.session_state["explorer_checkpoint"] = found.path  # as another page opens one
    checked = {name: values[name] for name in ("size", "map") if name in values}  # against the model's options
    ask_vlm.take_link(values)
    ask_in_words.take_link(values)
    for name, key in WIDGETS.items():
        if name in values:
            st.session_state[key] = values.pop(name)
    kind = values.pop("map", None)
    if kind is not None:
        st.session_state["map_kind"] = (explorer.MORE_METHODS if attention_maps.is_method_map(kind)
                                        else vlm_words.CHOICE if kind in vlm_words.KINDS else kind)
        st.session_state["map_default"] = None  # a link's map is a choice, not the previous model's default
        if attention_maps.is_method_map(kind):
            st.session_state["method_kind"] = kind
        if kind in vlm_words.KINDS:
            st.session_state[word_lens.METHOD_KEY] = kind
    linked = values.pop("attr", ())  # an attribution's settings: its sidebar inputs, those the linked map takes
    takes = captum_maps.page_options(kind) if kind is not None else ()
    for name, value in linked:
        if name in takes:
            st.session_state[option_key(name)] = value
    for name in PAGE_FIRST:  # left out of a link: the default, not the page's first look
        if name in takes and name not in dict(linked):
            st.session_state[option_key(name)] = getattr(captum_maps.Options(), name)
    note([f"The link's {captum_maps.options_text(((name, value),))} was not used: {kind or 'the default map'} "
           "does not take it."
           for name, value in linked if name not in takes])
    if "mass" in values:
        st.session_state["mass_mask"], st.session_state["mask_share"] = True, values.pop("mass")
    st.session_state["hide_registers"] = values.pop("registers", None) == "hidden"
    if "sae" in values:
        st.session_state[features.TOGGLE_KEY], st.session_state[features.FOLDER_KEY] = True, values.pop("sae")
    if "upload" in values:
        st.session_state[UPLOAD_KEY] = values.pop("upload")
    sam_prompts.take_link(values)  # a SAM's prompt: checked against the image where the section shows it
    st.session_state[PENDING_KEY] = {**values, **checked}


def linked_upload(what: str = "image") -> Upload | None:
    """The upload the link names (an image, or a clip: ``what``), from the server's store, until closed, its file
    name said in the sidebar as plain text; says so and stops the page when it is no longer held."""
    digest = st.session_state.get(UPLOAD_KEY)
    if digest is None:
        return None
    if st.sidebar.button(f"Close the linked {what}", help="Back to the sample images." if what == "image" else
                         f"Back to uploading a {what}."):
        st.session_state.pop(UPLOAD_KEY)
        return None
    st.session_state[SHOWN_KEY] = digest
    found = upload_store().upload(digest)
    if found is None:
        st.info(f"The {what} this link shows was an upload the server no longer holds: upload it again (the same "
                "file) to see the view.")
        st.stop()
    st.sidebar.text(f"The linked upload: {visible(found.name) or 'an image without a name'}")
    return found


def keep_upload(data: bytes, name: str) -> None:
    """Keeps an upload and its file name in the server's store, for links; it replaces the link's upload."""
    st.session_state.pop(UPLOAD_KEY, None)
    st.session_state[SHOWN_KEY] = upload_store().put(data, name)


def apply_sample(model_key: str, samples: list[Path] | None) -> None:
    """The link's sample image, once the model's samples are known."""
    pending = st.session_state.get(PENDING_KEY) or {}
    name = pending.pop("sample", None)
    if name is None:
        return
    found = next((p for p in samples or [] if p.name == name), None)
    if found is None:
        note([share.dropped("sample", name, "this model has no sample image of that name")])
    else:
        st.session_state[f"sample-{model_key}"] = found


def apply_size(sides: list[int]) -> None:
    """The link's input size, where it is one of this model's ``sides`` (0: its own); else one line, and its own
    size (the picker has no such option)."""
    side = (st.session_state.get(PENDING_KEY) or {}).pop("size", None)
    if side is not None and side not in sides:
        offered = ", ".join(map(str, sides[1:]))
        note([share.dropped("size", str(side), f"this model's sizes are 0 (its own), {offered}")])
        st.session_state["input_side"] = 0


def apply_heads_off(model_key: str, layers: int, heads: int) -> None:
    """The link's heads switched off in every map, checked against the model before the page reads them (the whole
    page is drawn from the model with them off)."""
    pending = st.session_state.get(PENDING_KEY) or {}
    if "ablate" not in pending:
        return
    values, notes = share.fit({"ablate": pending.pop("ablate")}, layers=layers, heads=heads, tokens=0, classes=0)
    note(notes)
    if "ablate" in values:
        st.session_state[mechanism.ablate_key(model_key)] = list(values["ablate"])
        st.session_state[mechanism.TOGGLE_KEY] = st.session_state[mechanism.EVERYWHERE_KEY] = True


def apply_model_settings(model_key: str, shape: image_analysis.ViewShape, class_names: list[str],
                         has_words: bool = False) -> None:
    """The link's settings that the model bounds (layer, head, query, class, feature, a word map: a VLM's tower
    ``has_words``), checked against it."""
    pending = st.session_state.pop(PENDING_KEY, None)
    if not pending:
        return
    values, notes = share.fit(pending, layers=shape.num_layers, heads=shape.num_heads, tokens=shape.num_tokens,
                              classes=len(class_names))
    kinds = attention_maps.map_kinds(shape, bool(class_names)) + (list(vlm_words.KINDS) if has_words else [])
    if values.get("map", kinds[0]) not in kinds:  # the page would show its first map instead
        why = ("this model has no attention-pooling probe" if values["map"] in attention_maps.PROBE_MAP_KINDS
               and not shape.num_probe_heads else "this model has no classes" if not class_names
               and attention_maps.is_class_map(values["map"])
               else "this model is no vision-language model's tower with its projector"
               if values["map"] in vlm_words.KINDS else "this model cannot draw it")
        notes.append(share.dropped("map", values["map"], f"{why}; its maps are {', '.join(kinds)}"))
        st.session_state["map_kind"] = None  # the model's default
    if "word" in values:  # one of the words the link types (its labels), as the sidebar's picker offers them
        if has_words and values["word"] in word_lens.typed_words():
            st.session_state[word_lens.WORD_KEY] = values["word"]
        else:
            notes.append(share.dropped("word", values["word"], "it is not one of the link's words (labels)"
                                       if has_words else "this model is no vision-language model's tower"))
    note(notes)
    kind = {explorer.MORE_METHODS: st.session_state.get("method_kind"),
            vlm_words.CHOICE: st.session_state.get(word_lens.METHOD_KEY)}.get(st.session_state.get("map_kind"),
                                                                           st.session_state.get("map_kind"))
    for name, key in {"layer": "layer", "end": "end", "head": "head", "class": "class"}.items():
        if name in values:
            st.session_state[f"{key}-{model_key}"] = values[name] - (1 if name == "head" else 0)
    if "query" in values:
        st.session_state[explorer.query_key(kind, model_key)] = values["query"]
    if "feature" in values:
        st.session_state[features.LINKED_KEY] = values["feature"]  # checked against the SAE once it is open


def view_values(model: str, view: Shown, image_name: str, sample: Path | None, invert: bool,
                asks_vlm: bool = False) -> dict[str, object]:
    """What decides the view now, as ``vit.app.share``'s values; a question to the VLM only where the page ``asks_vlm``
    (another model's question and clip, still in the session, are not this view's)."""
    s = view.settings
    controls = _controls(view)
    values: dict[str, object] = {"model": model}
    if st.session_state.get(SHOWN_KEY) is not None:
        values["upload"] = st.session_state[SHOWN_KEY]
    elif sample is not None:
        values["sample"] = sample.name
    values.update(size=view.size.side or 0, aspect=view.size.keep_aspect, invert=invert or None, map=s.kind,
                  registers="hidden" if st.session_state.get("hide_registers") else None,
                  opacity=view.opacity, cmap=view.colormap, scale=view.scale, upsample=view.mode, grid=view.show_grid,
                  mass=view.mask_share)
    if "class" in controls and s.class_index is not None:
        values["class"] = s.class_index
    if "query" in controls and not s.readout:  # the pooled readout is the default: no token to name
        values["query"] = s.query
    values["layer"] = view.layer
    if "head" in controls and s.head is not None:
        values["head"] = s.head + 1
    if "fusion" in controls and (s.kind not in ("attention", "probe") or s.head is None):  # as the sidebar reads it
        values["fusion"] = s.fusion
    if "end_layer" in controls:
        values["end"] = s.end_layer + 1
    if "discard_ratio" in controls:
        values["discard"] = s.discard_ratio
    if s.options:  # an attribution's settings that differ from the defaults
        values["attr"] = s.options
    values.update(ask_in_words.shared_values())  # the labels asked and their map's picks
    if s.kind in vlm_words.KINDS:
        values.update(space=bool(st.session_state.get(word_lens.SPACE_KEY)) or None, word=view.word,
                      target=view.target if "target" in controls else None)
    heads = mechanism.heads_off_everywhere(view.model_key)
    if heads:
        values["ablate"] = tuple(heads[0])
    values.update(features.link_values())
    if asks_vlm:
        values.update(ask_vlm.link_values())
    values.update(sam_prompts.link_values(view))
    return {k: v for k, v in values.items() if v is not None}


def _controls(view: Shown) -> tuple[str, ...]:
    """The sidebar controls the view's map reads."""
    s = view.settings
    if s.kind in vlm_words.KINDS:
        return vlm_words.controls(s.kind, view.target)
    return attention_maps.method_of(s.kind).reads


def share_buttons(values: dict[str, object], view: Shown, main: MainMap, image_name: str, model_name: str) -> None:
    """"Copy link to this view" and "Export this view (HTML)"."""
    link, export = st.columns(2)
    view_link.link_popover(link, values)
    analysis, s = view.analysis, view.settings
    shown = dict(values)  # and the pickers' first options, which a link leaves out but the sidebar shows
    if "head" in _controls(view) and s.head is None:
        shown["head"] = 0  # every head fused
    if "class" in _controls(view) and s.class_index is None and view.class_names:
        shown["class"] = -1  # the predicted class
    settings = {"Model": model_name, "Image": image_name,
                **share.describe(shown, size_label=view.checkpoint.preprocessing.size_label, grid=analysis.grid,
                                 num_prefix_tokens=analysis.num_prefix_tokens, prefix_names=analysis.prefix_names,
                                 class_names=view.class_names, predicted=analysis.prediction.class_index,
                                 own_size=view.checkpoint.preprocessing.own_size_rule)}
    export.download_button("Export this view (HTML)", on_click="ignore", mime="text/html",
                           file_name=f"{file_name_part(Path(image_name).stem)}-view.html",
                           data=partial(_export, view, main, image_name, model_name, settings, values),
                           help="One self-contained .html file: the image, the map with its colour bar and caption, "
                                "the heads grid (hover a patch for its value), the prediction and these settings. "
                                "Opens offline.")


def _export(view: Shown, main: MainMap, image_name: str, model_name: str, settings: dict,
            values: dict | None = None) -> bytes:
    analysis, s = view.analysis, view.settings
    prompt = sam_prompts.export_part(view, values or {})
    heads = attention_maps.head_maps(analysis, s.query, layer=view.layer - 1)
    if analysis.staged:  # a Swin stage's heads on its own grid, drawn over the image's patches (as the Heads tab)
        heads = on_patch_grid(heads, analysis.grid)
    page = view_html(View(
        title=f"{image_name} — {model_name}", seen=view.shown, map2d=np.asarray(main.map2d), colormap=main.colormap,
        vmin=main.vmin, vmax=main.vmax, opacity=view.opacity, mode=view.mode,
        caption=map_caption(view, main) if main.error is None else main.error,
        query=s.query if view.outline is not None else 0, num_prefix_tokens=analysis.num_prefix_tokens,
        show_grid=view.show_grid, mask=main.mask, grid=main.grid,  # a pixel method's map at its pixels, as the page
        heads=heads, heads_caption=f"Layer {view.layer}: each head's attention of the query.",
        heads_layer=view.layer - 1, selected_head=s.head if s.kind == "attention" else None, scale=view.scale,
        mask_share=view.mask_share, prediction=analysis.prediction if view.class_names else None, settings=settings,
        prompts=None if prompt is None else PromptView(**prompt)))
    return page.encode("utf-8")


# -- a clip's view (a video model's page, ``clip_view``) --------------------------------------------------------------


def apply_clip_link(model_key: str, kinds: tuple[str, ...], layers: int, heads: int) -> None:
    """Before a clip page's sidebar is drawn: the link's map, layer, head, opacity and heads off as its widgets'
    values, checked against the model; its frame, query patch and class wait for the clip (``apply_clip_bounds``).
    Nothing once the image page has read the link (it pops ``PENDING_KEY``)."""
    values = st.session_state.pop(LINKED_KEY, None)
    if st.session_state.pop(PENDING_KEY, None) is None or not values:
        return
    values, notes = share.fit(values, layers=layers, heads=heads, tokens=2**31, classes=2**31)
    kind = values.get("map")
    if kind is not None and kind not in kinds:
        notes.append(share.dropped("map", kind, f"this video model's maps are {', '.join(kinds)}"))
        kind = None
    if kind is not None:
        st.session_state["clip_map"] = kind
    if "layer" in values:
        shown = kind or st.session_state.get("clip_map") or kinds[0]
        st.session_state[f"clip_{'legrad_from' if shown == 'legrad' else 'layer'}-{model_key}"] = values["layer"]
    if "head" in values:
        st.session_state[f"clip_head-{model_key}"] = values["head"] - 1  # a link counts heads from 1
    if "opacity" in values:
        st.session_state["clip_opacity"] = values["opacity"]
    if "ablate" in values:
        st.session_state[f"clip_heads_off-{model_key}"] = list(values["ablate"])
    if "upload" in values:
        st.session_state[UPLOAD_KEY] = values["upload"]
    ignored = [name for name in values if name not in ("map", "layer", "head", "opacity", "ablate", "upload",
                                                        "frame", "patch", "class")]
    notes += [share.dropped(name, str(values[name]), "a clip's view has no such setting") for name in ignored]
    note(notes)
    st.session_state[CLIP_PENDING_KEY] = {k: values[k] for k in ("frame", "patch", "class") if k in values}


def apply_clip_bounds(model_key: str, frames: int, grid: tuple[int, int], classes: int) -> None:
    """Once the clip is read: the link's shown frame, query patch and class, checked against it."""
    pending = st.session_state.pop(CLIP_PENDING_KEY, None)
    if not pending:
        return
    values, notes = share.fit(pending, layers=0, heads=0, tokens=0, classes=classes, clip=(frames, *grid))
    note(notes)
    if "frame" in values:
        st.session_state["clip_frame"] = values["frame"]
    if "patch" in values:
        for axis, value in zip(("frame", "row", "col"), values["patch"], strict=True):
            st.session_state[f"clip_query_{axis}-{model_key}"] = value
    if "class" in values:
        st.session_state[f"clip_class-{model_key}"] = values["class"]
