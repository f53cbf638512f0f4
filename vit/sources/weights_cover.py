"""A folder's weights files against the model its config declares, from the files' headers alone, before any real
tensor (issue 114, item 3): transformers' ``from_pretrained`` allocates and initialises every tensor the config
declares, so a config.json declaring ``intermediate_size: 10000000`` over weights of 128 allocated gigabytes before
its loading report named the mismatch. Here the model is built on the meta device (names and shapes, no memory,
``vit.sources.build_bounds``) and each of its tensors is looked up in the headers under the name transformers would
load it from (its own renamings, its base-model prefix added or dropped): ``from_pretrained`` is called only for a
folder whose every declared tensor is there at its declared size.

What the files need not hold (tensors transformers ties to another, or computes: its ignored-when-missing keys,
buffers) is what the load allocates beyond the files; it is bounded too (``MAX_UNSTORED``).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from vit.checkpoint import CheckpointError
from vit.sources.files import SourceError, loading_problem
from vit.sources.weights_files import read_hf_weights

# Elements the model may hold beyond its weights files (computed buffers, keys transformers fills when missing):
# a vision model's position ids and rotary tables are some thousands; a language model's at most 2^24.
MAX_UNSTORED = 2**25


def header_shapes(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's weights files (model.safetensors, pytorch_model.bin or their shards) as a meta
    tensor, from the headers (a pickle's tensors on the meta device): no data read. SourceError (one line) for
    files that cannot be read so, whole (a header's refusal names the file and the tensor; cut at a library error's
    200 characters after a long folder's path twice, it lost its reason)."""
    try:
        return read_hf_weights(folder, "meta")
    except CheckpointError as e:  # safetensors_shapes' refusal of a header: ours, one line already
        raise SourceError(str(e)) from None


def _renamer(model: torch.nn.Module, expected: dict):
    """A function from a stored tensor's name to the names transformers loads it into (its conversion mapping's
    renamings, its base-model prefix added or dropped: one name; a converter's targets, RADIO's ``attn.qkv`` split
    into ``q_proj``, ``k_proj``, ``v_proj``: several) and whether a converter (which merges or splits tensors, so
    shapes differ) took it; the name itself for a model that is no transformers ``PreTrainedModel``."""
    try:
        from transformers import PreTrainedModel
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
    except ImportError:  # another transformers than the one this was written against: names as they are
        return lambda key: ([key], False)
    if not isinstance(model, PreTrainedModel):
        return lambda key: ([key], False)
    mapping = get_model_conversion_mapping(model)
    renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
    converters = [m for m in mapping if isinstance(m, WeightConverter)]
    by_pattern = {pattern: converter for converter in converters for pattern in converter.source_patterns}
    prefix = model.base_model_prefix

    def rename(key: str) -> tuple[list[str], bool]:
        renamed, pattern = rename_source_key(key, renamings, converters, prefix, expected)
        if renamed not in expected and key in expected:  # as transformers does: the name as stored, where it fits
            renamed, pattern = rename_source_key(key, [], [], prefix, expected)
        if pattern is None:
            return [renamed], False
        targets = list(getattr(by_pattern.get(pattern), "target_patterns", None) or ())
        if not targets or targets[0] not in renamed:
            return [renamed], True
        return [renamed.replace(targets[0], target, 1) for target in targets], True

    return rename


def cover_problem(model: torch.nn.Module, stored: dict[str, torch.Tensor]) -> str | None:
    """Why the tensors ``stored`` (a folder's, ``header_shapes``) do not hold every tensor ``model`` (built on the
    meta device) declares at its declared shape, in one line (``loading_problem``'s, as if transformers had loaded
    it), or None. A tensor tied to another, or one transformers fills when missing
    (``_keys_to_ignore_on_load_missing``), may be absent; those and the model's buffers the files do not hold count
    against ``MAX_UNSTORED`` elements."""
    expected = model.state_dict()  # parameters and persistent buffers, on the meta device
    rename = _renamer(model, expected)
    found: dict[str, tuple[int, ...] | None] = {}  # the model's name -> the stored shape (None: a converter's)
    astray: list[tuple[str, str]] = []  # (stored name, the name transformers reads it under, which the model lacks)
    for key, tensor in stored.items():
        names, converted = rename(key)
        for name in names:
            if name in expected:
                found[name] = None if converted else tuple(tensor.shape)
        if not any(name in expected for name in names):
            astray.append((key, names[0]))
    tied = dict(getattr(model, "all_tied_weights_keys", None) or {})
    ignored = [p for p in (getattr(model, "_keys_to_ignore_on_load_missing", None) or ()) if isinstance(p, str)]
    may_miss = re.compile("|".join(f"({p})" for p in ignored)) if ignored else None
    buffers = dict(model.named_buffers())
    wrong, missing, unstored = [], [], 0
    for name, tensor in expected.items():
        shape = tuple(tensor.shape)
        if name in found:
            if found[name] is not None and found[name] != shape:
                wrong.append((name, found[name], shape))
        elif name in tied and tied[name] in found:
            continue
        elif may_miss is not None and may_miss.search(name) or name in buffers:
            unstored += tensor.numel()
        else:
            missing.append(name)
    unstored += sum(b.numel() for name, b in buffers.items() if name not in expected)  # not persistent
    problem = loading_problem({"mismatched_keys": wrong, "missing_keys": missing})  # as transformers' report reads
    if problem and missing and astray:
        return _renamed_astray(model, missing, sorted(astray))
    if problem:
        return problem
    if unstored > MAX_UNSTORED:
        return (f"its config.json declares {unstored:,} elements its weights files do not hold (buffers, weights "
                f"filled when missing), past the {MAX_UNSTORED:,} this program allocates beyond them")
    return None


def _renamed_astray(model: torch.nn.Module, missing: list[str], astray: list[tuple[str, str]]) -> str:
    """The one line for weights the files hold but transformers' own renaming reads under names the model lacks
    (ShieldGemma 2's: its ``shieldgemma2`` conversion adds the ``model.`` prefix of its classifier, which wraps a
    Gemma3ForConditionalGeneration, to the generating class's keys too), leaving the model's own at random."""
    import transformers

    key, name = astray[0]
    more = f", and {len(astray) - 1:,} more" if len(astray) > 1 else ""
    shown = ", ".join(sorted(missing)[:2]) + (f" and {len(missing) - 2:,} more" if len(missing) > 2 else "")
    return (f"transformers {transformers.__version__} reads its weights files' tensors under names its "
            f"{type(model).__name__} lacks ({key} as {name}{more}), so {len(missing):,} of the model's weights "
            f"({shown}) would be filled at random: these files do not load as this class")


def weights_problem(model: torch.nn.Module, folder: Path) -> str | None:
    """``cover_problem`` of ``model`` (built on the meta device) against the folder's weights files' headers."""
    return cover_problem(model, header_shapes(folder))
