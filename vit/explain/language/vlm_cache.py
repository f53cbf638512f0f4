"""Which keys a VLM answer's rows are read from, per layer of its language model: the decoder layer whose KV cache
holds them (``cache_sources``), the window that cache keeps (``cache_windows``), and the layers whose cache keeps
other keys than its attention reads (``latent_layers``: Mistral Large 4's and dots.ocr 3's compressed latents,
expanded into keys after the cache; Idefics' cross-attention, whose keys no cache keeps), whose keys the answer then
keeps itself as each call hands them over."""

from __future__ import annotations

import torch


def latent_layers(recorder, cache) -> frozenset[int]:
    """The layers of ``recorder`` (a ``vlm_answer._Recorder``) whose ``cache`` keeps other keys than their attention
    was handed: checked at the last call's own position, where every row would be formed from the cache's keys."""
    latent = set()
    for layer, own in enumerate(recorder.own_keys):
        if own is None or recorder.keys[layer] is not None or not recorder.seen[layer]:
            continue
        try:
            keys, _ = recorder.keys_read(layer, len(recorder.seen[layer]) - 1, cache)
        except (ValueError, IndexError, AttributeError):
            if recorder.cross:  # a cross layer whose keys no cache keeps (Idefics' gated layers): kept by the answer
                latent.add(layer)
            continue  # else a window the attention was not told of: refused when its row is asked
        kept = keys[:, -1].float().cpu() if keys.dim() == 3 else None
        if kept is None or kept.shape != own.shape or not torch.allclose(kept, own, rtol=1e-5, atol=1e-6):
            latent.add(layer)
    return frozenset(latent)


def cache_sources(attending: list[tuple[int, object]]) -> list[int]:
    """The decoder layer whose cache holds each attention layer's keys: its own, or, for a layer that reuses another's
    (Gemma 3n's KV sharing: ``is_kv_shared_layer``), the last layer of its type before it that stores them
    (``store_full_length_kv``)."""
    stores, sources = {}, []
    for n, module in attending:
        if getattr(module, "is_kv_shared_layer", False) and module.layer_type in stores:
            sources.append(stores[module.layer_type])
            continue
        if getattr(module, "store_full_length_kv", False):
            stores[module.layer_type] = n
        sources.append(n)
    return sources


def cache_windows(vlm, decoder_layers: list[int]) -> list[int | None]:
    """The keys each of ``decoder_layers``' cache keeps, as transformers builds generate's cache from the text config
    (``cache_utils.get_layer_types_and_kwargs``): a sliding or a chunked layer's window (Llama 4's
    ``attention_chunk_size``), None for a layer whose cache keeps every key."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    try:
        _, per_layer = get_layer_types_and_kwargs(vlm.model.config.get_text_config(decoder=True))
    except (AttributeError, TypeError, ValueError, IndexError):  # a config transformers' cache does not read so
        return [None] * len(decoder_layers)
    return [per_layer[n].get("sliding_window") if n < len(per_layer) else None for n in decoder_layers]
