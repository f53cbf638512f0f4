"""The sidebar's checkpoint: the picker of shipped checkpoints, runs and the HF cache's models, and the fields that
open one by path or from the Hub."""

import streamlit as st

from app_pages.explorer_sections import starting
from app_pages.explorer_sections.caches import hf_cache_models
from app_pages.explorer_sections.hub_download import download_panel
from vit.app import catalog
from vit.checkpoint import CheckpointError
from vit.core.runfiles import default_checkpoints_dir
from vit.core.text import escape_markdown
from vit.runs import access

HF_FILTER, OPEN_PATH, OPEN_HUB = "Find in the HF cache", "Open a path", "Open from the Hub"
CHOICE_KEY = "explorer_checkpoint_choice"  # the model shown (a plain value, remembered across pages)


# A picker the server chooses for (a path or Hub id opened, another page's hand-off, a vanished file) is drawn under
# a widget key that moves on at each of the server's choices. The browser's next message still carries the old
# picker's value when it was sent before the new picker reached it (an upload or a click while a path opens, the run
# that opened it stopped for that message's run): under the old key that value is ignored, where under one key it
# chose the old model again and the path was lost.
def choose(key: str, value: str) -> None:
    """The picker of ``key`` (drawn by ``picker``) shows ``value`` from this run on, whatever the browser last said
    of the one before."""
    st.session_state[key] = value
    st.session_state[f"{key}-generation"] = st.session_state.get(f"{key}-generation", 0) + 1


def picker(where, label: str, options: list[str], key: str, **kwargs) -> str:
    """``where.selectbox(label, options, **kwargs)`` showing ``st.session_state[key]`` (one of ``options``: the last
    ``choose`` or the visitor's last pick), which it sets to the visitor's pick."""
    generation = st.session_state.get(f"{key}-generation", 0)
    chosen = where.selectbox(label, options, index=options.index(st.session_state[key]),
                             key=f"{key}-picker-{generation}", **kwargs)
    st.session_state[key] = chosen
    return chosen


def open_from_hub(text: str, may_download: bool, place=st.sidebar, key: str = "explorer_hub_download",
                  library_road: bool = False) -> catalog.Candidate | None:
    """The Hub model ``text`` names, drawn in ``place`` (the sidebar, or ``st`` for a page's body): the cached copy,
    else (for a visitor who may) its size on a Download button and, once pressed, the download's progress
    (``hub_download``: in the background, so the page stays usable and a rerun does not stop it); None, with the
    reason shown, until it is there. The explorer (``library_road``: a model no port reads too), the Analyse and
    the Train page share it."""
    # The Hub's answer takes a second, or up to its deadline on a slow network: said after half a second (a cached
    # plan answers at once, with nothing drawn)
    asking = f"Asking the Hub about {escape_markdown(text.strip()[:120])}…"
    try:
        with place.spinner(asking):
            found, wanted = catalog.open_from_hub(text, may_download, library_road)
        if wanted is not None and download_panel(wanted, key, place):  # its files just came: it opens now
            catalog.forget_hub_plans()
            with place.spinner(asking):
                found, _ = catalog.open_from_hub(text, may_download, library_road)
        return found
    except CheckpointError as e:
        place.error(escape_markdown(e))
        return None


def server_gate() -> access.Access:
    """This server's access rule (``vit.runs.access``: the one rule of every page), from its address and the
    configured token."""
    return access.server_access(st.get_option("server.address"), access.configured_token(st.secrets.get))


def may_open_path() -> bool:
    """Whether this visitor may read the server's files by path (``server_gate``)."""
    return server_gate().allows(st.session_state.get(access.UNLOCKED))


def pick_checkpoint() -> tuple[dict[str, catalog.CatalogEntry], str, bool]:
    """(every checkpoint offered by path, the one chosen, whether this visitor may read the server's files by
    path); stops the page, saying what to do, when there is none."""
    hf_dirs = catalog.hf_cache_dirs()
    hf_filter = ""
    if len(catalog.hf_cache_folders(hf_dirs)) > catalog.MAX_HF_CACHE_EXAMINED:  # folder names only: cheap
        hf_filter = st.sidebar.text_input(HF_FILTER, key="explorer_hf_filter", placeholder="part of a model's name",
                                          help="The Hugging Face cache holds more models than the picker lists: only "
                                               "those whose name holds this are looked at.")
    hf_listing = hf_cache_models(tuple(str(d) for d in hf_dirs), hf_filter, True)  # the library road's too
    candidates = catalog.find_checkpoints() + list(hf_listing.candidates)
    hf_chosen = st.session_state.get("explorer_hf_choice")  # kept in the picker when the name filter changes
    if hf_chosen is not None and hf_chosen not in candidates and hf_chosen.path.is_dir():  # unless deleted since
        candidates.append(hf_chosen)
    extra = st.session_state.setdefault("explorer_extra_checkpoints", [])  # opened by path here or from another page
    gate = server_gate()
    may_open = gate.allows(st.session_state.get(access.UNLOCKED))
    opened = ""  # a visitor the rule does not allow reads no file of the server by path: no field, nothing read
    if may_open:
        opened = st.sidebar.text_input(
            OPEN_PATH, key="explorer_open_path", placeholder="/path/to/model folder or file",
            help="A file or folder on the server: one of our .pt checkpoints, a Hugging Face or timm model folder, "
                 "timm / torchvision weights, or a from-scratch ViT (a tutorial's experiment folder, vit-pytorch "
                 "weights).").strip()
    elif gate.mode == "token":
        st.sidebar.caption("Opening a model by its path on the server needs the token: enter it on the Train page.")
    hub_text = st.sidebar.text_input(
        OPEN_HUB, key="explorer_open_hub", placeholder="google/vit-base-patch16-224",
        help="A model on the Hugging Face Hub: ORG/NAME[@REVISION], hf-hub:ORG/NAME or a timm model name. Downloaded "
             "into the Hugging Face cache (its safetensors and configs, never code) when it is not there yet.").strip()
    from_hub = open_from_hub(hub_text, may_open, library_road=True) if hub_text else None
    opened_hub = str(from_hub.path) if from_hub is not None else None
    if opened_hub is not None and opened_hub != st.session_state.get("explorer_opened_hub"):
        if from_hub not in candidates + extra:
            extra.append(from_hub)
        choose(CHOICE_KEY, opened_hub)  # what was just opened is shown
    # What was asked for is marked as done only after ``choose``: a run stopped before it (a newer one was asked
    # for) leaves it to the next run.
    st.session_state["explorer_opened_hub"] = opened_hub
    handed = st.session_state.get("explorer_checkpoint")  # another page's (or a link's) model
    requested = handed or (opened if opened != st.session_state.get("explorer_opened_path") else None)
    if requested:
        wanted = catalog.candidate_for(requested, candidates + extra)
        if wanted not in candidates + extra:
            extra.append(wanted)
        choose(CHOICE_KEY, str(wanted.path))
    st.session_state.pop("explorer_checkpoint", None)
    st.session_state["explorer_opened_path"] = opened
    candidates = candidates + [c for c in extra if c not in candidates]
    # a model no port reads is listed as its library builds it: the page shows it in library_view
    entries = {str(c.path): catalog.describe_current(c, library_road=True) for c in candidates}

    st.sidebar.header("Checkpoint")
    if not entries:
        starting.clear()
        st.title("ViT Attention Explorer")
        st.info(f"No checkpoints yet: put a .pt file in {escape_markdown(default_checkpoints_dir())} or train "
                "a model on the Train page.")
        st.stop()
    default = catalog.default_entry(list(entries.values())) or next(iter(entries.values()))
    if st.session_state.get(CHOICE_KEY) not in entries:
        # Remembered across pages and reset when its file disappears.
        last = st.session_state.get("explorer_last_checkpoint", "")
        choose(CHOICE_KEY, last if last in entries else str(default.path))
    choice = picker(st.sidebar, "Checkpoint", list(entries), CHOICE_KEY, format_func=lambda p: entries[p].label,
                    help="Shipped checkpoints, completed training runs, the supported models of the local Hugging "
                         "Face cache and models opened by path.")
    st.session_state["explorer_last_checkpoint"] = choice
    entry = entries[choice]
    st.sidebar.caption(entry.description)
    hf_note = catalog.hf_cache_note(hf_listing, HF_FILTER, OPEN_PATH if may_open else None)
    if hf_note:
        st.sidebar.caption(escape_markdown(hf_note))
    if entry.source == "hf-cache":
        st.session_state["explorer_hf_choice"] = next(c for c in candidates if str(c.path) == choice)
    return entries, choice, may_open
