"""Small files read on the way to a model, by opening (``vit.sources.open``) and by downloading
(``vit.sources.hub``, which checks a config.json before fetching its weights): the one-line error and a bounded
JSON reader, and what transformers' loading info says is wrong with a folder's weights."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
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


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers prints a multi-line loading report (missing and unexpected keys) on its logger, and a "Loading
    weights" progress bar on stderr (which the commands keep to one line a problem): our one line says what
    matters, so its logger is kept at errors and its progress bars off while a model opens."""
    import transformers

    level = transformers.logging.get_verbosity()
    bars = transformers.logging.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(level)
        if bars:
            transformers.logging.enable_progress_bar()


def loading_problem(loaded: dict) -> str | None:
    """What transformers' loading info (``from_pretrained(..., ignore_mismatched_sizes=True,
    output_loading_info=True)``) says is wrong with a folder's weights, in one line, or None: a weight of the model
    the files do not hold (transformers fills it at random, and the model runs with random layers without a word),
    or one of another size than the config's (transformers' own refusal is a RuntimeError pointing at a report)."""
    mismatched = sorted(loaded.get("mismatched_keys") or (), key=lambda m: str(m[0]))
    if mismatched:
        key, stored, built = mismatched[0]
        more = f" and {len(mismatched) - 1:,} more" if len(mismatched) > 1 else ""
        return (f"its weights do not match its config.json (size mismatch for {key}: {tuple(stored)} in the weights, "
                f"{tuple(built)} in the config{more}); give the folder the config.json saved with these weights")
    missing = sorted(map(str, loaded.get("missing_keys") or ()))
    if missing:
        language = sum(".language_model." in f".{key}" or key.startswith("lm_head.") for key in missing)
        which = f", {language:,} of them the language model's" if language else ""
        shown = ", ".join(missing[:2]) + (f" and {len(missing) - 2:,} more" if len(missing) > 2 else "")
        return (f"its weights files lack {len(missing):,} of the model's weights{which} ({shown}), which transformers "
                "would fill at random, so the model would run with random layers; copy every weights file of the "
                "model into the folder (model.safetensors, or each shard model.safetensors.index.json names)")
    return None
