"""SAM 3 (transformers' ``Sam3Model``), opened whole as transformers builds it: segmentation by a concept (a noun
phrase, an exemplar box) rather than by points. Its folder's own model and processor, offline and without remote
code, every attention module routed through the recording attention over SDPA (``vit.core.recording_attention``):
the masks, boxes and scores are transformers' by construction, and a view that asks records the decoder's attention
beside them (``vit.explain.methods.concepts``). No port: SAM 3 runs nowhere but in transformers here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from vit.core import recording_attention
from vit.sources.build_bounds import bounded_build, built_on_meta
from vit.sources.files import (
    SourceError,
    auxiliary_problem,
    library_error_line,
    library_errors,
    loading_problem,
    quiet_transformers,
    read_json,
)
from vit.sources.weights_cover import cover_problem, header_shapes

MODEL_TYPE = "sam3"  # config.json's model_type of transformers' Sam3Model (the detector, with its text encoder)
MAX_QUERIES = 1024  # the decoder's object queries a config may declare: each is a row of every map kept


@dataclass
class Sam3:
    """A SAM 3 opened whole: ``model`` (transformers' ``Sam3Model``, eval mode, its attention through the recording
    function) and ``processor`` (the folder's ``Sam3Processor``)."""

    folder: Path
    model: torch.nn.Module
    processor: object

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def is_sam3(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a config.json of transformers' SAM 3 (the detector, ``model_type`` "sam3")."""
    path = Path(folder) / "config.json"
    try:
        return path.is_file() and read_json(path).get("model_type") == MODEL_TYPE
    except SourceError:
        return False


def _declared(config_json: dict) -> str | None:
    """What config.json declares past what is built before its weights are checked, or None: the library road's
    bounds (layers, sides) and at most ``MAX_QUERIES`` object queries."""
    from vit.sources.library_road.transformers_models import declared_problem

    decoder = config_json.get("detr_decoder_config")
    queries = decoder.get("num_queries", 200) if isinstance(decoder, dict) else 200
    if isinstance(queries, bool) or not isinstance(queries, int) or not 1 <= queries <= MAX_QUERIES:
        return f"its decoder declares {str(queries)[:20]} object queries, not 1 to {MAX_QUERIES}"
    return declared_problem(config_json)


def folder_problem(folder: Path, config_json: dict) -> str | None:
    """What ``open_sam3`` refuses of ``folder`` (``config_json`` its config.json) before it reads a weight, in one line,
    or None: its declared sizes (``_declared``) and its tokenizer and processor files' sizes. The explorer's picker
    asks it too, so that such a folder is listed as refused."""
    return _declared(config_json) or auxiliary_problem(folder)


def open_sam3(source: str | os.PathLike | Sam3, device: str | torch.device | None = None) -> Sam3:
    """The SAM 3 in ``source`` (a folder saved by ``Sam3Model.save_pretrained`` with its processor, or a Hub id):
    transformers' ``Sam3Model`` from its weights (safetensors) and its ``Sam3Processor``, offline, no remote code.
    SourceError (one line) for a folder that is not SAM 3's, declares past the bounds (before anything is built),
    lacks a file, or holds weights that do not fit its config."""
    if isinstance(source, Sam3):
        return source
    from vit.sources import hub

    folder = Path(hub.resolve(source)).expanduser()
    if not (folder / "config.json").is_file():
        raise SourceError(f"{source} is no model folder with a config.json; give the folder of a SAM 3 saved whole "
                          "(Sam3Model.save_pretrained, with its processor)")
    config_json = read_json(folder / "config.json")
    if config_json.get("model_type") != MODEL_TYPE:
        raise SourceError(f"{folder} is a {str(config_json.get('model_type'))[:40]} model, not SAM 3 (transformers' "
                          "Sam3Model); segment SAM and SAM 2 with points or a box instead")
    wrong = folder_problem(folder, config_json)  # its tokenizer and processor files too
    if wrong:
        raise SourceError(f"{folder} is refused: {wrong}")
    # every weights file's header checked (shapes, offsets) before transformers' raw SafetensorError could, read
    # once: the same shapes are what the model built on the meta device is looked up in below
    stored = header_shapes(folder)
    import transformers

    name = recording_attention.recording_name("sdpa")
    try:
        # on the meta device first, under the build's budget, its every tensor looked up in the weights' headers:
        # from_pretrained allocates what the config declares (a text intermediate_size of 10^7: gigabytes) first
        config = transformers.Sam3Config.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
        wrong = cover_problem(built_on_meta(transformers.Sam3Model, config, str(folder), attn_implementation=name),
                              stored)
        if wrong:
            raise SourceError(f"{folder} is refused: {wrong}")
        processor = transformers.Sam3Processor.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
        with quiet_transformers(), bounded_build(str(folder), seconds=None):  # its report: loading_problem's line
            model, loaded = transformers.Sam3Model.from_pretrained(
                folder, local_files_only=True, trust_remote_code=False, use_safetensors=True, dtype=torch.float32,
                ignore_mismatched_sizes=True, output_loading_info=True, attn_implementation=name)
    except SourceError:
        raise
    except library_errors() as e:
        raise SourceError(f"{folder}'s Sam3Model or its processor cannot be opened by transformers: "
                          f"{library_error_line(e)}") from None
    wrong = loading_problem(loaded)
    if wrong:
        del model
        raise SourceError(f"{folder} is refused: {wrong}")
    return Sam3(folder, model.to(device or "cpu").eval(), processor)
