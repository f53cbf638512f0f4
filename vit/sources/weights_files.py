"""A model folder's weights files read by name and shape: a safetensors header or a torch pickle on the meta device
(names, dtypes, shapes: no data), or the tensors themselves, whole or only those wanted. Used by the openers
(``vit.sources.open``) and by what checks a folder's files against the model its config declares before anything is
allocated (``vit.sources.weights_cover``), so it sits below both."""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType

import torch

from vit.checkpoint import check_archive, clean_key, safetensors_shapes
from vit.sources.files import SourceError, _one_line, read_json
from vit.sources.hub_names import INDEXES

HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def shard_index(folder: Path) -> tuple[Path, Mapping[str, str]] | None:
    """The shard index of a sharded HF folder (the first of ``INDEXES`` there) and its ``weight_map``, tensor name to
    shard file; None when the folder has no index. Read once for each version of the file (its size and time), so a
    page that asks on every run reads it once. SourceError (one line) for an index without a weight_map or one naming
    a shard that is not a file beside it: the one reading every opener, planner and page shares."""
    for name in INDEXES:
        path = folder / name
        try:
            if path.is_file():
                stat = path.stat()
                return path, _weight_map(str(path), stat.st_mtime_ns, stat.st_size)
        except OSError as e:
            raise SourceError(f"cannot read {path} ({_one_line(e)})") from None
    return None


@lru_cache(maxsize=32)
def _weight_map(path: str, mtime_ns: int, size: int) -> Mapping[str, str]:
    weight_map = read_json(Path(path)).get("weight_map")
    if not isinstance(weight_map, Mapping) or not weight_map:
        raise SourceError(f"{path} has no weight_map; the sharded weights cannot be found")
    for shard in weight_map.values():  # shards sit next to the index; never follow a path out of the folder
        if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", ".."):
            raise SourceError(f"{path} names a shard outside the folder: {str(shard)[:80]}")
    return MappingProxyType({str(name): shard for name, shard in weight_map.items()})


def read_weights(path: Path, map_location: str | torch.device = "cpu",
                 wanted: Callable[[str], bool] | None = None,
                 slots: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """A flat ``{name: tensor}`` from a ``.safetensors`` file or a torch pickle read with ``weights_only=True``.

    Wrapper prefixes (``module.``, ``_orig_mod.``) are removed and a training checkpoint's
    ``state_dict`` / ``model`` entry is unwrapped; floating tensors become float32 (maps are
    compared at 1e-5). With ``map_location="meta"`` only names, dtypes and shapes are read (the
    safetensors header, the torch pickle); otherwise the tensors land on the CPU. With ``wanted``, only the
    tensors whose names (as stored) it accepts: of a safetensors file only those are read (``safe_open``), a
    pickle is memory-mapped and the others never touched; and each q, k, v projection triple among them is read
    into one buffer (``joined_slots``; ``slots``: those of a sharded folder's other files too), which the mappings'
    join then takes whole (``import_dinov3.joined``) instead of holding the three beside a copy.
    """
    if not path.is_file():
        raise SourceError(f"weights file not found: {path}")
    meta = torch.device(map_location).type == "meta"
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        shapes = safetensors_shapes(path)  # the header checked (counts, dtypes, sizes, offsets) before any data
        if wanted is not None:
            shapes = {k: v for k, v in shapes.items() if wanted(k)}
        try:
            state = shapes if meta else load_file(str(path)) if wanted is None else _read_tensors(
                path, shapes, joined_slots(shapes) if slots is None else slots)
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise SourceError(f"{path} is not a readable safetensors file ({_one_line(e)})") from None
        if not state and wanted is not None:
            raise SourceError(f"{path} holds none of the tensors it is listed for")
    else:
        check_archive(path)  # what our checkpoints get: no legacy or bare pickle, no pickle bomb, before unpickling
        try:
            state = torch.load(path, map_location="meta" if meta else "cpu", weights_only=True,
                               mmap=wanted is not None and not meta)  # mapped: the unwanted tensors stay on disk
        except pickle.UnpicklingError as e:
            if "GLOBAL" in str(e) or "weights_only" in str(e).lower():
                raise SourceError(f"refused to load {path}: it contains Python objects other than tensors and plain "
                                  "data, which could run code; only weights are read") from None
            raise SourceError(f"{path} is not a torch weights file ({_one_line(e)})") from None
        except Exception as e:  # the weights-only unpickler raises many types on garbage
            raise SourceError(f"{path} is not a readable torch weights file ({_one_line(e)})") from None
        for key in ("state_dict", "model", "module"):
            if isinstance(state, Mapping) and isinstance(state.get(key), Mapping):
                state = state[key]
                break
        if wanted is not None and isinstance(state, Mapping):
            state = {k: v for k, v in state.items() if isinstance(k, str) and wanted(k)}
    if not isinstance(state, Mapping) or not state or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise SourceError(f"{path} does not hold a state dict of named tensors")
    return {clean_key(key): value.float() if value.is_floating_point() else value for key, value in state.items()}


def _read_tensors(path: Path, names: Iterable[str], slots: Mapping[str, torch.Tensor] | None = None
                  ) -> dict[str, torch.Tensor]:
    """The tensors ``names`` of a safetensors file, each read alone (``safe_open``), the others never; one with a
    slot in ``slots`` is copied into it (as float32) and the slot returned."""
    from safetensors import safe_open

    slots = slots or {}
    state = {}
    with safe_open(str(path), framework="pt", device="cpu") as f:
        for name in names:
            tensor = f.get_tensor(name)
            slot = slots.get(name)
            if slot is not None:
                if slot.shape != tensor.shape:
                    raise ValueError(f"{name} has shape {tuple(tensor.shape)}, its header {tuple(slot.shape)}")
                tensor = slot.copy_(tensor)
            state[name] = tensor
    return state


# A q, k or v projection's tensor, as CLIP, SigLIP and InternViT store them: (the layer's prefix, q|k|v, weight|bias)
_QKV_PART = re.compile(r"(.*[._])([qkv])_proj\.(weight|bias)")


def joined_slots(shapes: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """For each q, k, v projection triple among ``shapes`` (a header's meta tensors: ``PREFIX.q_proj.weight``, its
    ``k_proj`` and ``v_proj``, of one trailing shape), one float32 buffer of their rows in that order, and each
    name's view of its part: read into them, the three are already the one qkv tensor our attention holds, so a
    mapping that joins them copies nothing (a LLaVA tower once peaked 22 % over its size holding both)."""
    groups: dict[tuple[str, str], dict[str, str]] = {}
    for name, meta in shapes.items():
        match = _QKV_PART.fullmatch(name)
        if match and meta.is_floating_point() and meta.dim():
            groups.setdefault((match.group(1), match.group(3)), {})[match.group(2)] = name
    slots = {}
    for parts in groups.values():
        metas = [shapes[parts[p]] for p in "qkv" if p in parts]
        if len(metas) != 3 or len({m.shape[1:] for m in metas}) != 1:
            continue
        rows = [m.shape[0] for m in metas]
        buffer = torch.empty((sum(rows), *metas[0].shape[1:]), dtype=torch.float32)  # (3 * inner, ...)
        slots.update(zip((parts[p] for p in "qkv"), buffer.split(rows), strict=True))
    return slots


def read_shapes(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file as float32 meta tensors (names and shapes from its header, no data
    read)."""
    return {k: v.float() if v.is_floating_point() else v for k, v in safetensors_shapes(path).items()}


def read_hf_weights(folder: Path, map_location: str | torch.device = "cpu",
                    wanted: Callable[[str], bool] | None = None) -> dict[str, torch.Tensor]:
    """The weights of an HF folder: model.safetensors, else pytorch_model.bin, else their sharded forms. With
    ``wanted``, only the tensors whose names it accepts: of a sharded folder only the shards its index lists for
    them are opened, and in those only these tensors read."""
    for name in HF_WEIGHTS:
        if (folder / name).is_file():
            return read_weights(folder / name, map_location, wanted)
    index = shard_index(folder)
    if index is not None:
        _, weight_map = index
        state: dict[str, torch.Tensor] = {}
        shards = sorted({s for k, s in weight_map.items() if wanted is None or wanted(k)})
        slots = None  # q, k and v of one layer may sit in different shards: their buffers planned over all
        if wanted is not None and torch.device(map_location).type != "meta" \
                and all(shard.endswith(".safetensors") and (folder / shard).is_file() for shard in shards):
            slots = joined_slots({k: v for shard in shards for k, v in safetensors_shapes(folder / shard).items()
                                  if wanted(k)})
        for shard in shards:
            state.update(read_weights(folder / shard, map_location, wanted, slots))
        return state
    raise SourceError(f"{folder} has a config.json but no model.safetensors or pytorch_model.bin")
