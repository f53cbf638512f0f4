"""Hook points (TransformerLens's ``HookPoint``) and relevance rules: a named place in the forward, and the
elementary operations a rule context swaps for the length of a ``with``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from types import MappingProxyType

import torch
import torch.nn.functional as F
from torch import nn


def activate(x: torch.Tensor, name: str, inplace: bool = False) -> torch.Tensor:
    """One of ``ACTIVATIONS``: exact GELU, tanh-approximated GELU, OpenAI's QuickGELU ``x * sigmoid(1.702 x)``, SiLU,
    ReLU; ``inplace``: written over ``x`` (the same values), for a caller that holds the only reference to it."""
    if name in ("gelu", "gelu_tanh"):
        approximate = "tanh" if name == "gelu_tanh" else "none"
        return torch.ops.aten.gelu_(x, approximate=approximate) if inplace else F.gelu(x, approximate=approximate)
    if name == "quick_gelu":
        gate = torch.sigmoid(1.702 * x)
        return x.mul_(gate) if inplace else x * gate
    if name == "relu":
        return F.relu(x, inplace=inplace)
    return F.silu(x, inplace=inplace)



# --- hook points and relevance rules --------------------------------------------------------------

Hook = Callable[[torch.Tensor, "HookPoint"], "torch.Tensor | None"]  # (tensor, hook point) -> replacement or None


class HookPoint(nn.Module):
    """A named place in the forward (TransformerLens's ``HookPoint``): the identity, unless hooks are set.

    Each hook ``fn(tensor, hook)`` reads the tensor and may return a replacement (None keeps it). ``ViT.hooks``
    sets them for the length of a ``with`` block and for this thread only, so a model shared by several pages
    (``st.cache_resource``) runs unhooked everywhere else; ``name`` is the point's path in the model
    (``blocks.3.attn.hook_pattern``)."""

    def __init__(self) -> None:
        super().__init__()
        self.name = ""

    @property
    def fns(self) -> tuple[Hook, ...]:
        """The hooks set on this point in this thread (empty: the point is the identity)."""
        return active_hooks().get(self, ())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        active = active_hooks()
        if active:
            for fn in active.get(self, ()):
                out = fn(x, self)
                if out is not None:
                    x = out
        return x

    # Called directly, without nn.Module's call machinery (its global-hook checks cost more than the identity):
    # with no hooks set a point costs one ContextVar lookup. torch's own module hooks are not used here.
    __call__ = forward


NO_HOOKS: Mapping[HookPoint, tuple[Hook, ...]] = MappingProxyType({})
_hooks: ContextVar[Mapping[HookPoint, tuple[Hook, ...]]] = ContextVar("vit_hooks", default=NO_HOOKS)


# A compiled forward (vit.train --compile) runs unhooked and under the plain rules: torch.compile before 2.15
# cannot trace ContextVar.get, and its graph break at every read (hook points, norms, attention, MLP) recompiled
# each block (a float per block) until the limit, leaving a compiled cifar-m step slower than eager on an H100
# (torch 2.11). Hooks and rules are for explaining, which runs eager. Every read of the two goes through these.

def active_hooks() -> Mapping[HookPoint, tuple[Hook, ...]]:
    """The hooks set in this thread (``ViT.hooks``); none inside a compiled forward."""
    return NO_HOOKS if torch.compiler.is_compiling() else _hooks.get()


class Rules:
    """The elementary operations whose backward a relevance method replaces (lxt's approach), as their plain
    versions. ``vit.explain.methods.relevance`` subclasses it (AttnLRP, CP-LRP) and makes it current for a ``with``
    block (``use_rules``); the forward values stay the model's own, only the gradients change."""

    def layer_norm(self, x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
        return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)

    def rms_norm(self, x: torch.Tensor, norm: nn.RMSNorm) -> torch.Tensor:
        return F.rms_norm(x, norm.normalized_shape, norm.weight, norm.eps)

    def activation(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return activate(x, name)

    def product(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """An element-wise product of two activations: SwiGLU's gate ``a`` times its linear branch ``b``."""
        return a * b

    def attention_inputs(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k (after rotary positions) and v ``(B, nh, T, hd)`` as the two attention matmuls take them."""
        return q, k, v

    def divide_by_norm(self, x: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
        """An L2 normalisation ``x / norm`` (a prompt head's cosine)."""
        return x / norm

    def logit_bias(self, bias: torch.Tensor) -> torch.Tensor:
        """What a layer adds to its attention logits (BEiT's table, SAM's relative positions of the queries)."""
        return bias


PLAIN_RULES = Rules()
_rules: ContextVar[Rules] = ContextVar("vit_rules", default=PLAIN_RULES)  # per thread: a page's other runs unaffected


def current_rules() -> Rules:
    """The rules in effect in this thread: ``PLAIN_RULES`` outside a ``use_rules`` block and inside a compiled
    forward (see ``active_hooks``)."""
    return PLAIN_RULES if torch.compiler.is_compiling() else _rules.get()


@contextlib.contextmanager
def use_rules(rules: Rules) -> Iterator[Rules]:
    """Every ``ViT`` forward in this ``with`` block (in this thread) runs its elementary operations by ``rules``."""
    token = _rules.set(rules)
    try:
        yield rules
    finally:
        _rules.reset(token)




_checkpointed: ContextVar[bool] = ContextVar("vit_checkpointed_blocks", default=False)


def checkpointing_blocks() -> bool:
    """Whether ``ViT.run_blocks`` checkpoints each block here (``checkpointed_blocks``); never when compiling."""
    return not torch.compiler.is_compiling() and _checkpointed.get()


@contextlib.contextmanager
def checkpointed_blocks() -> Iterator[None]:
    """Every ``ViT`` forward under autograd in this ``with`` block (in this thread) keeps each block's input alone
    and runs the block again in the backward (``torch.utils.checkpoint``, under the rules current at the forward):
    one block's graph at a time, the same gradients. A relevance method past its memory bound (AttnLRP) runs so."""
    token = _checkpointed.set(True)
    try:
        yield
    finally:
        _checkpointed.reset(token)
