"""Which keys a VLM answer's rows are read from, per layer of its language model: the decoder layer whose KV cache
holds them (``cache_sources``), the window that cache keeps (``cache_windows``), and the layers whose cache keeps
other keys than its attention reads (``latent_layers``: Mistral Large 4's and dots.ocr 3's compressed latents,
expanded into keys after the cache; Idefics' cross-attention, whose keys no cache keeps), whose keys the answer then
keeps itself as each call hands them over; and the language model's sizes as the cost model reads them
(``text_shape``)."""

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


def text_shape(vlm):
    """The language model's sizes, as the cost model reads them."""
    from vit.costs.plan import TextShape, mlp_width

    config = vlm.model.config.get_text_config(decoder=True)
    # an encoder-decoder's decoder (Florence-2's BART; Pix2Struct's T5 names its decoder's sizes alone): its cache and
    # rows
    decoder = getattr(config, "is_encoder_decoder", False) or getattr(vlm.model.config, "is_encoder_decoder", False)
    heads = _named(config, ("decoder_attention_heads", "num_attention_heads") if decoder else ("num_attention_heads",))
    layers = _named(config, ("decoder_layers", "num_decoder_layers", "num_hidden_layers") if decoder else
                    ("num_hidden_layers",))
    kinds, window = getattr(config, "layer_types", None) or (), getattr(config, "sliding_window", None)
    linear = sum(1 for kind in kinds if kind == "linear_attention")  # a hybrid's: a recurrent state, no KV cache
    mlp = getattr(config, "intermediate_size", None) or mlp_width(config)  # OPT's ffn_dim (BLIP-2's)
    windows = tuple(window if kind == "sliding_attention" else None for kind in kinds
                    if kind != "linear_attention") if window else ()
    state = 0
    if linear and hasattr(config, "mamba_head_dim"):  # Nemotron-H's Mamba 2: (heads x head dim x state) and its conv's
        inner, n = config.mamba_num_heads * config.mamba_head_dim, config.ssm_state_size
        state = linear * (inner * n * 4 + (inner + 2 * config.n_groups * n) * config.conv_kernel * 4)
    elif linear:  # each linear layer's state: its recurrent (value heads x key dim x value dim) and convolution's
        # (GLM-5 Next's keys and values share one width and count: linear_head_dim, linear_num_heads)
        key_dim, value_dim = (getattr(config, f"linear_{kind}_head_dim", None) or config.linear_head_dim
                              for kind in ("key", "value"))
        value_heads, key_heads = (getattr(config, f"linear_num_{kind}_heads", None) or config.linear_num_heads
                                  for kind in ("value", "key"))
        conv = (2 * key_heads * key_dim + value_heads * value_dim) * config.linear_conv_kernel_dim
        state = linear * (value_heads * key_dim * value_dim * 4 + conv * next(vlm.model.parameters()).dtype.itemsize)
    return TextShape(layers=layers - linear - sum(kind in ("mlp", "moe") for kind in kinds), heads=heads,
                     state_bytes=state,
                     kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                     # a latent attention's head_dim names its rotary part (0: none); its cache's keys are wider
                     head_dim=getattr(config, "head_dim", None) or getattr(config, "qk_head_dim", None)
                     or config.hidden_size // heads,
                     hidden=config.hidden_size,
                     mlp=(getattr(config, "decoder_ffn_dim", None) or mlp) if decoder else max(
                         mlp if isinstance(mlp, list) else [mlp]),  # Gemma 3n's: per layer
                     vocab=config.vocab_size,
                     itemsize=next(vlm.model.parameters()).dtype.itemsize, windows=windows)


def _named(config, names: tuple[str, ...]) -> int:
    """The first of ``names`` ``config`` sets (a decoder's sizes under its family's names); a one-line ValueError
    where it sets none."""
    found = next((getattr(config, name) for name in names if getattr(config, name, None) is not None), None)
    if found is None:
        raise ValueError(f"its text config ({type(config).__name__}) sets none of {', '.join(names)}, which the "
                         "cost of its answer is counted from; open a folder whose config.json states them")
    return found
