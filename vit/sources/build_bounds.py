"""What a config declares, bounded before and while a model of it is built (issue 114, item 2): a listed folder is
built on the meta device to be described, and a config can declare sizes under any key (UDOP's
``num_decoder_layers: 1000000`` built a million blocks, the server growing past 2 GB in 100 s). So every whole
number config.json declares, at any depth and under any key, is bounded (``declared_number_problem``), and the build
itself runs under a budget of modules and seconds (``bounded_build``), counted by torch's global module-registration
hook while the modules are made: whatever key sizes a module list, the build is stopped at ``MAX_MODULES`` modules,
before it holds more than some tens of MB.

Tensors on the meta device cost nothing; what the build allocates off it is checked against the weights' headers
first (``vit.sources.weights_cover``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping

import torch
from torch.nn.modules.module import register_module_module_registration_hook

from vit.sources.files import SourceError

# Any whole number a config declares: the largest a vision or language model's config holds are vocabularies
# (262,208, Gemma 3), positions (1,010,000, Qwen2.5-1M) and integer rope thetas (5,000,000, Qwen3-VL); a size of
# 2^24 is a 2^24-long list or buffer, at most 128 MB, where 10^7 and more grew the server past its cap.
MAX_DECLARED = 2**24
# Modules one build may register: SAM 3, the largest model opened here, registers 1,236; Qwen2.5-VL with 80 text
# layers 1,410. UDOP's decoder blocks, built past the budget in a fresh process on 2 busy cores: 2,000 modules grew
# it by 13 MB in 1.1 s, 5,000 by 21 MB in 2.2 s, 20,000 by 60 MB in 11 s; 10,000 by 26 MB in 5.1 s.
MAX_MODULES = 10_000
MAX_BUILD_SECONDS = 60.0  # a meta build takes 0.1-1.5 s (SAM 3); the budget is for the busiest server


class BuildBoundError(SourceError):
    """A model whose build went past ``MAX_MODULES`` modules or its time budget; the message is one line."""


def declared_number_problem(config_json: Mapping) -> str | None:
    """Why config.json declares a whole number past ``MAX_DECLARED`` (or below its negative), at any depth and
    under any key, or None: the first one found, by its path (``text_config.intermediate_size``). Walked without
    recursion; booleans and fractions are not sizes."""
    stack: list[tuple[str, Mapping | list]] = [("", config_json)]
    while stack:  # only containers are stacked, with their paths: a 4 MB list of numbers makes no string per number
        path, container = stack.pop()
        items = container.items() if isinstance(container, Mapping) else enumerate(container)
        for key, value in items:
            if isinstance(value, (Mapping, list)):
                stack.append((_path(path, key), value))
            elif isinstance(value, int) and not isinstance(value, bool) and not -MAX_DECLARED <= value <= MAX_DECLARED:
                return (f"its config declares {_path(path, key)[:80]} = {value:,}"[:160] + f", past the "
                        f"{MAX_DECLARED:,} any size a model here is built with may be")
    return None


def _path(path: str, key: object) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else str(key)


class _Budget:
    """One build's modules and deadline, counted on the thread that builds."""

    def __init__(self, origin: str, seconds: float | None) -> None:
        self.origin, self.modules = origin, 0
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.seconds = seconds

    def count(self) -> None:
        self.modules += 1
        if self.modules > MAX_MODULES:
            raise BuildBoundError(f"{self.origin}: its config declares more than {MAX_MODULES:,} modules (stopped "
                                  "while building them); give the folder the config.json saved with its weights")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise BuildBoundError(f"{self.origin}: building the model its config declares took more than "
                                  f"{self.seconds:g} s (stopped at {self.modules:,} modules)")


_active = threading.local()  # the budget of the build running on this thread, if any


def _registered(module: torch.nn.Module, name: str, submodule: torch.nn.Module | None) -> None:
    budget = getattr(_active, "budget", None)
    if budget is not None:
        budget.count()


# Registered once, for the process: torch calls it on every thread, each of which counts only its own build.
_HOOK = register_module_module_registration_hook(_registered)


@contextlib.contextmanager
def bounded_build(origin: str, seconds: float | None = MAX_BUILD_SECONDS) -> Iterator[None]:
    """Build a model of a declared config under a budget: ``BuildBoundError`` (one line naming ``origin``) raised
    from inside the build at its ``MAX_MODULES + 1``-th module, or at the first module past ``seconds`` (None: no
    time bound, for a load that reads weights). Inside an outer budget, the outer one goes on counting."""
    if getattr(_active, "budget", None) is not None:
        yield
        return
    _active.budget = _Budget(origin, seconds)
    try:
        yield
    finally:
        _active.budget = None


def built_on_meta(cls, config, origin: str, **kwargs) -> torch.nn.Module:
    """``cls._from_config(config, **kwargs)`` (a transformers class) on the meta device, under ``bounded_build``:
    names and shapes, no memory."""
    with bounded_build(origin), torch.device("meta"):
        return cls._from_config(config, **kwargs)
