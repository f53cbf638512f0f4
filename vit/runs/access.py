"""Who may use what reaches beyond the page: one rule for every page, from the server's address and its token.

Some things a page offers act on the server itself: training runs (start, stop, delete, their logs), reading
the server's files by path (the explorer's and the Analyse page's "Open a path", the Analyse page's image folder)
and work on the Ray cluster. Who may use them:

- ``open``: the server listens on the loopback interface only (``server.address`` localhost, 127.0.0.1 or ::1,
  the app's default) and no token is configured: only people on this machine reach it.
- ``token``: a token is configured (``$VIT_TRAIN_TOKEN`` or ``train_token`` in Streamlit's secrets.toml), on any
  address, localhost included: a reverse proxy on this machine serves a localhost server to the network, and the
  server cannot tell. Only a session that has entered the token may use them; one entry unlocks every page.
- ``disabled``: the server listens on the network (``--server.address 0.0.0.0``, a LAN address, or no address
  at all, which Streamlit takes as every interface) without a token, or with one too short to resist guessing.

Even where the rule allows it, image folders the Analyse page reads lie inside the data roots, as the Train page's
``folder:`` datasets do (``vit.runs.launch.folder_problem``).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Callable
from dataclasses import dataclass, field

TOKEN_ENV = "VIT_TRAIN_TOKEN"
TOKEN_SECRET = "train_token"  # the key in .streamlit/secrets.toml
MIN_TOKEN_LENGTH = 16  # a guessable token is no protection on a network
UNLOCKED = "access_unlocked"  # where a page keeps that its visit entered the token: every page reads the same key
GUARDED = "training, opening the server's files by path, analysing its image folders and the Ray cluster"


def configured_token(read_secret: Callable[[str], object]) -> str | None:
    """The token: ``$VIT_TRAIN_TOKEN``, else ``train_token`` read by ``read_secret`` (Streamlit's ``st.secrets.get``);
    None when neither is set or the secrets file cannot be read."""
    token = os.environ.get(TOKEN_ENV)
    if not token:
        try:
            token = read_secret(TOKEN_SECRET)
        except Exception:  # noqa: BLE001 - no secrets.toml, or an unreadable one: no token
            return None
    return str(token) if token else None


def is_local_address(address: str | None) -> bool:
    """Whether Streamlit's ``server.address`` keeps the server on this machine (a loopback address).

    An empty or missing address is not local: Streamlit then listens on every interface.
    """
    text = (address or "").strip().strip("[]").lower()
    if text == "localhost":
        return True
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Access:
    """How what reaches beyond the page may be used: ``open`` (local server, no token), ``token`` (a token is
    configured: after it is entered) or ``disabled``."""

    mode: str
    message: str
    token: str = field(default="", repr=False)

    def accepts(self, given: str | None) -> bool:
        """Whether ``given`` is the configured token (compared in constant time)."""
        if self.mode != "token" or not given:
            return False
        return hmac.compare_digest(given.encode("utf-8"), self.token.encode("utf-8"))

    def allows(self, unlocked: bool) -> bool:
        """Whether a session may train, read the server's files by path and use the Ray cluster: always on an
        ``open`` server, after the token was entered (``unlocked``) on a ``token`` one, never when ``disabled``."""
        return self.mode == "open" or (self.mode == "token" and bool(unlocked))


def server_access(address: str | None, token: str | None) -> Access:
    """The access rule of a server on ``address`` with ``token`` configured (or None).

    A configured token is always asked for, on localhost too: behind a reverse proxy on this machine
    the server listens on localhost yet serves the network.
    """
    local = is_local_address(address)
    if local and not token:
        return Access("open", "")
    where = "on this machine only" if local else f"on {address}" if (address or "").strip() \
        else "on every network interface"
    if not token:
        return Access("disabled", (
            f"This server listens {where}, so anyone who can reach it could use it: {GUARDED} are disabled. To "
            f"use them here, set a token of at least {MIN_TOKEN_LENGTH} characters in the {TOKEN_ENV} environment "
            f"variable (or {TOKEN_SECRET} in .streamlit/secrets.toml) and restart the server, or run it on "
            "localhost."))
    if len(token) < MIN_TOKEN_LENGTH:
        return Access("disabled", (
            f"The configured token is shorter than {MIN_TOKEN_LENGTH} characters, too easy to guess for a server "
            f"that listens {where}: {GUARDED} are disabled. Set a longer one and restart the server."))
    return Access("token", f"This server listens {where} and a token is set: enter it to use {GUARDED} (once "
                           "per visit, for every page).", token)
