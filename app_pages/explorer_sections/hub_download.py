"""A Hub download on a page: its size on a Download button, then the transfer in a worker thread the whole server
shares, its progress redrawn every second with a Stop button.

The transfer does not run in the page's script: a click, an upload or any message from the browser reruns the
script and would stop it there, and huggingface_hub deletes a file it did not finish, so a multi-gigabyte model
would start over and the visitor see the Download button again. Here the page only starts it and watches it; every
visitor who asks for the same files at the same commit watches the one transfer (``vit.app.work.Shared``). It stops
when a visitor stops it, or when no page has shown it for ``LEASE_S`` (nobody asks for that model any more); at
most ``at_once()`` run on the server, the others wait and say so.
"""

import os

import streamlit as st

from vit.app import work
from vit.core.text import escape_markdown
from vit.sources import hub

AT_ONCE_ENV = "VIT_DOWNLOADS_AT_ONCE"
DEFAULT_AT_ONCE = 2  # transfers share the server's bandwidth: more at once only make each slower
# Its progress is not redrawn while the page's script runs (a fragment waits for the run), and a run may open a
# large model for minutes: a download is stopped only once nobody asked for it longer than that. Left to run, its
# files are in the cache for the next visitor; the number at once stays bounded.
LEASE_S = 300.0
POLL_S = 1.0  # how often the progress redraws (and tells the transfer a page still shows it)
QUICK_S = 1.0  # a download done within this after its click opens at once, with no progress drawn
STOPPED_BY_VISITOR = "stopped by a visitor"


def at_once() -> int:
    """How many Hub downloads may run at once on this server: ``VIT_DOWNLOADS_AT_ONCE``, else 2."""
    value = os.environ.get(AT_ONCE_ENV, "").strip()
    return int(value) if value.isdigit() and int(value) >= 1 else DEFAULT_AT_ONCE


@st.cache_resource(show_spinner=False)
def downloads(size: int) -> work.Shared:
    """The server's downloads (every session shares them)."""
    return work.Shared(size, lease_s=LEASE_S)


def _key(wanted: hub.Download) -> tuple:
    # by the files at a commit, not the name typed: "org/model" and "org/model@main" share one transfer
    return "hub-download", wanted.name.repo_id, wanted.commit, wanted.files


def download_panel(wanted: hub.Download, key: str, place=st) -> bool:
    """Draw, in ``place`` (``st`` or ``st.sidebar``), the download of ``wanted``: its summary and a Download button
    (``key``), its progress and a Stop button while it runs, how it ended when it stopped or failed. True once
    its files are in the HF cache (the page then opens them), False while they are not."""
    registry = downloads(at_once())
    job = registry.get(_key(wanted))
    if job is not None and job.state == "done":
        registry.forget(job)
        return True
    holder = place.empty()  # emptied when the download ends within this run: its size and button say nothing more
    box = holder.container()
    box.caption(escape_markdown(wanted.summary))
    if job is None or job.finished:
        said, button = box.empty(), box.empty()  # emptied once the button is clicked: the progress takes their place
        if job is not None:  # stopped or failed: why, and the button again
            job.touch()
            (said.info if job.state == "stopped" else said.error)(escape_markdown(job.describe()))
        if not button.button(f"Download {hub.format_bytes(wanted.size)}", key=key):
            return False
        said.empty()
        button.empty()
        job = registry.start(_key(wanted), f"Downloading {wanted.name}", lambda progress: hub.download(
            wanted, progress), unit="bytes")
        waited = 0.0
        while waited < QUICK_S and not job.wait(min(POLL_S, QUICK_S - waited)):
            job.touch()  # this run waits for it: its page is showing it
            waited += POLL_S
        if job.state == "done":
            registry.forget(job)
            holder.empty()
            return True
    job.touch()
    with box:
        _progress(wanted, key)
    return False


@st.fragment(run_every=POLL_S)
def _progress(wanted: hub.Download, key: str) -> None:
    """The running download's bar and Stop button, redrawn every ``POLL_S``; the page reruns once it has ended.
    A Stop click is read before the button is drawn, so it takes effect in this run."""
    job = downloads(at_once()).get(_key(wanted))
    if job is None or job.finished:
        st.rerun()  # the page opens the files, or says how the download ended
    if st.session_state.get(f"{key}-stop"):
        job.stop(STOPPED_BY_VISITOR)
        if job.wait(2.0):  # most transfers stop within a chunk
            st.rerun()
    job.touch()
    st.progress(job.fraction(), text=escape_markdown(job.describe()))
    st.button("Stop", key=f"{key}-stop", help="Stops the download; a file not finished is fetched again from its "
              "start next time (the files finished stay in the cache).")


def snapshot_files_panel(folder, missing: list[str], may_download: bool, key: str, why: str, place=st) -> bool:
    """Whether the section may go on: ``missing`` (weights files ``folder`` lacks) is empty, or ``folder`` is no
    snapshot of the server's HF cache (the section's own reading says what it lacks). Else, a sharded VLM opened
    from the Hub with its tower's shards alone: ``why`` (a caption: what needs them) and those files on a Download
    button beside the page (``download_panel``), in ``place``, False until they are in, then the page runs again;
    or why not, in one line (a visitor who may not download, a download over the bound or the disk)."""
    from vit.app import catalog

    name = hub.snapshot_of(folder) if missing else None
    if name is None:
        return True
    try:
        wanted = catalog.missing_from_hub(name, frozenset(missing), may_download)
    except hub.HubError as e:
        place.error(escape_markdown(str(e)))
        return False
    absent = sorted(set(missing) - {f for f, _ in wanted.files})  # the index names files the Hub has not either
    if absent:
        place.error(escape_markdown(f"{name.repo_id} lacks {absent[0]}, which its index lists and the Hub does not "
                                    "have either"))
        return False
    place.caption(why)
    if not download_panel(wanted, key, place):
        return False
    catalog.forget_hub_plans()
    st.rerun()  # the sections drawn above this one saw the files missing (another section's offer of one of them)
