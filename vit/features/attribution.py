"""Which SAE features drive a prediction: the SAE spliced into the model's one forward at its hook point, and the
target logit's gradient there split among the latents, the decoder bias and the reconstruction error.

At the SAE's layer the stream ``x (T, D)`` is replaced by ``decode(f) + e`` with ``f = encode(x)`` and the error
``e = x - decode(f)`` (numerically ``x``: the model computes what it computed before). With ``g = ∂y/∂x`` the gradient
of the target logit ``y`` at that point, the first-order share of each part is its dot product with ``g``, token by
token (Marks et al. 2024's attribution patching with an SAE, "sparse feature circuits"):

    latent i at token t:  f[t, i] · (g[t] · W_dec[i])      (with decoder-norm rescaling, f[t, i] / |W_dec[i]|)
    the decoder bias:     g[t] · b_dec
    the error:            g[t] · e[t]

and since the decoder is affine in ``f``, they sum to ``g[t] · x[t]`` exactly, per token and over the image. A
latent's map is its share on each patch; its share for the image is the sum over every token (prefix tokens too).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from vit.features.autoencoder import SparseAutoencoder, check_fits, resid_hook_name, stream_shape


@dataclass
class FeatureAttribution:
    """One image's target logit split among the SAE's latents, its decoder bias and its error at the SAE's layer."""

    target: int  # the class whose logit is attributed
    logit: float  # that logit
    latents: Tensor  # (T, d_sae): f, the latents at every token, prefix tokens first
    attributions: Tensor  # (T, d_sae): f[t, i] · (g[t] · W_dec[i]), each latent's share at each token
    bias: Tensor  # (T,): g[t] · b_dec
    error: Tensor  # (T,): g[t] · (x[t] - decode(f[t]))
    total: Tensor  # (T,): g[t] · x[t], what the three sum to
    grid: tuple[int, int]  # the grid the tokens after the prefix lie on (a stage layer's own, with stages)
    num_prefix_tokens: int
    image_grid: tuple[int, int] | None = None  # the image's patch grid, where ``grid`` is a stage layer's (else None)

    def per_image(self) -> Tensor:
        """``(d_sae,)``: each latent's share summed over every token of the image."""
        return self.attributions.sum(dim=0)

    def top(self, count: int = 8) -> list[tuple[int, float]]:
        """The ``count`` latents with the largest positive share for the image: ``(latent, share)``, largest
        first (the features that drive the prediction; those against it are left out)."""
        share = self.per_image()
        values, index = share.topk(min(count, len(share)))
        return [(int(i), float(v)) for i, v in zip(index, values, strict=True) if v > 0]

    def patch_map(self, latent: int) -> Tensor:
        """Latent ``latent``'s share on every cell of ``grid`` ``(gh, gw)``, row-major."""
        return self.attributions[self.num_prefix_tokens:, latent].reshape(self.grid)

    def patch_maps(self, latents: list[int]) -> np.ndarray:
        """The maps of ``latents`` ``(n, gh, gw)`` on the image's patch grid (a stage layer's cells repeated over
        the patches they cover)."""
        from vit.explain.methods.stage_maps import on_patch_grid

        index = torch.as_tensor(list(latents), dtype=torch.long)
        maps = self.attributions[self.num_prefix_tokens:, index].T.reshape(len(index), *self.grid)
        return on_patch_grid(maps.float().cpu().numpy(), self.image_grid or self.grid)

    def totals(self) -> dict[str, float]:
        """The image's sums: the latents', the bias's, the error's and ``g · x`` (the first three add up to it)."""
        return {"latents": float(self.attributions.sum()), "bias": float(self.bias.sum()),
                "error": float(self.error.sum()), "total": float(self.total.sum())}


def feature_attribution(model: nn.Module, sae: SparseAutoencoder, image: Tensor, target: int | None = None,
                        fits: nn.Module | None = None) -> FeatureAttribution:
    """``image`` ``(1, C, H, W)`` -> its ``target`` logit (default the predicted class) attributed to the SAE's
    latents, decoder bias and error at the SAE's layer (the module docstring's terms); one forward with the SAE
    spliced in at ``blocks.{l}.hook_resid_post`` and one backward to it. ``fits``: the model the SAE is checked
    against, as in ``vit.features.explore``. ValueError for a model without a classifier."""
    if getattr(model, "head", None) is None:
        raise ValueError("feature attribution reads a classifier's logit and this model has none (an image encoder)")
    layer = check_fits(sae, model if fits is None else fits)
    spliced: dict[str, Tensor] = {}

    def splice(x: Tensor, point) -> Tensor:
        with torch.no_grad():
            f = sae.encode(x[0])  # (T, d_sae)
            x_hat = sae.decode(f).to(x.dtype)  # (T, D)
        # A leaf holding decode(f) + error: the gradient stops here, at the SAE's layer, where it is read.
        stream = (x_hat + (x[0] - x_hat)).detach().requires_grad_(True)
        spliced.update(x=x[0].detach(), f=f, x_hat=x_hat, stream=stream)
        return stream[None]

    with torch.enable_grad():
        logits = model.logits_recorded_from(image, layer - 1, [(resid_hook_name(layer), splice)])[0]  # (classes,)
        index = int(logits.argmax()) if target is None else int(target)
        if not 0 <= index < logits.shape[-1]:
            raise ValueError(f"target {index} is out of range: the model has {logits.shape[-1]} classes")
        (g,) = torch.autograd.grad(logits[index], spliced["stream"])  # (T, D)
        # Each latent's share is f_i times the logit's derivative along what latent i adds to the reconstruction:
        # the decoder's gradient at f (the rows W_dec[i], over their norms when the SAE rescales by them).
        f = spliced["f"].detach().requires_grad_(True)
        (along,) = torch.autograd.grad((sae.decode(f) * g.to(f.dtype)).sum(), f)  # (T, d_sae)
    with torch.no_grad():
        f, x, x_hat, g = spliced["f"], spliced["x"], spliced["x_hat"], g.detach()
        zero = sae.decode(torch.zeros_like(f)).to(x.dtype)  # what the decoder adds whatever the latents: b_dec
        image_grid = model.patch_grid(image.shape[2], image.shape[3])
        grid, prefix, _ = stream_shape(model, layer, image_grid)
        return FeatureAttribution(
            index, float(logits[index]), f, f * along, (g * zero).sum(-1), (g * (x - x_hat)).sum(-1),
            (g * x).sum(-1), grid, prefix, None if grid == image_grid else image_grid)
