"""TrivialAugment Wide's, RandAugment's and AutoAugment's image ops on uint8 batches, vectorised: every image draws
its own op and magnitude (as torchvision does when it augments one image at a time in a DataLoader), and each op runs
once on the batch. The op lists and magnitude bins are torchvision's own tables; each op reproduces the arithmetic of
``torchvision.transforms.v2.functional`` with a per-image factor (``tests/test_data.py``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

GEOMETRIC_OPS = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
NUM_MAGNITUDE_BINS = 31  # torchvision's default for both policies


@dataclass(frozen=True)
class OpSpace:
    """A policy's ops, in torchvision's order, with each op's magnitudes per bin."""

    names: tuple[str, ...]
    magnitudes: torch.Tensor  # (ops, bins) float64; 0 for ops without a magnitude
    signed: torch.Tensor  # (ops,) bool: the magnitude's sign is flipped with probability 0.5


def _v2():
    """torchvision's ``transforms.v2``, imported when an augmentation first needs it: importing torchvision takes
    seconds (it loads torch._dynamo), and ``vit.train --ray`` reads this module to check its arguments."""
    from torchvision.transforms import v2

    return v2


def op_space(policy: str, height: int, width: int, device: torch.device | str = "cpu") -> OpSpace:
    """The op space of torchvision's ``TrivialAugmentWide`` or ``RandAugment`` for images of this size."""
    v2 = _v2()
    cls = {"trivialaugment": v2.TrivialAugmentWide, "randaugment": v2.RandAugment}[policy]
    space = cls._AUGMENTATION_SPACE  # torchvision's table itself, so the bins cannot drift from it
    rows, signed = [], []
    for magnitudes_fn, is_signed in space.values():
        values = magnitudes_fn(NUM_MAGNITUDE_BINS, height, width)
        # float() of each entry, as torchvision does before it applies an op
        rows.append(torch.zeros(NUM_MAGNITUDE_BINS, dtype=torch.float64) if values is None else values.double())
        signed.append(is_signed)
    return OpSpace(tuple(space), torch.stack(rows).to(device), torch.tensor(signed, device=device))


def draw_ops(space: OpSpace, batch: int, device: torch.device | str, magnitude_bin: int | None = None,
             generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per image: an op index drawn uniformly, and its signed magnitude (float64), as torchvision draws them.

    ``magnitude_bin`` None draws the bin uniformly (TrivialAugment); an int fixes it (RandAugment).
    """
    op = torch.randint(len(space.names), (batch,), device=device, generator=generator)
    if magnitude_bin is None:
        bins = torch.randint(NUM_MAGNITUDE_BINS, (batch,), device=device, generator=generator)
    else:
        bins = torch.full((batch,), magnitude_bin, device=device)
    magnitude = space.magnitudes[op, bins]
    flip = space.signed[op] & (torch.rand(batch, device=device, generator=generator) <= 0.5)
    return op, torch.where(flip, -magnitude, magnitude)


def _affine_theta(names: tuple[str, ...], op: torch.Tensor, magnitude: torch.Tensor, height: int,
                  width: int) -> torch.Tensor:
    """Per-image inverse affine matrices ``(B, 2, 3)`` as ``v2.functional.affine``/``rotate`` build them.

    torchvision's ``_get_inverse_affine_matrix`` with scale 1, in float64 like its Python floats;
    images whose op is not geometric get the identity.
    """
    zero = torch.zeros_like(magnitude)
    is_op = {name: op == names.index(name) for name in GEOMETRIC_OPS}
    shear_deg = torch.rad2deg(torch.atan(magnitude))
    shear_x = torch.where(is_op["ShearX"], shear_deg, zero)
    shear_y = torch.where(is_op["ShearY"], shear_deg, zero)
    shift = torch.trunc(magnitude)  # int(magnitude)
    tx = torch.where(is_op["TranslateX"], shift, zero)
    ty = torch.where(is_op["TranslateY"], shift, zero)
    # rotate: angle % 360, then the negated angle (torchvision's rotate/affine direction convention)
    angle = torch.where(is_op["Rotate"], -torch.remainder(magnitude, 360.0), zero)
    shear = is_op["ShearX"] | is_op["ShearY"]  # sheared about the top-left corner (center=[0, 0])
    cx = torch.where(shear, zero - width * 0.5, zero)
    cy = torch.where(shear, zero - height * 0.5, zero)

    rot, sx, sy = torch.deg2rad(angle), torch.deg2rad(shear_x), torch.deg2rad(shear_y)
    cos_sy, tan_sx = torch.cos(sy), torch.tan(sx)
    a = torch.cos(rot - sy) / cos_sy
    b = -(a * tan_sx + torch.sin(rot))
    c = torch.sin(rot - sy) / cos_sy
    d = torch.cos(rot) - c * tan_sx
    m0, m1, m3, m4 = d, -b, -c, a
    m2 = cx - m0 * (cx + tx) - m1 * (cy + ty)
    m5 = cy - m3 * (cx + tx) - m4 * (cy + ty)
    return torch.stack([m0, m1, m2, m3, m4, m5], dim=1).view(-1, 2, 3)


def _affine_nearest(images: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """``v2.functional.affine`` with nearest interpolation and zero fill, one matrix per image."""
    B, C, H, W = images.shape
    theta = theta.float()
    base = torch.empty(1, H, W, 3, device=images.device)  # torchvision's _affine_grid, batched
    base[..., 0].copy_(torch.linspace((1.0 - W) * 0.5, (W - 1.0) * 0.5, steps=W, device=images.device))
    base[..., 1].copy_(torch.linspace((1.0 - H) * 0.5, (H - 1.0) * 0.5, steps=H, device=images.device)[:, None])
    base[..., 2].fill_(1)
    rescaled = theta.transpose(1, 2).clone()  # (B, 3, 2); scaled column by column: no host-to-device copy
    rescaled[..., 0] /= 0.5 * W
    rescaled[..., 1] /= 0.5 * H
    grid = base.view(1, H * W, 3).expand(B, -1, -1).bmm(rescaled)  # (B, H*W, 2)
    out = F.grid_sample(images.float(), grid.view(B, H, W, 2), mode="nearest", padding_mode="zeros",
                        align_corners=False)
    return out.round_().to(images.dtype)


def _blend(images: torch.Tensor, other: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """torchvision's ``_blend`` with a per-image ratio: ``ratio * images + (1 - ratio) * other``, truncated."""
    complement = (1.0 - ratio).float().view(-1, 1, 1, 1)  # in float64 first, as torchvision's Python float
    return (images * ratio.float().view(-1, 1, 1, 1)).addcmul_(other, complement).clamp_(0, 255).to(torch.uint8)


def _grey(images: torch.Tensor) -> torch.Tensor:
    """torchvision's floored ITU-R 601 luma as float ``(B, 1, H, W)`` (``rgb_to_grayscale`` truncates)."""
    return _v2().functional.rgb_to_grayscale(images).float()


def _brightness(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return (images * factor.float().view(-1, 1, 1, 1)).clamp_(0, 255).to(torch.uint8)


def _saturation(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    if images.shape[1] == 1:  # torchvision (and PIL) leave greyscale images alone
        return images
    return _blend(images, _grey(images), factor)


def _contrast(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    grey = _grey(images) if images.shape[1] == 3 else images.float()
    return _blend(images, grey.mean(dim=(-3, -2, -1), keepdim=True), factor)


def _sharpness(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    B, C, H, W = images.shape
    if H <= 2 or W <= 2:
        return images
    kernel = torch.full((C, 1, 3, 3), 1.0 / 13.0, device=images.device)  # torchvision's smoothing kernel,
    kernel[:, :, 1, 1] = 5.0 / 13.0  # built in place: no host-to-device copy
    out = images.float()
    blurred = F.conv2d(out, kernel, groups=C).round_()
    inner = out[..., 1:-1, 1:-1]  # the border keeps its pixels
    inner.addcmul_(blurred - inner, (1.0 - factor).float().view(-1, 1, 1, 1))
    return out.clamp_(0, 255).to(torch.uint8)


def _posterize(images: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    bits = bits.to(torch.int64)
    mask = ((1 << bits) - 1) << (8 - bits)  # keep the top ``bits`` bits; 8 bits keeps all
    return images & mask.to(torch.uint8).view(-1, 1, 1, 1)


def _solarize(images: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    threshold = (255.0 * magnitude).float().view(-1, 1, 1, 1)
    return torch.where(images >= threshold, 255 - images, images)


def _autocontrast(images: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    x = images.float()
    low, high = x.amin(dim=(-2, -1), keepdim=True), x.amax(dim=(-2, -1), keepdim=True)
    flat = high == low  # a flat channel is left as it is
    scale = torch.where(flat, 1.0, (high - low) * (1.0 / 255))
    return ((x - torch.where(flat, 0.0, low)) / scale).clamp_(0, 255).to(torch.uint8)


# An image's op ``name`` applied to a batch, with the per-image magnitudes (float64, sign included).
_COLOUR_OPS = {
    "Brightness": lambda x, m: _brightness(x, 1.0 + m),
    "Color": lambda x, m: _saturation(x, 1.0 + m),
    "Contrast": lambda x, m: _contrast(x, 1.0 + m),
    "Sharpness": lambda x, m: _sharpness(x, 1.0 + m),
    "Posterize": _posterize,
    "Solarize": _solarize,
    "AutoContrast": _autocontrast,
    "Equalize": lambda x, m: _v2().functional.equalize(x),  # already per image in torchvision
    "Invert": lambda x, m: x.bitwise_not(),  # AutoAugment's; torchvision's invert of uint8 images
}


def apply_ops(images: torch.Tensor, space: OpSpace, op: torch.Tensor, magnitude: torch.Tensor,
              by_subset: bool | None = None) -> torch.Tensor:
    """Apply op ``space.names[op[i]]`` with ``magnitude[i]`` to image i of a uint8 batch ``(B, C, H, W)``.

    ``by_subset`` (default: on the CPU) runs each op on the images that drew it. Otherwise every op
    runs on the whole batch and ``torch.where`` picks: no data-dependent shapes, so no host sync,
    and the augmentation can be compiled or captured in a CUDA graph; the extra arithmetic is cheap
    on a GPU. Both give the same images.
    """
    H, W = images.shape[-2:]
    geometric = torch.zeros_like(op, dtype=torch.bool)
    for name in GEOMETRIC_OPS:
        geometric |= op == space.names.index(name)
    kinds = [(geometric, lambda x, o, m: _affine_nearest(x, _affine_theta(space.names, o, m, H, W)))]
    kinds += [(op == space.names.index(name), lambda x, o, m, fn=fn: fn(x, m)) for name, fn in _COLOUR_OPS.items()
              if name in space.names]
    if by_subset is None:
        by_subset = images.device.type == "cpu"
    if by_subset:
        out = images.clone()
        for chosen, fn in kinds:
            idx = chosen.nonzero().squeeze(1)
            if len(idx):
                out[idx] = fn(images[idx], op[idx], magnitude[idx])
        return out
    out = images
    for chosen, fn in kinds:
        out = torch.where(chosen.view(-1, 1, 1, 1), fn(images, op, magnitude), out)
    return out
