"""Open any ViT a user already has as our ``Checkpoint``: our ``.pt`` files, HF folders, timm and torchvision weights.

``open_source(path, arch=None)`` decides what ``path`` is:

- one of our checkpoints (``vit.checkpoint``), or a ``vit.train`` run folder (its ``best.pt``, else ``last.pt``);
- a Hugging Face ``save_pretrained`` folder (``config.json`` with ``architectures`` +
  ``model.safetensors`` or ``pytorch_model.bin``), e.g. a snapshot in the HF cache;
- a timm folder (``config.json`` with ``architecture``, ``pretrained_cfg``, ``label_names``)
  or a timm state dict file (``.safetensors``, ``.pth``) with ``arch="timm:NAME"``;
- a torchvision ``vit_*`` state dict file (recognised from its keys, or ``arch="torchvision:NAME"``);
- CLIP (``vit.sources.ports.families.import_clip``): open_clip state dicts and folders (``open_clip_config.json``),
  OpenAI's layout, HF ``clip`` / ``clip_vision_model`` folders; SigLIP (``vit.sources.ports.families.import_siglip``):
  HF ``siglip`` folders and SigLIP 2 NaFlex's ``siglip2`` ones;
- the vision tower (and projector) of a vision-language model (``vit.sources.vlm.import_vlm``): LLaVA 1.5 / NeXT /
  OneVision, PaliGemma and Gemma 3 folders, and InternVL 2.5 / 3 / 3.5 ``-hf`` ones
  (``vit.sources.vlm.import_internvl``),
  whose language model is never read;
- DINOv3 (``vit.sources.ports.families.import_dinov3``): HF ``dinov3_vit`` folders, timm ``vit_*_dinov3*`` weights,
  original ``facebookresearch/dinov3`` backbones (recognised from ``storage_tokens``, or ``arch="dinov3:NAME"``),
  with dino.txt's vision head and text tower (``import_dinotxt``: its head and text file, or a folder of the two);
- from-scratch ViTs (``vit.sources.ports.libraries.import_scratch``,
  ``vit.sources.ports.libraries.import_vit_pytorch``): the tutorials' models (tintn's ``experiments/NAME/`` folders, the
  MNIST tutorial's, the CIFAR-10 notebook's) and vit-pytorch's ``ViT`` / ``SimpleViT``, recognised from their keys, with
  the constructor arguments the weights cannot tell from a ``config.json`` beside them or ``arch="scratch:num_heads=8"``
  / ``"vit_pytorch:heads=8,..."``; any other state dict is refused with what it looks like and the ``vit.convert
  --inspect`` command that maps it (``open_mapped``);
- a Hub id (``ORG/NAME[@REVISION]``, ``hf-hub:ORG/NAME``, a timm or open_clip model name) that is no path here:
  its snapshot in the Hugging Face cache, downloaded first when needed (``vit.sources.hub``).

Nothing from a model folder is executed: safetensors files are read with the ``safetensors``
package, pickles only with ``torch.load(weights_only=True)``, ``config.json`` as JSON, and a
config asking for custom code (``auto_map``) is refused. The declared config is checked
against every tensor's shape on the ``meta`` device before any memory is allocated for the
model, so an absurd config fails with one line instead of exhausting memory.

The door is this module: which road a path takes (``open_source``); each road's opening stands beside it, the
Hugging Face folders' in ``vit.sources.open_hf``, the other libraries' and from-scratch weights' in
``vit.sources.open_libraries``, and what they share (the checked build, the finished ``Checkpoint``, the refusals'
pointer to the README) in ``vit.sources.open_shared``. Every name they hold is importable from here too.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from vit.checkpoint import Checkpoint, ForeignCheckpointError, load_checkpoint, read_checkpoint_payload
from vit.core.runfiles import BEST_CHECKPOINT, LAST_CHECKPOINT, STATUS_FILE
from vit.sources import hub
from vit.sources.arch_names import ARCH_LIBRARIES, arch_problem  # noqa: F401 (importable from here)
from vit.sources.build_bounds import bounded_build
from vit.sources.files import SourceError, _one_line, read_json
from vit.sources.hf_preprocessing import channel_numbers, hf_preprocessing  # noqa: F401 (importable from here, as before)
from vit.sources.library_road.transformers_models import one_open
from vit.sources.open_hf import (  # noqa: F401 (every name importable from here, as before the split)
    _HF_MODEL_TYPES,
    HF_ARCHITECTURES,
    HF_FAMILIES,
    HF_MODEL_TYPES,
    HF_REFUSED,
    HF_VLMS,
    VLM_MODULES,
    hf_architecture,
    hf_class_names,
    hf_family,
    hf_family_config,
    hf_image_processor,
    needed_shards,
    open_hf_family,
    open_hf_folder,
    open_plugin_family,
    open_vlm,
    tower_note,
    tower_tensors,
)
from vit.sources.open_libraries import (  # noqa: F401 (every name importable from here, as before the split)
    _finish_scratch,
    _open_timm_port,
    describe_timm_folder,
    open_clip_preprocessing,
    open_dinotxt,
    open_dinov3_original,
    open_mapped,
    open_open_clip,
    open_scratch,
    open_timm,
    open_torchvision,
    open_vit_pytorch,
    scratch_sidecar,
    scratch_weights,
    timm_family,
    timm_model_args,
)
from vit.sources.open_shared import (  # noqa: F401 (every name importable from here, as before the split)
    MAX_INPUT_SIZE,
    README_FAMILIES,
    WEIGHT_SUFFIXES,
    _config,
    _finish,
    _size_text,
    build_model,
    default_class_names,
    unsupported,
)
from vit.sources.ports.families import import_clip, import_dinotxt, import_dinov3
from vit.sources.ports.libraries import import_scratch, import_timm, import_torchvision, import_vit_pytorch, mapping
from vit.sources.weights_files import HF_WEIGHTS, read_hf_weights, read_shapes, read_weights  # noqa: F401

OPEN_CLIP_CONFIG = "open_clip_config.json"
OPEN_CLIP_WEIGHTS = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")


def parse_arch(arch: str | None) -> tuple[str | None, str | None]:
    """'timm:vit_small_patch14_dinov2' -> ('timm', 'vit_small_patch14_dinov2'); None -> (None, None)."""
    if not arch:
        return None, None
    if problem := arch_problem(arch):
        raise SourceError(problem)
    library, _, name = arch.partition(":")
    return library, name


def open_source(path: str | os.PathLike, arch: str | None = None, map_location: str | torch.device = "cpu",
                library_road: bool = False) -> Checkpoint:
    """Open ``path`` (a file or folder, see the module docstring) as an eval-mode ``Checkpoint``.

    ``arch`` names the architecture of a bare state dict: ``timm:NAME`` or ``torchvision:NAME``. With
    ``library_road`` (``vit.load``), a transformers vision model no port reads opens as transformers builds it
    (``vit.sources.library_road.transformers_models``, ``Checkpoint.road == "library"``); without, it is refused in one
    line. Raises ``CheckpointError`` (``SourceError``) with a one-line message for anything it cannot open. The whole
    opening runs first on the ``meta`` device, from the files' headers alone, so weights whose names, shapes or counts
    do not fit are refused before any tensor data is read; both build under ``bounded_build``. A Hub id is downloaded
    first (its size on stderr, then huggingface_hub's progress bars) unless the HF cache has it.
    """
    path = hub.resolve(path, needed=needed_shards)
    with one_open():  # the meta pass's traced forward serves the real pass too (the library road's)
        with bounded_build(str(path)):  # whatever road builds it, at most MAX_MODULES modules and MAX_BUILD_SECONDS
            checked = _open(path, arch, "meta", library_road)
        if torch.device(map_location).type == "meta":  # the meta pass is the opening asked for: not built twice
            return checked
        with bounded_build(str(path), seconds=None):
            return _open(path, arch, map_location, library_road)


def _open(path: str | os.PathLike, arch: str | None, map_location: str | torch.device, library_road: bool = False
          ) -> Checkpoint:
    path = Path(path).expanduser()
    library, name = parse_arch(arch)
    if not path.exists():
        raise SourceError(f"checkpoint not found: {path}")
    if path.is_dir():
        run_checkpoint = next((path / n for n in (BEST_CHECKPOINT, LAST_CHECKPOINT) if (path / n).is_file()), None)
        if run_checkpoint is not None and (path / STATUS_FILE).is_file():  # a vit.train run: its best epoch's model
            return _open(run_checkpoint, arch, map_location)
        config_path = path / "config.json"
        if not config_path.is_file() and (path / OPEN_CLIP_CONFIG).is_file():
            weights = next((path / f for f in OPEN_CLIP_WEIGHTS if (path / f).is_file()), None)
            if weights is None:
                raise SourceError(f"{path} has an open_clip_config.json but no {' or '.join(OPEN_CLIP_WEIGHTS)}")
            return open_open_clip(weights, read_weights(weights, map_location), name,
                                  read_json(path / OPEN_CLIP_CONFIG), map_location, library_road)
        if not config_path.is_file():
            files = [p for p in sorted(path.iterdir()) if p.is_file() and p.suffix in WEIGHT_SUFFIXES]
            heads = [p for p in files if len(files) > 1 and import_dinotxt.is_head_state_dict(read_weights(p, "meta"))]
            files = heads if len(heads) == 1 else files  # dino.txt's head and text file, its backbone beside it
            if len(files) != 1:
                raise SourceError(f"{path} has no config.json; open a Hugging Face or timm model folder, or a weights "
                                  f"file ({README_FAMILIES})")
            return _open(files[0], arch, map_location)
        config_json = read_json(config_path)
        if not {"model_type", "architectures", "architecture"} & set(config_json) \
                and (weights := scratch_weights(path)) is not None:  # a from-scratch model's constructor arguments
            return _open(weights, arch, map_location)
        if "auto_map" in config_json or config_json.get("trust_remote_code"):
            raise SourceError(f"{path} asks for custom model code (auto_map / trust_remote_code), which this program "
                              f"never runs; {README_FAMILIES}")
        if "architecture" in config_json or library == "timm":  # timm's push_to_hub / save_for_hf layout
            name = name or str(config_json.get("architecture"))
            weights = next((path / f for f in HF_WEIGHTS + ("open_clip_model.safetensors",) if (path / f).is_file()),
                           None)
            if weights is None:
                raise SourceError(f"{path} has a timm config.json but no model.safetensors or pytorch_model.bin")
            state = read_weights(weights, map_location)
            if config_json.get("model_type") == "timm_wrapper":  # transformers' TimmWrapper: timm's keys, prefixed
                state = {k.removeprefix("timm_model."): v for k, v in state.items()}
            return open_timm(path, state, name, config_json, map_location, library_road)
        return open_hf_folder(path, config_json, map_location, library_road)
    if path.suffix != ".safetensors":
        try:
            read_checkpoint_payload(path, mmap=True)  # which kind of torch file: the pickle only, tensors mapped
        except ForeignCheckpointError:
            pass  # a plain state dict: read once, below
        else:
            return load_checkpoint(path, map_location)
    state = read_weights(path, map_location)
    layout = import_scratch.layout_of(state)
    if library in ("scratch", "vit_pytorch") or (library is None and layout is not None) \
            or (library is None and import_vit_pytorch.is_vit_pytorch_state_dict(state)):
        try:
            arguments = import_scratch.parse_arguments(name or "")
        except ValueError as e:
            raise SourceError(f"--arch {arch}: {_one_line(e)}") from None
        if library == "vit_pytorch" or (library is None and layout is None):
            if not import_vit_pytorch.is_vit_pytorch_state_dict(state):
                raise SourceError(f"{path} is not a vit-pytorch ViT or SimpleViT state dict (no "
                                  "to_patch_embedding.2 / transformer.layers.0.0.to_qkv)")
            return open_vit_pytorch(path, state, arguments, map_location)
        if layout is None:
            raise SourceError(f"{path} is none of the from-scratch layouts this program knows; supported: "
                              f"{import_scratch.SUPPORTED}")
        return open_scratch(path, state, layout, arguments, map_location)
    if library == "open_clip" or (library is None and import_clip.is_open_clip_state_dict(state)):
        sidecar = path.parent / OPEN_CLIP_CONFIG
        return open_open_clip(path, state, name, read_json(sidecar) if sidecar.is_file() else None, map_location)
    if library == "dinov3" or (library is None and import_dinov3.is_original_state_dict(state)):
        return open_dinov3_original(path, state, name, map_location)
    if library is None and import_dinotxt.is_head_state_dict(state):
        return open_dinotxt(path, state, map_location)
    if library == "torchvision" or (library is None and import_torchvision.is_torchvision_state_dict(state)):
        return open_torchvision(path, state, name, map_location)
    if library == "timm" or import_timm.is_timm_state_dict(state):
        sidecar = path.parent / "config.json"
        config_json = read_json(sidecar) if sidecar.is_file() else None
        if config_json and "architecture" in config_json:
            name = name or str(config_json["architecture"])
        else:
            config_json = None
        return open_timm(path, state, name, config_json, map_location, library_road)
    if any(k.endswith("embeddings.cls_token") for k in state):
        raise SourceError(f"{path} looks like Hugging Face weights; open the folder that holds it with its config.json")
    raise SourceError(f"{path} holds {mapping.describe(state)}, which this program does not recognise; to map it "
                      f"onto ours: python -m vit.convert {path} --inspect")
