"""The app server the browser modules share, and the page steps they repeat (issue 112).

Seven browser modules served the same world, each from a server of its own: the tiny random model under the default
name with its sample (test_browser_explorer, _map_labels, _library_reload, _reload_pages, _share's link) and models
opened by path on a server without a token (_reload_pages, _ask_vlm, _library_reload, _vlm_words, _concepts;
_library_reload is now _reload_pages' library case).
``serve_local_app`` is that server, started once per test process by the session fixture ``local_app``
(tests/conftest.py): the browser modules run on one xdist worker (their group, tests/conftest.py ``_group``), so one
start and one load of each model (the app caches them by path) where there were seven. It stops after the run's last
test that asks for it (``stop_after``), as the worker's Chromium stops with its last browser test, not idle beside
every later test. Each test still opens its pages in browser contexts of its own: a new Streamlit session, no cookie,
no storage. A module whose check needs a server of its own (a token, a counted run, a watched memory peak, a fresh
interpreter, a world of its own: hostile class names, an empty checkpoints folder) keeps starting one.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import numpy as np
from helpers import ship_default, streamlit_app
from PIL import Image

from vit.core.runfiles import DEFAULT_CHECKPOINT
from vit.model import ViTConfig
from vit.runs.access import TOKEN_ENV

TINY = ViTConfig(image_size=16, patch_size=4, num_channels=3, num_classes=3, hidden_size=16, num_layers=2,
                 num_heads=2, mlp_size=32)  # a 4 x 4 patch grid
CLASSES = ["airplane", "cat", "dog"]
# The shipped model's samples: (file name, width, height, seed of its noise). The first is the one the page opens on.
SAMPLES = (("cat_1.png", 32, 32, 1), ("dog_1.png", 40, 24, 3))


def png(width: int, height: int, seed: int) -> bytes:
    """A PNG of random pixels (seeded)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def ship_tiny(root: Path, samples=SAMPLES, metadata: dict | None = None) -> tuple[Path, Path]:
    """``TINY`` (random, seed 0, three classes) under the default name with ``samples`` beside it; returns the
    checkpoints and (empty) runs folders."""
    checkpoints, runs = ship_default(root, TINY, CLASSES, metadata=metadata)
    folder = checkpoints / "samples" / Path(DEFAULT_CHECKPOINT).stem
    folder.mkdir(parents=True)
    for name, width, height, seed in samples:
        (folder / name).write_bytes(png(width, height, seed))
    return checkpoints, runs


@dataclass(frozen=True)
class LocalApp:
    """A running app server: its address and the folders it serves from."""

    url: str
    checkpoints: Path
    runs: Path
    root: Path  # its HOME, Hugging Face folders and log


@contextmanager
def serve_local_app(root: Path) -> Iterator[LocalApp]:
    """``streamlit run app.py`` on the tiny model shipped with ``SAMPLES`` (its metadata names a dataset and an
    accuracy), HOME and the Hugging Face folders under ``root``, and no token: a local visitor may open paths."""
    checkpoints, runs = ship_tiny(root, metadata={"dataset": "folder:data/tiny", "val_acc": 0.5})
    env = {"VIT_CHECKPOINTS_DIR": str(checkpoints), "VIT_RUNS_DIR": str(runs), "HOME": str(root),
           "HF_HOME": str(root / "hf-home"), "HF_HUB_CACHE": str(root / "hf-cache")}
    with streamlit_app(env, log=root / "server.log", unset=(TOKEN_ENV,)) as (url, _):
        yield LocalApp(url, checkpoints, runs, root)


_RUNNING: list[ExitStack] = []  # the process's shared server while it runs (conftest's ``local_app``)


@contextmanager
def shared_local_app(root: Path) -> Iterator[LocalApp]:
    """``serve_local_app`` that ``stop_after`` may stop before the context ends (``local_app``'s session)."""
    with ExitStack() as stack:
        app = stack.enter_context(serve_local_app(root))
        _RUNNING.append(stack)
        try:
            yield app
        finally:
            if stack in _RUNNING:
                _RUNNING.remove(stack)


def stop_after(item) -> None:
    """Stop the shared server after ``item`` when ``item`` asks for it and no later test of this run does (the
    session fixture's value is then never read again)."""
    if not _RUNNING or "local_app" not in item.fixturenames:
        return
    items = item.session.items
    later = items[items.index(item) + 1:] if item in items else []
    if not any("local_app" in other.fixturenames for other in later):
        while _RUNNING:
            _RUNNING.pop().close()


def save_llava(folder: Path) -> Path:
    """test_vlm_answer's tiny LLaVA (seed 0, its weights spread by ``noisy``) saved whole in ``folder``."""
    import torch
    from test_vlm_answer import _build, noisy

    torch.manual_seed(0)
    model, processor = _build("llava")
    noisy(model).save_pretrained(folder, max_shard_size="20KB")
    processor.save_pretrained(folder)
    return folder


# -- page steps ---------------------------------------------------------------------------------------------------

def enter(field, text: str, timeout_ms: float | None = None) -> None:
    """Type ``text`` into ``field`` (a text box or number input) and press Enter, as a user commits it (each step
    within ``timeout_ms``: the page's default when None)."""
    field.fill(text, timeout=timeout_ms)
    field.press("Enter", timeout=timeout_ms)


def upload_image(page, image: Path) -> None:
    """Give ``image`` to the sidebar's uploader."""
    page.locator('[data-testid="stSidebar"] input[type="file"]').set_input_files(str(image))


def open_with_image(page, url: str, model: Path, image: Path, query: str = ""):
    """Open the page of ``model`` (a folder) by its link, ``query`` appended (``&name=value...``), and upload
    ``image``; returns the page's main area."""
    page.goto(f"{url}?model={quote(str(model))}{query}")
    upload_image(page, image)
    return page.locator('[data-testid="stMain"]')


def ask_the_vlm(page, url: str, model: Path, image: Path, question: str, length: int,
                clip: Path | None = None, frames: int | None = None):
    """"Ask the VLM" on ``model`` with ``image``: the answer's length set, a ``clip`` (and its ``frames``) given
    when asked, and ``question`` typed and sent; returns the page's main area."""
    main = open_with_image(page, url, model, image)
    enter(main.get_by_role("spinbutton", name="Answer length"), str(length))
    if clip is not None:
        uploader = main.locator('[data-testid="stFileUploader"]').filter(has_text="Or a clip to ask about instead")
        uploader.locator('input[type="file"]').set_input_files(str(clip))
        enter(main.get_by_role("spinbutton", name="Clip frames"), str(frames))
    enter(main.get_by_role("textbox", name="Question"), question)
    return main
