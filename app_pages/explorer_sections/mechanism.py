"""Mechanism: logit lens, head attribution, ablation, patching and phenomena, as tabs (issue 24); the Patching
tab is drawn by ``patching.py``.

A fragment: a tab, a slider or a head switched off for the Ablation tab alone reruns this section only. Heads
switched off "in every map on this page" change what every section shows, so a change of them reruns the page.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import streamlit as st
from PIL import Image

from app_pages.explorer_sections import patching, sink_diagnostics, textspan
from app_pages.explorer_sections.caches import UPLOAD_TYPES, analyse, decode_image
from app_pages.explorer_sections.long_work import long_work
from app_pages.explorer_sections.state import Shown, keep_settings
from vit.app import drawing
from vit.app import explorer_page as explorer
from vit.checkpoint import Checkpoint
from vit.core.images import ImageError
from vit.core.inference import InputSize, input_shape
from vit.core.text import escape_markdown
from vit.costs.bounds import TooManyTokens
from vit.explain.views import figures, mechanism_views
from vit.explain.views.overlay import overlay
from vit.sources.vlm.text_tower import has_text_tower

TOGGLE_KEY, TABS_KEY, MODE_KEY, EVERYWHERE_KEY = "mechanism_view", "mechanism_tab", "ablation_mode", "ablate_everywhere"
REFERENCES_KEY = "reference_uploads"
# Drawn in one tab only: kept while another tab is open (heads switched off "in every map" came back on).
KEPT = ("ablation_mode", "ablation_grid", "ablate", "corrupted-", "patch_positions", "norm_threshold", "tt_register",
        sink_diagnostics.KEY)


def ablate_key(model_key: str) -> str:
    """The key of the heads switched off, per model (their labels depend on its layers and heads)."""
    return f"ablate-{model_key}"


@dataclass(frozen=True, eq=False)
class References:
    """The images mean ablation and test-time registers average over: the ones uploaded, else the samples."""

    uploads: tuple  # Streamlit's uploaded files
    keys: tuple[str, ...]  # what the means depend on: the uploads' ids or the samples' paths
    label: str
    invert: bool

    def images(self):
        """The reference images, decoded one at a time as they are read (at most REFERENCE_CHUNK held at once)."""
        if len(self.uploads) > mechanism_views.MAX_REFERENCE_IMAGES:
            raise ValueError(f"{len(self.uploads)} reference images are uploaded; at most "
                             f"{mechanism_views.MAX_REFERENCE_IMAGES} are averaged: remove some")
        if self.uploads:
            for key, upload in zip(self.keys, self.uploads, strict=True):
                yield decode_image(key, upload.name, self.invert, upload.getvalue())
            return
        for path in self.keys:
            data = Path(path).read_bytes()
            yield decode_image(explorer.image_digest(data), Path(path).name, self.invert, data)


def references(uploads: list, samples: list[Path] | None, invert: bool) -> References:
    if uploads:
        return References(tuple(uploads), tuple(f"upload-{f.file_id}" for f in uploads),  # not hashed every rerun
                          f"the {len(uploads)} uploaded reference images", invert)
    keys = tuple(str(p) for p in (samples or [])[:mechanism_views.MAX_REFERENCE_IMAGES])
    return References((), keys, f"the {len(keys)} sample images", invert)


def reference_means(fingerprint: tuple, key: tuple, checkpoint: Checkpoint, image: Image.Image,
                    refs: References, size: InputSize, place: str):
    """The reference images' mean head outputs (long work: None while they are computed)."""
    return long_work(("reference means", fingerprint, key), "Averaging the heads over the reference images",
                     lambda progress: mechanism_views.reference_means(checkpoint, refs.images(), image, size,
                                                                      progress=progress, count=len(refs.keys)), place)


def means_for(mode: str, full_fingerprint: tuple, full_checkpoint: Checkpoint, image: Image.Image, size: InputSize,
              refs: References, place: str):
    """(cache key, means) of the reference set on this image's grid for mean ablation; (None, None) for zero;
    (key, None) while the means are computed (their progress is drawn at ``place``)."""
    if mode != "mean":
        return None, None
    pre = full_checkpoint.preprocessing
    shape = input_shape(image, pre, full_checkpoint.model.config.patch_size, size)
    key = (size, shape, refs.invert, refs.keys)  # what the means depend on
    return key, reference_means(full_fingerprint, key, full_checkpoint, image, refs, size, place)


def means_for_image(mode: str, view: Shown, refs: References):
    return means_for(mode, view.full_fingerprint, view.full_checkpoint, view.image, view.size, refs, "ablation")


@st.cache_resource(max_entries=2, show_spinner="Switching the heads off…")
def ablated_checkpoint(fingerprint: tuple, heads: tuple[tuple[int, int], ...], mode: str, means_key: tuple | None,
                       _checkpoint: Checkpoint, _means) -> Checkpoint:
    grid = _checkpoint.model.patch_grid(*means_key[1]) if means_key is not None else None  # the means' input shape
    return mechanism_views.ablated_checkpoint(_checkpoint, list(heads), mode, _means, grid)


def pick_references(samples: list[Path] | None, invert: bool) -> References:
    """The sidebar's uploader of reference images, shown while Mechanism is open; without uploads, the samples."""
    uploads = []
    if st.session_state.get(TOGGLE_KEY):
        uploads = st.sidebar.file_uploader(
            "Reference images (mean ablation, test-time registers)", type=UPLOAD_TYPES, accept_multiple_files=True,
            key=REFERENCES_KEY,
            help=f"Up to {mechanism_views.MAX_REFERENCE_IMAGES} images a head's mean output is taken over; without "
                 "them, the checkpoint's sample images.") or []
    return references(uploads, samples, invert)


def with_heads_off(everywhere: tuple[tuple[str, ...], str] | None, checkpoint: Checkpoint, fingerprint: tuple,
                   image: Image.Image, size: InputSize, refs: References) -> tuple[Checkpoint, tuple, tuple | None]:
    """(checkpoint, fingerprint, mean_ablated) the page is drawn with: the model with the heads of ``everywhere``
    ablated in its weights, said on the page, else the model as loaded. ``mean_ablated``: (the full checkpoint,
    the heads) while heads are mean-ablated."""
    if everywhere is None:
        return checkpoint, fingerprint, None
    heads_off_labels, everywhere_mode = everywhere
    try:
        heads_off = tuple(explorer.parse_head_labels(heads_off_labels))
        means_key, means_off = means_for(everywhere_mode, fingerprint, checkpoint, image, size, refs, "everywhere")
        if means_key is not None and means_off is None:  # being computed: the page is drawn as loaded meanwhile
            return checkpoint, fingerprint, None
        ablated = ablated_checkpoint(fingerprint, heads_off, everywhere_mode, means_key, checkpoint, means_off)
    except (ValueError, ImageError, OSError, TooManyTokens) as e:
        st.warning(escape_markdown(e))
        return checkpoint, fingerprint, None
    over = f" over {escape_markdown(refs.label)}" if everywhere_mode == "mean" else ""
    st.info(f"Heads {escape_markdown(', '.join(heads_off_labels))} are switched off ({everywhere_mode} "
            f"ablation{over}) in the prediction and in every map on this page. Switch them on again under "
            "Mechanism → Ablation.")
    return (ablated, (fingerprint, f"{everywhere_mode}-ablated", heads_off, means_key),
            (checkpoint, heads_off) if everywhere_mode == "mean" else None)


def heads_off_everywhere(model_key: str) -> tuple[tuple[str, ...], str] | None:
    """(head labels, ablation mode) while heads are switched off in every map on the page; else None."""
    heads = tuple(st.session_state.get(ablate_key(model_key)) or [])
    if heads and st.session_state.get(TOGGLE_KEY) and st.session_state.get(EVERYWHERE_KEY):
        return heads, st.session_state.get(MODE_KEY, "zero")
    return None


@st.cache_resource(max_entries=8, show_spinner="Looking inside the mechanism…")
def mechanism_view(fingerprint: tuple, digest: str, size: InputSize, class_index: int | None, words_key: tuple | None,
                   _checkpoint: Checkpoint, _image: Image.Image, _asked) -> mechanism_views.MechanismView:
    return mechanism_views.mechanism_view(_checkpoint, _image, class_index, size, _asked)


@st.cache_resource(max_entries=8, show_spinner="Switching the heads off…")
def ablation_view(fingerprint: tuple, digest: str, size: InputSize, heads: tuple[tuple[int, int], ...], mode: str,
                  means_key: tuple | None, _checkpoint: Checkpoint, _image: Image.Image, _means):
    return mechanism_views.ablation_view(_checkpoint, _image, list(heads), mode, _means, size)


@st.cache_resource(max_entries=4, show_spinner="Finding the register neurons…")
def registers_view(fingerprint: tuple, digest: str, size: InputSize, threshold: float, top_k: int,
                   references_key: tuple, _checkpoint: Checkpoint, _image: Image.Image, _references: References,
                   _mean_ablated=None):
    return mechanism_views.registers_view(_checkpoint, _image, _references.images(), threshold, top_k, size,
                                          _mean_ablated)


def ablation_effects(fingerprint: tuple, digest: str, size: InputSize, class_index: int, mode: str,
                     means_key: tuple | None, checkpoint: Checkpoint, image: Image.Image, means):
    """Each head ablated in turn (long work, one pass per layer: None while it runs)."""
    return long_work(("ablation grid", fingerprint, digest, size, class_index, mode, means_key),
                     "Ablating each head in turn",
                     lambda progress: mechanism_views.ablation_effects(checkpoint, image, class_index, mode, means,
                                                                       size, progress), "ablation_grid", unit="heads")


@st.fragment
def mechanism(view: Shown, refs: References, samples: list[Path] | None, sample: Path | None,
              everywhere: tuple[tuple[str, ...], str] | None, mean_ablated, asked) -> None:
    """The Mechanism tabs. ``everywhere``: the heads the page was drawn with switched off (``heads_off_everywhere``);
    ``mean_ablated``: (the full checkpoint, those heads) under mean ablation; ``asked``: the labels asked in words."""
    keep_settings(KEPT)
    checkpoint, fingerprint, image, image_key, size = (view.checkpoint, view.fingerprint, view.image, view.image_key,
                                                       view.size)
    full_checkpoint, full_fingerprint, model_key = view.full_checkpoint, view.full_fingerprint, view.model_key
    analysis, class_names, class_index, layer = view.analysis, view.class_names, view.settings.class_index, view.layer
    prediction, grid, prefix, names = (analysis.prediction, analysis.grid, analysis.num_prefix_tokens,
                                       analysis.prefix_names)
    L = analysis.num_layers
    small, shown, opacity, colormap, mode, show_grid = (view.small, view.shown, view.opacity, view.colormap,
                                                         view.mode, view.show_grid)
    mechanism_class = class_index if class_names else None
    lens_prompts = asked.prompts if asked is not None and not class_names else None
    words_key = (tuple(lens_prompts.labels), tuple(lens_prompts.templates)) if lens_prompts is not None else None
    try:
        mech = mechanism_view(fingerprint, image_key, size, mechanism_class, words_key, checkpoint, image,
                              lens_prompts)
    except (ValueError, TooManyTokens) as e:  # MechanismError: a model option the walk does not know
        st.warning(f"The mechanism view cannot analyse this model: {escape_markdown(e)}")
    else:
        names_mech = [f"{i + 1}.{h + 1}" for i in range(L) for h in range(analysis.heads_in(i))]  # a stage's own
        lens_rows = [f"layer {i + 1}" if i >= 0 else "embedding" for i in mech.lens_layers]
        tabs = st.tabs(["Logit lens", "Head attribution", "Ablation", "Patching", "Phenomena"]
                       + (["TextSpan"] if textspan.applies(checkpoint) else []), key="mechanism_tab",
                       on_change="rerun")
        lens_tab, dla_tab, ablation_tab, patching_tab, phenomena_tab = tabs[:5]
        class_label = escape_markdown(class_names[mech.class_index]) if class_names else ""
        if lens_tab.open:
            with lens_tab:
                lens_names = class_names or mech.lens_labels
                if not lens_names:
                    st.info("This model has no classifier, so there is no class to read from its tokens"
                            + (": type labels under “Ask in words” and the lens reads them." if
                               has_text_tower(checkpoint) else "."))
                else:
                    lens_label = escape_markdown(lens_names[mech.class_index])
                    reader = ("final norm and head" if class_names else
                              "final norm, projection and cosine to the typed labels (the zero-shot read-out)")
                    cells = drawing.small_multiples(small, mech.lens_maps, opacity, colormap, mode, scale="zero")
                    st.image(drawing.heads_grid_image(cells, columns=min(len(cells), 7), labels=lens_rows),
                             output_format="PNG")
                    read = (f"after each of the last stage's layers ({lens_rows[0]} to {L}: earlier stages' tokens "
                            "have another grid and width, which the final norm and head do not read)"
                            if analysis.staged else f"after the embedding, then after each of the {L} layers")
                    st.caption(f"Each patch's probability of {lens_label} when the model's {reader} read it "
                               f"directly: {read} (as labelled), each map from 0 to its own maximum.")
                    st.dataframe({"after": lens_rows,
                                  **{f"top {k + 1}": [f"{lens_names[row[k][0]]} ({row[k][1]:.1%})"
                                                      if k < len(row) else "" for row in mech.lens_top]
                                     for k in range(3)}}, hide_index=True)
                    st.caption("The pooled read-out (what the " + ("classifier" if class_names else "zero-shot "
                               "classifier over the typed labels") + " reads) of each layer's tokens: its top 3.")
        if dla_tab.open:
            with dla_tab:
                if not class_names:
                    st.info("This model has no classifier, so there is no logit to attribute.")
                else:
                    st.plotly_chart(figures.layer_head_figure(mech.dla_heads, "Direct logit attribution",
                                                              "logit", mech.dla_mlps, first_layer=mech.dla_first),
                                    theme=None, key="dla_figure")
                    if mech.dla_first:
                        st.caption(f"The last stage's layers {mech.dla_first + 1} to {L}: the merge or pooling "
                                   "before them is not a sum of what earlier blocks wrote.")
                    parts = mech.dla_heads.sum() + mech.dla_mlps.sum() + sum(mech.dla_rest.values())
                    st.caption(f"Each head's and MLP's direct contribution to the logit of {class_label} "
                               f"({mech.logit:.4g}), through the final norm with its scale fixed at the last "
                               "layer (TransformerLens's apply_ln_to_stack). Heads "
                               f"({mech.dla_heads.sum():.4g}) + MLPs ({mech.dla_mlps.sum():.4g}) + "
                               + " + ".join(f"{k} ({v:.4g})" for k, v in mech.dla_rest.items())
                               + f" = {parts:.4g}, the logit.")
        if ablation_tab.open:
            with ablation_tab:
                if not class_names:
                    st.info("This model has no classifier: heads switched off here change every map on this page"
                            + (" and the scores and maps of the labels asked in words" if has_text_tower(checkpoint)
                               else "") + ", with “Every map on this page” on.")
                ablation_mode = st.radio("Ablation", ["zero", "mean"], horizontal=True, key="ablation_mode",
                                         disabled=not refs.keys,
                                         format_func={"zero": "zero the head's output",
                                                      "mean": "its mean over reference images"}.get,
                                         help="Mean ablation replaces a head's output, at each token "
                                              "position, by its average over the reference images (sidebar; "
                                              "without uploads, the checkpoint's sample images) at this "
                                              "input size.")
                if ablation_mode == "mean":
                    st.caption(f"Means over {escape_markdown(refs.label)}, each at this image's "
                               "input size.")
                elif not refs.keys:
                    st.caption("Upload reference images in the sidebar to ablate heads to their mean.")
                try:
                    means_key, means = means_for_image(ablation_mode, view, refs)
                    chosen_heads = st.multiselect("Switch heads off (layer.head)", names_mech,
                                                  key=f"ablate-{model_key}")
                    st.toggle("Every map on this page with these heads off", key="ablate_everywhere",
                              help="The prediction (or the labels asked in words), the attention maps, rollout, "
                                   "class maps, LeGrad, AttnLRP and flow all computed by the model with the "
                                   "chosen heads' outputs zeroed or replaced by their means.")
                    if heads_off_everywhere(model_key) != everywhere:  # what every section shows changed
                        st.rerun(scope="app")
                    means_ready = means_key is None or means is not None  # else: their progress is drawn above
                    if chosen_heads and class_names and means_ready:
                        ablated = ablation_view(full_fingerprint, image_key, size,
                                                tuple(explorer.parse_head_labels(chosen_heads)), ablation_mode,
                                                means_key, full_checkpoint, image, means)
                        full_prediction = prediction if checkpoint is full_checkpoint else analyse(
                            full_fingerprint, image_key, size, full_checkpoint, image).prediction
                        before, after = st.columns(2)
                        before.plotly_chart(drawing.predictions_figure(full_prediction),
                                            config={"displayModeBar": False}, key="ablation_before")
                        before.caption("All heads on.")
                        after.plotly_chart(drawing.predictions_figure(ablated.prediction),
                                           config={"displayModeBar": False}, key="ablation_after")
                        after.caption(f"Heads {', '.join(chosen_heads)} off ({ablation_mode} ablation): "
                                      f"predicts {escape_markdown(ablated.prediction.label)}.")
                        if ablated.rollout_on is not None:  # a model with stages has no CLS to roll out from
                            before.image(overlay(shown, ablated.rollout_on, opacity, colormap, mode),
                                         output_format="PNG")
                            before.caption("The CLS rollout with all heads on.")
                            after.image(overlay(shown, ablated.rollout_off, opacity, colormap, mode),
                                        output_format="PNG")
                            after.caption("The CLS rollout with those heads off: later layers attend differently.")
                    effects = None
                    if class_names and st.toggle(
                            f"Each head alone ({len(names_mech)} heads)", key="ablation_grid",
                            help="Each head ablated in turn, one layer's heads batched together; the progress counts "
                                 "the heads ablated.") and means_ready:
                        effects = ablation_effects(full_fingerprint, image_key, size, mech.class_index,
                                                   ablation_mode, means_key, full_checkpoint, image, means)
                    if effects is not None:
                        st.plotly_chart(figures.layer_head_figure(effects, "Logit change when one head is "
                                                                  "ablated", "Δ logit"), theme=None,
                                        key="ablation_figure")
                        st.caption(f"The change of the logit of {class_label} when each head alone is "
                                   f"ablated ({ablation_mode}); negative: the head helped this class."
                                   + (" Blank: heads a layer's stage does not have." if analysis.staged else ""))
                except (ValueError, ImageError) as e:
                    st.warning(escape_markdown(e))
        if patching_tab.open:
            with patching_tab:
                patching.patching_tab(view, samples, sample, refs.invert)
        if len(tabs) > 5 and tabs[5].open:
            with tabs[5]:
                textspan.textspan_tab(view, refs)
        if phenomena_tab.open:
            with phenomena_tab:
                layer_norms = mech.norms[layer]  # after the sidebar's layer
                norm_grid = mech.norm_grids[layer] if mech.norm_grids else grid  # with stages: that layer's own
                top_norm = max(float(n.max()) for n in mech.norms) * 1.05 + 1e-6
                if not 0.0 <= st.session_state.get("norm_threshold", -1.0) <= top_norm:  # new image or model
                    st.session_state["norm_threshold"] = top_norm / 2
                threshold = st.slider("High-norm threshold", 0.0, top_norm, key="norm_threshold",
                                      help="Tokens whose norm is over it count as high-norm (Darcet et al. 2023).")
                high = layer_norms > threshold
                left, right = st.columns(2)
                left.plotly_chart(figures.norm_histogram_figure(layer_norms, threshold, f"Token norms after layer "
                                                                                     f"{layer}"),
                                  theme=None, key="norm_histogram")
                patches_high = high[prefix:].reshape(norm_grid).astype(np.float32)
                right.image(overlay(shown, patches_high, opacity, colormap, "nearest", show_grid=show_grid,
                                    vmin=0.0, vmax=1.0), output_format="PNG")
                prefix_high = [names[i] for i in range(prefix) if high[i]]
                right.caption(f"{int(high[prefix:].sum())} of {high.size - prefix} patches over {threshold:.3g} "
                              f"after layer {layer} (lit)" + (f"; prefix tokens over it: {', '.join(prefix_high)}"
                                                              if prefix_high else "") + ".")
                st.plotly_chart(figures.massive_activations_figure(mech.massive, "Massive activations"),
                                theme=None, key="massive_figure")
                st.caption("Per layer, the three largest |activations| of the block output over all tokens and "
                           "channels, and their median (Sun et al. 2024).")
                if mech.sinks_refused:
                    st.info(f"{mech.sinks_refused}. Test-time registers are extra tokens, which windows and merges "
                            "have no place for.")
                else:
                    hover = np.array([[f"<br>strongest sink: {drawing.short_token_label(int(t), grid, prefix, names)}"
                                       f"<br>its value norm: {v:.3g}" for t, v in zip(tr, vr, strict=True)]
                                      for tr, vr in zip(mech.sink_token, mech.sink_value_norm, strict=True)])
                    st.plotly_chart(figures.layer_head_figure(mech.sink_mass, "Attention sinks", "mass",
                                                              signed=False, hover=hover), theme=None,
                                    key="sink_figure")
                    st.caption("Per head, the share of attention (averaged over queries) that its most attended key "
                               "token receives; hover for that token and the norm of its value vector, which is "
                               "small for a sink that only soaks up attention.")
                    sink_diagnostics.section(checkpoint, fingerprint, image, image_key, size, grid, prefix, names)
                if class_names and not mech.sinks_refused and st.toggle(
                        "Test-time register (Jiang et al. 2025)", key="tt_register",
                        help="Find the register neurons (outliers: last-layer norms over the threshold above, on this "
                             "image and the reference images), add one extra token and move those neurons' "
                             "activations onto it."):
                    top_k = st.number_input("Register neurons", 1, 200, 10, key="tt_register_neurons")
                    try:
                        registers = registers_view(fingerprint, image_key, size, threshold, int(top_k),
                                                   (refs.invert, refs.keys), checkpoint, image, refs,
                                                   mean_ablated)
                    except (ValueError, ImageError, OSError) as e:
                        st.warning(escape_markdown(e))
                    else:
                        cells = drawing.small_multiples(small, np.stack([registers.attention_before,
                                                                         registers.attention_after,
                                                                         registers.norms_before,
                                                                         registers.norms_after]),
                                                        opacity, colormap, mode)
                        st.image(drawing.heads_grid_image(cells, columns=4), output_format="PNG")
                        shown_neurons = ", ".join(f"{layer + 1}.{neuron}" for layer, neuron, _ in
                                                  registers.neurons[:10])
                        st.caption("Left to right: the last layer's CLS attention before and after the test-time "
                                   "register, then the patch norms after the last layer before and after. "
                                   f"Register neurons (layer.neuron): {shown_neurons}"
                                   + (" …" if len(registers.neurons) > 10 else "") + ".")
