"""What the explorer's "Features" view shows for one image and an SAE that fits the model (``check_fits``): its
strongest features with their activation maps on the patch grid, the features active at a token, an intervention
that zeroes or scales features and runs the rest of the model on the edited stream (one pass with a hook, or a copy
of the model that edits every pass: ``edited_copy``), a CLIP's nearest words to each feature, and the exemplars and
browser orders of ``features.npz``.

Everything is read from or written to the model's one forward at the SAE's hook point
(``blocks.{l}.hook_resid_post``); the edit replaces the layer's output by the reconstruction with the latents
changed plus the reconstruction error, so with no change the model computes exactly what it computed before.

A model with stages (Swin, Hiera): the SAE reads a layer's tokens on that layer's own grid and width
(``stream_shape``); a feature's map is on that grid, drawn over the image's patches (``ImageFeatures.patch_maps``:
each cell repeated over the ``2**stage`` patches it covers), a patch of the image means the cell covering it, and
the intervention's rollout runs through the stages from what the average pooling reads.
"""

from __future__ import annotations

import copy
import math
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor, nn

from vit.features.autoencoder import SAEError, SparseAutoencoder, check_fits, resid_hook_name, stream_shape
from vit.model import Encoding, HookPoint


@dataclass
class ImageFeatures:
    """One image's latents at the SAE's layer."""

    latents: Tensor  # (T, d_sae): every token's latents, prefix tokens first
    grid: tuple[int, int]  # the grid (gh, gw) the latents lie on: the image's patch grid, or a stage layer's own
    num_prefix_tokens: int
    image_grid: tuple[int, int] | None = None  # the image's patch grid, where ``grid`` is a stage layer's (else None)

    @property
    def patch_grid(self) -> tuple[int, int]:
        """The image's patch grid, which the maps of ``patch_maps`` and the tokens of ``cell`` are on."""
        return self.image_grid or self.grid

    def cell(self, token: int) -> int:
        """Token ``token`` of the image (prefix tokens first, then its patches) -> the token of ``latents`` covering
        it: itself, or on a stage layer's grid the cell over that patch (``covering_token``)."""
        if self.image_grid is None or token < self.num_prefix_tokens:
            return token
        from vit.model.stages import covering_token

        return covering_token(token - self.num_prefix_tokens, self.image_grid, self.grid) + self.num_prefix_tokens

    def strongest(self, count: int = 8) -> list[tuple[int, float]]:
        """The ``count`` features with the largest activation on any patch: ``(latent, max activation)``, largest
        first; features that never fire on a patch are left out."""
        peak = self.latents[self.num_prefix_tokens:].max(dim=0).values  # (d_sae,)
        values, index = peak.topk(min(count, len(peak)))
        return [(int(i), float(v)) for i, v in zip(index, values, strict=True) if v > 0]

    def patch_map(self, latent: int) -> Tensor:
        """Feature ``latent``'s activation on every patch ``(gh, gw)``, row-major as the patches are ordered."""
        return self.latents[self.num_prefix_tokens:, latent].reshape(self.grid)

    def patch_maps(self, latents: Sequence[int]) -> np.ndarray:
        """The maps of ``latents`` ``(n, gh, gw)`` on the image's patch grid (a stage layer's cells repeated over
        the patches they cover), for a grid of small maps."""
        from vit.explain.methods.stage_maps import on_patch_grid

        index = torch.as_tensor(list(latents), dtype=torch.long)
        maps = self.latents[self.num_prefix_tokens:, index].T.reshape(len(index), *self.grid).float().cpu().numpy()
        return on_patch_grid(maps, self.patch_grid)

    def active_at(self, token: int, count: int = 10) -> list[tuple[int, float]]:
        """The features active at ``token`` (prefix tokens first, then patches row by row): ``(latent, value)``,
        largest first, at most ``count``."""
        if not 0 <= token < len(self.latents):
            raise ValueError(f"token {token} is out of range for {len(self.latents)} tokens")
        row = self.latents[token]
        values, index = row.topk(min(count, len(row)))
        return [(int(i), float(v)) for i, v in zip(index, values, strict=True) if v > 0]


@torch.no_grad()
def image_features(model: nn.Module, sae: SparseAutoencoder, image: Tensor, fits: nn.Module | None = None
                   ) -> ImageFeatures:
    """``image`` ``(1, C, H, W)`` (any size that tiles into patches) -> its latents at the SAE's layer.

    ``fits``, here and below: the model the SAE is checked against (``check_fits``), when ``model`` is a copy of it
    with heads switched off (``ablated_copy``), whose weights are no longer the ones the SAE was trained on."""
    layer = check_fits(sae, model if fits is None else fits)
    name = resid_hook_name(layer)
    _, cache = model.run_with_cache(image, [name])
    image_grid = model.patch_grid(image.shape[2], image.shape[3])
    grid, prefix, _ = stream_shape(model, layer, image_grid)
    return ImageFeatures(sae.encode(cache[name][0]), grid, prefix, None if grid == image_grid else image_grid)


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


def check_scales(sae: SparseAutoencoder, scales: Mapping[int, float]) -> None:
    """ValueError in one line for a latent out of range or a factor that is not a finite number."""
    for latent, factor in scales.items():
        if not 0 <= latent < sae.d_sae:
            raise ValueError(f"feature {latent} is out of range: the SAE has {sae.d_sae:,}")
        if not math.isfinite(float(factor)):
            raise ValueError(f"feature {latent}'s factor must be a finite number, got {factor!r}")


@torch.no_grad()
def intervene(model: nn.Module, sae: SparseAutoencoder, images: Tensor, scales: Mapping[int, float],
              output_attentions: bool = True, fits: nn.Module | None = None) -> Encoding:
    """The model's pass over ``images`` with the SAE's latents ``scales`` ``{latent: factor}`` scaled at its layer
    (``edit_hook``): logits, embedding and every layer's attention, as ablation gives them for heads."""
    layer = check_fits(sae, model if fits is None else fits)
    check_scales(sae, scales)
    return model.run_with_hooks(images, [(resid_hook_name(layer), edit_hook(sae, scales))], output_attentions)


class EditedStream(HookPoint):
    """A block's ``hook_resid_post`` that always applies ``edit_hook(sae, scales)`` before the hooks set on it: the
    point an ``edited_copy`` holds in place of the model's."""

    def __init__(self, point: HookPoint, sae: SparseAutoencoder, scales: Mapping[int, float]) -> None:
        super().__init__()
        self.name = point.name
        self.edit = edit_hook(sae, scales)

    def forward(self, x: Tensor) -> Tensor:
        return HookPoint.forward(self, self.edit(x, self))

    __call__ = forward


def edited_copy(model: nn.Module, sae: SparseAutoencoder, scales: Mapping[int, float], fits: nn.Module | None = None
                ) -> nn.Module:
    """A copy of ``model`` whose every pass has the SAE's latents ``scales`` scaled at its layer (``edit_hook``):
    the forward, its attentions and every gradient or relevance walk the explorer draws, as ``ablated_copy`` does
    for heads. The copy shares every parameter and buffer with ``model``; the model itself is left alone."""
    layer = check_fits(sae, model if fits is None else fits)
    check_scales(sae, scales)
    shared = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    edited = copy.deepcopy(model, memo=shared)
    block = edited.blocks[layer - 1]
    block.hook_resid_post = EditedStream(block.hook_resid_post, sae, scales)
    return edited


@dataclass
class InterventionView:
    """One image's prediction read before and after an intervention, and its CLS rollout both ways."""

    logits_before: Tensor | None  # (classes,), None without a classifier
    logits_after: Tensor | None
    embedding_before: Tensor  # (E,)
    embedding_after: Tensor
    rollout_before: Tensor  # (gh, gw): attention rollout from the CLS token, heads averaged
    rollout_after: Tensor

    def rollouts(self) -> np.ndarray:
        """``(2, gh, gw)``: the rollout before and after, for a grid of two maps."""
        return torch.stack([self.rollout_before, self.rollout_after]).cpu().numpy()


@torch.no_grad()
def intervention_view(model: nn.Module, sae: SparseAutoencoder, image: Tensor, scales: Mapping[int, float],
                      fits: nn.Module | None = None) -> InterventionView:
    """``image`` ``(1, C, H, W)`` with and without ``scales``: two passes, their logits and CLS rollouts (the
    layers after the SAE's attend differently once the stream is edited)."""
    from vit.explain.methods.attention import rollout, token_map

    P = model.config.num_prefix_tokens
    grid = model.patch_grid(image.shape[2], image.shape[3])
    clean = model.encode(image, output_attentions=True)
    edited = intervene(model, sae, image, scales, fits=fits)

    def cls_rollout(attentions) -> Tensor:
        if getattr(model.config, "stage_depths", ()):  # no CLS: from every last-layer token, what the pooling reads
            from vit.explain.methods.stage_maps import rollout_row

            return rollout_row(attentions, model.layer_layouts(grid), -1, None)[0].float()
        return token_map(rollout(list(attentions), "mean", num_prefix_tokens=P), 0, grid, P)[0].float()

    return InterventionView(None if clean.logits is None else clean.logits[0],
                            None if edited.logits is None else edited.logits[0], clean.embedding[0],
                            edited.embedding[0], cls_rollout(clean.attentions), cls_rollout(edited.attentions))


# -- nearest words (CLIP, SigLIP) ----------------------------------------------------------------------------------

def _linear_norm(x: Tensor, norm: nn.Module) -> Tensor:
    """A LayerNorm's linear part on directions ``(..., D)``: centred and times its weight. Its division by the
    scale leaves a direction's cosine unchanged and its bias is the same for every feature, so both are left out.
    An RMSNorm (AIMv2) does not centre: its linear part is its weight alone."""
    if isinstance(norm, nn.RMSNorm):
        return x * norm.weight
    if not isinstance(norm, nn.LayerNorm):  # nn.Identity where fc_norm replaces the token norm
        return x
    x = x - x.mean(dim=-1, keepdim=True)
    return x * norm.weight if norm.weight is not None else x


@torch.no_grad()
def decoder_embeddings(model: nn.Module, sae: SparseAutoencoder, latents: Sequence[int] | None = None) -> Tensor:
    """Each decoder row ``W_dec[i]`` read as the model reads its last stream into the joint embedding, as though
    every token held it: the final norm's linear part, the pooling (CLS, mean, both, or an attention probe's value
    and output projections, whose weights sum to one over the tokens; its MLP branch is not linear and is left out),
    fc_norm's linear part and the projection -> ``(n, E)``, L2-normalised."""
    rows = sae.W_dec if latents is None else sae.W_dec[torch.as_tensor(list(latents), dtype=torch.long)]
    x = _linear_norm(rows.to(next(model.parameters())), model.norm)  # (n, D)
    pooling = model.config.pooling
    if pooling == "cls+avg":
        x = torch.cat([x, x], dim=-1)
    elif pooling == "map":
        pool = model.attn_pool
        D = x.shape[-1]
        # On every token a direction moves every key alike (the probe's softmax is unchanged) and every value by
        # W_v x, which weights summing to one pass on whole: the value and output projections, biases cancelling.
        x = F.linear(F.linear(x, pool.kv.weight[D:]), pool.proj.weight)
    if model.fc_norm is not None:
        x = _linear_norm(x, model.fc_norm)
    if model.projection is not None:
        x = F.linear(x, model.projection.weight)
    return F.normalize(x.float(), dim=-1)


def nearest_words(model: nn.Module, sae: SparseAutoencoder, text_embeddings: Tensor, latents: Sequence[int],
                  count: int = 5, fits: nn.Module | None = None) -> dict[int, list[tuple[int, float]]]:
    """For each of ``latents``, the ``count`` texts of ``text_embeddings`` ``(n, E)`` whose cosine with its
    ``decoder_embeddings`` is largest: ``{latent: [(text index, cosine), ...]}``, largest first."""
    check_fits(sae, model if fits is None else fits)
    if text_embeddings.ndim != 2 or text_embeddings.shape[0] == 0:
        raise ValueError("give at least one text embedding, (n, E)")
    directions = decoder_embeddings(model, sae, latents)  # (m, E)
    if directions.shape[-1] != text_embeddings.shape[-1]:
        raise ValueError(f"the text embeddings are {text_embeddings.shape[-1]}-wide, the model's joint embedding "
                         f"{directions.shape[-1]}-wide: give the model's own text tower's")
    cosines = directions @ F.normalize(text_embeddings.to(directions), dim=-1).T  # (m, n)
    values, index = cosines.topk(min(count, cosines.shape[1]), dim=-1)
    return {int(latent): [(int(i), float(v)) for i, v in zip(row_i, row_v, strict=True)]
            for latent, row_i, row_v in zip(latents, index, values, strict=True)}


# -- features.npz: exemplars, frequencies, classes ---------------------------------------------------------------

FEATURES_FILE = "features.npz"
MAX_FEATURE_VALUES = 200_000_000  # all arrays together: 2**20 latents' exemplars and 64-bin histograms fit
MAX_EXEMPLAR_IMAGES = 10_000_000  # the held-out images the exemplars index
FEATURES_ARRAYS = ("exemplar_values", "exemplar_images", "exemplar_tokens", "frequency", "images", "tokens_per_image")


@dataclass
class FeatureTable:
    """What ``features.npz`` says of each latent: its top (image, token) exemplars and how often it fires."""

    values: np.ndarray  # (d_sae, E) activation of each exemplar, largest first; 0 where fewer fired
    images: np.ndarray  # (d_sae, E) index into ``names``, -1 where fewer fired
    tokens: np.ndarray  # (d_sae, E) the token of that image (prefix tokens first, then patches row by row)
    frequency: np.ndarray  # (d_sae,) share of held-out tokens on which the latent fired
    names: list[str]  # the held-out images, relative to the folder the SAE was trained from
    tokens_per_image: int

    def exemplars(self, latent: int, distinct: bool = False) -> list[tuple[str, int, float]]:
        """Latent ``latent``'s exemplars: ``(image name, token, activation)``, strongest first; ``distinct``: each
        image once, at its strongest token (a feature of sky fills its top 16 with the patches of one sky)."""
        found = [(self.names[i], int(t), float(v)) for i, t, v in
                 zip(self.images[latent], self.tokens[latent], self.values[latent], strict=True) if i >= 0]
        if distinct:
            seen: set[str] = set()
            found = [e for e in found if not (e[0] in seen or seen.add(e[0]))]
        return found

    def dominant_class(self, latent: int) -> tuple[str, float] | None:
        """The class most of latent ``latent``'s exemplar images belong to (an image's first folder: the
        class folders of an image folder dataset) and its share; None without exemplars in class folders."""
        classes = [image_class(self.names[i]) for i in self.images[latent] if i >= 0]
        classes = [c for c in classes if c is not None]
        if not classes:
            return None
        names, counts = np.unique(classes, return_counts=True)
        best = int(np.argmax(counts))  # ties: the first name in sorted order
        return str(names[best]), float(counts[best] / len(classes))


def image_class(name: str) -> str | None:
    """The class folder of an image named relative to its dataset (``cat/0001.jpg`` -> ``cat``), or None."""
    parts = Path(name).parts
    return parts[0] if len(parts) > 1 else None


def _member_shapes(npz, keys: Sequence[str]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Each member's shape and dtype from its .npy header, before anything is read; ValueError past the bounds."""
    found, total = {}, 0
    for key in keys:
        with npz.zip.open(f"{key}.npy") as member:
            major, _ = np.lib.format.read_magic(member)
            read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            shape, _, dtype = read_header(member)
        if dtype.hasobject:
            raise ValueError(f"{key} holds Python objects")
        found[key] = (tuple(int(n) for n in shape), dtype)
        total += math.prod(found[key][0]) * (dtype.itemsize // 4 if dtype.kind == "U" else 1)
        if total > MAX_FEATURE_VALUES:
            raise ValueError(f"its arrays declare more than {MAX_FEATURE_VALUES:,} values")
    return found


def read_features(path: str | Path, d_sae: int) -> FeatureTable:
    """``features.npz`` of an SAE with ``d_sae`` latents; SAEError in one line for a file that is missing,
    damaged, of another width, or declares sizes past the bounds (checked from the headers before it is read)."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [key for key in FEATURES_ARRAYS if key not in npz.files]
            if missing:
                raise ValueError(f"it lacks {', '.join(missing)}")
            shapes = _member_shapes(npz, FEATURES_ARRAYS)
            (rows, E), names_shape = shapes["exemplar_values"][0], shapes["images"][0]
            for key in ("exemplar_images", "exemplar_tokens"):
                if shapes[key][0] != (rows, E):
                    raise ValueError(f"{key} has the shape {shapes[key][0]}, not {(rows, E)}")
            if rows != d_sae or shapes["frequency"][0] != (d_sae,):
                raise ValueError(f"it describes {rows:,} latents, the SAE has {d_sae:,}")
            if len(names_shape) != 1 or names_shape[0] > MAX_EXEMPLAR_IMAGES or shapes["images"][1].kind != "U":
                raise ValueError(f"images has the shape {names_shape} ({shapes['images'][1]}), not a list of names")
            table = FeatureTable(npz["exemplar_values"].astype(np.float32), npz["exemplar_images"].astype(np.int64),
                                 npz["exemplar_tokens"].astype(np.int64), npz["frequency"].astype(np.float32),
                                 [str(n) for n in npz["images"]], int(npz["tokens_per_image"]))
    except FileNotFoundError:
        raise SAEError(f"{path.parent.name} has no {FEATURES_FILE}: no exemplars to show (vit.sae train writes it)"
                       ) from None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise SAEError(f"{path.name} is not a readable features file ({str(e)[:120]})") from None
    if (table.images >= len(table.names)).any() or (table.images < -1).any() or not 1 <= table.tokens_per_image:
        raise SAEError(f"{path.name}: its exemplars index images it does not name")
    if ((table.tokens >= table.tokens_per_image) | (table.tokens < -1)).any():
        raise SAEError(f"{path.name}: its exemplars name tokens past {table.tokens_per_image} per image")
    return table


def browse_order(table: FeatureTable, sort: str = "frequency", class_name: str | None = None) -> list[int]:
    """The latents with exemplars in the order a browser shows them: ``sort`` "frequency" (most often firing
    first), "rare" (least often first, dead ones left out) or "class" (by their exemplars' dominant class, the
    purest first); with ``class_name`` only those whose dominant class it is."""
    live = [i for i in range(len(table.frequency)) if table.images[i, 0] >= 0]
    dominant = {i: table.dominant_class(i) for i in live} if sort == "class" or class_name is not None else {}
    if class_name is not None:
        live = [i for i in live if dominant[i] is not None and dominant[i][0] == class_name]
    if sort == "frequency":
        return sorted(live, key=lambda i: (-float(table.frequency[i]), i))
    if sort == "rare":
        return sorted(live, key=lambda i: (float(table.frequency[i]), i))
    if sort == "class":
        return sorted(live, key=lambda i: (dominant[i] is None, dominant[i][0] if dominant[i] else "",
                                           -(dominant[i][1] if dominant[i] else 0), i))
    raise ValueError(f"unknown order {sort!r}: frequency, rare or class")


def exemplar_crop(image: Image.Image, preprocessing, grid: tuple[int, int], num_prefix_tokens: int, token: int,
                  context: int = 1) -> tuple[Image.Image, tuple[int, int, int, int] | None]:
    """The part of ``image`` around exemplar ``token``, from what the model saw of it at its training size
    (``seen_region``, as the SAE's held-out pass saw it): the patch and ``context`` patches on each side, and the
    patch's box ``(x0, y0, x1, y1)`` in the crop. A prefix token (CLS, registers) reads the whole image: all of it
    and no box."""
    from vit.core.inference import seen_region

    seen = seen_region(image, preprocessing)
    if token < num_prefix_tokens:
        return seen, None
    gh, gw = grid
    row, col = divmod(token - num_prefix_tokens, gw)
    if row >= gh:
        raise ValueError(f"token {token} is past the {gh} x {gw} grid")
    ph, pw = seen.height / gh, seen.width / gw  # a patch in the seen region's pixels
    r0, c0 = max(row - context, 0), max(col - context, 0)
    r1, c1 = min(row + context + 1, gh), min(col + context + 1, gw)
    box = (round(c0 * pw), round(r0 * ph), round(c1 * pw), round(r1 * ph))
    crop = seen.crop(box)
    patch = (round(col * pw) - box[0], round(row * ph) - box[1], round((col + 1) * pw) - box[0],
             round((row + 1) * ph) - box[1])
    return crop, patch


def exemplar_thumbnail(image: Image.Image, preprocessing, grid: tuple[int, int], num_prefix_tokens: int, token: int,
                       side: int = 96, context: int = 1) -> Image.Image:
    """``exemplar_crop`` at ``side`` px on its long side, the exemplar's patch outlined (a prefix token's: the
    whole image the model saw, unmarked)."""
    from PIL import ImageDraw

    crop, patch = exemplar_crop(image, preprocessing, grid, num_prefix_tokens, token, context)
    scale = side / max(crop.size)
    thumb = crop.convert("RGB").resize((max(1, round(crop.width * scale)), max(1, round(crop.height * scale))),
                                       Image.Resampling.NEAREST if scale > 1 else Image.Resampling.BICUBIC)
    if patch is not None:
        box = [round(v * scale) for v in patch]
        ImageDraw.Draw(thumb).rectangle([box[0], box[1], box[2] - 1, box[3] - 1], outline=(255, 75, 75), width=2)
    return thumb
