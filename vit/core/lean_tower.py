"""A vision tower's memory-heavy steps run in bounded memory, each equal to what the module's own forward computes
up to float rounding (the order of a sum's terms).

Once ``install``ed on a model (``vit.open_vlm`` does it for a VLM), in inference (no gradient, eval mode), two kinds
of module compute their output another way where they would hold more than ``BUDGET`` bytes:

- **A convolution whose kernel covers its whole input and strides by it, its weight over the budget** (a merger of
  units: GLM-4V's ``downsample``, a Conv2d(1,536 -> 4,096, kernel 2, stride 2) over each 2 x 2 unit) is one matrix
  product: each unit's input flattened against the weight viewed as a matrix. PyTorch's CPU convolution (oneDNN)
  first copies the weight into a layout of its own, twice for an input that is not contiguous (GLM-4.1V-9B at
  448 px: 196 MB of the answer's 222 MB peak); the product reads the weight where it is.
- **An inverted-residual block of timm's** (``UniversalInvertedResidual``, ``EdgeResidual``: MobileNetV5's, Gemma
  3n's tower) **whose widest activation is over the budget** runs over strips of its output rows. Its steps are
  convolutions (a strip's input rows read with the halo its kernel reaches, the conv's zero padding only at the
  image's true edges) and steps that act on each pixel alone (RMS or batch norm over channels, activations, layer
  scale). So the expanded activation (Gemma 3n at 768 px: 192 x 192 pixels x 768 channels, 113 MB, two or three
  alive at once) exists one strip at a time; a strip recomputes its halo's rows of the steps before a convolution.

Anything else runs its own forward unchanged: a module in training or under autograd, one within the budget, a
block with a step not known to act per pixel (a squeeze-and-excitation's global pool, a blur pool), and a module
whose weights accelerate moves in and out (``_hf_hook``).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["BUDGET", "install", "lean", "merges_whole_input", "steps", "strip_forward"]

BUDGET = 32 << 20  # the widest activation a strip of a block may hold; the largest weight a convolution may copy

# the steps each block's forward runs, in its order (timm's ``_efficientnet_blocks``), then its residual
CHAINS = {"UniversalInvertedResidual": ("dw_start", "pw_exp", "dw_mid", "se", "pw_proj", "dw_end", "layer_scale"),
          "EdgeResidual": ("conv_exp", "bn1", "aa", "se", "conv_pwl", "bn2")}
# modules that act on each pixel alone (over its channels at most), in eval mode
PER_PIXEL = {"Identity", "RmsNorm2d", "RmsNormAct2d", "BatchNorm2d", "BatchNormAct2d", "LayerScale2d", "GELU",
             "GELUTanh", "ReLU", "ReLU6", "SiLU", "Hardswish", "Hardsigmoid", "Sigmoid", "Tanh", "Dropout", "DropPath"}


def install(model: nn.Module) -> Callable[[], None]:
    """From now on, ``model``'s mergers of units and timm's wide inverted-residual blocks run in bounded memory in
    inference (the module docstring); returns the call that puts every forward back as it was."""
    swapped = []
    for module in model.modules():
        if _hooked(module):
            continue
        chain = steps(module) if type(module).__name__ in CHAINS else None
        if _merger(module):
            forward = _lean_merge.__get__(module)
        elif chain is not None:
            forward = functools.partial(_lean_block, module, chain)  # its steps read once, here
        else:
            continue
        swapped.append((module, module.__dict__.get("forward")))
        module.forward = forward

    def restore() -> None:
        for module, own in swapped:
            if own is None:
                del module.forward
            else:
                module.forward = own
    return restore


@contextlib.contextmanager
def lean(model: nn.Module) -> Iterator[None]:
    """``install`` for the block's length."""
    restore = install(model)
    try:
        yield
    finally:
        restore()


def _hooked(module: nn.Module) -> bool:
    return any(hasattr(m, "_hf_hook") for m in module.modules())


def _inference(module: nn.Module) -> bool:
    return not torch.is_grad_enabled() and not module.training


def _merger(module: nn.Module) -> bool:
    return (type(module) in (nn.Conv2d, nn.Conv3d) and module.groups == 1 and module.padding_mode == "zeros"
            and not isinstance(module.padding, str) and not any(module.padding)
            and tuple(module.stride) == tuple(module.kernel_size) and set(module.dilation) == {1})


def merges_whole_input(conv: nn.Module, x: torch.Tensor) -> bool:
    """Whether ``conv`` (a merger: kernel = stride, no padding) reads each unit of ``x`` whole: its one output
    position a unit."""
    return x.dim() == conv.weight.dim() and tuple(x.shape[2:]) == tuple(conv.kernel_size)


def _lean_merge(self, x: torch.Tensor) -> torch.Tensor:
    heavy = self.weight.numel() * self.weight.element_size() > BUDGET
    if not (heavy and _inference(self) and merges_whole_input(self, x)):
        return type(self).forward(self, x)
    out = F.linear(x.reshape(x.shape[0], -1), self.weight.reshape(self.weight.shape[0], -1), self.bias)
    return out.view(*out.shape, *([1] * (x.dim() - 2)))


def steps(block: nn.Module) -> list[nn.Module] | None:
    """The modules ``block``'s forward runs, in order, its ``ConvNormAct``s opened into conv, norm and anti-alias
    pool; None where one is neither a plain zero-padded Conv2d nor known to act per pixel."""
    out = []
    for name in CHAINS[type(block).__name__]:
        module = getattr(block, name)
        if type(module).__name__ == "ConvNormAct":
            parts = [module.conv, module.bn] + ([module.aa] if getattr(module, "aa", None) is not None else [])
        else:
            parts = [module]
        for part in parts:
            if isinstance(part, nn.Conv2d):
                if not _local_conv(part):
                    return None
            elif any(type(m).__name__ not in PER_PIXEL for m in part.modules()):
                return None
            out.append(part)
    return out


def _local_conv(conv: nn.Module) -> bool:
    """A Conv2d with zero padding this module places itself: PyTorch's own (static, both sides alike) or timm's
    ``Conv2dSame`` (TensorFlow's "same", the odd row at the bottom)."""
    same = type(conv).__name__ == "Conv2dSame"
    return ((type(conv) is nn.Conv2d or same) and conv.padding_mode == "zeros" and set(conv.dilation) == {1}
            and not isinstance(conv.padding, str) and (not same or not any(conv.padding)))


def _pads(conv: nn.Conv2d, height: int, width: int) -> tuple[int, int, int, int]:
    """The zero rows above and below, columns left and right, ``conv`` reads around an input of this size."""
    if type(conv).__name__ != "Conv2dSame":
        return conv.padding[0], conv.padding[0], conv.padding[1], conv.padding[1]
    from timm.layers.padding import pad_same_arg  # the padding its forward computes (timm: Conv2dSame's library)

    left, right, top, bottom = pad_same_arg([height, width], conv.kernel_size, conv.stride, conv.dilation)
    return top, bottom, left, right


def _lean_block(block: nn.Module, chain: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    if not _inference(block) or x.dim() != 4:
        return type(block).forward(block, x)
    return strip_forward(block, chain, x)


def strip_forward(block: nn.Module, chain: list[nn.Module], x: torch.Tensor, budget: int | None = None) -> torch.Tensor:
    """``block``'s output on ``x`` computed ``rows`` output rows at a time: as many as keep each strip's widest
    activation within ``budget`` bytes (``BUDGET``); the block's own forward where one strip is the whole."""
    budget = BUDGET if budget is None else budget
    n, channels, height, width = x.shape
    sizes, widest = [(height, width)], x.numel()
    for step in chain:
        if isinstance(step, nn.Conv2d):
            top, bottom, left, right = _pads(step, height, width)
            (k, kw), (s, sw) = step.kernel_size, step.stride
            height = (height + top + bottom - k) // s + 1
            width = (width + left + right - kw) // sw + 1
            channels = step.out_channels
            widest = max(widest, n * channels * height * width)
        sizes.append((height, width))
    widest *= x.element_size()
    rows = max(1, math.floor(height * budget / widest))
    if rows >= height:
        return type(block).forward(block, x)
    skip = getattr(block, "has_skip", False)
    out = x.new_empty((n, channels, height, width))
    for start in range(0, height, rows):
        stop = min(start + rows, height)
        y = _rows(chain, sizes, x, start, stop)
        out[:, :, start:stop] = y + x[:, :, start:stop] if skip else y
    return out


def _rows(chain: list[nn.Module], sizes: list[tuple[int, int]], x: torch.Tensor, start: int,
          stop: int) -> torch.Tensor:
    """Output rows ``[start, stop)`` of ``chain`` on ``x`` (``sizes``: each step's input height and width, then the
    output's): each convolution's input rows (its halo included) asked of the steps before it, the rows past the
    image's edges its zero padding."""
    wants = [None] * len(chain)  # the rows of each step's input the strip needs, before clipping to the image
    lo, hi = start, stop
    for i in range(len(chain) - 1, -1, -1):
        step = chain[i]
        if isinstance(step, nn.Conv2d):
            top = _pads(step, *sizes[i])[0]
            k, s = step.kernel_size[0], step.stride[0]
            lo, hi = lo * s - top, (hi - 1) * s - top + k
        wants[i] = (lo, hi)
        lo, hi = max(lo, 0), min(hi, sizes[i][0])
    t = x[:, :, lo:hi]
    for i, step in enumerate(chain):
        if isinstance(step, nn.Conv2d):
            (want_lo, want_hi), height = wants[i], sizes[i][0]
            _, _, left, right = _pads(step, *sizes[i])
            t = F.pad(t, (left, right, max(0, -want_lo), max(0, want_hi - height)))
            t = F.conv2d(t, step.weight, step.bias, step.stride, 0, step.dilation, step.groups)
        else:
            t = step(t)
    return t
