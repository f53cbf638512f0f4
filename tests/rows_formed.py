"""A spy on the probabilities the recorders form at an SDPA call (``attention_recorder.sdpa_probabilities``, which
both roads' recorders compute through): each call's ``(rows, keys)`` noted, so a test of a one-row map can check that
no call formed more than the asked row (issue 117's speed item: only the asked rows formed)."""

from __future__ import annotations


def spy_formed(monkeypatch) -> list[tuple[int, int]]:
    """The list each SDPA call's formed ``(rows, keys)`` is appended to, from now until ``monkeypatch`` undoes it."""
    from vit.core import attention_recorder

    original, formed = attention_recorder.sdpa_probabilities, []

    def spy(query, key, *args, **kwargs):
        out = original(query, key, *args, **kwargs)
        formed.append(tuple(out.shape[-2:]))
        return out

    monkeypatch.setattr(attention_recorder, "sdpa_probabilities", spy)
    return formed
