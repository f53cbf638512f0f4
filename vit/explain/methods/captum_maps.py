"""The model-agnostic baselines: captum's Integrated Gradients, SmoothGrad, occlusion, feature ablation, KernelSHAP
and Input x Gradient, run by captum itself on the model's logits, and RISE (``vit.explain.methods.rise``).

Each explains one class of one input ``x (1, C, H, W)`` (the model's normalised input). A pixel method's map
(``PIXEL_METHODS``: ``integrated_gradients``, ``smoothgrad``, ``input_x_gradient``) is captum's attribution summed
over the colour channels, on the model's input pixels ``(H, W)``, signed; ``patch_map`` sums it over each patch's
pixels (``relevance.patch_sums``, as full LRP's) for what reads the patch grid (benchmarks, the explorer's page).
RISE's is summed per patch. A patch method's
(``occlusion``, ``feature_ablation``, ``kernel_shap``) perturbs the patches: captum's ``feature_mask`` is the patch
grid, ``(1, 1, H, W)`` of row-major patch indices broadcast over the channels, and captum gives every pixel of a
patch the patch's value; its map is the mean over each patch's pixels and channels (that value; an occlusion
window other than one patch makes it the mean of the windows over the patch).

Every parameter is captum's (its defaults, and its names: ``n_steps``, ``baselines``, ``nt_samples``, ``stdevs``,
``sliding_window_shapes``, ``strides``, ``n_samples``) or the RISE authors' (``n_masks``, ``s``, ``p1``), and
``batch``: the forwards run at once (captum's ``internal_batch_size``, ``nt_samples_batch_size``,
``perturbations_per_eval``; RISE's ``gpu_batch``), by default the most that fit the memory limit.
``Options.of(method, given)`` checks them before any work; ``passes`` counts the forwards, which
``vit.costs.plan.attribution`` holds to its limits.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from vit.explain.methods import rise as rise_module

CAPTUM_METHODS = ("integrated_gradients", "smoothgrad", "occlusion", "feature_ablation", "kernel_shap",
                  "input_x_gradient")
ATTRIBUTION_METHODS = CAPTUM_METHODS + ("rise",)
PATCH_METHODS = ("occlusion", "feature_ablation", "kernel_shap")  # captum's perturbations of the patch grid
GRADIENT_METHODS = ("integrated_gradients", "smoothgrad", "input_x_gradient")  # a backward per forward
PIXEL_METHODS = GRADIENT_METHODS  # a map on the input's pixels (registry.Method.pixels), patch sums on request


@dataclass(frozen=True)
class Options:
    """The parameters of one attribution; the defaults are captum's (and the RISE authors')."""

    n_steps: int = 50  # integrated_gradients: captum's default (Gauss-Legendre steps)
    baselines: float = 0.0  # IG, occlusion, feature ablation, KernelSHAP: captum's zeros, in the model's input space
    baseline: str = "value"  # "value": ``baselines`` (0: the preprocessing's mean colour); "black": a black image
    nt_samples: int = 5  # smoothgrad: captum's NoiseTunnel default
    stdevs: float = 1.0  # smoothgrad: captum's default, the noise's standard deviation in the model's input space
    sliding_window_shapes: int | None = None  # occlusion: the window's side in pixels (default one patch)
    strides: int | None = None  # occlusion: in pixels (default the window's side: windows tile the input)
    n_samples: int = 25  # kernel_shap: captum's default
    n_masks: int = rise_module.N_MASKS  # rise: the authors' N
    s: int = rise_module.CELLS  # rise: the authors' grid of s x s cells
    p1: float = rise_module.P1  # rise: the probability a cell is kept
    seed: int = 0  # smoothgrad's noise, KernelSHAP's coalitions, RISE's masks
    batch: int | None = None  # forwards at once; default the most that fit the memory limit (at most plan.MAX_BATCH)

    @classmethod
    def of(cls, method: str, given: Mapping[str, object] | None = None) -> Options:
        """``method``'s options from ``given`` (name -> value; a CLI's strings are converted), each checked against
        its bounds; ValueError in one line for a name the method does not take or a value out of bounds."""
        given = dict(given or {})
        takes = OPTIONS.get(method, ())
        unknown = [name for name in given if name not in takes]
        if unknown:
            raise ValueError(f"{method} does not take {', '.join(unknown)}; it takes {', '.join(takes) or 'none'}")
        values = {}
        for f in fields(cls):
            if f.name not in given or given[f.name] is None:
                continue
            if f.name in CHOICES:  # a word, not a number
                if given[f.name] not in CHOICES[f.name]:
                    raise ValueError(f"{method}'s {f.name} must be one of {', '.join(CHOICES[f.name])}; got "
                                     f"{given[f.name]!r}")
                values[f.name] = given[f.name]
                continue
            low, high, kind = BOUNDS[f.name]
            value = given[f.name]
            try:
                if isinstance(value, bool) or (kind is int and isinstance(value, float) and not value.is_integer()):
                    raise ValueError
                value = kind(value)
            except (TypeError, ValueError):
                raise ValueError(f"{method}'s {f.name} must be {'an integer' if kind is int else 'a number'}; "
                                 f"got {given[f.name]!r}") from None
            if not (low <= value <= high):  # NaN fails too
                raise ValueError(f"{method}'s {f.name} must be between {low:,} and {high:,}; got {value!r}")
            values[f.name] = value
        return cls(**values)


# Integrated Gradients' steps: captum's Gauss-Legendre weights (numpy's leggauss) cost n² memory and n³ time before any
# forward (10,000 steps: 1.2 GB and minutes, issue 95); 2,000 take 0.5 s and 46 MB, and are counted (QUADRATURE_BYTES).
MAX_STEPS = 2_000
QUADRATURE_BYTES = 16  # per n_steps²: leggauss's companion matrix and its eigenvectors (46 MB measured at 2,000)
# captum's perturbation methods form each pass's input beside its forward: (input-sized float tensors, int64 masks of
# the input's pixels) a pass. Feature ablation and KernelSHAP: the expanded input, the masked input, the baseline's
# share and their sum, and the patch mask compared to each feature; occlusion also its window's mask over every
# channel and its complement. Measured at 512 px on 3 channels, 32 passes at once, of which 4.2 MB each the forward's:
# feature ablation 17.1 MB a pass, occlusion 28.3 (issue 95: occlusion at 1,024 px counted at 1,020 MB, killed at 3 GB).
PERTURBATION = {"feature_ablation": (4, 1), "kernel_shap": (4, 1), "occlusion": (8, 1)}


def held_bytes(method: str, options: Options, shape: tuple[int, int], channels: int) -> tuple[int, int]:
    """``(bytes each pass holds beside its forward, bytes held throughout)`` of ``method`` on an input of ``shape``
    px: RISE's masks (``vit.explain.methods.rise``), captum's perturbations' formed inputs, IG's quadrature,
    SmoothGrad's noisy copies."""
    H, W = shape
    if method == "rise":
        return rise_module.batch_bytes(options.s, shape), rise_module.held_bytes(options.n_masks, options.s)
    if method in PERTURBATION:
        inputs, masks = PERTURBATION[method]  # and throughout: the attribution, its weights, the input and baseline
        return H * W * (inputs * channels * 4 + masks * 8), 6 * channels * H * W * 4
    if method == "integrated_gradients":
        return 0, QUADRATURE_BYTES * options.n_steps ** 2
    if method == "smoothgrad":  # every noisy copy, drawn before the first forward (``smoothgrad``), and their sum
        return 0, (options.nt_samples + 1) * channels * H * W * 4
    return 0, 0


# What each method takes, captum's names; and each option's (low, high, type), checked before the work.
OPTIONS: dict[str, tuple[str, ...]] = {
    "integrated_gradients": ("n_steps", "baseline", "baselines", "batch"),
    "smoothgrad": ("nt_samples", "stdevs", "seed", "batch"),
    "occlusion": ("sliding_window_shapes", "strides", "baseline", "baselines", "batch"),
    "feature_ablation": ("baseline", "baselines", "batch"),
    "kernel_shap": ("n_samples", "baseline", "baselines", "seed", "batch"),
    "input_x_gradient": (),
    "rise": ("n_masks", "s", "p1", "seed", "batch"),
}
BOUNDS: dict[str, tuple[float, float, type]] = {
    "n_steps": (1, MAX_STEPS, int), "baselines": (-1e6, 1e6, float), "nt_samples": (1, 10_000, int),
    "stdevs": (0.0, 1e6, float), "sliding_window_shapes": (1, 100_000, int), "strides": (1, 100_000, int),
    "n_samples": (1, 100_000, int), "n_masks": (1, 100_000, int), "s": (1, 1024, int), "p1": (1e-6, 1.0, float),
    "seed": (0, 2**32 - 1, int), "batch": (1, 4096, int),
}
# The options whose value is one of a few words: the baseline, "value" (``baselines`` in the model's normalised input,
# captum's 0 the preprocessing's mean colour) or "black" (a black image, normalised as the model's input is)
CHOICES: dict[str, tuple[str, ...]] = {"baseline": ("value", "black")}


# What the explorer's sidebar offers of each method's options (the batch is the memory bound's to choose) and how a
# link writes them: ``name=value`` pairs, only those that differ from the defaults.
def page_options(method: str) -> tuple[str, ...]:
    """The options of ``method`` the explorer shows (``OPTIONS`` but ``batch``); () for any other map."""
    return tuple(name for name in OPTIONS.get(method, ()) if name != "batch")


def chosen_options(method: str, values: Mapping[str, object]) -> tuple[tuple[str, float | int], ...]:
    """``(name, value)`` of ``values`` that ``method`` takes and that differ from the defaults, in ``OPTIONS``'
    order: what a map's settings, cache keys and link hold (a default left out, so a default view's link is
    unchanged). ValueError for a value out of its bounds (``Options.of``)."""
    given = {name: values[name] for name in page_options(method) if values.get(name) is not None}
    chosen = Options.of(method, given)
    default = Options()
    return tuple((name, getattr(chosen, name)) for name in page_options(method)
                 if getattr(chosen, name) != getattr(default, name))


def options_text(options: tuple[tuple[str, float | int], ...]) -> str:
    """A link's ``attr`` value: ``n_steps=20,baselines=0.5``."""
    return ",".join(f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}" for name, value in options)


def parse_options(text: str) -> tuple[tuple[str, float | int], ...]:
    """``options_text``'s pairs back, each name one of ``BOUNDS`` (but ``batch``) or ``CHOICES`` and its value within
    them; ValueError in one line otherwise. Which method takes them is checked where the map is drawn."""
    pairs = []
    for part in text.split(","):
        name, sep, value = part.partition("=")
        if not sep or name not in (*BOUNDS, *CHOICES) or name == "batch":
            raise ValueError(f"give name=value pairs of {', '.join(n for n in (*BOUNDS, *CHOICES) if n != 'batch')}")
        if name in CHOICES:
            if value not in CHOICES[name]:
                raise ValueError(f"{name} must be one of {', '.join(CHOICES[name])}")
            pairs.append((name, value))
            continue
        low, high, kind = BOUNDS[name]
        try:
            number = kind(value) if kind is float else int(value)
        except ValueError:
            raise ValueError(f"{name} must be {'an integer' if kind is int else 'a number'}") from None
        if not low <= number <= high:
            raise ValueError(f"{name} must be between {low:,} and {high:,}")
        pairs.append((name, number))
    return tuple(pairs)


def _window(options: Options, patch: tuple[int, int], shape: tuple[int, int]) -> tuple[tuple[int, int],
                                                                                       tuple[int, int]]:
    """Occlusion's window and strides in pixels ``((h, w), (h, w))``: one patch by default; ValueError for a window
    larger than the input, or strides past a window that does not cover the input (captum's assertion: the pixels
    between two windows would never be occluded)."""
    window = patch if options.sliding_window_shapes is None else (options.sliding_window_shapes,) * 2
    strides = window if options.strides is None else (options.strides,) * 2
    if window[0] > shape[0] or window[1] > shape[1]:
        raise ValueError(f"occlusion's sliding_window_shapes {window[0]} px is larger than the {shape[1]}x{shape[0]} "
                         "px input; choose a smaller window")
    if any(w < side and s > w for s, w, side in zip(strides, window, shape, strict=True)):
        most = min(window)
        raise ValueError(f"occlusion's strides {strides[0]} px are larger than its {window[1]}x{window[0]} px window, "
                         f"so the pixels between two windows would never be occluded; choose strides of at most "
                         f"{most} px (the default is the window's side) or a larger sliding_window_shapes")
    return window, strides


def passes(method: str, options: Options, grid: tuple[int, int], shape: tuple[int, int],
           patch: tuple[int, int]) -> int:
    """The forwards ``method`` runs on an input of ``shape = (H, W)`` px on patch ``grid`` (each with a backward for
    ``GRADIENT_METHODS``): IG ``n_steps``, SmoothGrad ``nt_samples``, occlusion one per window and the input's,
    feature ablation one per patch and the input's, KernelSHAP ``n_samples`` and the input's, Input x Gradient
    one, RISE ``n_masks``. ValueError for an occlusion window larger than the input."""
    if method == "occlusion":
        (wh, ww), (sh, sw) = _window(options, patch, shape)
        return ((shape[0] - wh) // sh + 1) * ((shape[1] - ww) // sw + 1) + 1
    return {"integrated_gradients": options.n_steps, "smoothgrad": options.nt_samples,
            "feature_ablation": grid[0] * grid[1] + 1, "kernel_shap": options.n_samples + 1,
            "input_x_gradient": 1, "rise": options.n_masks}[method]


def feature_mask(grid: tuple[int, int], shape: tuple[int, int], device: torch.device | str = "cpu") -> Tensor:
    """captum's ``feature_mask`` of the patch grid: ``(1, 1, H, W)`` long, each pixel its patch's row-major index
    (``row * gw + col``), broadcast over the channels. The patches tile ``shape = (H, W)`` exactly."""
    (gh, gw), (H, W) = grid, shape
    if H % gh or W % gw:
        raise ValueError(f"a {H}x{W} input does not tile into a {gh}x{gw} grid")
    index = torch.arange(gh * gw, device=device).reshape(gh, gw)
    return index.repeat_interleave(H // gh, 0).repeat_interleave(W // gw, 1)[None, None]  # (1, 1, H, W)


_GLOBAL_GENERATOR = threading.Lock()  # held while a computation draws from torch's global generator (KernelSHAP)


def smoothgrad(saliency, x: Tensor, class_index: int, options: Options, batch: int) -> Tensor:
    """captum's SmoothGrad (``NoiseTunnel(Saliency).attribute(nt_type="smoothgrad", abs=False)``) of ``x (1, C, H,
    W)``: ``(1, C, H, W)``, the mean of ``saliency``'s signed gradients over ``options.nt_samples`` noisy copies, run
    ``batch`` at a time, drawn from a generator of its own seeded ``options.seed``: the draws captum's call makes after
    ``torch.manual_seed(options.seed)``, while torch's global generator, which every thread of the server shares, is
    left to them.

    captum draws each batch's noise with one ``torch.normal``, whose draws depend on the tensor's size (on the CPU it
    fills 16 at a time and redraws the last 16), so with C x H x W not a multiple of 16 the same seed gave another map
    at each batch (issue 90). Here all the noise is drawn first, as captum's call in one batch draws it (its
    ``_add_noise_to_input``): the map is that call's whatever the batch, at the cost of ``held_bytes``'s noisy
    copies."""
    n = options.nt_samples
    with torch.no_grad():
        stdevs = torch.tensor(options.stdevs, device=x.device).expand(n, *x.shape[1:])  # captum's, not repeated
        generator = torch.Generator(device=x.device).manual_seed(options.seed)
        noisy = torch.normal(0, stdevs, generator=generator).add_(x.detach())  # (n, C, H, W)
    total = torch.zeros_like(x, dtype=noisy.dtype)  # (1, C, H, W)
    for start in range(0, n, batch):
        gradients = saliency.attribute(noisy[start:start + batch].detach().requires_grad_(), target=class_index,
                                       abs=False)  # (b, C, H, W)
        total += gradients.detach().sum(dim=0, keepdim=True)
    return total / n


def black_input(x: Tensor, preprocessing) -> Tensor:
    """A black image as the model's input ``x (1, C, H, W)`` is formed (``preprocessing``'s mean and std): the
    ``baseline="black"`` of the methods that take one."""
    from vit.core.images import normalize

    return normalize(torch.zeros_like(x), preprocessing.mean, preprocessing.std).to(x.dtype)  # (1, C, H, W)


def attribution(forward, x: Tensor, method: str, class_index: int, grid: tuple[int, int], options: Options,
                batch: int, progress=None, baselines: float | Tensor | None = None) -> Tensor:
    """captum's (or RISE's) attribution of ``class_index`` for ``x (1, C, H, W)``: ``(1, C, H, W)`` (RISE's
    ``(1, H, W)``), ``batch`` forwards at once. ``forward(images) -> logits (B, classes)``. The random ones are
    seeded by ``options.seed`` without touching the caller's random state. ``baselines``: captum's, default
    ``options.baselines`` (``black_input`` for ``baseline="black"``)."""
    baselines = options.baselines if baselines is None else baselines
    from captum.attr import (
        FeatureAblation,
        InputXGradient,
        IntegratedGradients,
        KernelShap,
        Occlusion,
        Saliency,
    )

    H, W = x.shape[2:]
    if method == "rise":
        masks = rise_module.Masks(options.n_masks, options.s, options.p1, (H, W), options.seed)
        return rise_module.rise(forward, x, class_index, masks, batch, progress)
    mask = feature_mask(grid, (H, W), x.device)
    x = x.detach().requires_grad_(method in GRADIENT_METHODS)
    if method == "integrated_gradients":
        return IntegratedGradients(forward).attribute(x, baselines=baselines, target=class_index,
                                                      n_steps=options.n_steps, internal_batch_size=batch)
    if method == "smoothgrad":
        return smoothgrad(Saliency(forward), x, class_index, options, batch)
    if method == "input_x_gradient":
        return InputXGradient(forward).attribute(x, target=class_index)
    if method == "occlusion":
        patch = (H // grid[0], W // grid[1])
        window, strides = _window(options, patch, (H, W))
        return Occlusion(forward).attribute(x, sliding_window_shapes=(x.shape[1], *window),
                                            strides=(x.shape[1], *strides), baselines=baselines,
                                            target=class_index, perturbations_per_eval=batch)
    if method == "feature_ablation":
        return FeatureAblation(forward).attribute(x, baselines=baselines, target=class_index,
                                                  feature_mask=mask, perturbations_per_eval=batch)
    if method == "kernel_shap":
        # captum draws the coalitions from torch's global generator, between forwards, and takes none of its own:
        # every thread's, so one seeded KernelSHAP at a time in this process (another's draws, or fork_rng's restore
        # at its end, would change this one's), the caller's random state restored after
        devices = [x.device] if x.device.type == "cuda" else []
        with _GLOBAL_GENERATOR, torch.random.fork_rng(devices=devices):
            torch.manual_seed(options.seed)
            return KernelShap(forward).attribute(x, baselines=baselines, target=class_index, feature_mask=mask,
                                                 n_samples=options.n_samples, perturbations_per_eval=batch)
    raise ValueError(f"unknown attribution {method!r}; choose one of: {', '.join(ATTRIBUTION_METHODS)}")


def pixel_map(attributions: Tensor) -> Tensor:
    """The ``(1, H, W)`` map of a pixel method's attribution ``(1, C, H, W)``: summed over the colour channels,
    signed."""
    return attributions.detach().sum(dim=1).float()  # (1, H, W)


def patch_map(method: str, attributions: Tensor, grid: tuple[int, int]) -> Tensor:
    """The ``(1, gh, gw)`` map of an attribution ``(1, C, H, W)`` (RISE's ``(1, H, W)``): a pixel method's summed
    over the channels and each patch's pixels, a patch method's its mean there (the patch's own value)."""
    from vit.explain.methods.relevance import patch_sums

    pixels = attributions if attributions.dim() == 3 else attributions.sum(dim=1)  # (1, H, W)
    sums = patch_sums(pixels.detach().float(), grid)
    if method in PATCH_METHODS:
        cells = attributions[0].numel() / (grid[0] * grid[1])  # a patch's pixels times the channels
        return sums / cells
    return sums


def batches(count: int, batch: int) -> int:
    """How many batches of ``batch`` run ``count`` forwards."""
    return math.ceil(count / batch)


def title(method: str) -> str:
    """``method``'s name in a refusal: ``Integrated gradients``, ``RISE``."""
    return method.replace("_", " ").capitalize() if method != "rise" else "RISE"


def planned_batch(model, method: str, options: Options, grid: tuple[int, int], shape: tuple[int, int],
                  patch: tuple[int, int], channels: int) -> tuple[int, int]:
    """``(forwards, forwards at once)`` of ``method`` with ``options`` on an input of ``shape = (H, W)`` px of
    ``channels`` colours, on patch ``grid`` of ``patch`` px, each counted by the cost model before any work and
    refused there in one line: the forwards (``plan.attribution_passes``), then the batch's memory
    (``plan.attribution``), the batch ``options.batch`` or the most that fit the memory limit
    (``plan.attribution_batch``). ``model``: our ViT, or a library model's ``vit.costs.plan.LibraryShape``."""
    from vit.costs import plan

    name = title(method)
    count = passes(method, options, grid, shape, patch)
    gradient = method in GRADIENT_METHODS
    plan.decide(plan.attribution_passes(model, grid, name, count))
    extra, held = held_bytes(method, options, shape, channels)
    batch = options.batch or plan.attribution_batch(model, grid, count, gradient, extra, held)
    hint = {"rise": "fewer masks or a smaller s", "integrated_gradients": "fewer steps",
            "smoothgrad": "fewer samples"}.get(method, "")
    plan.decide(plan.attribution(model, grid, name, count, batch, gradient, extra, held, hint))
    return count, batch


def attribution_map(checkpoint, image, method: str, class_index: int, size, options: Mapping[str, object] | None = None,
                    progress=None, reporting: Callable[[int], AbstractContextManager] | None = None,
                    pixels: bool = False) -> Tensor:
    """``model_method_map``'s map of ``method`` (``ATTRIBUTION_METHODS``) for one image: ``(1, gh, gw)``; with
    ``pixels``, a ``PIXEL_METHODS`` one's ``(1, H, W)`` on the model's input pixels (``pixel_map``). Its options
    (``Options.of``), its forwards and its batch's memory (``vit.costs.plan.attribution``) are checked before any
    work. ``progress(done, total)`` reports RISE's masks; captum's methods report the blocks run inside
    ``reporting(total blocks)``, the caller's context (``method_maps.reported_blocks``, which imports this module)."""
    from vit.core.inference import ModelInput

    model = checkpoint.model
    if model.head is None:
        raise ValueError(f"{title(method)} explains a class: this model has no classifier")
    if model.config.stage_depths:
        raise ValueError(f"{title(method)} is drawn on one patch grid: a model with stages (Swin, Hiera) is refused")
    chosen = Options.of(method, options)
    given = ModelInput.of(checkpoint, image, size)
    shape = given.shape  # (H, W)
    grid = model.patch_grid(*shape)
    patch = (shape[0] // grid[0], shape[1] // grid[1])
    count, batch = planned_batch(model, method, chosen, grid, shape, patch, checkpoint.preprocessing.num_channels)
    device = next(model.parameters()).device
    x = given.pixels(device)  # (1, C, H, W)

    def forward(images: Tensor) -> Tensor:
        return model(images)[0]  # the logits of the (logits, attentions) contract

    if method == "rise":
        return patch_map(method, attribution(forward, x, method, class_index, grid, chosen, batch, progress), grid)
    baselines = black_input(x, checkpoint.preprocessing) if chosen.baseline == "black" else None
    with (reporting or (lambda total: contextlib.nullcontext()))(batches(count, batch) * len(model.blocks)):
        attributions = attribution(forward, x, method, class_index, grid, chosen, batch,
                                   baselines=baselines)  # (1, C, H, W)
    return pixel_map(attributions) if pixels else patch_map(method, attributions, grid)


# The explorer's caption of each (vit.explain.views.map_captions): the method's name, what its map sums.
def caption(method: str, options: Options | None = None, pixels: bool = False) -> tuple[str, str]:
    """``(title, what it shows)`` of an attribution map with ``options`` (default: captum's and the RISE authors'),
    for the map's caption: the settings named are the ones it ran with. ``pixels``: a pixel method's map on the
    input's pixels (``pixel_map``), not summed over each patch."""
    o = options or Options()
    summed = "summed over the colour channels at each of the model's input pixels" if pixels else \
        "summed over the colour channels and each patch's pixels"
    # Zeros in the normalised input are the preprocessing's mean colour, not black (issue 90: the caption said black).
    baseline = "a baseline of zeros in the model's normalised input (every pixel at the preprocessing's mean " \
        "colour)" if o.baselines == 0 else f"a baseline of {o.baselines:g} in the model's normalised input"
    set_to = "set to the preprocessing's mean colour (zeros in the model's normalised input)" if o.baselines == 0 \
        else f"set to {o.baselines:g} in the model's normalised input"
    if o.baseline == "black":  # the option says which baseline ran: then ``baselines`` is not used
        baseline, set_to = "a black image (baseline=black)", "set to black (baseline=black)"
    window = "a patch-sized window" if o.sliding_window_shapes is None else \
        f"a {o.sliding_window_shapes}-px window"
    stride = "" if o.strides is None else f", every {o.strides} px"
    steps = f"{o.n_steps} step{'s' if o.n_steps != 1 else ''}"
    return {
        "integrated_gradients": ("Integrated Gradients", f"the gradient of the class score along the straight path "
                                 f"from {baseline} to the image, times the input's difference, {summed} "
                                 f"(Sundararajan et al., 2017; captum's, {steps})"),
        "smoothgrad": ("SmoothGrad", f"the gradient of the class score averaged over {o.nt_samples} noisy copies of "
                       f"the input (noise of standard deviation {o.stdevs:g} in the model's input), {summed} "
                       "(Smilkov et al., 2017; captum's NoiseTunnel)"),
        "input_x_gradient": ("Input × Gradient", f"the input times the gradient of the class score, {summed} "
                             "(captum's InputXGradient)"),
        "occlusion": ("Occlusion", f"how much the class score drops when {window}{stride} there is {set_to} "
                      "(Zeiler & Fergus, 2014; captum's Occlusion)"),
        "feature_ablation": ("Feature ablation", f"how much the class score drops when the patch is {set_to} "
                             "(captum's FeatureAblation)"),
        "kernel_shap": ("KernelSHAP", f"each patch's Shapley value for the class score, estimated from "
                        f"{o.n_samples:,} random coalitions of patches, the others {set_to} (Lundberg & Lee, 2017; "
                        "captum's KernelShap)"),
        "rise": ("RISE", f"the mean of {o.n_masks:,} random masks ({o.s}x{o.s} cells, each kept with probability "
                 f"{o.p1:g}), each weighted by the class's probability of the image masked by it, summed per patch "
                 "(Petsiuk et al., 2018)"),
    }[method]


