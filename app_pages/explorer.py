"""Explore a ViT's attention: a checkpoint and an image in the sidebar, any layer, head, query or map.

The model runs once per (checkpoint, image); changing a layer, head, query or overlay setting
only redraws. The computations are plain functions in ``vit/`` (mostly ``vit.explorer``).
Other pages open a checkpoint here (``st.session_state["explorer_checkpoint"]``, its path) and an image file
(``["explorer_image"]``) through a link that hands them over (``app_pages/open_in_explorer.py``).
"""

import streamlit as st

from app_pages import open_in_explorer
from app_pages.explorer_sections import (
    analyses,
    ask_in_words,
    ask_vlm,
    clip_view,
    concept_view,
    features,
    image_picker,
    library_clip_view,
    library_view,
    main_view,
    map_settings,
    mechanism,
    plotly_preload,
    sam_prompts,
    share_view,
    starting,
    view_link,
    vlm_view,
    word_lens,
)
from app_pages.explorer_sections.caches import analyse, display_images, load_model
from app_pages.explorer_sections.checkpoint_picker import may_open_path, pick_checkpoint
from app_pages.explorer_sections.compare_checkpoints import compare_checkpoints
from app_pages.explorer_sections.dense_features import KEPT as DENSE_KEPT
from app_pages.explorer_sections.dense_features import dense_features
from app_pages.explorer_sections.image_picker import pick_image
from app_pages.explorer_sections.in_hand import page as in_hand_page
from app_pages.explorer_sections.map_settings import choose_class, choose_map, main_map
from app_pages.explorer_sections.probe_snapshots import probe_snapshots
from app_pages.explorer_sections.state import Shown, keep_settings
from vit.app import catalog, drawing, share, vlm_words
from vit.app import explorer_page as explorer
from vit.checkpoint import CheckpointError
from vit.core.images import ImageError
from vit.core.inference import NonFiniteOutput, input_box, seen_region
from vit.core.text import escape_markdown
from vit.explain.language import words
from vit.explain.views import image_analysis, video
from vit.sources.vlm.text_tower import has_text_tower
from vit.sources.vlm.whole_vlm import can_answer

# Settings must survive a run in which their widget is not drawn (a rejected upload stops the page early; a closed
# tab hides its toggle): Streamlit forgets such widget state unless it is written back. Each section names its own
# (a fragment also writes its own back on its own reruns); the page writes back all of them before any may stop it.
keep_settings(clip_view.KEPT + image_picker.KEPT + map_settings.KEPT + main_view.KEPT + analyses.KEPT
              + ask_in_words.KEPT + ask_vlm.KEPT + features.KEPT + mechanism.KEPT + DENSE_KEPT + sam_prompts.KEPT
              + library_view.KEPT + concept_view.KEPT)


# -- checkpoint -----------------------------------------------------------------------------------------------

open_in_explorer.take()  # a run, an SAE or an image another page's link hands over
in_hand_page()  # a model vit.explore serves from this process (?model=in-hand:ID): its page alone, then stop
share_view.read_link(may_open_path())  # a link's view, once per session, before any widget is drawn
entries, choice, may_open = pick_checkpoint()
entry = entries[choice]
starting.clear()  # app.py's frame for a fresh server: the page's own title takes its place
st.title("ViT Attention Explorer")
share_view.show_notes(choice)  # what a link could not use, where its recipient looks first
model_text = share.model_text(choice, entry.name, share.model_names(entries.values()))  # what a link names it by
view_link.follow_model(model_text)  # never the previous model's view in the URL, whichever page draws this one
if concept_view.applies(entry.path):  # SAM 3: a concept in, its instances out (issue 94), transformers' own model
    concept_view.concept_view(entry, entries, explorer.image_digest(choice.encode())[:10], model_text)
    st.stop()
if vlm_view.applies(entry.path):  # a whole VLM whose tower no port reads (issue 92): its question page alone
    vlm_view.vlm_view(entry, entries, explorer.image_digest(choice.encode())[:10], model_text, may_open)
    st.stop()
if not entry.ok:
    st.error(f"This checkpoint cannot be loaded: {escape_markdown(entry.error)}")
    st.stop()
fingerprint = catalog.Candidate(entry.path, entry.source, entry.name).fingerprint
try:
    checkpoint = load_model(choice, fingerprint, library_road=True)  # a model no port reads: as its library builds it
except CheckpointError as e:
    st.error(f"This checkpoint cannot be loaded: {escape_markdown(e)}")
    st.stop()
class_names = checkpoint.class_names
model_key = explorer.image_digest(choice.encode())[:10]  # widgets whose range depends on the model
if checkpoint.metadata.get("preprocessing_guessed"):  # bare weights: say what the images are prepared with
    st.sidebar.warning(escape_markdown(checkpoint.metadata["preprocessing_guessed"]))
if video.is_video(checkpoint):  # a clip in, its maps per frame (issue 65); the image sections below take images
    clip_view.clip_view(checkpoint, fingerprint, model_key, model_text, entry.name)
    st.stop()
if getattr(checkpoint.model, "takes_clips", False):  # PE video as transformers builds it (issues 91, 116)
    library_clip_view.library_clip_view(checkpoint, fingerprint, model_key, model_text, entry.name)
    st.stop()
if checkpoint.road == "library":  # the library's own model, its attention recorded (issue 91): the maps that road
    library_view.library_view(checkpoint, fingerprint, entry, entries, model_key, model_text)  # draws, in a smaller
    st.stop()  # view of its own; the sections below read our own ViT


full_checkpoint, full_fingerprint = checkpoint, fingerprint

# -- image ----------------------------------------------------------------------------------------------------

chosen = pick_image(entry, entries, checkpoint, model_key, may_open)
image, image_name, image_key, size, invert = chosen.image, chosen.name, chosen.key, chosen.size, chosen.invert
samples, sample, pre = chosen.samples, chosen.sample, checkpoint.preprocessing

# Mean ablation and test-time registers average over reference images: the ones uploaded here, else the samples.
refs = mechanism.pick_references(samples, invert)
# Heads switched off under Mechanism → Ablation, with "every map" on: the whole page is drawn from a copy of the
# model with those heads ablated in its weights; the Ablation tab keeps comparing with the full model.
share_view.apply_heads_off(model_key, full_checkpoint.model.config.num_layers, full_checkpoint.model.config.num_heads)
everywhere = mechanism.heads_off_everywhere(model_key)
checkpoint, fingerprint, mean_ablated = mechanism.with_heads_off(everywhere, full_checkpoint, full_fingerprint, image,
                                                                 size, refs)
# Features scaled under Features with "every map" on: the page is drawn from a copy of the model that scales them.
checkpoint, fingerprint = features.with_features_edited(checkpoint, fingerprint, full_checkpoint, full_fingerprint,
                                                        may_open)

# -- map settings (only the controls the chosen map uses) ---------------------------------------------------------

# Drawn from the shape the analysis will have, before the model runs: the browser lays the sidebar out meanwhile
# instead of after the forward, where it held the new map back by ~0.1 s (bench/bench_start.py).
try:
    shape = image_analysis.view_shape(checkpoint, image, size)
except (ValueError, ImageError) as e:  # too many tokens; too small for a Swin's windows
    st.error(escape_markdown(e))
    st.stop()
share_view.apply_model_settings(model_key, shape, class_names, vlm_words.has_words(checkpoint.model))
map_choice = choose_map(shape, class_names, model_key, checkpoint.model)

# -- image, overlay and prediction ----------------------------------------------------------------------------------

# A model whose preprocessing crops (DINOv2, timm's crop_pct) sees only the centre: everything is drawn over that.
box = input_box(image.size, pre, size)
seen = seen_region(image, pre, size)
shown, shown_uri, small = display_images(f"{image_key}-{tuple(round(v) for v in box)}", seen)
plotly_preload.clear()  # app.py's blank chart, which had the browser load Plotly meanwhile
places = main_view.lay_out(shown, shown_uri, shape.grid, map_choice.settings.query, shape.num_prefix_tokens,
                           map_choice.query_key,  # the image, drawn by the browser while the model runs
                           drawing.map_heading(map_choice.settings.kind))
try:
    analysis = analyse(fingerprint, image_key, size, checkpoint, image)
except (ValueError, ImageError, NonFiniteOutput) as e:
    st.error(escape_markdown(e))
    st.stop()
map_choice = choose_class(map_choice, analysis.prediction, class_names, model_key)
main = main_map(checkpoint, fingerprint, image, image_key, size, analysis, map_choice)
state = Shown(checkpoint=checkpoint, fingerprint=fingerprint, full_checkpoint=full_checkpoint,
              full_fingerprint=full_fingerprint, model_key=model_key, image=image, image_key=image_key, size=size,
              analysis=analysis, settings=map_choice.settings, layer=map_choice.layer, tokens=map_choice.tokens,
              outline=map_choice.outline, shown=shown, small=small, opacity=map_choice.opacity,
              colormap=map_choice.colormap, mode=map_choice.mode, show_grid=map_choice.show_grid,
              scale=map_choice.scale, mask_share=map_choice.mask_share, word=map_choice.word,
              target=map_choice.target)
prediction_box = main_view.main_view(state, main, places, map_choice.query_key, image_name, seen, shown_uri, box,
                                     invert)
# The URL follows the view as it is drawn (issue 50): a link to it reproduces it in a fresh session.
asks_vlm = not has_text_tower(checkpoint) and can_answer(full_checkpoint)  # the page has "Ask the VLM"
shared = share_view.view_values(model_text, state, image_name, sample, invert, asks_vlm)
view_link.follow(shared)
share_view.share_buttons(shared, state, main, image_name, entry.name)

# -- a whole SAM / SAM 2: prompts in, masks out, and what its mask decoder looked at (issue 81) -------------------

if sam_prompts.applies(full_checkpoint):
    sam_prompts.prompt_section(state)

# -- ask a CLIP or SigLIP in words (issue 22), or a VLM's tower (issue 68) -----------------------------------------

asked = None  # the labels typed into "Ask in words" (a CLIP's logit lens reads them too)
if has_text_tower(checkpoint):
    st.session_state.pop(ask_in_words.DRAWN_KEY, None)  # drawn below: the section compares what it asks with it
    asked = ask_in_words.ask_in_words(state)
    if asked is not None and not class_names:  # scored labels are this model's prediction: not "no classifier"
        prediction_box.markdown(words.describe_prediction(asked))
elif vlm_words.has_words(checkpoint.model):  # a VLM's tower: words against its language model's embeddings
    word_lens.ask_in_words(state, may_open)
if asks_vlm:  # the whole VLM in its folder (issue 80)
    ask_vlm.ask_vlm(state, may_open, shared, entry.name, image_name)

# -- analyses (only the open tab is computed) -------------------------------------------------------------------

analyses.analyses(state)

# -- features: a sparse autoencoder's features of this image, their exemplars and intervention (issue 36) --------

features.features(state, may_open, asked)

# -- what the patches represent: PCA colours, patch similarity, correspondences (issue 48) ----------------------

dense_features(state, entries)

# -- mechanism: logit lens, head attribution, ablation, phenomena (issue 24) ------------------------------------

if st.toggle("Mechanism: logit lens, head attribution, ablation, phenomena", key=mechanism.TOGGLE_KEY,
             help="Which component does what: each layer read through the model's own head, each head's direct "
                  "contribution to the class logit, heads switched off, high-norm tokens, massive activations "
                  "and attention sinks."):
    mechanism.mechanism(state, refs, samples, sample, everywhere, mean_ablated, asked)

# -- compare two checkpoints; the run's attention snapshots at any epoch (issue 12) -------------------------------

compare_checkpoints(state, entries, choice, main.map2d, main.error, main.grid)
probe_snapshots(state, entry)

# Room below the tabs: while a newly opened tab is computed its old content is gone, and a page that
# shrank for that moment made the browser jump up (clicking a tab seemed to scroll to the top).
st.html('<div style="height: 70vh"></div>')
