"""Who may drive the Train page: anyone on this machine, and from other machines only with a token.

The Train page starts processes, stops and deletes runs and shows their logs. While the server
listens on the loopback interface only (``server.address`` localhost, 127.0.0.1 or ::1, the
app's default) only people on this machine reach it. Once it listens on the network (for example
``--server.address 0.0.0.0``, or no address at all, which Streamlit takes as every interface), the
page asks for the token in ``$VIT_TRAIN_TOKEN`` (or ``train_token`` in Streamlit's secrets.toml),
as Jupyter does; without a token configured it is disabled and says how to enable it. A configured
token is asked for on localhost too (a reverse proxy may serve a localhost server to the network).
"""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass, field

TOKEN_ENV = "VIT_TRAIN_TOKEN"
TOKEN_SECRET = "train_token"  # the key in .streamlit/secrets.toml
MIN_TOKEN_LENGTH = 16  # a guessable token is no protection on a network


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
class TrainAccess:
    """How the Train page may be used: ``open`` (local server), ``token`` (networked, token set) or ``disabled``."""

    mode: str
    message: str
    token: str = field(default="", repr=False)

    def accepts(self, given: str | None) -> bool:
        """Whether ``given`` is the configured token (compared in constant time)."""
        if self.mode != "token" or not given:
            return False
        return hmac.compare_digest(given.encode("utf-8"), self.token.encode("utf-8"))


def train_access(address: str | None, token: str | None) -> TrainAccess:
    """The Train page's access rule for a server on ``address`` with ``token`` configured (or None).

    A configured token is always asked for, on localhost too: behind a reverse proxy on this machine
    the server listens on localhost yet serves the network.
    """
    local = is_local_address(address)
    if local and not token:
        return TrainAccess("open", "")
    where = "on this machine only" if local else f"on {address}" if (address or "").strip() \
        else "on every network interface"
    if not token:
        return TrainAccess("disabled", (
            f"Training is disabled: this server listens {where}, so anyone who can reach it could start, stop "
            f"and delete runs. To train here, set a token of at least {MIN_TOKEN_LENGTH} characters in the "
            f"{TOKEN_ENV} environment variable (or {TOKEN_SECRET} in .streamlit/secrets.toml) and restart the "
            "server, or run it on localhost."))
    if len(token) < MIN_TOKEN_LENGTH:
        return TrainAccess("disabled", (
            f"Training is disabled: the configured token is shorter than {MIN_TOKEN_LENGTH} characters, too easy "
            f"to guess for a server that listens {where}. Set a longer one and restart the server."))
    return TrainAccess("token", f"This server listens {where} and a training token is set: enter it to start, "
                                "stop or delete runs and read their logs.", token)


def may_download(address: str | None, token: str | None, unlocked: bool) -> bool:
    """Whether a visitor may start a model download from the Hub (disk and bandwidth on the server): by the Train
    page's rule, anyone on a local server without a token, else only a visitor who entered the training token
    (``unlocked``). Opening a model the HF cache already holds needs no download."""
    gate = train_access(address, token)
    return gate.mode == "open" or (gate.mode == "token" and unlocked)
