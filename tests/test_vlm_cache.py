"""``vlm_cache.latent_layers``: a layer whose KV cache keeps other keys than its attention was handed (compressed
latents, expanded into keys after the cache) is found from the keys a recording kept, on hand-built tensors; a layer
whose cache keeps the keys it read is not, nor one whose keys the recording keeps itself."""

import types

import torch

from vit.explain.language.vlm_answer import _Recorder
from vit.explain.language.vlm_cache import latent_layers


def _recorded(handed: torch.Tensor) -> _Recorder:
    """A recorder of two layers, each handed ``handed`` (1, Hkv, 3, d) keys by one prompt call of 3 positions."""
    recorder = _Recorder({object(): 0, object(): 1})
    for layer in (0, 1):
        recorder.keep(layer, torch.zeros(1, 2, 3, 4), handed, handed, None, {})
    return recorder


def _cache(*keys: torch.Tensor):
    return types.SimpleNamespace(layers=[types.SimpleNamespace(keys=k) for k in keys])


def test_a_cache_of_other_keys_than_the_attention_read_is_found_by_layer():
    handed = torch.arange(24, dtype=torch.float32).reshape(1, 2, 3, 4)
    latents = torch.ones(1, 3, 5)  # (B, positions, latent): no head, other width
    assert latent_layers(_recorded(handed), _cache(handed, latents)) == {1}
    assert latent_layers(_recorded(handed), _cache(handed + 1, handed)) == {0}
    assert latent_layers(_recorded(handed), _cache(handed, handed)) == frozenset()


def test_a_layer_whose_keys_the_recording_keeps_is_not_read_from_the_cache():
    handed = torch.arange(24, dtype=torch.float32).reshape(1, 2, 3, 4)
    recorder = _Recorder({object(): 0, object(): 1}, latent=frozenset({1}))
    for layer in (0, 1):
        recorder.keep(layer, torch.zeros(1, 2, 3, 4), handed, handed, None, {})
    assert latent_layers(recorder, _cache(handed, torch.ones(1, 3, 5))) == frozenset()
    torch.testing.assert_close(recorder.keys_read(1, 0, None)[0], handed[0], rtol=0, atol=0)
