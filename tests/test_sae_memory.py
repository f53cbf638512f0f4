"""``python -m vit.sae train`` checks the width, k and the buffer against memory before anything runs, and says in
one line how many latents would fit."""

import pytest

from vit.features import train
from vit.features.sae import SAEError
from vit.features.train import SAESettings, check_settings, memory_needed


def test_the_refusal_names_the_largest_width_that_fits(monkeypatch):
    monkeypatch.setattr(train, "available_memory", lambda device: 2 * 2**30)
    settings = dict(layer=1, k=16, batch_size=512, buffer_tokens=65536)
    with pytest.raises(SAEError, match=r"at most [\d,]+ latents fit") as error:
        check_settings(SAESettings(width=10**6, **settings), 768, 12, "cpu", held_out_rows=64 * 197)
    fits = int(str(error.value).split("at most ")[1].split(" ")[0].replace(",", ""))
    assert "\n" not in str(error.value)
    assert memory_needed(768, fits, 512, 65536, 64 * 197) <= 2**30 < memory_needed(768, fits + 1, 512, 65536, 64 * 197)
    check_settings(SAESettings(width=fits, **settings), 768, 12, "cpu", held_out_rows=64 * 197)
    with pytest.raises(SAEError):
        check_settings(SAESettings(width=fits + 1, **settings), 768, 12, "cpu", held_out_rows=64 * 197)


def test_the_held_out_pass_counts_against_memory():
    without = memory_needed(96, 768, 512, 65536)
    assert memory_needed(96, 768, 512, 65536, held_out_rows=64 * 65) > without + 64 * 65 * 768 * 8
