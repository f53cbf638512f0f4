"""The one access rule of every page: open on a loopback address without a token, token-only once a token is set
(on any address), disabled on a network without one."""

import pytest

from vit.runs.access import MIN_TOKEN_LENGTH, TOKEN_ENV, is_local_address, server_access

TOKEN = "correct-horse-battery-staple"


@pytest.mark.parametrize("address, local", [
    ("localhost", True), ("LOCALHOST", True), ("127.0.0.1", True), ("127.0.1.1", True), ("::1", True),
    ("[::1]", True), ("0.0.0.0", False), ("::", False), ("", False), (None, False), ("192.168.1.20", False),
    ("example.org", False), ("10.0.0.1", False),
])
def test_only_loopback_addresses_are_local(address, local):
    # Streamlit listens on every interface when server.address is empty.
    assert is_local_address(address) is local


def test_a_local_server_needs_no_token():
    assert server_access("localhost", None).mode == "open"


def test_a_networked_server_without_a_token_disables_what_reaches_the_server_and_says_how_to_enable_it():
    gate = server_access("0.0.0.0", None)
    assert gate.mode == "disabled"
    assert "listens on 0.0.0.0" in gate.message and TOKEN_ENV in gate.message
    assert server_access("", None).message.count("every network interface") == 1


def test_a_short_token_is_refused_as_too_easy_to_guess():
    gate = server_access("0.0.0.0", "x" * (MIN_TOKEN_LENGTH - 1))
    assert gate.mode == "disabled" and "shorter than" in gate.message


def test_a_networked_server_with_a_token_accepts_only_that_token():
    gate = server_access("0.0.0.0", TOKEN)
    assert gate.mode == "token"
    assert gate.accepts(TOKEN)
    assert not gate.accepts(TOKEN[:-1]) and not gate.accepts("") and not gate.accepts(None)
    assert TOKEN not in repr(gate), "the token never shows up in a repr (logs, tracebacks)"


def test_a_configured_token_is_asked_for_on_localhost_too():
    # Behind a reverse proxy on this machine the server listens on localhost yet serves the network.
    gate = server_access("localhost", TOKEN)
    assert gate.mode == "token" and gate.accepts(TOKEN) and not gate.accepts("guess")


def test_an_open_gate_accepts_no_token():
    assert not server_access("localhost", None).accepts(TOKEN)


@pytest.mark.parametrize("address", ["localhost", "127.0.0.1", "0.0.0.0", ""])
def test_with_a_token_on_any_address_only_an_unlocked_session_is_allowed(address):
    # Behind a reverse proxy the server listens on localhost: the token, not the address, decides.
    gate = server_access(address, TOKEN)
    assert gate.allows(True) and not gate.allows(False) and not gate.allows(None)


def test_an_open_server_allows_every_session_and_a_disabled_one_none():
    assert server_access("localhost", None).allows(False)
    assert not server_access("0.0.0.0", None).allows(True)
    assert not server_access("localhost", "short").allows(True)


def test_the_token_comes_from_the_environment_before_the_secrets_and_an_unreadable_secrets_file_is_no_token(
        monkeypatch):
    from vit.runs.access import configured_token

    def broken(key):
        raise FileNotFoundError("no secrets.toml")

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert configured_token(broken) is None
    assert configured_token({"train_token": TOKEN}.get) == TOKEN
    monkeypatch.setenv(TOKEN_ENV, "from-the-environment")
    assert configured_token(broken) == "from-the-environment"
