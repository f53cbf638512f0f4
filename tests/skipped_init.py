"""A reference model built without drawing the random weights a strict ``load_state_dict`` replaces next.

An authors' model (or a library's) built only to hold a state dict draws every weight first: ``nn.Linear``'s
Kaiming-uniform, CLIP's ``initialize_parameters`` normals, ``nn.MultiheadAttention``'s Xavier. For ViT-B widths that
drawing was a fifth of tests/test_dense_clip.py's CPU (issue 112). Inside ``random_init_skipped`` torch's random
initialisers (``torch.nn.init``: what the modules call at build time) leave the tensor as allocated; the weights
that the test then compares come from the state dict alone: ``built_holding`` loads it strictly (every parameter and
persistent buffer replaced, nothing left as allocated). What a module computes at build time (masks, position ids,
constants) is computed as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from unittest import mock

import torch

RANDOM_INITS = ("uniform_", "normal_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
                "xavier_normal_", "orthogonal_")


@contextlib.contextmanager
def random_init_skipped():
    """``torch.nn.init``'s random initialisers as no-ops (each returns its tensor unchanged) for the block."""
    with contextlib.ExitStack() as stack:
        for name in RANDOM_INITS:
            stack.enter_context(mock.patch.object(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor))
        yield


def built_holding(build: Callable[[], torch.nn.Module], state: dict) -> torch.nn.Module:
    """``build()`` without its random draws, then ``state`` loaded strictly (nothing missing, nothing left over):
    every weight of the model is the state's."""
    with random_init_skipped():
        model = build()
    model.load_state_dict(state, strict=True)
    return model
