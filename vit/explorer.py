"""Start the explorer app from wherever it is installed: ``vit-explorer [STREAMLIT OPTIONS]`` (or ``python -m
vit.explorer``), the same as ``streamlit run app.py`` in the repository.

``--version`` prints the project's version. Every other option is passed to ``streamlit run`` (e.g.
``--server.port 8502``, ``--server.address 0.0.0.0``: see "Deploy and security" in the docs first). The app's own
server defaults (``.streamlit/config.toml``: localhost only, no file watcher, no tracebacks shown) apply unless an
option overrides them, from any working folder. Runs go to ``./runs`` and datasets to ``./data`` of the folder it
starts in unless ``VIT_RUNS_DIR`` / ``VIT_DATA_DIR`` say otherwise.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

from vit.core.runfiles import ROOT, app_root

PROG = "vit-explorer"


def server_defaults(config: Path) -> list[str]:
    """``--section.key=value`` for every setting of a Streamlit ``config.toml``."""
    try:
        settings = tomllib.loads(config.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return []
    return [f"--{section}.{key}={str(value).lower() if isinstance(value, bool) else value}"
            for section, values in settings.items() if isinstance(values, dict) for key, value in values.items()]


def streamlit_args(argv: list[str], root: Path) -> list[str]:
    """``streamlit run`` arguments: the app, the app's server defaults the user did not set, then ``argv``."""
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    defaults = [d for d in server_defaults(root / ".streamlit" / "config.toml") if d.split("=", 1)[0] not in given]
    return ["run", str(root / "app.py"), *defaults, *argv]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if argv and argv[0] == "--version":  # the project's version, not Streamlit's
        from vit.core.version import project_version

        print(f"{PROG} {project_version()}")
        return 0
    root = app_root()
    if not (root / "app.py").is_file():
        print(f"{PROG}: error: the app's files are not installed next to vit ({root}); reinstall the package",
              file=sys.stderr)
        return 2
    if root != ROOT:  # installed: keep runs and data out of site-packages
        os.environ.setdefault("VIT_RUNS_DIR", str(Path.cwd() / "runs"))
        os.environ.setdefault("VIT_DATA_DIR", str(Path.cwd() / "data"))
    from streamlit.web import cli as streamlit_cli

    sys.argv = ["streamlit", *streamlit_args(argv, root)]
    return streamlit_cli.main()


def command() -> None:
    """The console command (pyproject.toml) and ``python -m``: ``main()``'s status, with a fast, quiet exit."""
    from vit.core.cli import run_command

    run_command(main)


if __name__ == "__main__":
    command()
