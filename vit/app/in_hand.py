"""Models in hand (issue 117, item 5): the models ``vit.explore`` serves from the notebook's own process, held here in
memory and named by a random id, which the explorer page reads from its ``?model=`` (``in-hand:ID``).

Nothing of a model is written or pickled: the page runs in the same process as the notebook (Streamlit's server in
a thread, ``vit.app.explore_server``) and takes the very object. The id is random and unguessable, so a page opens
only the model whose link it was given; a model is forgotten when its ``vit.explore`` call returns.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass

from vit.checkpoint import Checkpoint

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
