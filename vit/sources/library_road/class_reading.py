"""A transformers class read from a folder's weights, as the library road reads every class it builds: built on the
meta device first, under the build's budget (``build_bounds``), its every tensor looked up in the weights' headers,
then read (not on ``map_location="meta"``). The folder's whole model (``read_class``: its own class, a head's, a
part's, by transformers' ``from_pretrained``) or one part of a bigger model (``read_part``: a VLM's vision tower,
``vlm_towers``), read alone under the one prefix that holds every tensor of it (``tower_prefix``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from vit.sources.build_bounds import bounded_build, built_on_meta
from vit.sources.files import SourceError, library_error_line, library_errors, loading_problem, quiet_transformers
from vit.sources.weights_cover import header_shapes, weights_problem
from vit.sources.weights_files import read_hf_weights


def read_class(cls, config, folder: Path, origin: str, map_location, **name) -> torch.nn.Module:
    """``cls`` of ``config`` from ``folder``'s weights, the folder's whole model; SourceError (one line) for what it
    refuses. ``name``: its ``attn_implementation``."""
    return _read(cls, config, folder, origin, map_location, False, name)[0]


def read_part(cls, config, folder: Path, origin: str, map_location, **name) -> tuple[torch.nn.Module, str]:
    """``cls`` of ``config`` (a part of the folder's model), its tensors the folder's under the one prefix that holds
    them all (``tower_prefix``), read alone and loaded strictly, and that prefix; SourceError (one line) for what it
    refuses. ``name``: its ``attn_implementation``."""
    return _read(cls, config, folder, origin, map_location, True, name)


def tower_prefix(tower_keys: list[str], stored: Mapping[str, torch.Tensor], shapes: Mapping[str, torch.Size]) -> str:
    """The one prefix under which the folder's weights (``stored``: name -> meta tensor) hold every tensor of the
    tower (``tower_keys``, of ``shapes``), at its shape; ValueError (one line) where none or several do."""
    first = tower_keys[0]
    found = sorted({name[:-len(first)] for name in stored if name.endswith(first)
                    and (name == first or name[-len(first) - 1] == ".")})
    whole = [p for p in found if all(p + k in stored and tuple(stored[p + k].shape) == tuple(shapes[k])
                                     for k in tower_keys)]
    if len(whole) != 1:
        raise ValueError(f"its weights hold the {len(tower_keys)} tensors of its vision tower under "
                         f"{'no one prefix' if not whole else 'several prefixes (' + ', '.join(whole)[:80] + ')'}")
    return whole[0]


def _read(cls, config, folder: Path, origin: str, map_location, part: bool, name: dict) -> tuple[torch.nn.Module, str]:
    """``read_class`` (``part`` False) or ``read_part``: the model and the prefix its tensors were read under."""
    loaded, prefix = {}, ""  # transformers' loading info: none on the meta device, where no weight is read
    try:
        # on the meta device first, under the build's budget, and its every tensor looked up in the weights'
        # headers: from_pretrained allocates what the config declares before it reads a weight
        model = built_on_meta(cls, config, origin, **name)
        if part:
            shapes = {k: v.shape for k, v in model.state_dict().items()}
            try:
                prefix = tower_prefix(list(shapes), header_shapes(folder), shapes)
            except ValueError as e:
                raise SourceError(f"{origin}: {e}") from None
        else:
            wrong = weights_problem(model, folder)
            if wrong:
                raise SourceError(f"{folder} is refused: {wrong}")
        if torch.device(map_location).type != "meta":
            if part:
                state = read_hf_weights(folder, map_location,
                                        lambda k: k.startswith(prefix) and k[len(prefix):] in shapes)
            with quiet_transformers(), bounded_build(origin, seconds=None):  # its report: loading_problem's line
                if part:
                    model = cls._from_config(config, **name).float()
                    model.load_state_dict({k[len(prefix):]: v for k, v in state.items()}, strict=True)
                else:
                    model, loaded = cls.from_pretrained(folder, local_files_only=True, trust_remote_code=False,
                                                        dtype=torch.float32, ignore_mismatched_sizes=True,
                                                        output_loading_info=True, **name)
            model = model.to(map_location)
    except SourceError:
        raise
    except library_errors() as e:
        raise SourceError(f"{origin}: {library_error_line(e)}") from None
    wrong = loading_problem(loaded)
    if wrong:
        raise SourceError(f"{folder} is refused: {wrong}")
    return model, prefix
