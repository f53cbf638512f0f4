"""Ask in words, for a vision-language model's tower (issue 68): the words typed here are read by the folder's own
tokenizer, and each is mapped by the visual logit lens (where the projected image tokens point at it); the sidebar's
"A word" map draws one of them, by the lens or by a gradient map whose target is its lens score.

The maps are the notebook API's own (``vit.visual_logit_lens``, ``vit.explain_word``): a notebook given the same
folder, image and word gets the map drawn here. Not a fragment: the words are the sidebar's options, so a change of
them reruns the page.
"""

from pathlib import Path

import numpy as np
import streamlit as st
from PIL import Image

from app_pages.explorer_sections.ask_in_words import LABELS_KEY
from app_pages.explorer_sections.hub_download import snapshot_files_panel
from app_pages.explorer_sections.map_choice import MainMap, MapChoice
from app_pages.explorer_sections.state import Shown
from vit import api
from vit.app import drawing, vlm_words
from vit.checkpoint import Checkpoint, CheckpointError
from vit.core.images import ImageError
from vit.core.inference import InputSize
from vit.core.text import escape_markdown
from vit.explain.views import attention_maps, image_analysis
from vit.explain.views.map_captions import token_label
from vit.explain.views.overlay import DIVERGING_COLORMAP, overlay
from vit.sources import hub
from vit.sources.vlm.word_embeddings import missing_embedding_shard

SPACE_KEY, METHOD_KEY = "words_lens_space", "words_lens_method"  # "words_": kept by the page (ask_in_words.KEPT)
WORD_KEY, TARGET_KEY = "words_lens_word", "words_lens_target"
NO_WORD = ("**No word yet**: type a word or several under “Ask in words” below the image; this map then shows where "
           "the image tokens point at the word picked in the sidebar.")
THUMBNAIL_COLUMNS = 4


def typed_words() -> list[str]:
    """The words typed under "Ask in words", as the tokenizer will read them; [] while none is, or the text is
    refused (the section says why)."""
    text = str(st.session_state.get(LABELS_KEY) or "")
    try:
        return vlm_words.split_words(text, bool(st.session_state.get(SPACE_KEY))) if text.strip() else []
    except ValueError:
        return []


@st.cache_resource(max_entries=4, show_spinner=False)
def embedding(fingerprint: tuple, _checkpoint: Checkpoint) -> vlm_words.Embedding:
    """The LM's input embedding, from its shard's header (nothing of it read), once per model."""
    return vlm_words.embedding(_checkpoint)


@st.cache_resource(max_entries=16, show_spinner="Reading the words' embeddings (one forward of the tower)…")
def lens_maps(fingerprint: tuple, digest: str, size: InputSize, words: tuple[str, ...], _checkpoint: Checkpoint,
              _image: Image.Image) -> list:
    """``vit.visual_logit_lens`` of ``words``, once per model, image and words."""
    return api.visual_logit_lens(_checkpoint, _image, list(words), size)


@st.cache_resource(max_entries=32, show_spinner="Computing the word's map (one backward pass)…")
def gradient_map(fingerprint: tuple, digest: str, size: InputSize, word: str, kind: str, patch: int | None,
                 _checkpoint: Checkpoint, _image: Image.Image) -> np.ndarray:
    """``vit.explain_word``'s map, once per model, image, word, method and target."""
    return api.explain_word(_checkpoint, _image, word, vlm_words.METHODS[kind], patch=patch, size=size).map


def _one_line(error: Exception | str) -> str:
    return escape_markdown(" ".join(str(error).split()))


def _on_the_hub(checkpoint: Checkpoint) -> str | None:
    """Where to get the word embeddings' shard when the model is a Hub snapshot that lacks it (opened from the Hub
    for its tower): the section's Download button, not the library's "download that file into the folder"."""
    folder = Path(checkpoint.path) if checkpoint.path is not None else None
    shard = missing_embedding_shard(folder) if folder is not None and folder.is_dir() else None
    if shard is None or hub.snapshot_of(folder) is None:
        return None
    return (f"The word maps read the language model's word embeddings, in {shard}, which was left on the Hub when "
            "the model was opened (its tower's shards alone were downloaded): download it under “Ask in words” "
            "below.")


def main_map(checkpoint: Checkpoint, fingerprint: tuple, image: Image.Image, image_key: str, size: InputSize,
             analysis: image_analysis.Analysis, choice: MapChoice) -> MainMap:
    """The sidebar's word map: the word's lens, or its gradient map; with no word, or a word the folder cannot read,
    an empty map whose caption or one-line error says what to do (the page goes on: the words are typed below)."""
    s, word = choice.settings, choice.word
    empty = np.zeros(analysis.grid, np.float32)
    if word is None:
        return MainMap(empty, choice.colormap, None, None, None, caption=NO_WORD, word_parts=(s.kind, "", None))
    words = typed_words()
    try:
        table = embedding(fingerprint, checkpoint)
        maps = lens_maps(fingerprint, image_key, size, tuple(words), checkpoint, image)
        word_map = maps[words.index(word)]
        patch = None
        if "query" in vlm_words.controls(s.kind, choice.target):
            patch = vlm_words.patch_target(s.query, analysis.num_prefix_tokens)
        if s.kind == "word_lens":
            map2d = word_map.map
        else:
            map2d = gradient_map(fingerprint, image_key, size, word, s.kind, patch, checkpoint, image)
    except (ValueError, CheckpointError, ImageError) as e:  # a word the tokenizer cannot read, no embedding shard
        return MainMap(empty, choice.colormap, None, None, None, error=_one_line(_on_the_hub(checkpoint) or e),
                       word_parts=(s.kind, word, None))
    label = None if patch is None else token_label(s.query, analysis.grid, analysis.num_prefix_tokens)
    units = int(np.prod(word_map.units.shape))
    caption = vlm_words.describe(s.kind, word_map, table, checkpoint, choice.target, label, units)
    colormap, vmin, vmax = choice.colormap, None, None
    if s.kind in vlm_words.SIGNED:
        bound = float(np.abs(map2d).max()) or 1.0
        colormap, vmin, vmax = DIVERGING_COLORMAP, -bound, bound
    elif choice.scale == "zero":
        vmin, vmax = drawing.colour_range(map2d, "zero")
    elif choice.scale == "shared" and s.kind == "word_lens":  # one range for every typed word's lens
        vmin, vmax = drawing.colour_range(np.stack([m.map for m in maps]), "shared")
        caption += " Colours: one range for every word typed."
    mask = attention_maps.map_mask(map2d, choice.mask_share) if choice.mask_share is not None else None
    return MainMap(map2d, colormap, vmin, vmax, mask, caption=caption,
                   word_parts=(s.kind, word, patch))


def ask_in_words(view: Shown, may_download: bool = False) -> None:
    """The section for a VLM's tower: the words, how the tokenizer reads each and where its lens is highest, and
    every word's lens map on one colour range. The language model's shard holding the word embeddings, left on the
    Hub when the tower was opened from there, is offered first (``may_download``: this visitor may download)."""
    checkpoint, image, size = view.checkpoint, view.image, view.size
    st.subheader("Ask in words")
    folder = Path(checkpoint.path) if checkpoint.path is not None else None
    shard = missing_embedding_shard(folder) if folder is not None and folder.is_dir() else None
    if shard is not None and not snapshot_files_panel(
            folder, [shard], may_download, "word_lens_download",
            "The lens reads one tensor of the language model, its word embeddings, whose shard was left on the Hub "
            "when the model was opened (its tower's alone were downloaded)."):
        return
    col_ask, col_tokens, col_maps = st.columns([0.8, 1, 1], gap="medium")
    with col_ask:
        # No max_chars: Streamlit would show a counter; split_labels bounds the text (one line if over).
        text = st.text_area("Words", key=LABELS_KEY, placeholder="dog, cat, red",
                            help="Words or short phrases, separated by commas, semicolons or line breaks; each is "
                                 "read by the model's own tokenizer exactly as typed (plain text).")
        space = st.checkbox("Read each word after a space", key=SPACE_KEY,
                            help="A BPE tokenizer (Qwen, LLaVA's Llama) reads “ dog”, the word inside a sentence, as "
                                 "another token than “dog” at the start of a text.")
    try:
        table = embedding(view.fingerprint, checkpoint)
        words = vlm_words.split_words(text, space) if text.strip() else []
        maps = lens_maps(view.fingerprint, view.image_key, size, tuple(words), checkpoint, image) if words else []
    except (ValueError, CheckpointError, ImageError) as e:  # not beside its LM, no tokenizer, an unknown word
        col_ask.error(_one_line(e))
        return
    col_ask.caption(f"The lens reads one tensor of the language model, the word embeddings: {table.what}; only the "
                    "rows of the words' tokens, never the rest.")
    if not maps:
        col_tokens.caption("Type words to see where the image tokens point at each (the visual logit lens), and pick "
                           "“A word” as the map in the sidebar for one word's lens or gradient maps.")
        return
    grid, prefix = view.analysis.grid, view.analysis.num_prefix_tokens
    rows = []
    for m in maps:
        peak = int(np.argmax(m.map))
        rows.append({"word": m.word, "tokens": " ".join(m.tokens), "ids": " ".join(map(str, m.token_ids)),
                     "max": float(m.map.max()), "at": drawing.short_token_label(peak + prefix, grid, prefix),
                     "mean": float(m.units.mean())})
    with col_tokens:
        st.dataframe(rows, hide_index=True, width="stretch")  # plain text: typed words and tokens are data
        st.caption("Each word as its tokenizer reads it, and its lens score (the projected image token · the word's "
                   "input embedding, the mean of its tokens' for several): the highest, where (the patch's row and "
                   "column), and the mean over the image tokens.")
    with col_maps:
        stacked = np.stack([m.map for m in maps])
        low, high = drawing.colour_range(stacked, "shared")
        cells = [overlay(view.small, m.map, view.opacity, view.colormap, view.mode, vmin=low, vmax=high) for m in maps]
        st.image(drawing.heads_grid_image(cells, min(THUMBNAIL_COLUMNS, len(cells)), labels=[m.word for m in maps]),
                 output_format="PNG")
        st.caption(f"Each word's visual logit lens on one colour range, {low:.3g} (dark) to {high:.3g} (bright).")
