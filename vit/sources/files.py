"""Small files read on the way to a model, by opening (``vit.sources.open``) and by downloading
(``vit.sources.hub``, which checks a config.json before fetching its weights): the one-line error, the one bounded
reader of a model folder's auxiliary files (configs, processors, chat templates, tokenizers, vocabularies, ``.gz``
files, each bounded by what it inflates to, counted while it is read), and what transformers' loading info says is
wrong with a folder's weights."""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import os
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from vit.checkpoint import CheckpointError
from vit.core.runfiles import NotARegularFile, open_regular
from vit.core.threads import WhileAny

MAX_JSON_BYTES = 4 * 1024 * 1024  # config files are a few kB; refuse to parse a huge one
MAX_TOKENIZER_BYTES = 40 * 2**20  # SigLIP 2's Gemma tokenizer.json is 34 MB, CLIP's 2 MB
MAX_VOCABULARY_BYTES = 8 * 2**20  # inflated: CLIP's bpe_simple_vocab_16e6.txt.gz is 1.3 MB, 3.0 MB inflated
BPE_VOCABULARY = "bpe_simple_vocab_16e6.txt.gz"  # CLIP's, which dino.txt's hub downloads and open_clip ships
# Every file the libraries or we read from a model folder beside its weights, and what it may inflate to (a plain
# file's size on disk; a .gz file's inflated bytes): the one table read_bounded and auxiliary_problem read. The
# tokenizers' and processors' files (transformers', open_clip's) are each a few kB in published models, but the
# tokenizer's own: a 60 MB tokenizer.json of 3 M entries took 28 s and 2 GB to read.
TOKENIZER_FILE_NAMES = ("tokenizer.json", "vocab.json", "merges.txt", "vocab.txt", "spiece.model", "tokenizer.model",
                        "sentencepiece.bpe.model")
CHAT_TEMPLATE_DIR = "additional_chat_templates"  # transformers reads each .jinja in it with the tokenizer or processor
MAX_TEMPLATES = 64  # files in it: a model has one template or a few
SMALL_FILES = ("config.json", "generation_config.json", "processor_config.json", "preprocessor_config.json",
               "video_preprocessor_config.json", "chat_template.json", "chat_template.jinja", "tokenizer_config.json",
               "special_tokens_map.json", "added_tokens.json", "open_clip_config.json")
AUXILIARY_FILES = {**dict.fromkeys(SMALL_FILES, (MAX_JSON_BYTES, "a few kB")),
                   **dict.fromkeys(TOKENIZER_FILE_NAMES, (MAX_TOKENIZER_BYTES, "Gemma 3's is 33 MB")),
                   BPE_VOCABULARY: (MAX_VOCABULARY_BYTES, "CLIP's inflates to 3 MB")}
MAX_REF_BYTES = 256  # an HF cache's refs/NAME: a 40-hex commit and a newline
CHUNK = 2**20  # read and inflated a MiB at a time: the bound is passed by at most this much before the refusal
MAX_VERSIONED_FILES = 256  # a model folder's files stated for its version: published ones hold a few dozen shards


class SourceError(CheckpointError):
    """A model path that cannot be opened; the message is one line saying why and what is supported."""


def _one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:200] if lines else type(error).__name__


def library_errors() -> tuple[type[BaseException], ...]:
    """What the libraries raise for a folder they cannot read, caught around every ``from_pretrained`` for one line
    (``library_error_line``): transformers' own (OSError, ValueError, ...), its configs' strict validation
    (huggingface_hub's ``StrictDataclassError``: ``attn_implementation`` beside ``output_attentions``), safetensors'
    ``SafetensorError`` and torch's weights-only ``UnpicklingError`` (a pickle refused; nothing in it ran)."""
    import pickle

    from huggingface_hub.errors import StrictDataclassError
    from safetensors import SafetensorError

    return (OSError, ValueError, KeyError, TypeError, AttributeError, RuntimeError, ImportError,
            pickle.UnpicklingError, StrictDataclassError, SafetensorError)


def library_error_line(error: BaseException) -> str:
    """``error`` (one of ``library_errors()``) in one line: torch's weights-only refusal (six lines advising to load
    the file anyway) as what it is, a config's strict validation (two lines) as its reason, else its first line."""
    import pickle

    from huggingface_hub.errors import StrictDataclassError

    if isinstance(error, pickle.UnpicklingError):
        return ("its weights pickle Python objects other than tensors and plain data, which could run code: torch's "
                "weights-only load refused them and nothing in them ran; only weights are read")
    if isinstance(error, StrictDataclassError):  # "Class validation error for validator 'x':" then the reason
        reason = str(error).strip().splitlines()[-1].strip() if str(error).strip() else type(error).__name__
        return f"its config is refused by transformers ({reason.removeprefix('ValueError: ')[:200]})"
    return _one_line(error)


def _opened(path: Path, limit: int, label: str) -> BinaryIO:
    """``path`` opened, a regular file only; SourceError (one line, naming the file as ``label``) for anything else,
    and for a plain (not ``.gz``) file whose size on disk, which is what it reads, passes ``limit``: refused unread."""
    try:
        file = open_regular(path)  # a FIFO is refused, never waited on, nor /dev/zero read for ever
    except NotARegularFile:
        raise SourceError(f"{label} is not a regular file; give the model's own {path.name}") from None
    size = os.fstat(file.fileno()).st_size
    if not path.name.endswith(".gz") and size > limit:
        file.close()
        raise SourceError(f"{label} is {size / 2**20:,.0f} MB, over {_most(path, limit)}")
    return file


def _most(path: Path, limit: int) -> str:
    usual = AUXILIARY_FILES.get(path.name, (0, ""))[1]
    amount = f"{limit // 2**20} MB" if limit >= 2**20 else f"{limit:,} bytes"
    return f"the {amount} such a file may have" + (f" ({usual})" if usual else "")


def _chunks(path: Path, limit: int, label: str) -> Iterator[bytes]:
    """The bytes of ``path`` as a reader sees them (a ``.gz`` file inflated), a chunk at a time; SourceError (one
    line, naming the file as ``label``) as soon as they pass ``limit``, or for what is not a regular file, before
    the rest is read or inflated."""
    with _opened(path, limit, label) as file:
        total = 0
        if not path.name.endswith(".gz"):
            while block := file.read(CHUNK):  # counted still: a file that grows while it is read
                total += len(block)
                if total > limit:
                    raise SourceError(f"{label} is over {_most(path, limit)}")
                yield block
            return
        size = os.fstat(file.fileno()).st_size
        inflate, pending, ended = zlib.decompressobj(16 + zlib.MAX_WBITS), b"", False  # 16+: gzip's wrapper
        while pending or (pending := file.read(CHUNK)):
            out = inflate.decompress(pending, CHUNK)  # a chunk inflated at a time: a bomb never inflates whole
            pending, ended = inflate.unconsumed_tail, inflate.eof
            total += len(out)
            if total > limit:
                raise SourceError(f"{label}, a {size / 2**20:,.1f} MB .gz, inflates to more than {_most(path, limit)}")
            yield out
            if inflate.eof:  # a next gzip member, as gzip.open reads one
                pending, inflate = inflate.unused_data, zlib.decompressobj(16 + zlib.MAX_WBITS)
        if not ended:
            raise SourceError(f"{label} is not a whole .gz file (it ends early); give the model's own {path.name}")


def read_bounded(path: Path, limit: int | None = None) -> bytes:
    """The bytes of a model folder's auxiliary file as a reader sees them (a ``.gz`` file inflated), counted while
    they are read: SourceError (one line) past ``limit`` (default: the file's in ``AUXILIARY_FILES``), before the
    rest is read. The one reader of such files; those a library reads itself are checked by ``auxiliary_problem``."""
    limit = limit if limit is not None else AUXILIARY_FILES.get(path.name, (MAX_JSON_BYTES, ""))[0]
    try:
        return b"".join(_chunks(path, limit, str(path)))
    except (OSError, zlib.error, EOFError) as e:
        raise SourceError(f"cannot read {path} ({_one_line(e)})") from None


def auxiliary_problem(folder: Path, names: tuple[str, ...] = tuple(AUXILIARY_FILES)) -> str | None:
    """What is wrong with the auxiliary files ``names`` of ``folder`` that a library reads itself (a tokenizer, a
    processor), and with its ``additional_chat_templates/`` (which both read whole), in one line naming the file as
    "its NAME" (a caller says whose), or None: one over its bound (``AUXILIARY_FILES``), or not a regular file. A
    plain file is bounded by its size, which is what it reads; a ``.gz`` file by inflating it, a chunk at a time."""
    templates = folder / CHAT_TEMPLATE_DIR
    listed = []
    if templates.is_dir() and not templates.is_symlink():
        with os.scandir(templates) as entries:  # its listing bounded too: transformers lists it whole
            listed = [entry.name for entry in itertools.islice(entries, MAX_TEMPLATES + 1)]
        if len(listed) > MAX_TEMPLATES:
            return f"its {CHAT_TEMPLATE_DIR} holds more than {MAX_TEMPLATES} files (a model has a template or a few)"
        listed = [f"{CHAT_TEMPLATE_DIR}/{name}" for name in listed if name.endswith(".jinja")]
    for name in (*names, *listed):
        path = folder / name
        if path.exists() or path.is_symlink():
            limit = AUXILIARY_FILES.get(path.name, (MAX_JSON_BYTES, ""))[0]
            try:
                if name.endswith(".gz"):  # what it inflates to is counted by inflating it, never held
                    collections.deque(_chunks(path, limit, f"its {name}"), maxlen=0)
                else:
                    _opened(path, limit, f"its {name}").close()
            except SourceError as e:
                return str(e)
            except (OSError, zlib.error, EOFError) as e:
                return f"its {name} cannot be read ({_one_line(e)})"
    return None


def folder_version(folder: Path) -> tuple[tuple[str, int, int], ...]:
    """The version of a model folder: each file's (name, mtime_ns, size) at its top level, the first
    ``MAX_VERSIONED_FILES`` by name (symbolic links followed: an HF cache's snapshot links its blobs). A file
    rewritten in place changes it, where the folder's own stat does not (its entries are the same)."""
    try:
        names = sorted(entry.name for entry in os.scandir(folder))[:MAX_VERSIONED_FILES]
    except OSError:
        return ()
    version = []
    for name in names:
        try:
            stat = (folder / name).stat()
        except OSError:  # removed meanwhile, a dangling link
            continue
        version.append((name, stat.st_mtime_ns, stat.st_size))
    return tuple(version)


def read_json(path: Path) -> dict:
    """A JSON object from a small file (``read_bounded`` within ``MAX_JSON_BYTES``); SourceError for anything
    else."""
    text = read_bounded(path, MAX_JSON_BYTES)
    try:
        value = json.loads(text.decode("utf-8"))
    except RecursionError:  # nesting deeper than the parser's stack: bounded by MAX_JSON_BYTES, refused in one line
        raise SourceError(f"cannot read {path} as JSON (nested too deeply); not a model config") from None
    except (OSError, ValueError) as e:
        raise SourceError(f"cannot read {path} as JSON ({_one_line(e)})") from None
    if not isinstance(value, dict):
        raise SourceError(f"{path} is not a JSON object; not a model config")
    return value


def _quiet() -> Callable[[], None]:
    import transformers

    level, bars = transformers.logging.get_verbosity(), transformers.logging.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()

    def undo() -> None:
        transformers.logging.set_verbosity(level)
        if bars:
            transformers.logging.enable_progress_bar()

    return undo


_QUIET = WhileAny(_quiet)


def quiet_transformers() -> contextlib.AbstractContextManager[None]:
    """transformers prints a multi-line loading report (missing and unexpected keys) on its logger, and a "Loading
    weights" progress bar on stderr (which the commands keep to one line a problem): our one line says what
    matters, so its logger is kept at errors and its progress bars off while a model opens (in any thread: both
    settings are the process's, ``vit.core.threads.WhileAny``)."""
    return _QUIET()


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
