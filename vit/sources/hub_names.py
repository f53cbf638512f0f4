"""Whether a text names a model on the Hugging Face Hub, read from the text alone: no torch and no network, so a
command tells a missing path from a Hub id before it loads anything (``vit.sources.hub`` fetches the model)."""

from __future__ import annotations

import os
import re
from pathlib import Path

HF_HUB_PREFIX = "hf-hub:"  # open_clip's (open_clip.factory.HF_HUB_PREFIX); a test checks they agree
WEIGHT_FILES = (".pt", ".pth", ".bin", ".safetensors", ".npz")
INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")  # a sharded model's list of shards
REPO = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")
MODEL_NAME = re.compile(r"[A-Za-z][\w.-]{1,150}")  # a timm or open_clip model name


def looks_like_name(source: str | os.PathLike) -> bool:
    """Whether ``source`` should be fetched from the Hub: it is no file or folder here and reads as a Hub id
    (the registries are not consulted: a cheap test for pages)."""
    text = str(source).strip()
    if not text or Path(text).expanduser().exists() or text.lower().endswith(WEIGHT_FILES):
        return False  # a weights file's name is a path that is missing, not a model on the Hub
    repo = text.removeprefix(HF_HUB_PREFIX).partition("@")[0]
    return bool(REPO.fullmatch(repo)) or ("/" not in text and bool(MODEL_NAME.fullmatch(text)))
