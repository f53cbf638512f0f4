"""Small files read on the way to a model, by opening (``vit.sources.open``) and by downloading
(``vit.sources.hub``, which checks a config.json before fetching its weights): the one-line error and a bounded
JSON reader."""

from __future__ import annotations

import json
from pathlib import Path

from vit.checkpoint import CheckpointError

MAX_JSON_BYTES = 4 * 1024 * 1024  # config files are a few kB; refuse to parse a huge one


class SourceError(CheckpointError):
    """A model path that cannot be opened; the message is one line saying why and what is supported."""


def _one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:200] if lines else type(error).__name__


def read_json(path: Path) -> dict:
    """A JSON object from a small file; SourceError for anything else."""
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise SourceError(f"{path} is larger than {MAX_JSON_BYTES // 2**20} MiB; not a model config")
        value = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:  # nesting deeper than the parser's stack: bounded by MAX_JSON_BYTES, refused in one line
        raise SourceError(f"cannot read {path} as JSON (nested too deeply); not a model config") from None
    except (OSError, ValueError) as e:
        raise SourceError(f"cannot read {path} as JSON ({_one_line(e)})") from None
    if not isinstance(value, dict):
        raise SourceError(f"{path} is not a JSON object; not a model config")
    return value
