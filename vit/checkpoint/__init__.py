"""One-file checkpoints: config, class names, preprocessing, weights and training metadata.

The file is a ``torch.save`` archive of plain data and tensors only, read back with
``torch.load(weights_only=True)`` so an untrusted file can never run code. Writes go to a
temporary file that is renamed into place, so a crash never leaves a half-written checkpoint.

The package, by concern: ``torch_files`` (any torch file on disk: the atomic write, and the checks before anything
is unpickled or allocated, which imported weights pass too; ``CheckpointError``), ``preprocessing``
(``Preprocessing``: how an image becomes the model's input, and whether it fits a config) and ``file_format``
(``Checkpoint``, ``save_checkpoint``, ``load_checkpoint``: our file, every part checked against the others). Every
public name is importable from ``vit.checkpoint``, the path users and plugins import.
"""

from vit.checkpoint.file_format import (
    FORMAT,
    FORMAT_VERSION,
    MAX_CLASS_NAME_CHARS,
    MAX_LAYERS,
    Checkpoint,
    check_payload,
    class_names_problem,
    clean_key,
    load_checkpoint,
    read_checkpoint_payload,
    save_checkpoint,
    weights_problem,
)
from vit.checkpoint.preprocessing import (
    BACKENDS,
    CROP_RULES,
    IMAGENET_MEAN,
    IMAGENET_STD,
    MAX_PREPROCESSING_PATCHES,
    MAX_SMART_PIXELS,
    RESAMPLE_FILTERS,
    RESIZE_MODES,
    Preprocessing,
    preprocessing_problem,
)
from vit.checkpoint.torch_files import (
    MAX_PICKLE_BYTES,
    MAX_PICKLE_KEY,
    MAX_SAFETENSORS_HEADER_BYTES,
    MAX_TENSOR_DIMS,
    MAX_TENSORS,
    PICKLE_BASE_BYTES,
    PICKLE_BYTES_PER_ITEM,
    PICKLE_BYTES_PER_TENSOR,
    SAFETENSORS_DTYPES,
    CheckpointError,
    ForeignCheckpointError,
    atomic_torch_save,
    check_archive,
    safetensors_shapes,
)

__all__ = [
    "BACKENDS", "CROP_RULES", "FORMAT", "FORMAT_VERSION", "IMAGENET_MEAN", "IMAGENET_STD", "MAX_CLASS_NAME_CHARS",
    "MAX_LAYERS", "MAX_PICKLE_BYTES", "MAX_PICKLE_KEY", "MAX_PREPROCESSING_PATCHES", "MAX_SAFETENSORS_HEADER_BYTES",
    "MAX_SMART_PIXELS", "MAX_TENSORS", "MAX_TENSOR_DIMS", "PICKLE_BASE_BYTES", "PICKLE_BYTES_PER_ITEM",
    "PICKLE_BYTES_PER_TENSOR", "RESAMPLE_FILTERS", "RESIZE_MODES", "SAFETENSORS_DTYPES", "Checkpoint",
    "CheckpointError", "ForeignCheckpointError", "Preprocessing", "atomic_torch_save", "check_archive",
    "check_payload", "class_names_problem", "clean_key", "load_checkpoint", "preprocessing_problem",
    "read_checkpoint_payload", "safetensors_shapes", "save_checkpoint", "weights_problem",
]
