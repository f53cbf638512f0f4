"""The sidebar's attention map and overlay settings (only the controls the chosen map uses), and the main map."""

from dataclasses import replace

import numpy as np
import streamlit as st
from PIL import Image

from app_pages.explorer_sections.caches import class_relevance, method_map, rollout_map
from app_pages.explorer_sections.map_choice import MainMap, MapChoice
from vit.app import drawing, share, vlm_words
from vit.app import explorer_page as explorer
from vit.checkpoint import Checkpoint
from vit.core.inference import InputSize
from vit.core.text import escape_markdown
from vit.explain.methods import captum_maps
from vit.explain.methods.attention import HEAD_FUSIONS
from vit.explain.methods.stage_maps import on_patch_grid
from vit.explain.views import attention_maps, image_analysis, method_maps
from vit.explain.views.overlay import UPSAMPLE_MODES, is_signed, map_colours

# The sidebar's map settings, kept by the page while their widgets are not drawn (``state.keep_settings``).
# The per-model keys end with the model's key: ``class-`` also covers ``class-query-``.
KEPT = ("map_kind", "method_kind", "hide_registers", "query-", "class-", "word-query-", "layer-", "head-", "fusion",
        "end-", "start-", "discard_ratio", "opacity", "colormap", "colour_scale", "upsample", "show_grid", "mass_mask",
        "mask_share")


LABELS_BY_CHOICE = {explorer.MORE_METHODS: explorer.MORE_METHODS_LABEL, vlm_words.CHOICE: vlm_words.CHOICE_LABEL}


READOUT = -1  # the query picker's entry for what a mean-pooling classifier reads (MapSettings.readout)
READOUT_OPTION = "the mean of the patch tokens (what the classifier reads)"


def choose_map(shape: image_analysis.ViewShape, class_names: list[str], model_key: str, model) -> MapChoice:
    """The sidebar's "Attention map" and "Overlay" controls, drawn from the shape of the analysis before the model
    runs (the browser lays them out meanwhile); the class picker, whose first option names the prediction, is
    drawn in their place by ``choose_class`` after it."""
    grid, prefix = shape.grid, shape.num_prefix_tokens
    L, T = shape.num_layers, shape.num_tokens
    names = shape.prefix_names  # CLS, DIST, REG 1…R
    with st.sidebar:
        st.header("Attention map")
        # No class map without classes; the probe's first for SigLIP.
        kinds = attention_maps.map_kinds(shape, bool(class_names))
        # The newer methods share one entry (a second picker), which keeps the sidebar short.
        more = attention_maps.method_map_kinds()  # the registry's methods of a pass of their own, plugins' included
        choices = [k for k in kinds if k not in more]
        choices += [explorer.MORE_METHODS] if set(kinds) & set(more) else []
        choices += [vlm_words.CHOICE] if vlm_words.has_words(model) else []  # a VLM's tower: words typed below
        methods = [k for k in more if k in kinds  # a Swin's: AttnLRP
                   and (class_names or not attention_maps.is_class_map(k))]
        if st.session_state.get("method_kind") not in (None, *methods):  # another model's (a class map, a feature
            # model now): this model's default map, not the list's first method (a max-flow, slow or refused)
            dropped = attention_maps.method_of(st.session_state.pop("method_kind")).title.split(" (")[0]
            if st.session_state.get("map_kind") == explorer.MORE_METHODS:
                st.session_state["map_kind"] = None
                st.caption(f"{dropped} does not apply to this model: its default map is shown.")
        st.session_state["map_kind"] = explorer.map_choice(  # a model change resets what no longer fits
            st.session_state.get("map_kind"), st.session_state.get("map_default"), choices,
            st.session_state.get("map_model") != model_key)
        st.session_state["map_model"], st.session_state["map_default"] = model_key, choices[0]
        kind = st.radio(share.LABELS["map"], choices, key="map_kind",
                        format_func=lambda k: attention_maps.MAP_KINDS.get(k) or LABELS_BY_CHOICE[k])
        if kind == explorer.MORE_METHODS:
            kind = st.selectbox("Method", methods, format_func=lambda k: attention_maps.method_of(k).title,
                                key="method_kind",
                                help="LeGrad, LRP, AttnLRP and the CAMs (but EigenCAM) explain a class; attention "
                                     "flow, like rollout, follows attention and the residual, as a max-flow (slow).")
        word, target = None, "all"
        if kind == vlm_words.CHOICE:
            kind, word, target = word_controls()
            controls = vlm_words.controls(kind, target)
        else:
            controls = attention_maps.method_of(kind).reads
        if shape.staged:  # Swin's rollout keeps every attention; its class map starts from the average pooling
            controls = tuple(c for c in controls if c != "discard_ratio" and (kind != "class" or c != "query"))
        hide_registers = False
        if prefix > 1:
            hide_registers = st.checkbox(f"Hide the {prefix - 1} register/extra prefix token(s)", key="hide_registers",
                                         help="Leaves them out of the query list and the attention matrix.")
        tokens = explorer.visible_tokens(T, prefix, hide_registers)
        # The class-specific map reads from CLS unless a query is picked for it here: a patch clicked for
        # another map would make it a self-blob.
        # Without CLS: what the classifier reads (READOUT, the mean of the patches) for rollout and the class map
        # of a mean-pooling model, else the centre patch; token 0 would be a register or the corner patch
        default, readout = attention_maps.default_query(
            shape, kind, getattr(getattr(model, "config", None), "pooling", "") == "avg")
        query_key = explorer.query_key(kind, model_key, readout)
        # A word's target is an image token, which the projector makes of patches alone: no prefix token is offered.
        # It opens on the centre patch, not on the patch where the word's lens is highest: the sidebar is drawn
        # before the model runs (the lens is not known yet), and a default that followed the word would move the
        # target under a user who only changed the word.
        word_target = kind in vlm_words.KINDS and "query" in controls
        offered = [t for t in tokens if t >= prefix] if word_target else tokens
        default = explorer.centre_token(grid, prefix) if word_target else READOUT if readout else default
        offered = [READOUT, *offered] if readout else offered
        st.session_state.setdefault(query_key, default)
        grid_key = f"{query_key}-grid"  # the grid the query was picked on: keep its place when the grid changes
        if st.session_state.get(grid_key) not in (None, tuple(grid)):
            st.session_state[query_key] = explorer.remap_query(st.session_state[query_key], st.session_state[grid_key],
                                                               tuple(grid), prefix)
        st.session_state[grid_key] = tuple(grid)
        if st.session_state[query_key] not in offered:
            st.session_state[query_key] = default
        query, layer, head, fusion, discard_ratio, end_layer, class_index = 0, L, None, "mean", 0.0, L, None
        class_slot = st.empty() if "class" in controls else None
        if "query" in controls:
            for_class = " (for the class map)" if attention_maps.is_class_map(kind) else ""
            query = st.selectbox(share.LABELS["query"] + for_class, offered,
                                 key=query_key, format_func=lambda t: READOUT_OPTION if t == READOUT else
                                 drawing.token_option(t, grid, prefix, names),
                                 help="The image token whose lens score is explained: a patch, numbered row by row "
                                      "(the centre one at first). Clicking a patch on the image selects it too."
                                 if word_target else
                                 "Whose attention to show: CLS (token 0), another prefix token (DIST, REG) or a "
                                 "patch, numbered row by row. Clicking a patch on the image selects it too.")
        if "layer" in controls:
            st.session_state.setdefault(f"layer-{model_key}", L)
            layer = st.select_slider(share.LABELS["layer"], range(1, L + 1), key=f"layer-{model_key}",
                                     help="1 is the first block. Also for the heads grid and the matrix.")
        if "head" in controls:  # the probe's heads are its own (PE: 8), so its choice is kept apart
            probe = kind == "probe"
            heads = shape.num_probe_heads if probe else shape.heads_in(layer - 1)  # a Swin stage's own
            head_key = f"head-{model_key}" + ("-probe" if probe else "")
            if st.session_state.get(head_key, -1) >= heads:  # a head of another Swin stage: fused again
                st.session_state[head_key] = -1
            head = st.selectbox(share.LABELS["head"], [-1, *range(heads)], key=head_key,
                                format_func=drawing.head_option)
            head = None if head == -1 else head
        if "fusion" in controls and (kind not in ("attention", "probe") or head is None):
            fusion = st.radio(share.LABELS["fusion"], HEAD_FUSIONS, horizontal=True, key="fusion",
                              help="How heads combine: for 'all heads, fused' and in the rollout.")
        if "end_layer" in controls:
            st.session_state.setdefault(f"end-{model_key}", L)
            end_layer = st.select_slider(share.end_label(kind), range(1, L + 1), key=f"end-{model_key}",
                                         help="The block whose first norm's tokens the CAM reads (pytorch-grad-cam's "
                                              "ViT tutorial: the last)." if kind in attention_maps.CAM_KINDS else
                                         "Roll out from layer 1 through this layer.")
        start_layer = -2  # LeGrad's authors' default: the last two layers
        if "start_layer" in controls:
            from vit.explain.methods.relevance import legrad_layers

            starts = [i + 1 for i in legrad_layers(model)]  # 1-based, as the sidebar shows layers
            start_key = f"start-{model_key}"
            if st.session_state.get(start_key) not in starts:  # a new model: the authors' default, else its first
                st.session_state[start_key] = L - 1 if L - 1 in starts else starts[0]
            start_layer = st.select_slider("From layer", starts, key=start_key,
                                           help="LeGrad sums the maps of every layer from this one to the last "
                                                "(its authors' layer_index; they use the last two).") - 1 - L
        options = attribution_options(kind) if kind in captum_maps.ATTRIBUTION_METHODS else ()
        if "discard_ratio" in controls:
            st.session_state.setdefault("discard_ratio", 0.0)
            discard_ratio = st.slider(share.LABELS["discard"], 0.0, 0.95, step=0.05, key="discard_ratio",
                                      help="Share of each row's weakest patch attentions set to zero before "
                                           "rolling out; higher values keep only the strongest paths.")
        if "layer" not in controls:  # the heads grid and the matrix still need a layer
            layer = st.session_state.get(f"layer-{model_key}", L)

        st.header("Overlay")
        opacity = opacity_slider(st)
        # A signed map is drawn on the diverging scale around 0 (map_colours): a colour map would change nothing
        if is_signed(kind) or kind in vlm_words.SIGNED:
            colormap = st.session_state.get("colormap", drawing.COLORMAPS[0])  # kept for the heads grid, the matrix
        else:
            colormap = st.selectbox(share.LABELS["cmap"], drawing.COLORMAPS, key="colormap")
        scale = st.radio(share.LABELS["scale"], list(drawing.COLOUR_SCALES), format_func=drawing.COLOUR_SCALES.get,
                         key="colour_scale", help="Each map stretched to its own range makes a near-uniform map look "
                                                  "structured; 0 to max, or one range for all heads, compares them.")
        mode = st.radio(share.LABELS["upsample"], UPSAMPLE_MODES[::-1], horizontal=True, key="upsample",
                        help="bilinear: smooth between patch centres; nearest: one flat block per patch (exact "
                             "values).")
        show_grid = st.checkbox(share.LABELS["grid"], key="show_grid")
        masked = st.checkbox("Attention-mass contour (DINO)", key="mass_mask",
                             help="Outline the patches that hold the chosen share of the map's mass, per head in the "
                                  "heads grid (Caron et al. 2021).")
        st.session_state.setdefault("mask_share", 0.6)
        mass_share = st.slider(share.LABELS["mass"], 0.05, 0.95, step=0.05, key="mask_share", disabled=not masked)
    pooled, query = query == READOUT, max(query, 0)
    settings = attention_maps.MapSettings(kind=kind, layer=layer - 1, head=head, fusion=fusion, query=query,
                                          discard_ratio=discard_ratio, end_layer=end_layer - 1, class_index=class_index,
                                          start_layer=start_layer, options=options, readout=pooled)
    outline = explorer.patch_of(query, prefix) if "query" in controls and not pooled else None
    return MapChoice(settings, layer, tokens, query_key, outline, opacity, colormap, scale, mode, show_grid,
                     mass_share if masked else None, class_slot, word, target)


def opacity_slider(where) -> float:
    """The overlay's opacity slider in ``where`` (the sidebar's, or a column): one widget for every page, whose key a
    link's ``opacity`` sets (``share_view.read_link``)."""
    st.session_state.setdefault("opacity", 0.6)
    return where.slider(share.LABELS["opacity"], 0.0, 1.0, step=0.05, key="opacity")


def option_key(name: str) -> str:
    """The sidebar's widget of an attribution option (a link's ``attr`` sets it)."""
    return f"attr-{name}"


# captum's and RISE's parameters as the sidebar shows them: its label and what it does
OPTION_LABELS = {
    "n_steps": ("Steps", "Integrated Gradients' steps along the path from the baseline (captum's default: 50)."),
    "baseline": ("Baseline is", "What the input is compared with or replaced by: a value in the model's input "
                                "space (below; captum's default 0: the normalisation's mean colour), or a black image "
                                "normalised as the model's input is."),
    "baselines": ("Baseline", "The value the input is compared with or replaced by, in the model's input space "
                              "(captum's default 0: the normalisation's mean colour)."),
    "nt_samples": ("Noisy samples", "SmoothGrad's noisy copies of the input (captum's default: 5)."),
    "stdevs": ("Noise standard deviation", "SmoothGrad's noise, in the model's input space (captum's default: 1)."),
    "sliding_window_shapes": ("Window (px)", "Occlusion's window side; 0: one patch."),
    "strides": ("Stride (px)", "Occlusion's stride; 0: the window's side."),
    "n_samples": ("Coalitions", "KernelSHAP's random coalitions of patches (captum's default: 25)."),
    "n_masks": ("Masks", "RISE's random masks, each one forward: 1,000 for a first look; its authors' default is "
                         "6,000 (the button below the count)."),
    "s": ("Cells per side", "RISE's mask grid of s x s cells (its authors' default: 8)."),
    "p1": ("Keep probability", "The probability a RISE cell is kept (its authors' default: 0.1)."),
    "seed": ("Seed", "The noise's, the coalitions' or the masks' random seed."),
}


# The options whose first value on the page is not the default (captum_maps.Options): RISE's masks start at a first
# look, the authors' 6,000 one click away; a link without the option means the default (share_view.take_link).
PAGE_FIRST = {"n_masks": captum_maps.rise_module.FIRST_LOOK_MASKS}


def _set_option(key: str, value: int) -> None:
    st.session_state[key] = value


def attribution_options(kind: str) -> tuple[tuple[str, float | int], ...]:
    """The sidebar's inputs of an attribution's options (captum's names, captum's and the RISE authors' defaults),
    as ``MapSettings.options`` holds them: those that differ from the defaults. Each input is bounded as
    ``captum_maps.BOUNDS`` is; the map's cost is counted before it runs."""
    default, values = captum_maps.Options(), {}
    for name in captum_maps.page_options(kind):
        label, help_text = OPTION_LABELS[name]
        key, value = option_key(name), getattr(default, name)
        if name in captum_maps.CHOICES:  # the baseline: a value, or a black image
            st.session_state.setdefault(key, value)
            values[name] = st.radio(label, captum_maps.CHOICES[name], key=key, help=help_text, horizontal=True,
                                    format_func={"value": "a value", "black": "a black image"}.get)
            continue
        if name == "baselines" and values.get("baseline") == "black":  # not used: the black image is
            continue
        low, high, number = captum_maps.BOUNDS[name]
        if value is None:  # occlusion's window and stride: one patch, shown as 0
            st.session_state.setdefault(key, 0)
            values[name] = st.number_input(label, 0, int(high), step=1, key=key, help=help_text) or None
        elif number is int:
            st.session_state.setdefault(key, int(PAGE_FIRST.get(name, value)))
            values[name] = st.number_input(label, int(low), int(high), step=1, key=key, help=help_text)
            if name in PAGE_FIRST and values[name] != value:  # the default (the authors') one click away
                st.button(f"Use the authors' {value:,} masks", key=f"{key}-default", on_click=_set_option,
                          args=(key, int(value)), help="RISE as its authors ran it: six times the forwards, a "
                          "less noisy map.")
        else:
            st.session_state.setdefault(key, float(value))
            values[name] = st.number_input(label, float(low), float(high), step=0.05, format="%g", key=key,
                                           help=help_text)
    return captum_maps.chosen_options(kind, values)


def word_controls() -> tuple[str, str | None, str]:
    """A VLM tower's word map: which (``vlm_words.KINDS``), the word (of those typed under "Ask in words", None while
    none is) and, for LeGrad and AttnLRP, the target: every image token or the clicked patch's."""
    from app_pages.explorer_sections import word_lens

    kind = st.selectbox("Method", list(vlm_words.KINDS), format_func=vlm_words.KINDS.get, key=word_lens.METHOD_KEY,
                        help="The word's visual logit lens (no gradient: the projected image tokens against the "
                             "word's input embedding), or a gradient map whose target is that score.")
    words = word_lens.typed_words()
    if st.session_state.get(word_lens.WORD_KEY) not in words:
        st.session_state[word_lens.WORD_KEY] = words[0] if words else None
    word = st.selectbox(share.LABELS["word"], words, key=word_lens.WORD_KEY, disabled=not words,
                        placeholder="type words under “Ask in words”",
                        help="One of the words typed under “Ask in words” (below the image), each read by the "
                             "model's own tokenizer as typed.")
    target = "all"
    if kind in ("word_legrad", "word_attnlrp"):
        target = st.radio(share.LABELS["target"], list(vlm_words.TARGETS), format_func=vlm_words.TARGETS.get,
                          key=word_lens.TARGET_KEY, help="The score explained: the word's lens score at one image "
                          "token (the one whose unit covers the clicked patch), or summed over all of them.")
    return kind, word, target


def choose_class(choice: MapChoice, prediction, class_names: list[str], model_key: str) -> MapChoice:
    """The class picker of a class map, in its place among the sidebar's controls (``choice.class_slot``), now that
    ``prediction`` names its first option; ``choice`` with the class picked."""
    if choice.class_slot is None:
        return choice
    class_index = choice.class_slot.selectbox(
        share.LABELS["class"], [-1, *range(len(class_names))], key=f"class-{model_key}",
        format_func=lambda c: drawing.class_option(c, class_names, prediction.class_index))
    return replace(choice, settings=replace(choice.settings, class_index=None if class_index == -1 else class_index))


def main_map(checkpoint: Checkpoint, fingerprint: tuple, image: Image.Image, image_key: str, size: InputSize,
             analysis: image_analysis.Analysis, choice: MapChoice) -> MainMap:
    """The map the sidebar chose, computed (a class map or a method's, once per settings); when the model cannot
    give it, an empty map whose ``error`` says why in one line (the page goes on: the other sections do not depend
    on the main map)."""
    settings, colormap, scale = choice.settings, choice.colormap, choice.scale
    if settings.kind in vlm_words.KINDS:
        from app_pages.explorer_sections import word_lens

        return word_lens.main_map(checkpoint, fingerprint, image, image_key, size, analysis, choice)
    kind, query, layer = settings.kind, settings.query, choice.layer
    try:
        map2d = _map2d(checkpoint, fingerprint, image, image_key, size, analysis, choice)
    except ValueError as e:  # over a bound (TooManyTokens), an option the model does not support, a map a Swin
        # does not draw: said in one line where the map goes; the page goes on (a SAM's Prompts, the tabs below)
        return MainMap(np.zeros(analysis.grid, np.float32), colormap, None, None, None,
                       error=escape_markdown(" ".join(str(e).split())))
    map_colormap, vmin, vmax = map_colours(kind, map2d, colormap)  # signed maps: diverging, around 0
    signed = is_signed(kind)  # their symmetric range is kept whatever the colour scale
    if scale == "zero" and not signed:
        vmin, vmax = drawing.colour_range(map2d, scale)
    elif scale == "shared" and kind == "attention":  # the range of this layer's heads, as in the heads grid
        vmin, vmax = drawing.colour_range(attention_maps.head_maps(analysis, query, layer=layer - 1), scale)
    # A pixel method's map is on the model's input pixels, as vit.explain gives it; its mass contour on its patch sums
    grid = tuple(analysis.grid) if attention_maps.is_method_map(kind) and method_maps.draws_pixels(kind) else None
    patches = map2d if grid is None else method_maps.pixel_patch_sums(map2d, grid)
    mask = attention_maps.map_mask(patches, choice.mask_share) if choice.mask_share is not None else None
    return MainMap(map2d, map_colormap, vmin, vmax, mask, grid=grid)


def _map2d(checkpoint: Checkpoint, fingerprint: tuple, image: Image.Image, image_key: str, size: InputSize,
           analysis: image_analysis.Analysis, choice: MapChoice) -> np.ndarray:
    """The main map's values on the image's patch grid (gh, gw) (a pixel method's on the model's input pixels
    (H, W)), computed once per settings; ValueError (one line) when the model cannot give it."""
    settings = choice.settings
    kind, query, fusion, end_layer = settings.kind, settings.query, settings.fusion, settings.end_layer + 1
    relevance = None
    if kind == "class":
        relevance = class_relevance(fingerprint, image_key, size, attention_maps.resolved_class(settings, analysis),
                                    checkpoint, image, analysis.num_tokens)
    method_map2d = None
    if attention_maps.is_method_map(kind):
        method_map2d = method_map(fingerprint, image_key, size, kind, attention_maps.resolved_class(settings, analysis),
                                  query, end_layer - 1, fusion, checkpoint, image, settings.start_layer, analysis,
                                  settings.options)
    if kind in ("rollout", "probe_rollout") and not attention_maps.factors_fit(analysis):
        map2d = rollout_map(fingerprint, image_key, size, analysis, settings)
    else:
        map2d = attention_maps.attention_map(analysis, settings, relevance, method_map2d)
    if analysis.staged:  # a Swin layer's map on its own grid: each cell over the image patches it covers
        map2d = on_patch_grid(map2d, analysis.grid)
    return map2d
