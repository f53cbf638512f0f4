"""The censuses' fresh home: HOME, HF_HOME and the caches in a new temporary folder, offline (no cache, no token, no
network), set in this process's environment by a census run as a program (``python -m bench.census_families``,
``python -m bench.census_vlm``) before anything imports huggingface_hub, which reads them once, at its import.

Never on import: the tests import the censuses' helpers, and a test worker whose environment said
``HF_HUB_OFFLINE=1`` from then on gave it to every process it started after (an app server that then found the Hub
offline).
"""

from __future__ import annotations

import atexit
import os
import tempfile


def remove_home(home: str, owner: int) -> None:
    """Remove the fresh home at exit (only in the process that made it: a forked child exits leaving it)."""
    if os.getpid() == owner:
        import shutil

        shutil.rmtree(home, ignore_errors=True)


def fresh_home() -> str:
    """Make the fresh home, set the environment to it and return its path; it is removed at this process's exit."""
    home = tempfile.mkdtemp(prefix="census-home-")
    atexit.register(remove_home, home, os.getpid())
    os.environ.update({"HOME": home, "HF_HOME": f"{home}/hf", "HF_HUB_CACHE": f"{home}/hf/hub", "HF_HUB_OFFLINE": "1",
                       "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_OFFLINE": "1",
                       "TORCH_HOME": f"{home}/torch", "XDG_CACHE_HOME": f"{home}/cache"})
    return home
