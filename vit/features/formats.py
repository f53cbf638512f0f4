"""Other libraries' SAE files, read into ``SparseAutoencoder`` so that they encode exactly as their own code does.

- **SAELens** folders (``cfg.json`` + ``sae_weights.safetensors``): ``vit.features.autoencoder.load_sae``.
- **ViT-Prisma** (``vit_prisma.sae``): a training folder or Hub repository holds ``config.json``
  (``VisionModelSAERunnerConfig``) and ``n_images_N.pt``, which ``SparseAutoencoder.save_model`` writes as a torch
  pickle of ``{"cfg": VisionModelSAERunnerConfig, "state_dict": ...}``. Prisma's ``StandardSparseAutoencoder``
  always subtracts ``b_dec`` before the encoder, normalises the input first (``normalize_activations``: per-token
  ``layer_norm`` (its default) or ``constant_norm_rescale``, undone after the decoder with the same token's
  statistics) and activates with a ReLU or ``topk`` (the k largest through a ReLU).
- **saev** (``saev.nn.modeling.dump``): one file, a JSON header line then ``torch.save(state_dict)``. Files with
  ``"schema"`` 2 to 5 encode as saev does today: ``x @ W_enc + b_enc`` with no ``b_dec`` subtracted, then a ReLU,
  ``TopK`` (the k largest kept as they are, negative ones too: no ReLU) or ``BatchTopK`` (at inference, values
  above the stored ``activation.threshold``). Files without a schema were written by saev's first SAE
  (``saev/nn.py``, to early 2025), which subtracted ``b_dec`` and used a ReLU; they encode as that code did (saev's
  current loader reads them with its newer encoder, without the subtraction). Schema 1 held two layouts that saev
  itself calls incompatible and is refused. saev scales activations in its data pipeline
  (``scale_mean``/``scale_norm``) with constants its checkpoints do not hold: the SAE is read as the file has it.

Nothing here runs code from a file: Prisma's pickle is read with ``torch.load(weights_only=True)`` after
``check_archive``, its config objects stood in for by an inert class (only their names are allowed); every size a
file declares is checked against ``check_sizes`` and the file's own size before a tensor is read.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import torch
from torch import Tensor

from vit.features.autoencoder import (
    SAEError,
    SAEInfo,
    SparseAutoencoder,
    check_in_use,
    check_memory,
    check_sizes,
    load_sae,
    resid_hook_name,
)

PRISMA_CONFIG = "config.json"  # VisionModelSAERunnerConfig.save_config's file beside the checkpoints
PRISMA_CONFIG_CLASSES = ("VisionModelSAERunnerConfig", "HookedViTConfig")  # pickled inside Prisma's .pt files
# VisionModelSAERunnerConfig's defaults for the keys read here: a config.json without a key means the default
PRISMA_DEFAULTS = {"d_in": 768, "expansion_factor": 16, "architecture": "standard", "activation_fn_str": "topk",
                   "activation_fn_kwargs": {}, "normalize_activations": "layer_norm", "hook_point_layer": 9,
                   "layer_subtype": "ln2.hook_normalized", "hook_point_head_index": None, "is_transcoder": False,
                   "model_name": "open-clip:laion/CLIP-ViT-B-32-DataComp.XL-s13B-b90K", "_dtype": "float32",
                   "context_size": 50, "cls_token_only": False, "use_patches_only": False}
NORMALIZATIONS = ("none", "layer_norm", "constant_norm_rescale")
ACTIVATIONS = ("relu", "topk_relu", "topk", "threshold")
MAX_HEADER_BYTES = 1 << 20  # saev's JSON header line is a few hundred bytes
STATE_KEYS = ("W_enc", "b_enc", "W_dec", "b_dec")


class _Inert:
    """What a pickled config object becomes: its fields in ``__dict__``, none of its code (no ``__init__``,
    ``__post_init__`` or ``__setstate__`` of the real class runs)."""


class ForeignSAE(SparseAutoencoder):
    """A ``SparseAutoencoder`` whose input normalisation or activation is another library's: ``normalize`` one of
    ``NORMALIZATIONS`` (Prisma's and SAELens's run-time normalisations: the statistics of the last encoded input
    undo it after the decoder, as theirs do), ``activation`` one of ``ACTIVATIONS`` (``topk_relu`` is ours,
    ``topk`` keeps the k largest as they are, ``threshold`` keeps values above ``threshold``, a ReLU when it is
    not positive). Read-only: ``save_sae`` refuses it, since SAELens's format cannot say all of this."""

    saelens_compatible = False

    def __init__(self, d_in: int, d_sae: int, k: int | None, apply_b_dec_to_input: bool, info: SAEInfo,
                 activation: str = "topk_relu", normalize: str = "none", threshold: float = 0.0) -> None:
        if activation not in ACTIVATIONS or normalize not in NORMALIZATIONS:
            raise SAEError(f"activation {activation!r} / normalisation {normalize!r} is not supported")
        super().__init__(d_in, d_sae, k, "topk" if activation in ("topk_relu", "topk") else "standard",
                         apply_b_dec_to_input, info=info)
        self.activation, self.normalize, self.threshold = activation, normalize, threshold
        self._stats: tuple[Tensor, Tensor] | Tensor | None = None

    def pre_activations(self, x: Tensor) -> Tensor:
        x = x.to(self.W_enc.dtype)
        if self.normalize == "layer_norm":  # Prisma's run_time_activation_ln_in (eps 1e-5, unbiased std)
            mu = x.mean(dim=-1, keepdim=True)
            x = x - mu
            std = x.std(dim=-1, keepdim=True)
            x = x / (std + 1e-5)
            self._stats = (mu, std)
        elif self.normalize == "constant_norm_rescale":  # every token scaled to norm sqrt(d_in)
            coefficient = self.d_in ** 0.5 / x.norm(dim=-1, keepdim=True)
            x = x * coefficient
            self._stats = coefficient
        return super().pre_activations(x)

    def activate(self, pre: Tensor) -> Tensor:
        if self.activation == "topk":
            values, indices = pre.topk(self.k, dim=-1, sorted=False)
            return torch.zeros_like(pre).scatter(-1, indices, values)
        if self.activation == "threshold":
            return torch.where(pre > max(self.threshold, 0.0), pre, torch.zeros_like(pre))
        return super().activate(pre)

    def decode(self, z: Tensor) -> Tensor:
        x_hat = super().decode(z)
        if self.normalize == "none":
            return x_hat
        scale = self._stats[1] if isinstance(self._stats, tuple) else self._stats
        if scale is None or tuple(scale.shape[:-1]) != tuple(z.shape[:-1]):
            raise SAEError("this SAE normalises its input: decode the latents of the activations encoded last")
        if self.normalize == "layer_norm":
            mu, std = self._stats
            return x_hat * std + mu
        return x_hat / self._stats


def _int(cfg: dict, key: str, where: str) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SAEError(f"{where}: {key!r} is {json.dumps(value, default=str)[:40]}, not a whole number")
    return value


def _check_file_size(path: Path, d_in: int, d_sae: int, what: str) -> None:
    """SAEError, before anything is read or allocated, when ``path`` is smaller than float32 weights of these sizes
    (sizes a file declares but does not hold), larger than float64 ones can explain (a pickle or header padded to
    stall the reader), or the weights would not fit in half the free memory (``check_memory``)."""
    weights = 2 * d_in * d_sae + d_in + d_sae
    size, bound = path.stat().st_size, 8 * (weights + 1) + (1 << 20)
    if size < 4 * weights or size > bound:
        raise SAEError(f"{path.name}: {size:,} bytes, {'less' if size < 4 * weights else 'more'} than a {what} SAE "
                       f"of d_in {d_in}, d_sae {d_sae} holds; not an SAE checkpoint of those sizes")
    check_memory(d_in, d_sae, path.name)


def _read_state(path: Path, allowed_classes: tuple[str, ...] = ()) -> object:
    """A torch archive read safely: ``check_archive`` first, then ``torch.load(weights_only=True, mmap=True)``
    (the tensors stay in the file until copied) with the pickled classes named in ``allowed_classes`` (by their
    last name) built as ``_Inert``; any other class is a one-line refusal."""
    from vit.checkpoint import CheckpointError, check_archive

    try:
        check_archive(path)
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    except (CheckpointError, ValueError, RuntimeError) as e:
        raise SAEError(str(e).splitlines()[0] if str(e) else f"{path.name} is not a torch archive") from None
    foreign = [name for name in unsafe if name.rsplit(".", 1)[-1] not in allowed_classes]
    if foreign:
        raise SAEError(f"{path.name} pickles {', '.join(sorted(foreign))[:120]}, which is not an SAE's; refused "
                       "(nothing in it was run)")
    try:
        with torch.serialization.safe_globals([(_Inert, name) for name in unsafe]):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # torch raises UnpicklingError, RuntimeError, ... for a damaged or crafted pickle
        why = str(e).splitlines()[0][:120] if str(e).strip() else type(e).__name__
        raise SAEError(f"{path.name} cannot be read as an SAE checkpoint ({why})") from None


def _fill(sae: SparseAutoencoder, state: dict, expected: dict[str, tuple[int, ...]], name: str) -> None:
    """Copy ``state``'s tensors into ``sae`` after checking they are exactly ``expected``'s names and shapes."""
    found = {key: tuple(value.shape) for key, value in state.items() if isinstance(value, Tensor)}
    if found != expected or len(found) != len(state):
        shown = ", ".join(f"{k} {v}" for k, v in sorted(found.items()))[:200]
        raise SAEError(f"{name} holds {shown or 'no tensors'}, not the weights its config declares "
                       f"({', '.join(f'{k} {v}' for k, v in expected.items())})")
    if not all(bool(torch.isfinite(state[key]).all()) for key in STATE_KEYS):
        raise SAEError(f"{name} holds NaN or infinite weights")
    with torch.no_grad():
        for key in STATE_KEYS:
            getattr(sae, key).copy_(state[key].float())
    check_in_use(sae, name)


def _hook_name(layer: int | None, subtype: str) -> str | None:
    return None if layer is None else f"blocks.{layer}.{subtype}"


def load_prisma(path: str | Path, device: str | torch.device = "cpu") -> ForeignSAE:
    """A ViT-Prisma SAE: a folder with ``config.json`` and one checkpoint ``.pt`` (its ``*_log_feature_sparsity.pt``
    aside), or the ``.pt`` itself (its config from ``config.json`` beside it, as Prisma's ``load_from_pretrained``
    reads it, else from the pickled config). SAEError in one line for anything Prisma's standard SAE is not."""
    path = Path(path)
    if path.is_dir():
        checkpoints = sorted(p for p in path.glob("*.pt") if not p.name.endswith("_log_feature_sparsity.pt"))
        if len(checkpoints) != 1:
            raise SAEError(f"{path} holds {len(checkpoints)} Prisma checkpoints (.pt); give the one to load"
                           + (f": {', '.join(p.name for p in checkpoints)[:150]}" if checkpoints else ""))
        path = checkpoints[0]
    if not path.is_file():
        raise SAEError(f"{path} is not a file or folder")
    config_file = path.parent / PRISMA_CONFIG
    cfg = None
    if config_file.is_file():
        from vit.sources.open import SourceError, read_json

        try:
            cfg = read_json(config_file)
        except SourceError as e:
            raise SAEError(str(e)) from None
    where = config_file.name if cfg is not None else path.name
    if cfg is not None:  # the sizes are known before the archive is read
        cfg = {**PRISMA_DEFAULTS, **cfg}
        _check_file_size(path, _int(cfg, "d_in", where), _int(cfg, "d_in", where) *
                         _int(cfg, "expansion_factor", where), "Prisma")
    saved = _read_state(path, PRISMA_CONFIG_CLASSES)
    if isinstance(saved, dict) and "state_dict" in saved and "cfg" in saved:  # what save_model writes
        state, pickled = saved["state_dict"], saved["cfg"]
    else:
        state, pickled = saved, None
    if cfg is None:
        if not isinstance(pickled, _Inert):
            raise SAEError(f"{path.name} has no {PRISMA_CONFIG} beside it and no config inside; put Prisma's "
                           f"{PRISMA_CONFIG} next to it")
        cfg = {**PRISMA_DEFAULTS, **{k: v for k, v in vars(pickled).items() if isinstance(v, (str, int, float,
                                                                                               dict, type(None)))}}
    if not isinstance(state, dict):
        raise SAEError(f"{path.name} holds no state dict")
    d_in, expansion = _int(cfg, "d_in", where), _int(cfg, "expansion_factor", where)
    if cfg["is_transcoder"] or cfg["architecture"] != "standard":
        raise SAEError(f"{where}: a Prisma {'transcoder' if cfg['is_transcoder'] else cfg['architecture']!r} SAE is "
                       "not supported; only the standard architecture (ReLU or TopK) reads the residual stream here")
    if cfg["hook_point_head_index"] is not None:
        raise SAEError(f"{where}: an SAE of one attention head's output is not supported")
    if str(cfg["_dtype"]).removeprefix("torch.") not in ("float32", "float"):
        raise SAEError(f"{where}: _dtype {cfg['_dtype']!r}; only float32 Prisma SAEs are read")
    activation, kwargs = cfg["activation_fn_str"], cfg["activation_fn_kwargs"]
    if activation == "topk" and isinstance(kwargs, dict) and "k" in kwargs:
        k, kind = _int(kwargs, "k", f"{where} activation_fn_kwargs"), "topk_relu"
    elif activation == "relu":
        k, kind = None, "relu"
    else:
        raise SAEError(f"{where}: activation {activation!r} ({json.dumps(kwargs, default=str)[:40]}) is not "
                       "supported; Prisma's relu and topk (with a k) are")
    if cfg["normalize_activations"] not in NORMALIZATIONS:
        raise SAEError(f"{where}: normalize_activations {cfg['normalize_activations']!r} is not supported")
    d_sae = d_in * expansion
    check_sizes(d_in, d_sae, k, "topk" if k else "standard")
    _check_file_size(path, d_in, d_sae, "Prisma")  # again for a pickled config: before the SAE is allocated
    layer = cfg["hook_point_layer"]
    if isinstance(layer, list) and len(layer) == 1:  # Prisma's legacy configs hold a one-element list
        layer = layer[0]
    if isinstance(layer, bool) or not isinstance(layer, int) or not isinstance(cfg["layer_subtype"], str):
        raise SAEError(f"{where}: hook_point_layer {layer!r} / layer_subtype is not one hook point")
    info = SAEInfo(model_name=str(cfg["model_name"]), hook_name=_hook_name(layer, cfg["layer_subtype"]),
                   extra={"format": "vit-prisma", "context_size": cfg["context_size"],
                          "cls_token_only": cfg["cls_token_only"], "use_patches_only": cfg["use_patches_only"]})
    sae = ForeignSAE(d_in, d_sae, k, True, info, kind, cfg["normalize_activations"])
    _fill(sae, state, {"W_enc": (d_in, d_sae), "b_enc": (d_sae,), "W_dec": (d_sae, d_in), "b_dec": (d_in,)},
          path.name)
    return sae.to(device).eval().requires_grad_(False)


def _saev_header(path: Path) -> tuple[dict, int]:
    with open(path, "rb") as f:
        line = f.readline(MAX_HEADER_BYTES)
    if not line.endswith(b"\n"):
        raise SAEError(f"{path.name} does not start with saev's JSON header line")
    try:
        header = json.loads(line)
    except (ValueError, RecursionError):
        header = None
    if not isinstance(header, dict):
        raise SAEError(f"{path.name} does not start with saev's JSON header line")
    return header, len(line)


def load_saev(path: str | Path, layer: int | None = None, model_name: str | None = None,
              device: str | torch.device = "cpu") -> ForeignSAE:
    """A saev SAE file (``dump``'s JSON header line, then the state dict). saev's files do not say which model or
    layer they read: ``layer`` (counted from 1, as ``--ablate``) and ``model_name`` record it, so that ``check_fits``
    can refuse a mismatch. SAEError in one line for anything saev's loader would not read."""
    path = Path(path)
    if not path.is_file():
        raise SAEError(f"{path} is not a file")
    header, offset = _saev_header(path)
    schema = header.get("schema")
    if schema is None:  # saev/nn.py's dump: the config's fields themselves
        cfg, where = header, f"{path.name} (saev, no schema)"
        d_in = _int(cfg, "d_vit", where)
        d_sae = d_in * _int(cfg, "exp_factor", where)
        k, kind, subtract, extra_keys = None, "relu", True, {}
    elif schema in (2, 3, 4, 5) and isinstance(header.get("cfg"), dict):
        cfg, where = header["cfg"], f"{path.name} (saev schema {schema})"
        d_in = _int(cfg, "d_model", where)
        d_sae = _int(cfg, "d_sae", where) if "d_sae" in cfg else d_in * _int(cfg, "exp_factor", where)
        activation = cfg.get("activation")
        name = activation.get("cls") if isinstance(activation, dict) else None
        params = activation.get("params") if isinstance(activation, dict) else None
        if name == "Relu":
            k, kind, extra_keys = None, "relu", {}
        elif name in ("TopK", "BatchTopK") and isinstance(params, dict):
            k = _int(params, "top_k", where)
            kind, extra_keys = ("topk", {}) if name == "TopK" else ("threshold", {"activation.threshold": ()})
            if name == "BatchTopK":
                k = None
        else:
            raise SAEError(f"{where}: activation {json.dumps(activation, default=str)[:60]} is not saev's Relu, TopK "
                           "or BatchTopK")
        subtract = False
    elif schema == 1:
        raise SAEError(f"{path.name}: saev's schema 1 held two layouts saev itself calls incompatible; load it "
                       "with saev and save it again (saev.nn.modeling.dump)")
    else:
        raise SAEError(f"{path.name}: saev schema {json.dumps(schema)[:20]} is not known here (2 to 5 are)")
    check_sizes(d_in, d_sae, k, "topk" if k else "standard")
    _check_file_size(path, d_in, d_sae, "saev")
    if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int) or layer < 1):
        raise SAEError(f"layer must be a block number from 1, got {layer!r}")
    info = SAEInfo(model_name=model_name, hook_name=resid_hook_name(layer) if layer else None,
                   extra={"format": "saev", "schema": schema})
    sae = ForeignSAE(d_in, d_sae, k, subtract, info, kind)
    with tempfile.TemporaryDirectory() as folder:  # the archive after the header, checked as every torch file is
        archive = Path(folder) / "state.pt"
        with open(path, "rb") as source, open(archive, "wb") as target:
            source.seek(offset)
            while chunk := source.read(1 << 24):
                target.write(chunk)
        state = _read_state(archive)
        if not isinstance(state, dict):
            raise SAEError(f"{path.name} holds no state dict after its header")
        expected = {"W_enc": (d_in, d_sae), "b_enc": (d_sae,), "W_dec": (d_sae, d_in), "b_dec": (d_in,), **extra_keys}
        if kind == "threshold" and "activation.threshold" in state:
            threshold = state["activation.threshold"]
            if not isinstance(threshold, Tensor) or threshold.numel() != 1 or not math.isfinite(float(threshold)):
                raise SAEError(f"{path.name}: activation.threshold is not one finite number")
            sae.threshold = float(threshold)
        _fill(sae, state, expected, path.name)
    return sae.to(device).eval().requires_grad_(False)


def _is_sae_run(folder: Path) -> bool:
    """Whether ``folder`` is a ``vit.sae train`` run folder (its config.json says ``"kind": "sae"``)."""
    from vit.core.runfiles import CONFIG_FILE, RunFileError, read_config

    try:
        config = read_config(folder / CONFIG_FILE)
    except RunFileError:  # not ours to judge: Prisma's config.json has other fields
        return False
    return config is not None and config.get("kind") == "sae"


def detect_format(path: Path) -> str:
    """``"sae_lens"``, ``"vit-prisma"`` or ``"saev"`` for a local file or folder; SAEError when it is none."""
    from vit.features.autoencoder import CFG_FILE, WEIGHTS_FILE

    if path.is_dir():
        if (path / CFG_FILE).is_file() and (path / WEIGHTS_FILE).is_file():
            return "sae_lens"
        if _is_sae_run(path):  # its config.json and last.pt would pass for a Prisma folder's
            raise SAEError(f"{path} is an SAE run that has not finished (no {CFG_FILE} yet): wait for it to end, or "
                           f"continue it with python -m vit.sae train --resume {path}")
        if (path / PRISMA_CONFIG).is_file() and any(path.glob("*.pt")):
            return "vit-prisma"
        raise SAEError(f"{path} is no SAE folder: SAELens's holds {CFG_FILE} and {WEIGHTS_FILE}, ViT-Prisma's "
                       f"{PRISMA_CONFIG} and a .pt")
    if not path.is_file():
        raise SAEError(f"{path} is not a file or folder")
    with open(path, "rb") as f:
        start = f.read(1)
    if start == b"{":
        return "saev"
    return "vit-prisma"


def sae_path(source: str | os.PathLike, report=None, cached_only: bool = False) -> Path:
    """The local file or folder of the SAE ``source`` names: itself when it exists, else the copy of a Hub id
    (``ORG/NAME[/PATH/IN/REPO][@REVISION]``) in the HF cache, fetched when missing unless ``cached_only`` (then an
    SAEError says it is not there). The path as typed when it names nothing: ``detect_format`` says so."""
    from vit.sources import hub

    path = Path(source).expanduser()
    if path.exists() or not hub.looks_like_sae_name(str(source)):
        return path
    if cached_only:
        local = hub.cached_sae(str(source))
        if local is None:
            raise SAEError(f"{str(source).strip()} is neither a file or folder on the server nor an SAE in its Hugging "
                           f"Face cache ({hub.cache_dir()})")
        return local
    try:
        return hub.fetch_sae(str(source), report)
    except hub.HubError as e:
        raise SAEError(str(e)) from None


def open_sae(source: str | os.PathLike, layer: int | None = None, model_name: str | None = None,
             device: str | torch.device = "cpu", report=None) -> SparseAutoencoder:
    """An SAE from a SAELens folder, a ViT-Prisma folder or ``.pt``, a saev ``.pt`` (``layer`` and ``model_name``
    say what it reads, which its file does not), or any of them on the Hugging Face Hub as
    ``ORG/NAME[/PATH/IN/REPO][@REVISION]`` (``vit.sources.hub.fetch_sae``: only the SAE's own files are fetched).
    The format is told from the files; SAEError in one line for anything that cannot be read."""
    path = sae_path(source, report)
    kind = detect_format(path)
    if kind == "sae_lens":
        sae = load_sae(path, device)
    elif kind == "vit-prisma":
        sae = load_prisma(path, device)
    else:
        return load_saev(path, layer, model_name, device)
    if layer is not None and sae.info.hook_name != resid_hook_name(layer):
        raise SAEError(f"this SAE reads {sae.info.hook_name!r}, not block {layer}'s output")
    return sae
