"""What the explorer's "Features" view shows for one image and an SAE that fits the model (``check_fits``): its
strongest features with their activation maps on the patch grid, the features active at a token, and an
intervention that zeroes or scales features and runs the rest of the model on the edited stream.

Everything is read from or written to the model's one forward at the SAE's hook point
(``blocks.{l}.hook_resid_post``); the edit replaces the layer's output by the reconstruction with the latents
changed plus the reconstruction error, so with no change the model computes exactly what it computed before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vit.features.sae import SparseAutoencoder, check_fits, resid_hook_name
from vit.model import Encoding


@dataclass
class ImageFeatures:
    """One image's latents at the SAE's layer."""

    latents: Tensor  # (T, d_sae): every token's latents, prefix tokens first
    grid: tuple[int, int]  # the patch grid (gh, gw) the maps are drawn on
    num_prefix_tokens: int

    def strongest(self, count: int = 8) -> list[tuple[int, float]]:
        """The ``count`` features with the largest activation on any patch: ``(latent, max activation)``, largest
        first; features that never fire on a patch are left out."""
        peak = self.latents[self.num_prefix_tokens:].max(dim=0).values  # (d_sae,)
        values, index = peak.topk(min(count, len(peak)))
        return [(int(i), float(v)) for i, v in zip(index, values, strict=True) if v > 0]

    def patch_map(self, latent: int) -> Tensor:
        """Feature ``latent``'s activation on every patch ``(gh, gw)``, row-major as the patches are ordered."""
        return self.latents[self.num_prefix_tokens:, latent].reshape(self.grid)

    def active_at(self, token: int, count: int = 10) -> list[tuple[int, float]]:
        """The features active at ``token`` (prefix tokens first, then patches row by row): ``(latent, value)``,
        largest first, at most ``count``."""
        if not 0 <= token < len(self.latents):
            raise ValueError(f"token {token} is out of range for {len(self.latents)} tokens")
        row = self.latents[token]
        values, index = row.topk(min(count, len(row)))
        return [(int(i), float(v)) for i, v in zip(index, values, strict=True) if v > 0]


@torch.no_grad()
def image_features(model: nn.Module, sae: SparseAutoencoder, image: Tensor) -> ImageFeatures:
    """``image`` ``(1, C, H, W)`` (any size that tiles into patches) -> its latents at the SAE's layer."""
    layer = check_fits(sae, model)
    name = resid_hook_name(layer)
    _, cache = model.run_with_cache(image, [name])
    return ImageFeatures(sae.encode(cache[name][0]), model.patch_grid(image.shape[2], image.shape[3]),
                         model.config.num_prefix_tokens)


def edit_hook(sae: SparseAutoencoder, scales: Mapping[int, float]):
    """A hook that replaces the stream ``x (B, T, D)`` by ``decode(z') + (x - decode(z))``, where ``z'`` is ``z``
    with each latent of ``scales`` multiplied by its factor (0 switches it off)."""
    index = torch.tensor(sorted(scales), dtype=torch.long)
    factors = torch.tensor([float(scales[i]) for i in sorted(scales)])

    def hook(x: Tensor, point) -> Tensor:
        z = sae.encode(x)  # (B, T, d_sae)
        error = x - sae.decode(z).to(x.dtype)
        edited = z.clone()
        edited[..., index.to(z.device)] *= factors.to(z)
        return sae.decode(edited).to(x.dtype) + error

    return hook


@torch.no_grad()
def intervene(model: nn.Module, sae: SparseAutoencoder, images: Tensor, scales: Mapping[int, float],
              output_attentions: bool = True) -> Encoding:
    """The model's pass over ``images`` with the SAE's latents ``scales`` ``{latent: factor}`` scaled at its layer
    (``edit_hook``): logits, embedding and every layer's attention, as ablation gives them for heads."""
    layer = check_fits(sae, model)
    for latent, factor in scales.items():
        if not 0 <= latent < sae.d_sae:
            raise ValueError(f"feature {latent} is out of range: the SAE has {sae.d_sae:,}")
        if not torch.isfinite(torch.tensor(float(factor))):
            raise ValueError(f"feature {latent}'s factor must be a finite number, got {factor!r}")
    return model.run_with_hooks(images, [(resid_hook_name(layer), edit_hook(sae, scales))], output_attentions)
