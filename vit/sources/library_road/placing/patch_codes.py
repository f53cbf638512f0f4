"""Where a model's own forward puts each patch before its first attention block, read by running it (issue 117,
item 3): the patch embedding's output replaced by token codes (``read_pieces``), so that a layout places the tokens in
the order the model's code keeps them, never re-typed from a modelling file. ``placing.partitions`` lays windows folded
into the batch on these codes; ``order_problem`` is the library road's check that its row-major layout holds.

Opening a model reads its codes once: one forward of two coded images (``read_pieces``), the patch embedding's own
features never computed (the codes replace them), and within ``one_reading`` (an opening that may try two roads over the
same blocks: the library road, then the recorder's over its backbone) a block's codes are read once and shared."""

from __future__ import annotations

import contextlib
import contextvars

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from vit.core.threads import this_thread_only
from vit.costs.bounds import TooManyTokens
from vit.sources.library_road.placing.bounded_forward import probe_forward


class _Stop(Exception):
    """Raised at the first block's input: the codes it holds are read, the forward goes no further."""

    def __init__(self, hidden: torch.Tensor):
        super().__init__()
        self.hidden = hidden


class _Coded(TorchFunctionMode):
    """Within it, the patch embedding (the first convolution over the whole ``image_hw`` input whose stride is its
    kernel, unpadded) returns each patch's code ``(p + 1) * scale`` on every channel in place of its features, image
    ``i`` of the batch at ``scales[i]``. Its features, replaced, are not computed where its output's shape is plain
    (``_plain_shape``); otherwise the convolution runs, failing as it would."""

    def __init__(self, image_hw: tuple[int, int], scales: tuple[float, ...]):
        super().__init__()
        self.image_hw, self.scales, self.done = tuple(image_hw), tuple(scales), False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.done or func is not F.conv2d or not args or not isinstance(args[0], torch.Tensor) or \
                tuple(args[0].shape[-2:]) != self.image_hw:
            return func(*args, **kwargs)
        weight = args[1] if len(args) > 1 else kwargs["weight"]
        stride = args[3] if len(args) > 3 else kwargs.get("stride", 1)
        padding = args[4] if len(args) > 4 else kwargs.get("padding", 0)
        stride = (stride, stride) if isinstance(stride, int) else tuple(stride)
        if stride != tuple(weight.shape[-2:]) or padding not in (0, (0, 0), "valid"):
            return func(*args, **kwargs)
        shape = _plain_shape(args, kwargs)
        out = func(*args, **kwargs) if shape is None else None
        shape, dtype = (out.shape, out.dtype) if out is not None else (shape, args[0].dtype)
        self.done = True
        h, w = shape[-2:]
        scales = torch.tensor(self.scales, dtype=dtype, device=args[0].device).view(-1, 1, 1, 1)  # (B, 1, 1, 1)
        codes = (torch.arange(h * w, dtype=dtype, device=args[0].device) + 1).view(1, 1, h, w) * scales
        return codes.expand(shape).contiguous()


def _plain_shape(args, kwargs) -> tuple[int, ...] | None:
    """The output shape of the patch embedding's ``F.conv2d`` (stride its kernel, unpadded) where nothing about it
    can fail (a batch of images, its channels the weight's, one dtype and device, no dilation, every side at least a
    kernel): ``(B, out, H // kh, W // kw)``; else None."""
    x, weight = args[0], args[1] if len(args) > 1 else kwargs["weight"]
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    dilation = args[5] if len(args) > 5 else kwargs.get("dilation", 1)
    groups = args[6] if len(args) > 6 else kwargs.get("groups", 1)
    if x.dim() != 4 or weight.dim() != 4 or dilation not in (1, (1, 1)) or not isinstance(groups, int) or \
            x.shape[1] != weight.shape[1] * groups or weight.shape[0] % groups or \
            (bias is not None and tuple(bias.shape) != (weight.shape[0],)) or \
            any(t is not None and (t.dtype != x.dtype or t.device != x.device) for t in (weight, bias)) or \
            not x.dtype.is_floating_point or x.shape[-2] < weight.shape[-2] or x.shape[-1] < weight.shape[-1]:
        return None
    return (x.shape[0], weight.shape[0], x.shape[-2] // weight.shape[-2], x.shape[-1] // weight.shape[-1])


def first_block(name: str, modules: dict[str, torch.nn.Module]) -> torch.nn.Module | None:
    """The block the attention module ``name`` sits in: its nearest ancestor that is an item of a list of blocks
    (a name part that is an index), or None."""
    parts = name.split(".")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i].isdigit():
            return modules.get(".".join(parts[:i + 1]))
    return None


_READ: contextvars.ContextVar[dict | None] = contextvars.ContextVar("patch_codes_read", default=None)


@contextlib.contextmanager
def one_reading():
    """Within it, each block's codes at an input size are read once (``read_pieces``) and shared by every road that
    asks (an opening: the library road's ``order_problem``, then the recorder's road over the same blocks). Nested,
    the outermost's readings hold."""
    if _READ.get() is not None:
        yield
        return
    token = _READ.set({})
    try:
        yield
    finally:
        _READ.reset(token)


def read_pieces(model: torch.nn.Module, block: torch.nn.Module, image_hw: tuple[int, int],
                channels: int) -> torch.Tensor | None:
    """``(pieces, slots)``: the code of the patch each slot of ``block``'s input holds (0: a token of the model's
    own), read from one real forward of two images of zeros, coded at two scales, stopped at ``block``
    (``probe_forward``: every allocation counted first); None where the input is no such partition (see the module's
    docstring). Within ``one_reading``, read once a block and input size."""
    shared = _READ.get()
    key = (block, tuple(image_hw), channels)
    if shared is not None and key in shared:
        return None if shared[key] is None else shared[key].clone()
    codes = _read(model, block, image_hw, channels)
    if shared is not None:
        shared[key] = None if codes is None else codes.clone()
    return codes


_FAILED = object()  # a forward that failed before its first block (``_stopped``)


def _read(model, block, image_hw, channels) -> torch.Tensor | None:
    """``read_pieces``'s codes: the two scales' images in one forward, their block inputs told apart as the batch
    holds them, image-major (``(images * pieces, slots, D)``: a window partition's reshape of the batch). One forward
    a scale, each image alone as before (``_read_apart``), where the images together fail or pass the memory limit, or
    the input is several pieces and the image-major reading is not the one partition (the pieces-major one is too, or
    neither is)."""
    try:
        both = _stopped(model, block, image_hw, channels, (1.0, 2.0))
    except TooManyTokens:  # two images over the limit where one may not be: one at a time, each bounded itself
        return _read_apart(model, block, image_hw, channels)
    if both is _FAILED:  # a forward that takes one image at a time
        return _read_apart(model, block, image_hw, channels)
    if both is None:
        return None
    if both.shape[0] == 2:  # one piece an image: nothing to tell apart
        return _codes(both[1:] - both[:1])
    if both.shape[0] % 2 == 0:
        n = both.shape[0] // 2
        image_major = _codes(both[n:] - both[:n])
        if image_major is not None and _codes(both[1::2] - both[0::2]) is None:
            return image_major
    return _read_apart(model, block, image_hw, channels)


def _read_apart(model, block, image_hw, channels) -> torch.Tensor | None:
    """The codes from one forward of one image a scale."""
    seen = []
    for scale in (1.0, 2.0):
        one = _stopped(model, block, image_hw, channels, (scale,))
        if one is None or one is _FAILED:
            return None
        seen.append(one)
    return _codes(seen[1] - seen[0])


def _stopped(model, block, image_hw, channels, scales):
    """``block``'s input ``(rows, slots, D)`` (float64) in one forward of ``len(scales)`` images of zeros, image
    ``i`` coded at ``scales[i]`` (``_Coded``); None where the forward codes no patch embedding, does not reach
    ``block`` or hands it no 3-D tensor; ``_FAILED`` where it fails before it. TooManyTokens (one line) past the memory
    limit."""
    def stop(module, args, kwargs):
        hidden = args[0] if args else kwargs.get("hidden_states")
        raise _Stop(hidden)

    hook = block.register_forward_pre_hook(this_thread_only(stop), with_kwargs=True)
    try:
        with _Coded(image_hw, scales) as mode:
            probe_forward(model, (len(scales), channels, *image_hw), "its forward up to its first block")
    except _Stop as stopped:
        if not mode.done or not isinstance(stopped.hidden, torch.Tensor) or stopped.hidden.dim() != 3:
            return None
        return stopped.hidden.detach().double()
    except TooManyTokens:  # the probe's own bound, already one line
        raise
    except Exception:  # noqa: BLE001 - a forward that fails on codes before its first block: no partition
        return _FAILED
    finally:
        hook.remove()
    return None


def _codes(diff: torch.Tensor) -> torch.Tensor | None:
    """The codes a difference of two scales' block inputs ``(pieces, slots, D)`` holds (each slot's code, the rest
    cancelled), or None where it is not one whole code a slot on every channel, every patch held once."""
    codes = diff[..., 0]
    tolerance = 1e-3 * max(1.0, float(codes.abs().max())) if codes.numel() else 1e-3
    if not codes.numel() or (diff - codes[..., None]).abs().max() > tolerance or \
            (codes - codes.round()).abs().max() > tolerance:
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
