"""Where a model's own forward puts each patch before its first attention block, read by running it (issue 117,
item 3): the patch embedding's output replaced by token codes (``read_pieces``), so that a layout places the tokens in
the order the model's code keeps them, never re-typed from a modelling file. ``placing.partitions`` lays windows folded
into the batch on these codes; ``order_problem`` is the library road's check that its row-major layout holds."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from vit.costs.bounds import TooManyTokens
from vit.sources.library_road.placing.bounded_forward import probe_forward


class _Stop(Exception):
    """Raised at the first block's input: the codes it holds are read, the forward goes no further."""

    def __init__(self, hidden: torch.Tensor):
        super().__init__()
        self.hidden = hidden


class _Coded(TorchFunctionMode):
    """Within it, the patch embedding (the first convolution over the whole ``image_hw`` input whose stride is its
    kernel, unpadded) returns each patch's code ``(p + 1) * scale`` on every channel in place of its features."""

    def __init__(self, image_hw: tuple[int, int], scale: float):
        super().__init__()
        self.image_hw, self.scale, self.done = tuple(image_hw), scale, False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.done or func is not F.conv2d or tuple(args[0].shape[-2:]) != self.image_hw:
            return out
        weight = args[1] if len(args) > 1 else kwargs["weight"]
        stride = args[3] if len(args) > 3 else (kwargs or {}).get("stride", 1)
        padding = args[4] if len(args) > 4 else (kwargs or {}).get("padding", 0)
        stride = (stride, stride) if isinstance(stride, int) else tuple(stride)
        if stride != tuple(weight.shape[-2:]) or padding not in (0, (0, 0), "valid"):
            return out
        self.done = True
        h, w = out.shape[-2:]
        codes = (torch.arange(h * w, dtype=out.dtype, device=out.device) + 1).view(1, 1, h, w) * self.scale
        return codes.expand_as(out).contiguous()


def first_block(name: str, modules: dict[str, torch.nn.Module]) -> torch.nn.Module | None:
    """The block the attention module ``name`` sits in: its nearest ancestor that is an item of a list of blocks
    (a name part that is an index), or None."""
    parts = name.split(".")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i].isdigit():
            return modules.get(".".join(parts[:i + 1]))
    return None


def read_pieces(model: torch.nn.Module, block: torch.nn.Module, image_hw: tuple[int, int],
                channels: int) -> torch.Tensor | None:
    """``(pieces, slots)``: the code of the patch each slot of ``block``'s input holds (0: a token of the model's
    own), read from two real forwards of one image of zeros stopped at ``block`` (``probe_forward``: every
    allocation counted first); None where the input is no such partition (see the module's docstring)."""
    def stop(module, args, kwargs):
        hidden = args[0] if args else kwargs.get("hidden_states")
        raise _Stop(hidden)

    seen = []
    hook = block.register_forward_pre_hook(stop, with_kwargs=True)
    try:
        for scale in (1.0, 2.0):
            try:
                with _Coded(image_hw, scale) as mode:
                    probe_forward(model, (1, channels, *image_hw), "its forward up to its first block")
            except _Stop as stopped:
                if not mode.done or not isinstance(stopped.hidden, torch.Tensor) or stopped.hidden.dim() != 3:
                    return None
                seen.append(stopped.hidden.detach().double())
            except TooManyTokens:  # the probe's own bound, already one line
                raise
            except Exception:  # noqa: BLE001 - a forward that fails on codes before its first block: no partition
                return None
            else:
                return None
    finally:
        hook.remove()
    diff = seen[1] - seen[0]  # (pieces, slots, D): each slot's code, the rest cancelled
    codes = diff[..., 0]
    tolerance = 1e-3 * max(1.0, float(codes.abs().max()))
    if (diff - codes[..., None]).abs().max() > tolerance or (codes - codes.round()).abs().max() > tolerance:
        return None
    codes = codes.round().long()
    patches = int(codes.max())
    held = codes[codes > 0]
    if patches < 1 or held.numel() != patches or int((codes < 0).sum()) or not torch.equal(
            held.sort().values, torch.arange(1, patches + 1)):
        return None
    return codes


def in_row_order(codes: torch.Tensor) -> bool:
    """Whether ``codes`` (``read_pieces``) are one piece holding the patches row-major, whatever tokens of the model's
    own stand among them (a CLS first, registers): what every layout but a partition's places."""
    held = codes[codes > 0]
    return codes.shape[0] == 1 and torch.equal(held, torch.arange(1, held.numel() + 1))


def order_problem(model: torch.nn.Module, attention_name: str, image_hw: tuple[int, int],
                  channels: int) -> str | None:
    """Where the block of the attention module ``attention_name`` takes the patches in another order than row-major
    (LW-DETR's windows cut before its encoder, kept in window order by a config whose every layer is global), what a
    row-major layout would misplace, in one line; else None (no partition found, or the patches in row order)."""
    block = first_block(attention_name, dict(model.named_modules()))
    codes = None if block is None else read_pieces(model, block, image_hw, channels)
    if codes is None or in_row_order(codes):
        return None
    return (f"its first block takes its patches in {codes.shape[0]} piece(s) in another order than row-major (windows "
            "its forward cuts), not the patches the library road places")
