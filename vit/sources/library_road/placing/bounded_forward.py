"""One real forward of a small probe input, its every allocation counted before it is made.

Where a module's forward reads a value of its input (``.item()``, ``torch.nonzero``, a mask's sum: DETR's backbone,
SuperPoint's keypoints), the meta device cannot trace it, and where its tokens sit is read from one real forward of
an image of zeros instead (``vit.sources.library_road.recorded_road``). A module is data: a config can declare sizes
a small input turns into a huge allocation (object queries, latents, an upsampling factor). So the forward runs under
``AllocationBudget``, a ``TorchDispatchMode`` that, before each operation runs, forms its outputs on the meta device
(shapes only, no data) and adds their bytes to the forward's total: past the analysis memory limit
(``vit.costs.bounds.memory_limit``) the forward stops before that operation allocates, in one line. The total counts
every fresh output and never subtracts a freed one, so it bounds the forward's peak from above. An operation whose
outputs the meta device cannot form (its size depends on the data: ``nonzero``, ``item``) is counted at a bound of
its inputs (each element of each input, as many 8-byte indices as it has dimensions). A view or an in-place
operation allocates nothing and counts nothing. Parameters and buffers on the meta device (a model built, not yet
read) are stood in for by zeros, their bytes counted before they are made.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from vit.costs import bounds


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def _to_meta(x):
    """A tensor as a meta tensor of its shape, a device as the meta device (a factory's ``device=``: made there, the
    meta run would allocate), anything else as it is."""
    if isinstance(x, torch.device):
        return torch.device("meta")
    return x.to("meta") if isinstance(x, torch.Tensor) and not x.is_meta else x


def _signature(leaf):
    if isinstance(leaf, torch.Tensor):
        return tuple(leaf.shape), leaf.dtype, leaf.stride(), leaf.device.type
    try:
        hash(leaf)
    except TypeError:
        return repr(leaf)
    return type(leaf), leaf


_SEEN: dict = {}  # (operation, its arguments' shapes and values) -> the bytes its outputs take: a probe's repeated
MAX_SEEN = 4096  # layers, and the second probe of one opening (the meta pass's, then the CPU's), form each once


def output_bytes(func, args, kwargs) -> int:
    """The bytes ``func(*args, **kwargs)`` (an aten operation) allocates for its outputs, read from the meta device
    before it runs: 0 for a view or an in-place operation (its outputs alias an input); where the meta device cannot
    form them (a size that depends on the data), a bound from its inputs."""
    schema = getattr(func, "_schema", None)
    if schema is not None and schema.returns and all(r.alias_info is not None for r in schema.returns):
        return 0
    leaves = tree_flatten((args, kwargs))[0]
    key = (func, tuple(_signature(leaf) for leaf in leaves))
    if key in _SEEN:
        return _SEEN[key]
    try:
        out = func(*tree_map(_to_meta, args), **tree_map(_to_meta, kwargs))
    except Exception:  # noqa: BLE001 - a data-dependent size (nonzero, item, unique): bounded by its inputs
        inputs = [t for t in leaves if isinstance(t, torch.Tensor)]
        need = sum(t.numel() * 8 * max(1, t.dim()) for t in inputs) or 8
    else:
        need = _bytes(tree_flatten(out)[0])
    if len(_SEEN) >= MAX_SEEN:
        _SEEN.clear()
    _SEEN[key] = need
    return need


class AllocationBudget(TorchDispatchMode):
    """Within it, each operation's outputs are counted (``output_bytes``) before it runs, and ``TooManyTokens`` (one
    line naming ``what`` runs) raised before the first one that takes the total past ``limit`` bytes (default: the
    analysis memory limit). ``total``: the bytes counted so far."""

    def __init__(self, what: str, limit: int | None = None, total: int = 0):
        super().__init__()
        self.what, self.limit, self.total = what, bounds.memory_limit() if limit is None else limit, total

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.total += output_bytes(func, args, kwargs)
        if self.total > self.limit:
            raise bounds.TooManyTokens(
                f"{self.what} would allocate more than {self.limit / 2**20:,.0f} MB (the analysis memory limit, "
                f"{bounds.ANALYSIS_MEMORY_ENV}; stopped before {getattr(func, '__name__', str(func))} ran); give it a "
                "smaller input, or raise the limit")
        return func(*args, **kwargs)


def probe_forward(model: torch.nn.Module, pixels_shape: tuple[int, ...], what: str, limit: int | None = None):
    """``model``'s output for one input of zeros of ``pixels_shape`` (on the model's device, the CPU where its
    parameters are on the meta device, then stood in for by zeros), run under ``AllocationBudget``: every allocation,
    the stand-ins' included, counted before it is made (``TooManyTokens``, one line, past ``limit``)."""
    own = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    real = next((t.device for _, t in own if not t.is_meta), torch.device("cpu"))
    absent = {name: t for name, t in own if t.is_meta}
    budget = AllocationBudget(what, limit, total=_bytes(absent.values()) + 4 * int(torch.Size(pixels_shape).numel()))
    if budget.total > budget.limit:
        raise bounds.TooManyTokens(f"{what} needs {budget.total / 2**20:,.0f} MB for its weights' stand-ins and its "
                                   f"input, over the {budget.limit / 2**20:,.0f} MB limit "
                                   f"({bounds.ANALYSIS_MEMORY_ENV})")
    stand_ins = {name: torch.zeros(t.shape, dtype=t.dtype, device=real) for name, t in absent.items()}
    pixels = torch.zeros(pixels_shape, device=real)
    with torch.no_grad(), budget:
        if stand_ins:
            return torch.func.functional_call(model, stand_ins, (pixels,), strict=False, tie_weights=False)
        return model(pixels)
