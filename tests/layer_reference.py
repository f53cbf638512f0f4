"""The references the layer tests compare the recorder with, written once: each layer's probabilities as the
library computes them (its eager attention function caught where the modelling file calls it, or the softmax its
attention modules call on their explicit path), and a windowed layer's pieces placed on the grid by a table of token
indices the library's own partition made. Never our code's output.

Also the tiny models' weights: wide enough that every row of every head differs from uniform (a library's small
init makes near-uniform rows, which read the same transposed)."""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

MEAN_STD = dict(mean=(0.5, 0.4, 0.3), std=(0.2, 0.3, 0.4))


def tiny(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` in eval mode, every parameter drawn N(0, 0.3) from seed 0."""
    torch.manual_seed(0)
    with torch.no_grad():  # weights far from the libraries' small init, so that every row is its own
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
    return model.eval()


def widened(model: torch.nn.Module, matrices_only: bool = False) -> torch.nn.Module:
    """``model`` with its parameters (``matrices_only``: those of 2 dimensions or more) drawn N(0, 0.3) from a
    generator of seed 5, left in the mode it is in."""
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1 or not matrices_only:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return model


def caught_eager(modelling, run: Callable[[], object], name: str = "eager_attention_forward",
                 modules: bool = False) -> list:
    """The probabilities (the second output) of every call ``run()`` makes to the modelling file ``modelling``'s
    eager attention function ``name``, in the forward's order: the library's own reference, caught where its
    attention modules look it up (the model must be built with ``attn_implementation="eager"``); ``modules``: each
    as ``(the calling module, its probabilities)``."""
    original, seen = getattr(modelling, name), []

    def eager(module, *args, **kwargs):
        out = original(module, *args, **kwargs)
        seen.append((module, out[1].detach()) if modules else out[1].detach())
        return out

    setattr(modelling, name, eager)
    try:
        with torch.no_grad():
            run()
    finally:
        setattr(modelling, name, original)
    return seen


def assert_layers_are(recorded, library: list[torch.Tensor], layers: int, shape: tuple[int, ...],
                      atol: float = 1e-6) -> None:
    """The recorder's ``layers`` layers (``recorded``) are the library's (``library``: as many), each of ``shape``."""
    assert len(library) == len(recorded) == layers
    for layer, theirs in enumerate(library):
        assert recorded[layer].shape == theirs.shape == shape
        assert torch.allclose(recorded[layer], theirs, atol=atol, rtol=0)


def library_softmax(model: torch.nn.Module, layer_modules: list[torch.nn.Module], pixels: torch.Tensor):
    """Each layer's probabilities as the library's explicit path makes them: the output of every last-axis softmax
    that one of ``layer_modules`` calls, in the forward's order."""
    for module in model.modules():  # timm's explicit path
        if "fused_attn" in vars(module):
            module.fused_attn = False
    owners, caught = set(map(id, layer_modules)), []
    plain = torch.Tensor.softmax, torch.softmax, torch.nn.functional.softmax

    def catch(original):
        def softmax(*args, **kwargs):
            out = original(*args, **kwargs)
            frame = sys._getframe(1)
            if id(frame.f_locals.get("self")) in owners:
                caught.append(out.detach())
            return out
        return softmax

    torch.Tensor.softmax, torch.softmax, torch.nn.functional.softmax = (catch(f) for f in plain)
    try:
        with torch.no_grad():
            model(pixels)
    finally:
        torch.Tensor.softmax, torch.softmax, torch.nn.functional.softmax = plain
    return caught


def recorded_and_library(wrapped, model: torch.nn.Module, size: tuple[int, int], own=library_softmax):
    """Every layer as the recorder keeps it (``wrapped``, the model opened) and as the library computes it
    (``own(model, attention modules, pixels)``), for one random input of ``size`` (seed 1)."""
    torch.manual_seed(1)
    pixels = torch.randn(1, 3, *size)
    _, recorded = wrapped.run(pixels, layers=range(wrapped.num_layers))
    library = own(model, wrapped._attention, pixels)
    assert len(library) == wrapped.num_layers
    return recorded, library


def placed(raw: torch.Tensor, table: torch.Tensor, tokens: int) -> torch.Tensor:
    """``raw`` (pieces, H, n, n) placed on the grid by ``table`` (pieces, n) of token indices (-1: padding, no
    token): (1, H, T, T), zero outside each query's piece."""
    table = table.long()
    dense = raw.new_zeros(1, raw.shape[1], tokens, tokens)
    for piece in range(table.shape[0]):
        real = table[piece] >= 0
        where = table[piece][real]
        dense[0, :, where[:, None], where[None, :]] = raw[piece][:, real][:, :, real]
    return dense


def transposed(table: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """``table``'s token indices as they would be on the transposed grid (-1 kept): a placement that fails."""
    table = table.long()
    return torch.where(table >= 0, (table % grid[1]) * grid[0] + table // grid[1], table)


def on_its_grid(raw: torch.Tensor, place, table: Callable | None, model: torch.nn.Module, name: str) -> torch.Tensor:
    """The library's probabilities ``raw`` of one recorded layer (its ``LayerPlace`` ``place``, its module ``name``)
    as the recorder should keep them: as they are, or, for a windowed layer, its pieces placed on its key grid by
    ``table(model, name, grid)``, the library's own partition of a map of token indices."""
    if place is None or place.windows is None:
        return raw
    grid = place.key_grid
    return placed(raw, table(model, name, grid), grid[0] * grid[1])
