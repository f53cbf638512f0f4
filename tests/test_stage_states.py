"""The hidden states of a model with stages (Swin, Swin V2, Hiera), each layer's on its own grid and width, row-major:
equal to HF's ``reshaped_hidden_states`` (each stage's end; Swin's before its downsampling, Hiera's rerolled from
its unrolled order) to 1e-5; and the dense views of a stage layer (PCA colours, patch similarity, correspondences)
against numbers computed by hand from those HF states."""

import pytest
import torch
from test_hiera_parity import save_hf_hiera
from test_swin_parity import _hf

from vit.explain.hidden import forward_with_hidden_states, forward_with_stage_states
from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing transformers takes seconds


def stage_ends(checkpoint) -> list[int]:
    """The state index (0: the embedding, l + 1: block l's output) at each stage's end."""
    c = checkpoint.model.config
    return [0] + [c.stage_start(s) + c.stage_depths[s] for s in range(c.num_stages)]


@pytest.mark.parametrize("kind, size", [("swin", 40), ("swinv2", 32)])
def test_swin_states_are_hf_reshaped_hidden_states(tmp_path, kind, size):
    model = _hf(kind, size)
    model.save_pretrained(tmp_path)
    checkpoint = open_source(tmp_path)
    images = torch.randn(2, 3, size, size)
    with torch.no_grad():
        swin = model.swinv2 if kind == "swinv2" else model.swin  # V2's model does not pass "before downsampling" on
        hf = swin.encoder(*swin.embeddings(images)[:2], output_hidden_states=True,
                          output_hidden_states_before_downsampling=True)
        logits, states = forward_with_stage_states(checkpoint.model, images)
    expected = [h.flatten(2).transpose(1, 2) for h in hf.reshaped_hidden_states]  # (B, C, H, W) -> (B, H*W, C)
    ours = [states[i] for i in stage_ends(checkpoint)]
    assert [s.shape for s in ours] == [e.shape for e in expected]  # e.g. 10x10 x 24, 10x10 x 24, 5x5 x 48 at 40 px
    for s, e in zip(ours, expected, strict=True):
        assert torch.allclose(s, e, atol=1e-5), (s - e).abs().max()
    assert logits.shape == (2, 5)
    with pytest.raises(ValueError, match="forward_with_stage_states"):
        forward_with_hidden_states(checkpoint.model, images)


def test_hiera_states_are_hf_rerolled_hidden_states(tmp_path):
    model = save_hf_hiera(tmp_path)
    checkpoint = open_source(tmp_path)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        hf = model.hiera(images, output_hidden_states=True)
        _, states = forward_with_stage_states(checkpoint.model, images)
    expected = [h.flatten(1, 2) for h in hf.reshaped_hidden_states]  # (B, H, W, C) -> (B, H*W, C)
    ours = [states[i] for i in stage_ends(checkpoint)]
    assert [s.shape[1:] for s in ours] == [(64, 8), (64, 8), (16, 16), (4, 32)]
    for s, e in zip(ours, expected, strict=True):
        assert torch.allclose(s, e, atol=1e-5), (s - e).abs().max()
    unrolled = hf.hidden_states[1]  # the library's own order is not row-major: a test that would see a mix-up
    assert not torch.allclose(states[1], unrolled, atol=1e-3)
