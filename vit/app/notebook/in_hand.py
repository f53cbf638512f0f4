"""Models in hand and the explorer served from the calling process (issue 117, item 5).

``vit.explore`` holds the model here, in memory, named by a random id that the explorer page reads from its
``?model=`` (``in-hand:ID``), and starts Streamlit's own server in a thread of the notebook's process, on 127.0.0.1
and a free port, running the app's ``app.py`` with the app's server defaults (``.streamlit/config.toml``), as
``streamlit run app.py`` does. Nothing of a model is written or pickled: the page runs in the same process and takes
the very object. The id is random and unguessable, so a page opens only the model whose link it was given; a model is
forgotten when its ``vit.explore`` call returns.

The access rule is the app's own (``vit.runs.access``): the server listens on the loopback address, so it is
``open`` to this machine's users unless a token is configured (``$VIT_TRAIN_TOKEN`` or the secrets file), when the
guarded things (training, paths on the server, downloads) ask for it, as on any other server of the app.

Streamlit keeps one runtime per process: one server serves every ``vit.explore`` call of the process while any is
open, and a later call starts a new one once it stopped.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import sys
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from vit.checkpoint import Checkpoint
from vit.core.runfiles import ROOT, app_root

PREFIX = "in-hand:"  # ``?model=in-hand:ID``: no catalogue name, path or Hub id starts so (a Hub id has no colon)
_HELD: dict[str, InHand] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class InHand:
    """One model in hand: what the page calls it (``name``), and the opened model."""

    name: str
    checkpoint: Checkpoint


def is_in_hand(text: str | None) -> bool:
    """Whether a ``?model=`` value names a model in hand."""
    return bool(text) and str(text).startswith(PREFIX)


def hold(checkpoint: Checkpoint, name: str) -> str:
    """Holds ``checkpoint`` for the page under a fresh random id; returns the ``?model=`` value that names it."""
    if not isinstance(checkpoint, Checkpoint):
        raise TypeError(f"a model in hand is a vit.load(...) checkpoint, not a {type(checkpoint).__name__}")
    text = PREFIX + secrets.token_urlsafe(16)
    with _LOCK:
        _HELD[text] = InHand(str(name), checkpoint)
    return text


def held(text: str | None) -> InHand | None:
    """The model in hand ``text`` names, or None (never held, or forgotten since)."""
    with _LOCK:
        return _HELD.get(str(text)) if is_in_hand(text) else None


def forget(text: str) -> None:
    """Lets the model ``text`` names go: the page no longer opens it."""
    with _LOCK:
        _HELD.pop(text, None)


def count() -> int:
    """How many models are held now."""
    with _LOCK:
        return len(_HELD)

# -- the server --------------------------------------------------------------------------------------------------------

ADDRESS = "127.0.0.1"  # the loopback address only: the access rule's ``open`` server (no token configured)
START_TIMEOUT_S = 120.0
# After the last browser tab left: how long the page may be gone before the call returns (a reload reconnects within
# a second; a closed tab does not)
CLOSED_AFTER_S = 3.0
POLL_S = 0.2


def free_port(address: str = ADDRESS) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def server_options(root: Path, port: int) -> dict[str, object]:
    """Streamlit's options for the server: the app's ``.streamlit/config.toml`` (as ``vit.explorer`` passes them to
    ``streamlit run``), then this server's address, port and a headless start (the caller opens the page)."""
    options: dict[str, object] = {}
    try:
        settings = tomllib.loads((root / ".streamlit" / "config.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        settings = {}
    for section, values in settings.items():
        if isinstance(values, dict):
            options |= {f"{section}.{key}": value for key, value in values.items()}
    return options | {"server.address": ADDRESS, "server.port": port, "server.headless": True,
                      "browser.gatherUsageStats": False, "server.fileWatcherType": "none"}


@dataclass
class _Serving:
    """The one server of this process: its URL, its event loop's thread and Streamlit's ``Server``."""

    url: str
    server: object
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    users: set = field(default_factory=set)  # the ``?model=`` values of the calls it serves now


_SERVING: _Serving | None = None
_LOCK = threading.Lock()


def _start() -> _Serving:
    from streamlit import config
    from streamlit.runtime import Runtime, RuntimeState
    from streamlit.web import bootstrap
    from streamlit.web.server import Server

    running = Runtime._instance
    if running is not None and running.state not in (RuntimeState.INITIAL, RuntimeState.STOPPED):
        raise RuntimeError("vit.explore serves the explorer from a notebook or a script: this process already runs "
                           "a Streamlit app, whose page can open the model instead")
    root = app_root()
    if not (root / "app.py").is_file():
        raise RuntimeError(f"the app's files are not installed next to vit ({root}); reinstall the package")
    if root != ROOT:  # installed: runs and data beside the notebook, as vit-explorer keeps them
        os.environ.setdefault("VIT_RUNS_DIR", str(Path.cwd() / "runs"))
        os.environ.setdefault("VIT_DATA_DIR", str(Path.cwd() / "data"))
    if str(root) not in sys.path:  # app.py imports app_pages from its own folder, as streamlit run lets it
        sys.path.insert(0, str(root))
    port = free_port()
    config._config_options = None  # a fresh parse: an earlier server's options are no running server's to warn about
    config.get_config_options(force_reparse=True, options_from_flags=server_options(root, port))
    Runtime._instance = None  # a server stopped earlier in this process leaves its runtime behind; it is done
    script = str(root / "app.py")
    server = Server(script, False)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    failure: list[BaseException] = []

    async def serve() -> None:
        try:
            await server.start()
            bootstrap.prepare_streamlit_environment(script)  # MIME types, the secrets file: as streamlit run
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            failure.append(e)
            started.set()
            return
        started.set()
        await server.stopped

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(serve())
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="vit.explore server", daemon=True)
    thread.start()
    if not started.wait(START_TIMEOUT_S) or failure:
        raise RuntimeError(f"the explorer's server did not start on {ADDRESS}:{port}"
                           + (f": {failure[0]}" if failure else ""))
    return _Serving(f"http://{ADDRESS}:{port}", server, loop, thread)


def _stop(serving: _Serving) -> None:
    serving.loop.call_soon_threadsafe(serving.server.stop)
    serving.thread.join(timeout=30)


@dataclass
class Explorer:
    """What ``vit.explore`` serves: ``url`` (the page on the model), ``wait()`` until its page is closed and
    ``stop()``. The server stops when its last call stops."""

    url: str
    model: str  # the ``?model=`` value
    _serving: _Serving = field(repr=False)
    _stopped: bool = field(default=False, repr=False)

    @property
    def running(self) -> bool:
        return not self._stopped and self._serving.thread.is_alive()

    def wait(self, closed_after_s: float = CLOSED_AFTER_S) -> None:
        """Until the page was opened and every browser tab of the server has left it for ``closed_after_s`` (or the
        server stopped), then ``stop()``; Ctrl+C (KeyboardInterrupt) stops it too."""
        seen, gone_since = False, None
        try:
            while self.running:
                connected = self._serving.server.browser_is_connected
                seen = seen or connected
                if connected:
                    gone_since = None
                elif seen:
                    gone_since = gone_since or time.monotonic()
                    if time.monotonic() - gone_since >= closed_after_s:
                        break
                time.sleep(POLL_S)
        finally:
            self.stop()

    def stop(self) -> None:
        """The page no longer opens this model; the server stops when no other call uses it."""
        global _SERVING
        if self._stopped:
            return
        self._stopped = True
        forget(self.model)
        with _LOCK:
            self._serving.users.discard(self.model)
            if self._serving.users or _SERVING is not self._serving:
                return
            _SERVING = None
        _stop(self._serving)


def serve(model: str) -> Explorer:
    """The explorer page on ``model`` (a ``?model=`` value: ``in_hand.hold``'s, or a path the page opens under the
    access rule), served from this process; the server is started unless one of this process runs."""
    global _SERVING
    from urllib.parse import urlencode

    with _LOCK:
        if _SERVING is None or not _SERVING.thread.is_alive():
            _SERVING = _start()
        _SERVING.users.add(model)
        serving = _SERVING
    return Explorer(f"{serving.url}/?{urlencode({'model': model})}", model, serving)
