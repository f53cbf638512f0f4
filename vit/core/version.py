"""The project's version (``vit.__version__``, every command's ``--version``), read when first asked. Imports no
torch, so a command's ``--version`` answers at once."""

import functools
import tomllib
from pathlib import Path

DISTRIBUTION = "vit-attention-explorer"  # pyproject.toml's [project] name


@functools.cache
def project_version() -> str:
    """The project's version: in a checkout, its ``pyproject.toml`` (the code being run, even where an older copy is
    also installed); once installed, the distribution's metadata (the wheel carries no pyproject.toml)."""
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        with open(pyproject, "rb") as file:
            project = tomllib.load(file).get("project", {})
        if project.get("name") == DISTRIBUTION:
            return str(project["version"])
    except (OSError, ValueError, KeyError):
        pass
    from importlib import metadata  # only once installed: its import costs more than the file's read

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"
