"""``vit.explore``: the explorer page on the model in hand, served from the notebook's own process (issue 117, item 5).
"""

from __future__ import annotations

import os

import torch

from vit.checkpoint import Checkpoint


def _opened(model, image_size, mean, std, grid, prefix) -> tuple[Checkpoint, str]:
    """(the checkpoint ``model`` is or opens as, a name for it); a one-line refusal for anything else."""
    from vit.api.loading import load

    keywords = {"image_size": image_size, "mean": mean, "std": std, "grid": grid, "prefix": prefix}
    if isinstance(model, torch.nn.Module):
        return load(model, **keywords), type(model).__name__
    if any(v is not None for v in keywords.values()):
        raise TypeError("image_size, mean, std, grid and prefix are for a module in hand (vit.explore(module, ...)); "
                        "a checkpoint, a folder or a Hub id declares its own")
    if isinstance(model, Checkpoint):
        return model, model.path.name if model.path is not None else type(model.model).__name__
    if isinstance(model, (str, os.PathLike)):
        return load(model), os.fspath(model)
    raise TypeError(f"vit.explore takes a torch module, a vit.load(...) checkpoint, a path or a Hub id, not a "
                    f"{type(model).__name__}")


def explore(model: torch.nn.Module | Checkpoint | str | os.PathLike, *, image_size: int | tuple[int, int] | None = None,
            mean: tuple[float, ...] | None = None, std: tuple[float, ...] | None = None,
            grid: tuple[int, int] | None = None, prefix: int | None = None, name: str | None = None,
            block: bool = True, open_browser: bool = True):
    """Opens the explorer page on ``model`` and, with ``block`` (the default), returns when the page is closed (its
    last browser tab gone for a few seconds) or stopped (Ctrl+C, the notebook's Stop); without it, returns at once
    the server's handle: ``.url``, ``.wait()``, ``.stop()``.

    ``model``: a live ``torch.nn.Module`` (opened as ``vit.load(module, image_size=..., mean=..., std=...,
    grid=..., prefix=...)`` opens it), the checkpoint ``vit.load`` gave for a module or a library's folder, or a
    path or Hub id (our own ViT's ``.pt`` opens on the page from its file, which only a path names for sure). The
    page is served from this process by Streamlit's own server, on 127.0.0.1 and a free port, with the app's access
    rule (``streamlit run app.py``'s: open to this machine's users unless a token is configured); a model in hand
    reaches it in memory, named by a random id in the page's ``?model=``: nothing of it is written or pickled.
    ``name``: what the page calls it (default: its class's name, or its file's). ``open_browser``: open the page in
    this machine's browser (the URL is printed either way)."""
    from vit.app.notebook import in_hand

    checkpoint, default_name = _opened(model, image_size, mean, std, grid, prefix)
    if checkpoint.road == "library":  # the page draws the very object, from memory
        text = in_hand.hold(checkpoint, name or default_name)
    elif isinstance(model, (str, os.PathLike)) and checkpoint.path is not None:  # our own ViT: the page opens its
        text = str(checkpoint.path)  # file, as a link to it does
    else:  # an object may differ from its file (vit.ablate's copy keeps the path): never its file in its place
        raise ValueError("this checkpoint opened as our own ViT, which the page opens from its file: "
                         "vit.explore(PATH) for the file; a copy changed in the notebook cannot be shown there yet")
    try:
        served = in_hand.serve(text)
    except BaseException:
        in_hand.forget(text)
        raise
    print(f"The explorer on {name or default_name}: {served.url}"
          + (" (close its tab, or stop this cell, to return)" if block else ""))
    if open_browser:
        import webbrowser

        webbrowser.open(served.url)
    if block:
        try:
            served.wait()
        except KeyboardInterrupt:  # the notebook's Stop: the page is closed, the call returns
            served.stop()
    return served
