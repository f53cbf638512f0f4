"""A sparse autoencoder over one hook point's activations, and its files in SAELens's on-disk format.

``SparseAutoencoder`` computes what SAELens's ``TopKSAE``, ``StandardSAE``, ``JumpReLUSAE`` and ``GatedSAE`` compute
(sae-lens 6, checked against their code in ``tests/test_sae.py`` and ``tests/test_sae_architectures.py``):
``sae_in = x - b_dec`` (when ``apply_b_dec_to_input``), ``pre = sae_in @ W_enc + b_enc`` (times the decoder row
norms with ``rescale_acts_by_decoder_norm``), then the ``k`` largest pre-activations kept through a ReLU ("topk",
Gao et al. 2024), a plain ReLU ("standard"), a ReLU zeroed at or below a per-latent ``threshold`` ("jumprelu",
Rajamanoharan et al. 2024), or ("gated", Rajamanoharan et al. 2024) the ReLU of a magnitude path
``sae_in @ (W_enc * exp(r_mag)) + b_mag`` where the gate ``sae_in @ W_enc + b_gate`` is positive;
``x_hat = z @ W_dec + b_dec``. SAELens's BatchTopK and Matryoshka-BatchTopK SAEs are trained with a batch-wide TopK
and saved as JumpReLU (their running ``topk_threshold`` every latent's threshold, the decoder norms folded in when
they rescaled by them); a training folder of theirs (``architecture`` "batchtopk" or "matryoshka_batchtopk",
``topk_threshold`` among the weights) is read in that inference form, as "jumprelu". Its AuxK loss is Gao et al.'s:
the top ``d_in / 2`` dead latents reconstruct the live latents' residual (SAELens's ``calculate_topk_aux_loss``).

A folder holds ``cfg.json`` (SAELens 6's keys: ``d_in``, ``d_sae``, ``architecture``, ``k``,
``apply_b_dec_to_input``, ``metadata.model_name``, ``metadata.hook_name`` ...) and ``sae_weights.safetensors``
(``W_enc (d_in, d_sae)``, ``b_enc``, ``W_dec (d_sae, d_in)``, ``b_dec``; ``threshold (d_sae)`` for JumpReLU,
``b_gate``, ``r_mag``, ``b_mag (d_sae)`` and no ``b_enc`` for gated), so SAELens's ``SAE.load_from_disk``
reads what ``save_sae`` writes and ``load_sae`` reads SAELens's folders (pre-6 configs too).
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from vit.core.runfiles import atomic_write_bytes, atomic_write_text

CFG_FILE = "cfg.json"  # SAELens's SAE_CFG_FILENAME
WEIGHTS_FILE = "sae_weights.safetensors"  # SAELens's SAE_WEIGHTS_FILENAME
SAE_LENS_FORMAT = "6.0.0"  # the sae-lens version whose cfg.json layout we write (metadata holds model and hook)
ARCHITECTURES = ("topk", "standard", "jumprelu", "gated")
BATCH_TOPK = ("batchtopk", "matryoshka_batchtopk")  # SAELens's training forms, read as the JumpReLU they save
MAX_D_SAE = 2**20  # a million latents: the largest published SAEs (Gao et al.'s 16M aside) stay below
MAX_D_IN = 16384  # ViTConfig's bound on hidden_size
# check_in_use: what an SAE must keep finite. Published ViTs' residual streams stay below ~1e3 a token (outlier tokens
# included); an analysis multiplies a latent's reconstruction by a gradient and sums it over tokens (the headroom).
IN_USE_INPUT_NORM = 1e4
IN_USE_HEADROOM = 1e6


class SAEError(ValueError):
    """An SAE folder that cannot be used (missing, damaged, of another model or layer); one line saying why."""


@dataclass
class SAEInfo:
    """What a folder says about its SAE besides the weights: which model and hook point it reads."""

    model_name: str | None = None
    hook_name: str | None = None
    model_fingerprint: str | None = None  # ours: ``model_fingerprint(model)``, to refuse another model's SAE exactly
    extra: dict = field(default_factory=dict)  # the rest of cfg.json's metadata, kept when saving again


class SparseAutoencoder(nn.Module):
    """``W_enc (d_in, d_sae)``, ``b_enc (d_sae)``, ``W_dec (d_sae, d_in)``, ``b_dec (d_in)`` and how they encode;
    JumpReLU adds ``threshold (d_sae)``, gated has ``b_gate``, ``r_mag``, ``b_mag (d_sae)`` in place of ``b_enc``."""

    def __init__(self, d_in: int, d_sae: int, k: int | None = None, architecture: str = "topk",
                 apply_b_dec_to_input: bool = True, rescale_acts_by_decoder_norm: bool = False,
                 info: SAEInfo | None = None) -> None:
        super().__init__()
        check_sizes(d_in, d_sae, k, architecture)
        self.d_in, self.d_sae, self.k, self.architecture = d_in, d_sae, k, architecture
        self.apply_b_dec_to_input = apply_b_dec_to_input
        self.rescale_acts_by_decoder_norm = rescale_acts_by_decoder_norm
        self.info = info or SAEInfo()
        # SAELens's initialisation (and Gao et al.'s): the encoder starts as the decoder's transpose.
        W_dec = nn.init.kaiming_uniform_(torch.empty(d_sae, d_in))
        self.W_dec = nn.Parameter(W_dec)
        self.W_enc = nn.Parameter(W_dec.T.clone().contiguous())
        for name in encoder_biases(architecture):
            setattr(self, name, nn.Parameter(torch.zeros(d_sae)))
        self.b_dec = nn.Parameter(torch.zeros(d_in))

    def weight_names(self) -> tuple[str, ...]:
        """The tensors SAELens's class of this architecture holds, in its state dict's names."""
        return ("W_enc", "W_dec", "b_dec", *encoder_biases(self.architecture))

    def pre_activations(self, x: Tensor) -> Tensor:
        """``x (..., d_in)`` -> the latents before the activation ``(..., d_sae)`` (SAELens's ``hidden_pre``; a
        gated SAE's magnitude path)."""
        sae_in = x.to(self.W_enc.dtype) - self.b_dec * self.apply_b_dec_to_input
        if self.architecture == "gated":
            return sae_in @ (self.W_enc * self.r_mag.exp()) + self.b_mag  # as SAELens: exp(r_mag) scales W_enc
        pre = sae_in @ self.W_enc + self.b_enc  # (..., d_sae)
        if self.rescale_acts_by_decoder_norm:
            pre = pre * self.W_dec.norm(dim=-1)
        return pre

    def activate(self, pre: Tensor) -> Tensor:
        """Pre-activations -> latents: the ``k`` largest kept through a ReLU, the rest zero (or a ReLU, or a ReLU
        zeroed at or below each latent's threshold)."""
        if self.architecture == "standard":
            return pre.relu()
        if self.architecture == "jumprelu":
            return pre.relu() * (pre > self.threshold).to(pre.dtype)
        values, indices = pre.topk(self.k, dim=-1, sorted=False)  # (..., k)
        return torch.zeros_like(pre).scatter(-1, indices, values.relu())

    def encode(self, x: Tensor) -> Tensor:
        """``x (..., d_in)`` -> latents ``(..., d_sae)``."""
        if self.architecture == "gated":  # the gate reads the unscaled encoder, the magnitude its exp(r_mag) copy
            sae_in = x.to(self.W_enc.dtype) - self.b_dec * self.apply_b_dec_to_input
            gate = (sae_in @ self.W_enc + self.b_gate > 0).to(sae_in.dtype)
            return gate * self.pre_activations(x).relu()
        return self.activate(self.pre_activations(x))

    def decode(self, z: Tensor) -> Tensor:
        """Latents ``(..., d_sae)`` -> the reconstruction ``(..., d_in)``."""
        if self.rescale_acts_by_decoder_norm:
            z = z / self.W_dec.norm(dim=-1)
        return z @ self.W_dec + self.b_dec

    def forward(self, x: Tensor) -> Tensor:
        return self.decode(self.encode(x))

    def aux_k_loss(self, x: Tensor, x_hat: Tensor, pre: Tensor, dead: Tensor, coefficient: float = 1.0) -> Tensor:
        """Gao et al.'s AuxK: the top ``d_in // 2`` dead latents (``dead (d_sae,)`` bool) reconstruct the residual
        ``x - x_hat`` (detached) through the decoder without bias, scaled down while few latents are dead; the
        squared error summed over the width and averaged over rows. Zero when none is dead."""
        num_dead = int(dead.sum())
        if num_dead == 0:
            return x_hat.new_zeros(())
        residual = (x - x_hat).detach()
        k_aux = x.shape[-1] // 2
        scale = min(num_dead / k_aux, 1.0)
        k_aux = min(k_aux, num_dead)
        values, indices = torch.where(dead, pre, -torch.inf).topk(k_aux, dim=-1, sorted=False)
        aux = torch.zeros_like(pre).scatter(-1, indices, values)
        if self.rescale_acts_by_decoder_norm:
            aux = aux / self.W_dec.norm(dim=-1)
        return coefficient * scale * (aux @ self.W_dec - residual).pow(2).sum(dim=-1).mean()

    @torch.no_grad()
    def normalize_decoder(self) -> None:
        """Scale every decoder row to unit norm, as Gao et al. do after each step (the encoder is left as it is:
        folding the norms into it would change which latents a TopK keeps)."""
        self.W_dec.div_(self.W_dec.norm(dim=-1, keepdim=True).clamp(min=1e-8))

    @torch.no_grad()
    def remove_parallel_gradient(self) -> None:
        """Drop the part of the decoder's gradient along each row (Gao et al.'s projection), so that the step
        moves the directions and the renormalisation after it only undoes Adam's drift."""
        if self.W_dec.grad is not None:
            rows = self.W_dec / self.W_dec.norm(dim=-1, keepdim=True).clamp(min=1e-8)
            self.W_dec.grad -= (self.W_dec.grad * rows).sum(dim=-1, keepdim=True) * rows


def resid_hook_name(layer: int) -> str:
    """The hook point of the residual stream after block ``layer`` (counted from 1, as ``--ablate`` counts)."""
    return f"blocks.{layer - 1}.hook_resid_post"


def hook_layer(hook_name: str) -> int | None:
    """The block (from 1) whose output ``hook_name`` reads, or None for another hook point."""
    parts = hook_name.split(".")
    if len(parts) == 3 and parts[0] == "blocks" and parts[1].isdigit() and parts[2] == "hook_resid_post":
        return int(parts[1]) + 1
    return None


def stream_shape(model: nn.Module, layer: int, grid: tuple[int, int] | None = None
                 ) -> tuple[tuple[int, int], int, int]:
    """Block ``layer``'s (from 1) output as an SAE reads it on an input of patch ``grid`` (default the model's
    training size): its grid, its prefix tokens and its width. A model with stages (Swin, Hiera) has each layer's
    own grid and width (``ViT.layer_layouts``; no prefix tokens), a plain ViT the input's grid and its width."""
    config = model.config
    grid = tuple(grid or config.grid_size)
    if not getattr(config, "stage_depths", ()):
        return grid, config.num_prefix_tokens, config.hidden_size
    return model.layer_layouts(grid)[layer - 1].grid, 0, config.stage_width(config.stage_of(layer - 1))


def check_fits(sae: SparseAutoencoder, model: nn.Module) -> int:
    """The block (from 1) whose output ``sae`` reads in ``model``; SAEError in one line when it was trained on
    another model (its weights' fingerprint), another width or a hook point this project does not read."""
    if sae.info.hook_name is None:
        raise SAEError("this SAE's file does not say which block's output it reads (saev's files do not): give the "
                       "layer it was trained on")
    layer = hook_layer(sae.info.hook_name)
    if layer is None:
        raise SAEError(f"this SAE reads {sae.info.hook_name!r}; only a block's output (blocks.N.hook_resid_post) "
                       "is supported")
    if not 1 <= layer <= model.config.num_layers:
        raise SAEError(f"this SAE reads block {layer}'s output; the model has {model.config.num_layers} blocks")
    grid, prefix, width = stream_shape(model, layer)
    if sae.d_in != width:
        raise SAEError(f"this SAE reads {sae.d_in}-wide activations; the model's width at block {layer}'s output is "
                       f"{width}")
    extra = sae.info.extra
    tokens = prefix + grid[0] * grid[1]
    if (extra.get("format") == "vit-prisma" and not extra.get("cls_token_only") and not extra.get("use_patches_only")
            and isinstance(extra.get("context_size"), int) and extra["context_size"] != tokens):
        raise SAEError(f"this SAE was trained on {sae.info.model_name or 'another model'} with {extra['context_size']} "
                       f"tokens an image; the open model has {tokens}: another model")
    if sae.info.model_fingerprint and sae.info.model_fingerprint != model_fingerprint(model):
        raise SAEError(f"this SAE was trained on another model ({sae.info.model_name or 'unnamed'}): its weights "
                       "differ from the open model's")
    return layer


def check_in_use(sae: SparseAutoencoder, name: str) -> None:
    """SAEError in one line, when it is opened, for an SAE whose computation is not finite though its stored weights
    are: a gated SAE's ``exp(r_mag)`` that overflows, decoder row norms that overflow where they are folded in
    (``rescale_acts_by_decoder_norm``, a BatchTopK folder's inference form), weights so large that its latents or its
    reconstruction overflow float32 in an analysis. Bounded for an activation of norm ``IN_USE_INPUT_NORM``: each
    latent by ``|its encoder column| * (norm + |b_dec|) + |its bias|`` with the scales the SAE applies, the
    reconstruction by their sum along the decoder's rows; the bound must stay ``IN_USE_HEADROOM`` below float32's
    largest number. The norms are float32, as the SAE computes them: one of a NaN or infinite weight is not finite."""
    limit = torch.finfo(torch.float32).max / IN_USE_HEADROOM
    with torch.no_grad():
        if sae.architecture == "gated":  # the magnitude path: sae_in @ (W_enc * exp(r_mag)) + b_mag
            scale, bias = sae.r_mag.exp().double(), sae.b_mag.double()
        else:
            scale, bias = torch.ones(sae.d_sae, dtype=torch.float64), sae.b_enc.double()
        rows = sae.W_dec.norm(dim=-1).double()  # (d_sae,)
        if sae.rescale_acts_by_decoder_norm:  # pre-activations times the row norms, latents divided by them
            scale, bias, rows = scale * rows, bias * rows, rows / rows
        offset = sae.b_dec.double().norm() if sae.apply_b_dec_to_input else 0.0
        latents = sae.W_enc.norm(dim=0).double() * scale * (IN_USE_INPUT_NORM + offset) + bias.abs()  # (d_sae,)
        largest = float(torch.stack([latents.max(), (latents * rows).sum() + sae.b_dec.double().norm()]).max())
    if not largest < limit:  # NaN too
        reach = "are not finite (NaN or infinite)" if not math.isfinite(largest) else f"may reach {largest:.2g}"
        gated = " (W_enc * exp(r_mag))" if sae.architecture == "gated" else ""
        raise SAEError(f"{name}: for an activation of norm {IN_USE_INPUT_NORM:g} its latents{gated} or "
                       f"reconstruction {reach}, past what float32 holds in an analysis (3.4e38); its stored weights "
                       "are finite but not a trained SAE's")


def encoder_biases(architecture: str) -> tuple[str, ...]:
    """The per-latent encoder tensors of ``architecture`` besides ``W_enc``."""
    return {"jumprelu": ("b_enc", "threshold"), "gated": ("b_gate", "r_mag", "b_mag")}.get(architecture, ("b_enc",))


def check_sizes(d_in: int, d_sae: int, k: int | None, architecture: str) -> None:
    """SAEError unless the sizes make an SAE this module can hold."""
    if architecture not in ARCHITECTURES:
        raise SAEError(f"architecture {architecture!r} is not supported; this reads "
                       f"{', '.join(ARCHITECTURES + BATCH_TOPK)}")
    for name, value, bound in (("d_in", d_in, MAX_D_IN), ("d_sae", d_sae, MAX_D_SAE)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= bound:
            raise SAEError(f"{name} must be a whole number from 1 to {bound:,}, got {value!r}")
    if architecture == "topk" and (isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= d_sae):
        raise SAEError(f"k must be a whole number from 1 to d_sae ({d_sae:,}), got {k!r}")


def available_memory(device: torch.device) -> int:
    """Free bytes on ``device``: the GPU's free memory, else the machine's available RAM, less when this process's
    address-space limit (``ulimit -v``) leaves less room."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    free = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
    except OSError:
        pass
    if free is None:
        free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    return min(free, _address_space_left())


def _address_space_left() -> int:
    """Bytes this process may still map under RLIMIT_AS: past it an allocation is a MemoryError, whatever is free."""
    import resource

    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return sys.maxsize
    try:
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        mapped = 0
    return max(limit - mapped, 0)


def check_memory(d_in: int, d_sae: int, name: str) -> None:
    """SAEError in one line, before anything is read or allocated, when an SAE of these sizes would not fit in half
    the free memory (``available_memory``): the file's tensors are read, then copied into it."""

    need = 4 * (2 * d_in * d_sae + d_in + d_sae)  # float32
    free = available_memory(torch.device("cpu"))
    if need > free // 2:
        raise SAEError(f"{name}: an SAE of d_in {d_in}, d_sae {d_sae} needs {need / 2**30:.2f} GiB, more than half "
                       f"of the {free / 2**30:.2f} GiB free")


def model_fingerprint(model: nn.Module) -> str:
    """A short hash of the model's weights, so an SAE refuses any other model exactly (a renamed file too)."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def sae_config(sae: SparseAutoencoder) -> dict:
    """cfg.json as SAELens 6 writes it (``SAEConfig.to_dict``) for ``sae``; SAEError for an SAE that encodes as
    another library's (``vit.features.formats.ForeignSAE``), which that format cannot describe."""
    if not getattr(sae, "saelens_compatible", True):
        raise SAEError("this SAE encodes as another library's (its input normalisation or activation); SAELens's "
                       "format cannot hold it, so it is not saved")
    metadata = {**sae.info.extra, "sae_lens_version": SAE_LENS_FORMAT, "sae_lens_training_version": SAE_LENS_FORMAT,
                "model_name": sae.info.model_name, "hook_name": sae.info.hook_name, "hook_head_index": None,
                "prepend_bos": False, "model_fingerprint": sae.info.model_fingerprint}
    cfg = {"d_in": sae.d_in, "d_sae": sae.d_sae, "dtype": "float32", "device": "cpu",
           "apply_b_dec_to_input": sae.apply_b_dec_to_input, "normalize_activations": "none",
           "reshape_activations": "none", "metadata": metadata, "architecture": sae.architecture}
    if sae.architecture == "topk":
        cfg.update(k=sae.k, rescale_acts_by_decoder_norm=sae.rescale_acts_by_decoder_norm)
    return cfg


def save_sae(sae: SparseAutoencoder, folder: Path) -> None:
    """Write ``cfg.json`` and ``sae_weights.safetensors`` into ``folder``, each file atomically."""
    from safetensors.torch import save

    folder.mkdir(parents=True, exist_ok=True)
    weights = {name: getattr(sae, name).detach().to("cpu", torch.float32).contiguous() for name in sae.weight_names()}
    atomic_write_bytes(folder / WEIGHTS_FILE, save(weights))
    atomic_write_text(folder / CFG_FILE, json.dumps(sae_config(sae), indent=2) + "\n")


def _config_value(cfg: dict, key: str, types: type | tuple[type, ...], default: object = None) -> object:
    value = cfg.get(key, default)
    if value is not None and (not isinstance(value, types) or isinstance(value, bool) and bool not in (
            types if isinstance(types, tuple) else (types,))):
        raise SAEError(f"{CFG_FILE}: {key!r} is {json.dumps(value)[:40]}, not the expected type")
    return value


def load_sae(folder: str | Path, device: str | torch.device = "cpu") -> SparseAutoencoder:
    """An SAE from a SAELens-format folder (SAELens 6 or earlier); SAEError in one line for anything else.

    Every size cfg.json declares is checked against the bounds, the weights file's header and the free memory
    before a tensor is read; normalised or reshaped activations (SAELens options this project does not apply) are
    refused.
    """
    from vit.sources.open import SourceError, read_json, read_weights

    folder = Path(folder)
    if not (folder / CFG_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
        raise SAEError(f"{folder} is not an SAE folder: it needs {CFG_FILE} and {WEIGHTS_FILE} (SAELens's format)")
    try:
        cfg = read_json(folder / CFG_FILE)
    except SourceError as e:
        raise SAEError(str(e)) from None
    metadata = cfg.get("metadata") if isinstance(cfg.get("metadata"), dict) else {}
    # Pre-6 configs keep model and hook at the top level (hook_point before 5), and topk in activation_fn.
    architecture = _config_value(cfg, "architecture", str)
    if architecture is None:
        kwargs = cfg.get("activation_fn_kwargs") if isinstance(cfg.get("activation_fn_kwargs"), dict) else {}
        if cfg.get("activation_fn", cfg.get("activation_fn_str")) == "topk" and kwargs.get("k") is not None:
            architecture, cfg = "topk", {**cfg, "k": kwargs["k"]}
        else:
            architecture = "standard"
    training_architecture = architecture if architecture in BATCH_TOPK else None
    if training_architecture:
        architecture = "jumprelu"
    d_in, d_sae = _config_value(cfg, "d_in", int), _config_value(cfg, "d_sae", int)
    k = _config_value(cfg, "k", int) if architecture == "topk" else None
    check_sizes(d_in, d_sae, k, architecture)
    # SAELens's TopK training config rescales by the decoder norms unless told not to; its inference configs do not.
    rescale = bool(_config_value(cfg, "rescale_acts_by_decoder_norm", bool, training_architecture is not None))
    normalize = _config_value(cfg, "normalize_activations", (str, bool), "none")
    if normalize not in ("none", False):
        raise SAEError(f"{folder.name}: normalize_activations {normalize!r} is not supported; only 'none'")
    if _config_value(cfg, "reshape_activations", str, "none") != "none":
        raise SAEError(f"{folder.name}: reshaped activations (hook_z) are not supported; this reads the residual "
                       "stream")
    info = SAEInfo(
        model_name=_config_value(metadata, "model_name", str) or _config_value(cfg, "model_name", str),
        hook_name=(_config_value(metadata, "hook_name", str) or _config_value(cfg, "hook_name", str)
                   or _config_value(cfg, "hook_point", str)),
        model_fingerprint=_config_value(metadata, "model_fingerprint", str),
        extra={key: value for key, value in metadata.items()
               if key not in ("model_name", "hook_name", "model_fingerprint")})
    expected = {"W_enc": (d_in, d_sae), "W_dec": (d_sae, d_in), "b_dec": (d_in,),
                **{name: (d_sae,) for name in encoder_biases(architecture)}}
    if training_architecture:  # the training state: one running threshold, no per-latent one yet
        del expected["threshold"]
        expected["topk_threshold"] = ()
        info.extra.setdefault("training_architecture", training_architecture)
        info.extra.setdefault("training_architecture_details", {
            key: cfg[key] for key in ("k", "matryoshka_widths", "rescale_acts_by_decoder_norm") if key in cfg})
    try:
        shapes = read_weights(folder / WEIGHTS_FILE, "meta")  # the header only: sizes checked before the data
        if {name: tuple(shapes[name].shape) for name in expected if name in shapes} != expected:
            found = ", ".join(f"{n} {tuple(t.shape)}" for n, t in sorted(shapes.items()))
            raise SAEError(f"{folder.name}: {WEIGHTS_FILE} holds {found[:200]}, not the shapes {CFG_FILE} declares "
                           f"(d_in {d_in}, d_sae {d_sae})")
        check_memory(d_in, d_sae, f"{folder.name}/{WEIGHTS_FILE}")  # a file's size may be a sparse file's
        weights = read_weights(folder / WEIGHTS_FILE)
    except SourceError as e:
        raise SAEError(str(e)) from None
    if not all(bool(torch.isfinite(weights[name]).all()) for name in expected):
        raise SAEError(f"{folder.name}: {WEIGHTS_FILE} holds NaN or infinite weights")
    if training_architecture:
        weights = batch_topk_inference_weights(weights, rescale)
        rescale = False
    sae = SparseAutoencoder(d_in, d_sae, k, architecture, bool(_config_value(cfg, "apply_b_dec_to_input", bool, True)),
                            rescale and architecture == "topk", info)
    with torch.no_grad():
        for name in sae.weight_names():
            getattr(sae, name).copy_(weights[name])
    check_in_use(sae, folder.name)
    return sae.to(device).eval().requires_grad_(False)


def batch_topk_inference_weights(weights: dict[str, Tensor], rescale: bool) -> dict[str, Tensor]:
    """A BatchTopK training state -> the JumpReLU weights SAELens saves for inference
    (``BatchTopKTrainingSAE.process_state_dict_for_saving_inference``): with ``rescale`` the decoder norms folded into
    the encoder (rows of unit norm), then ``topk_threshold`` every latent's threshold."""
    W_enc, b_enc, W_dec = weights["W_enc"], weights["b_enc"], weights["W_dec"]
    if rescale:
        norms = W_dec.norm(dim=-1).clamp(min=1e-8)  # SAELens's get_W_dec_norm
        W_enc, b_enc, W_dec = W_enc * norms, b_enc * norms, W_dec / norms[:, None]
    threshold = torch.ones_like(b_enc) * float(weights["topk_threshold"])
    return {**weights, "W_enc": W_enc, "b_enc": b_enc, "W_dec": W_dec, "threshold": threshold}
