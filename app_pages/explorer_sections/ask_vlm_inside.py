"""Inside the language model on "Ask the VLM" (issues 91 and 115), each on demand for the clicked answer token: its
logit lens, the map without the visual sinks, its knockout curve over windows of layers (the whole image or a box of
it) and the heads that ground it (a layer x head grid whose clicked cell draws that head's map); each in the page's
link and its export. What they compute is ``vit.app.vlm_inside``'s (the notebook API's), kept for the answer shown."""

from functools import partial

import streamlit as st

from vit.app import vlm_inside
from vit.core.text import escape_markdown, visible
from vit.explain.language.vlm_answer import VLMAnswer


def one_line(error: Exception) -> str:
    """An error's message on one line, Markdown-escaped."""
    return escape_markdown(" ".join(str(error).split()))


LENS_KEY, SINKS_KEY, KNOCKOUT_KEY = "vlm_ask_lens", "vlm_ask_sinks", "vlm_ask_knockout"
WINDOW_KEY, KBOX_KEY, HEADS_KEY = "vlm_ask_window", "vlm_ask_kbox", "vlm_ask_heads"
# The heads grid's selection and what was computed for the answer shown: not under the page's KEPT prefix (a
# selection's state cannot be written back)
GRID_KEY, INSIDE_KEY = "ask_vlm_grid", "ask_vlm_inside"
FLAGS = {"lm_lens": LENS_KEY, "lm_sinks": SINKS_KEY, "lm_heads": HEADS_KEY}  # link parameter -> its toggle


def take_link(values: dict) -> None:
    """The link's toggles, knockout window (the curve shown) and box as the widgets' values (``values`` popped)."""
    for name, key in FLAGS.items():
        if name in values:
            st.session_state[key] = values.pop(name)
    if "lm_knockout" in values:
        st.session_state[KNOCKOUT_KEY], st.session_state[WINDOW_KEY] = True, values.pop("lm_knockout")
    if "lm_kbox" in values:
        st.session_state[KBOX_KEY] = vlm_inside.box_text(values.pop("lm_kbox"))


def link_values(method: str | None) -> dict[str, object]:
    """This part's values of the page's link (None: left out); the sinks only for the attention map (``method``)."""
    values: dict[str, object] = {name: True if st.session_state.get(key) else None for name, key in FLAGS.items()}
    if method not in (None, "attention"):
        values["lm_sinks"] = None
    if st.session_state.get(KNOCKOUT_KEY):
        values["lm_knockout"] = st.session_state.get(WINDOW_KEY) or vlm_inside.DEFAULT_WINDOW
        try:
            values["lm_kbox"] = vlm_inside.parse_box(st.session_state.get(KBOX_KEY) or "")
        except ValueError:  # the whole image (no box, or one that does not parse: said where it is typed)
            pass
    return values


def sinks_toggle() -> bool:
    """The "Without the visual sinks" toggle."""
    return st.toggle("Without the visual sinks", key=SINKS_KEY,
                     help="The image tokens with massive activations in the sink dimensions (Kang et al., ICLR 2025) "
                          "draw attention whatever is asked: on, each head's row is renormalised over the image's "
                          "other tokens. One or two forwards of the model, once per answer.")


def logit_lens(answer: VLMAnswer, token: int) -> None:
    """On demand (one forward of the model): the clicked token's probability read at every language-model layer
    (``VLMAnswer.logit_lens``), the layer that first "knows" the word."""
    if not st.toggle("Read the token at every layer (logit lens)", key=LENS_KEY,
                     help="The clicked token's probability read from the language model's stream at each layer, "
                          "through its own final norm and head: the layer where the word first appears. One forward "
                          "of the model."):
        return
    try:
        lens = answer.logit_lens(token)
    except ValueError as e:  # over the memory limit
        st.error(one_line(e))
        return
    st.dataframe([{"layer": "input" if n == 0 else str(n), "probability": 100 * float(p)}
                  for n, p in enumerate(lens)], hide_index=True, width="stretch",
                 column_config={"probability": st.column_config.ProgressColumn(
                     "probability", min_value=0.0, max_value=100.0, format="%.1f%%")})
    st.caption(f"“{visible(answer.pieces[token])}” read at the stream each layer hands on, through the model's final "
               "norm and head; the last row is the model's own prediction.")


def kept(answer: VLMAnswer, what: tuple, compute):
    """``compute()``, kept for the answer shown (one set of results at a time: a click on a token or a layer
    redraws without running the model again)."""
    kept = st.session_state.get(INSIDE_KEY)
    if kept is None or kept[0] is not answer:
        kept = st.session_state[INSIDE_KEY] = (answer, {})
    if what not in kept[1]:
        kept[1][what] = compute()
    return kept[1][what]


def knockout(answer: VLMAnswer, token: int, image: int, overview: bool) -> dict[str, str]:
    """On demand (a forward of the model per window of layers, and one more): the clicked token's probability with
    the edges from its query to the image (or a box of it) blocked, window by window (``VLMAnswer.knockout``); the
    export's lines."""
    if not st.toggle("Knock out the token's attention to the image, layer window by layer window", key=KNOCKOUT_KEY,
                     help="Attention knockout (Geva et al. 2023; Zhang et al., CVPR 2025): the edges from the query "
                          "that predicted the token to the image's tokens are blocked in a window of layers, and "
                          "the token's probability read again; one forward of the model per window."):
        return {}
    if not 1 <= (st.session_state.get(WINDOW_KEY) or 0) <= answer.layers:  # a link's past the model's layers
        st.session_state[WINDOW_KEY] = min(vlm_inside.DEFAULT_WINDOW, answer.layers)
    col_window, col_box = st.columns(2)
    window = col_window.number_input("Layers per window", min_value=1, max_value=answer.layers, step=1,
                                     key=WINDOW_KEY, help="How many consecutive layers are blocked at a time.")
    typed = col_box.text_input("Box (optional)", key=KBOX_KEY, placeholder="top,left,bottom,right",
                               help="The image tokens of this box of patches on the map's grid (its ends "
                                    "exclusive); empty: the whole image.")
    box = None
    if typed.strip():
        try:
            box = vlm_inside.parse_box(typed)
        except ValueError as e:
            st.error(one_line(e))
            return {}
    try:
        knockout = kept(answer, ("knockout", token, int(window), box, image, overview),
                         partial(vlm_inside.knockout_curve, answer, token, int(window), box, image, overview))
    except ValueError as e:  # over the memory limit, a box off the grid, a model whose attention is not recorded
        st.error(one_line(e))
        return {}
    st.line_chart([{"layers": row["layers"], "change (%)": row["change"]} for row in vlm_inside.curve_rows(knockout)],
                  x="layers", y="change (%)", height=220)
    st.dataframe(vlm_inside.curve_rows(knockout), hide_index=True, width="stretch",
                 column_config={"probability": st.column_config.NumberColumn("probability", format="%.3f%%"),
                                "change": st.column_config.NumberColumn("change", format="%+.2f%%")})
    where = "the box's image tokens" if box else "every image token"
    st.caption(f"“{escape_markdown(visible(answer.pieces[token]))}”: its probability with the edges from its query to "
               f"{where} blocked in each window of layers, and the change from its probability without "
               f"({knockout.baseline:.3%}).")
    return vlm_inside.knockout_lines(knockout, f"the box {vlm_inside.box_text(box)}" if box else "the whole image")


def heads(answer: VLMAnswer, token: int, image: int, on_pick) -> dict[str, str]:
    """On demand: every head's attention sum on the image at the clicked token's query, a layer x head grid whose
    cell, clicked, draws that head's map; the localization heads ranked (``VLMAnswer.grounding_heads``)."""
    if not st.toggle("The heads that ground the token (layer × head)", key=HEADS_KEY,
                     help="Each head's share of its attention on the image at the token's query; the localization "
                          "heads (Kang et al., CVPR 2025) ranked by spatial entropy. Click a head for its map."):
        return {}
    try:
        scores = kept(answer, ("heads", token, image), partial(answer.grounding_heads, token, image))
    except ValueError as e:  # a question about several images
        st.error(one_line(e))
        return {}
    st.dataframe(vlm_inside.heads_rows(scores), hide_index=True, width="stretch", key=GRID_KEY,
                 on_select=on_pick, selection_mode="single-cell",
                 column_config={f"head {h + 1}": st.column_config.NumberColumn(f"head {h + 1}", format="%.1f%%")
                                for h in range(answer.heads)})
    st.caption(f"Each head's attention on the image at the query of “{escape_markdown(visible(answer.pieces[token]))}"
               f"” (% of its row); click a cell for that head's map. Localization heads, best first: "
               f"{escape_markdown(vlm_inside.ranked_text(scores))}.")
    return vlm_inside.heads_lines(scores)
