"""Training runs on disk: launch, status, stop, resume and delete, for the app's training page.

The truth lives in the runs folder, one folder per run written by the training CLI
(`python -m vit.train`); nothing here keeps state in memory, so every tab, reload and
server restart sees the same runs.
"""

from __future__ import annotations

import os
from pathlib import Path


def default_runs_dir() -> Path:
    """The runs folder: $VIT_RUNS_DIR when set, else the repository's runs/ folder."""
    env = os.environ.get("VIT_RUNS_DIR")
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parent.parent / "runs"
