"""Models named by their Hub id, downloaded with ``huggingface_hub`` into the standard Hugging Face cache.

A name is one of:

- ``ORG/NAME[@REVISION]``: a Hugging Face model repository (a branch, tag or commit after ``@``);
- ``hf-hub:ORG/NAME``: open_clip's spelling of the same (its ``HF_HUB_PREFIX``);
- a timm model name (``vit_base_patch16_224.augreg_in21k``; without a tag, timm's default one), resolved to its
  repository by timm's own registry (``pretrained_cfg.hf_hub_id``), or an open_clip model name
  (``ViT-B-16-SigLIP2``) by open_clip's (``get_pretrained_cfg(...)["hf_hub"]``).

Only what opening needs is fetched: the top-level safetensors and json/txt/tokenizer files; a pickle
(``.bin`` / ``.pth`` / ``.pt``) only when the repository holds no safetensors (``vit.sources.open`` then reads it
with ``torch.load(weights_only=True)``), and never a ``.py``. The size comes from the repository's file list and
is checked against ``VIT_MAX_DOWNLOAD_GB`` (default 5) before a byte is downloaded, and the files are downloaded at
the commit that list was read at, each stopped once it passes its listed size; a revision must be a branch, tag or
commit before it touches the cache; every request has deadlines (``vit.sources.hub_network``). ``HF_TOKEN`` is used
when set (``huggingface_hub`` reads it). Offline (``HF_HUB_OFFLINE=1`` or no network) a cached copy opens; nothing
cached is one line naming the model.
"""

from __future__ import annotations

import fnmatch
import os
import re
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from vit.checkpoint import CheckpointError
from vit.core.runfiles import atomic_write_text
from vit.core.text import format_bytes  # noqa: F401 (hub.format_bytes: the pages' and commands' sizes)
from vit.sources.files import MAX_REF_BYTES, SourceError, read_bounded, read_json
from vit.sources.hub_names import HF_HUB_PREFIX, INDEXES, WEIGHT_FILES, looks_like_name
from vit.sources.hub_names import MODEL_NAME as _TIMM_OR_OPEN_CLIP
from vit.sources.hub_names import REPO as _REPO

MAX_DOWNLOAD_ENV = "VIT_MAX_DOWNLOAD_GB"
DEFAULT_MAX_DOWNLOAD_GB = 5.0
# What opening a model reads (vit.sources.open and the text towers' tokenizers); nothing else is fetched.
WANTED = ("*.safetensors", "*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja")  # .jinja: a chat template
PICKLES = ("*.bin", "*.pth", "*.pt")  # weights as torch pickles: only when there are no safetensors
NOT_WEIGHTS = ("training_args.bin", "optimizer.pt", "scheduler.pt", "rng_state*.pth")  # trainer state, not a model
_COMMIT = re.compile(r"[0-9a-f]{40}")
# git check-ref-format's rules for a branch or tag (the Hub's revisions are those, or a commit): printable ASCII
# without space ~ ^ : ? * [ \ and DEL, no "..", "@{" or "//", no component starting with "." or ending in ".lock",
# not starting or ending with "/", not ending with ".", not "@" alone
_REF_CHARS = re.compile(r"[!-~]{1,255}")
_REF_BAD = re.compile(r"[ ~^:?*\[\\\x7f]|\.\.|@\{|//|^/|/$|\.$|^@$|(^|/)\.|\.lock(/|$)")
MAX_FILE_BYTES = 10**12  # no model file is a terabyte: a file list that says so (or a negative size) is wrong
WEIGHTS = (".safetensors", ".bin", ".pth", ".pt")
WEIGHTS_HEADER_BYTES = 2**20  # a weights file's own header and names, beyond its tensors' bytes
DISK_RESERVE_BYTES = 2**30  # what a download leaves free on the HF cache's disk: the server's uploads, runs, logs
# The downloads under way in this process, each with its bytes still to come: what the disk's free space has yet to
# lose to them (the pages run two at once, each checked at its start against the space the other leaves).
_UNDER_WAY: dict[object, int] = {}
_UNDER_WAY_LOCK = threading.RLock()
MAX_CONFIG_LAYERS = 1000  # more blocks than any model opened has: such a config.json is not built to be counted


class HubError(CheckpointError):
    """A Hub model that cannot be fetched; the message is one line saying why and what to do."""


class HubUnreachable(HubError):
    """Offline (``HF_HUB_OFFLINE``) or no connection to the Hub: a cached copy may still open."""


@dataclass(frozen=True)
class HubName:
    """A Hub model: its repository, the revision asked for and what the user typed."""

    repo_id: str
    revision: str | None
    text: str

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


@dataclass(frozen=True)
class Download:
    """What fetching a model means, from the repository's file list: the files still missing from the HF cache
    and their sizes, at ``commit``."""

    name: HubName
    commit: str
    files: tuple[tuple[str, int], ...]  # (path in the repository, bytes), not yet in the cache

    @property
    def size(self) -> int:
        return sum(size for _, size in self.files)

    @property
    def summary(self) -> str:
        """One line for before the download: which model, how many files and bytes."""
        return f"{self.name}: {len(self.files)} files, {format_bytes(self.size)}"


def cache_dir() -> Path:
    """The folder huggingface_hub downloads into (``HF_HUB_CACHE``, else ``HF_HOME/hub``, ...)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def max_download_bytes() -> int:
    """``VIT_MAX_DOWNLOAD_GB`` (default 5) in bytes; HubError for a value that is not a positive number."""
    text = os.environ.get(MAX_DOWNLOAD_ENV, "").strip()
    try:
        gigabytes = float(text) if text else DEFAULT_MAX_DOWNLOAD_GB
    except ValueError:
        gigabytes = -1.0
    if not gigabytes > 0:
        raise HubError(f"{MAX_DOWNLOAD_ENV}={text!r} is not a positive number of gigabytes")
    return int(gigabytes * 1e9)


def valid_repo_id(repo: str) -> bool:
    """Whether ``repo`` is an ``ORG/NAME`` the Hub accepts (huggingface_hub's ``validate_repo_id``)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if not _REPO.fullmatch(repo):
        return False
    try:
        validate_repo_id(repo)
    except HFValidationError:
        return False
    return True


def check_revision(revision: str, text: str) -> None:
    """HubError (one line) unless ``revision`` is a 40-hex commit or a branch or tag name git allows: it becomes a
    path under the HF cache's ``refs/`` folder, so nothing else may pass."""
    if not (_COMMIT.fullmatch(revision) or (_REF_CHARS.fullmatch(revision) and not _REF_BAD.search(revision))):
        raise HubError(f"{text[:120]!r}: {revision[:60]!r} is no branch, tag or commit; give ORG/NAME@REVISION with "
                       "a branch or tag name, or a 40-hex commit")


def parse_name(text: str) -> HubName | None:
    """The Hub model ``text`` names (``ORG/NAME[@REV]``, ``hf-hub:ORG/NAME``, a timm or open_clip model name), or
    None when it names none. A timm or open_clip name is looked up in that library's registry. HubError (one line)
    for a Hub id whose revision is no branch, tag or commit."""
    text = str(text).strip()
    if text.lower().endswith(WEIGHT_FILES):
        return None
    if text.startswith(HF_HUB_PREFIX):
        text = text[len(HF_HUB_PREFIX):]
    repo, at, revision = text.partition("@")
    if valid_repo_id(repo):
        if at:
            check_revision(revision, text)
        return HubName(repo, revision or None, text)
    if "/" not in text and _TIMM_OR_OPEN_CLIP.fullmatch(text):
        repo = registry_repo(text)
        if repo:
            return HubName(repo, None, text)
    return None


def registry_repo(name: str) -> str | None:
    """The repository timm's registry (``vit_base_patch16_224.augreg_in21k``) or open_clip's
    (``ViT-B-16-SigLIP2``) gives for a model name, else None."""
    import timm.models

    try:
        cfg = timm.models.get_pretrained_cfg(name)
    except RuntimeError:  # a known architecture with an unknown tag
        cfg = None
    if cfg is not None and cfg.hf_hub_id:
        return cfg.hf_hub_id
    import open_clip

    for tag in open_clip.list_pretrained_tags_by_model(name):
        hub = (open_clip.get_pretrained_cfg(name, tag) or {}).get("hf_hub")
        if hub:
            return hub.strip("/")
    return None


def chosen_files(files: dict[str, int]) -> dict[str, int]:
    """Of a repository's ``{path: size}``, what opening needs: top-level safetensors and json/txt/tokenizer files,
    torch pickles only where there are no safetensors; never code."""
    top = {p: s for p, s in files.items() if "/" not in p and not p.endswith(".py")}
    wanted = {p: s for p, s in top.items() if any(fnmatch.fnmatch(p, w) for w in WANTED)}
    if not any(p.endswith(".safetensors") for p in wanted):
        wanted.update({p: s for p, s in top.items() if any(fnmatch.fnmatch(p, w) for w in PICKLES)
                       and not any(fnmatch.fnmatch(p, n) for n in NOT_WEIGHTS)})
    return dict(sorted(wanted.items()))


def _hub_error(name: HubName, error: Exception) -> HubError:
    """huggingface_hub's exception as one line that says what to do."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    from vit.sources.hub_network import HubDeadline, HubTooLarge, http

    status = getattr(getattr(error, "response", None), "status_code", None)
    if isinstance(error, HubDeadline):
        return HubUnreachable(f"the Hub is too slow for {name}: {error}; try again later")
    if isinstance(error, HubTooLarge):
        return HubError(f"the Hub's answer for {name} is not what its file list says: {error}; nothing of it was "
                        "kept")
    if isinstance(error, http.TimeoutException):
        return HubUnreachable(f"the Hub did not answer in time for {name} ({type(error).__name__}); try again later")
    if isinstance(error, RevisionNotFoundError):
        return HubError(f"{name.repo_id} has no revision {name.revision!r} on the Hub")
    if isinstance(error, GatedRepoError) or (status in (401, 403) and not isinstance(error, RepositoryNotFoundError)):
        return HubError(f"{name} is gated: accept its licence on https://huggingface.co/{name.repo_id} and set "
                        "HF_TOKEN to a token of that account")
    if isinstance(error, RepositoryNotFoundError):
        return HubError(f"{name} is neither a file or folder here nor a model on the Hub (a private one needs "
                        "HF_TOKEN)")
    if isinstance(error, OfflineModeIsEnabled):
        return HubUnreachable(f"{name} is neither a file or folder here nor in the Hugging Face cache, and "
                              f"downloading is off ({_first_line(error)}); unset HF_HUB_OFFLINE to download it")
    if _is_connection_error(error):  # the address and the reason: a proxy, a firewall or a mirror's typo shows
        from huggingface_hub import constants

        return HubUnreachable(f"{name} is neither a file or folder here nor in the Hugging Face cache, and the Hub "
                              f"at {constants.ENDPOINT} cannot be reached ({_first_line(error)}); connect to download "
                              "it")
    if isinstance(error, HfHubHTTPError):
        return HubError(f"the Hub answered {status} for {name}: {_first_line(error)}")
    if isinstance(error, http.TooManyRedirects):
        return HubError(f"the Hub redirected the request for {name} in a loop; try again later, or check HF_ENDPOINT")
    return HubError(f"cannot fetch {name} from the Hub: {_first_line(error)}")


def _first_line(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[0][:200] if lines else type(error).__name__


def _is_connection_error(error: BaseException) -> bool:
    from vit.sources.hub_network import http

    return isinstance(error, (http.ConnectError, http.TimeoutException, ConnectionError))


def _hub_failures() -> tuple[type[BaseException], ...]:
    """What asking the Hub can raise that is said in one line: huggingface_hub's errors, the HTTP client's (a
    timeout, a redirect loop) and our deadlines and byte bound."""
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    from vit.sources.hub_network import HubDeadline, HubTooLarge, http

    return HfHubHTTPError, OfflineModeIsEnabled, OSError, ValueError, http.HTTPError, HubDeadline, HubTooLarge


def _offline() -> bool:
    from huggingface_hub import constants

    return constants.is_offline_mode()


def snapshot_folder(repo_id: str, commit: str) -> Path:
    """Where huggingface_hub keeps the files of ``repo_id`` at ``commit`` (there or not)."""
    return cache_dir() / ("models--" + repo_id.replace("/", "--")) / "snapshots" / commit


def snapshot_of(folder: Path) -> HubName | None:
    """The Hub model, at its commit, whose snapshot in this HF cache (``cache_dir()``) ``folder`` is
    (``models--ORG--NAME/snapshots/COMMIT``); None for any other folder."""
    try:
        folder, cache = Path(folder).resolve(), cache_dir().resolve()
    except (OSError, RuntimeError):
        return None
    snapshots, model = folder.parent, folder.parent.parent
    if (model.parent != cache or snapshots.name != "snapshots" or not model.name.startswith("models--")
            or not _COMMIT.fullmatch(folder.name)):
        return None
    repo_id = model.name[len("models--"):].replace("--", "/")
    return HubName(repo_id, folder.name, repo_id) if valid_repo_id(repo_id) else None


def cached_snapshot(name: HubName) -> Path | None:
    """The snapshot of ``name`` in the HF cache (its revision, else ``main``), without the network; None if absent."""
    folder = cache_dir() / ("models--" + name.repo_id.replace("/", "--"))
    revision = name.revision or "main"
    check_revision(revision, str(name))  # a HubName built by hand is checked too: it becomes a path here
    commit = revision
    if not _COMMIT.fullmatch(revision):
        try:  # regular files only: a FIFO in its place is never waited on
            commit = read_bounded(folder / "refs" / revision, MAX_REF_BYTES).decode("ascii", "replace").strip()
        except (OSError, SourceError):
            return None
        if not _COMMIT.fullmatch(commit):
            return None
    snapshot = folder / "snapshots" / commit
    return snapshot if snapshot.is_dir() and any(snapshot.iterdir()) else None


def repo_files(name: HubName) -> tuple[str, dict[str, int]]:
    """The commit ``name``'s revision points at and every file of the repository there, ``{path: bytes}``, from the
    Hub's model info and file tree (no download). HubError (one line) for a gated, missing or unreachable model."""
    from huggingface_hub import HfApi

    from vit.sources.hub_network import ASK_S, budget

    api = HfApi()
    try:
        with budget("the model info and file list", ASK_S):
            commit = api.model_info(name.repo_id, revision=name.revision).sha or ""
            if not _COMMIT.fullmatch(commit):  # the file list and the download are asked at this commit
                raise HubError(f"the Hub gave {name} no commit ({commit[:60]!r}); try again later")
            files = [f for f in api.list_repo_tree(name.repo_id, revision=commit, recursive=True)
                     if hasattr(f, "size")]
    except HubError:
        raise
    except _hub_failures() as e:
        raise _hub_error(name, e) from None
    tree = {}
    for f in files:
        if not isinstance(f.size, int) or not 0 <= f.size <= MAX_FILE_BYTES:
            raise HubError(f"the Hub's file list of {name} gives {str(f.path)[:80]!r} the size {str(f.size)[:30]}, "
                           "which no file has; not downloading it")
        tree[f.path] = f.size
    return commit, tree


def plan(name: HubName) -> Download:
    """The files of ``name`` that opening needs and the cache does not hold yet, with their sizes, from the Hub's
    model info and file tree (no download). HubError (one line) for a gated, missing or unreachable model."""
    commit, tree = repo_files(name)
    files = chosen_files(tree)
    if not any(p.endswith(ext) for p in files for ext in (".safetensors", ".bin", ".pth", ".pt")):
        raise HubError(f"{name} holds no weights this program reads (safetensors, or a torch pickle when it has "
                       "none)")
    snapshot = snapshot_folder(name.repo_id, commit)
    return Download(name, commit, tuple((f, size) for f, size in files.items() if not (snapshot / f).is_file()))


def check_size(download: Download) -> None:
    """HubError when ``download`` is larger than ``VIT_MAX_DOWNLOAD_GB``, or than the HF cache's disk can take and
    keep ``DISK_RESERVE_BYTES`` free, the bytes the downloads under way have still to write counted as taken
    (huggingface_hub only warns, then fills the disk the server writes to)."""
    bound = max_download_bytes()
    if download.size > bound:
        raise HubError(f"{download.name} is {format_bytes(download.size)}, over the {format_bytes(bound)} download "
                       f"bound ({MAX_DOWNLOAD_ENV}); raise it to download this model")
    free = free_bytes(cache_dir())
    with _UNDER_WAY_LOCK:
        coming = sum(_UNDER_WAY.values())
    if free is not None and download.size > free - coming - DISK_RESERVE_BYTES:
        taken = f", {format_bytes(coming)} of it for the downloads under way" if coming else ""
        raise HubError(f"{download.name} is {format_bytes(download.size)}, and the disk of the server's Hugging Face "
                       f"cache has {format_bytes(max(free, 0))} free{taken} (a download leaves "
                       f"{format_bytes(DISK_RESERVE_BYTES)}); free some space there, or set HF_HUB_CACHE to a larger "
                       "disk")


def free_bytes(folder: Path) -> int | None:
    """The free bytes of the disk ``folder`` is (or will be) on: its nearest existing parent's; None when unknown."""
    import shutil

    for place in (folder, *folder.parents):
        if place.exists():
            try:
                return shutil.disk_usage(place).free
            except OSError:
                return None
    return None


def download(plan_: Download, progress: Callable[[int, int], None] | None = None) -> Path:
    """Fetch ``plan_``'s files, at the commit they were listed at, into the HF cache and return the snapshot folder.
    A connection cut mid-file is resumed by huggingface_hub within this call; a file left unfinished when the call
    ends (stopped, failed) is deleted, and fetched from its start next time, the files finished staying. A file
    that passes its listed size, or a download that falls under the rate floor (``vit.sources.hub_network``), is
    stopped and nothing of that file kept. ``progress(done, total)`` is called with bytes as they arrive (it may
    raise to stop the download); without it huggingface_hub's own tqdm bars show on stderr."""
    if not plan_.files:
        check_size(plan_)
        return snapshot_folder(plan_.name.repo_id, plan_.commit)
    key = object()  # this download's entry among those under way
    with _UNDER_WAY_LOCK:  # checked and counted at once: of two started together, the second sees the first
        check_size(plan_)
        _UNDER_WAY[key] = plan_.size
    try:
        return _fetch_files(plan_, progress, lambda arrived: _UNDER_WAY.__setitem__(key, plan_.size - arrived))
    finally:
        with _UNDER_WAY_LOCK:
            del _UNDER_WAY[key]


def _fetch_files(plan_: Download, progress: Callable[[int, int], None] | None,
                 arrived: Callable[[int], None]) -> Path:
    """``download``'s transfer of ``plan_``'s files, each byte counted by ``arrived(bytes so far)`` too."""
    from huggingface_hub import hf_hub_download

    from vit.sources.hub_network import RateFloor, budget

    name = plan_.name
    done, total = 0, plan_.size
    floor = RateFloor()  # one for the whole download: many small files trickling get no window each
    implied: list[int | None] = []  # what config.json allows a weights file, once it is read
    for filename, size in sorted(plan_.files, key=lambda file: not file[0].endswith(".json")):  # config.json first
        if filename.endswith(WEIGHTS):
            _check_implied(plan_, filename, size, implied)
        def report(n: int, before: int = done) -> None:
            arrived(before + n)
            if progress is not None:
                progress(before + n, total)

        try:
            # by the listed commit, not the branch: a branch that moved since would bring other (larger) files
            with budget(filename, max_bytes=size, floor=floor):
                hf_hub_download(name.repo_id, filename, revision=plan_.commit,
                                tqdm_class=_bounded_tqdm(filename, size, report, draw=progress is None))
        except _hub_failures() as e:
            raise _hub_error(name, e) from None
        done += size
        arrived(done)
        if progress is not None:
            progress(done, total)
    if name.revision != plan_.commit:
        _record_ref(name, plan_.commit)
    return snapshot_folder(name.repo_id, plan_.commit)


def implied_weight_bytes(config_json: Mapping) -> int | None:
    """The most bytes one weights file of the model ``config_json`` describes can take: its state dict's tensors,
    counted by its own library on the meta device (transformers for an HF config.json, timm for a timm one), at 8
    bytes each (float64, the widest a checkpoint keeps), plus ``WEIGHTS_HEADER_BYTES``. None when neither library
    builds it (the download is then bounded by ``VIT_MAX_DOWNLOAD_GB`` and the rate floor alone); HubError for a
    config of more than ``MAX_CONFIG_LAYERS`` blocks, which would take long to build."""
    import torch

    layers = _layer_count(config_json)
    if layers > MAX_CONFIG_LAYERS:
        raise HubError(f"its config.json describes {layers:,} layers, more than any model this program opens")
    try:
        with torch.device("meta"):
            model = _meta_model(config_json)
    except Exception:  # a config its library cannot build: opening says why, the other bounds hold meanwhile
        return None
    if model is None:
        return None
    return 8 * sum(t.numel() for t in model.state_dict().values()) + WEIGHTS_HEADER_BYTES  # what a checkpoint saves


def _layer_count(config_json) -> int:
    """The blocks a config describes, over its sub-configs (a CLIP's towers): its layer and depth fields added."""
    if isinstance(config_json, Mapping):
        count = 0
        for key, value in config_json.items():
            if isinstance(value, int) and not isinstance(value, bool) and ("layers" in key or "depth" in key):
                count += max(value, 0)
            elif isinstance(value, list) and "depth" in key:
                count += sum(max(v, 0) for v in value if isinstance(v, int) and not isinstance(v, bool))
            else:
                count += _layer_count(value)
        return count
    return 0


def _meta_model(config_json: Mapping):
    """The model of an HF (``model_type``) or timm (``architecture``) config.json, or None for neither."""
    if isinstance(config_json.get("model_type"), str):
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        if config_json["model_type"] not in CONFIG_MAPPING:
            return None
        config = CONFIG_MAPPING[config_json["model_type"]].from_dict(dict(config_json))
        names = config_json.get("architectures") or []
        model_class = getattr(transformers, str(names[0]), None) if names else None
        return model_class(config) if model_class is not None else transformers.AutoModel.from_config(config)
    if isinstance(config_json.get("architecture"), str):
        import timm

        args = config_json.get("model_args") or {}
        return timm.create_model(config_json["architecture"], pretrained=False,
                                 num_classes=int(config_json.get("num_classes", 1000)), **dict(args))
    return None


def _check_implied(plan_: Download, filename: str, size: int, implied: list[int | None]) -> None:
    """HubError when the Hub declares ``filename`` larger than the model its config.json (in the snapshot by now,
    when the repository has one) describes can take; ``implied`` keeps that bound across the download's files."""
    if not implied:
        config = snapshot_folder(plan_.name.repo_id, plan_.commit) / "config.json"
        try:
            implied.append(implied_weight_bytes(read_json(config)) if config.is_file() else None)
        except SourceError:  # a config.json that is no JSON object: opening says so
            implied.append(None)
        except HubError as e:
            raise HubError(f"{plan_.name}: {e}; not downloading it") from None
    if implied[0] is not None and size > implied[0]:
        raise HubError(f"the Hub's file list of {plan_.name} gives {filename} {format_bytes(size)}, more than the "
                       f"model its config.json describes can take ({format_bytes(implied[0])}); not downloading it")


def _record_ref(name: HubName, commit: str) -> None:
    """Note in the HF cache that ``name``'s revision (``main`` by default) is ``commit``, as huggingface_hub does
    when it downloads by a branch, so that the snapshot opens offline by that name."""
    ref = cache_dir() / ("models--" + name.repo_id.replace("/", "--")) / "refs" / (name.revision or "main")
    ref.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(ref, commit)  # a kill mid-write must not leave an empty ref


def _bounded_tqdm(filename: str, size: int, report: Callable[[int], None] | None, draw: bool = False):
    """huggingface_hub's progress bar for one file, which stops the transfer (``HubTooLarge``: the library then
    deletes its partial file) once the body, decoded, passes ``size``: the library calls ``update`` before it writes
    each chunk. With ``report``, it reports the file's bytes so far, and draws nothing unless ``draw``."""
    from tqdm.auto import tqdm

    from vit.sources.hub_network import HubTooLarge

    class Bounded(tqdm):
        def __init__(self, *args, **kwargs):
            if report is not None and not draw:
                kwargs["disable"] = False
                kwargs["file"] = open(os.devnull, "w")  # noqa: SIM115 (closed with the bar)
            super().__init__(*args, **kwargs)
            self.received = kwargs.get("initial") or 0  # counted here: a disabled bar does not count

        def update(self, n=1):
            self.received += n
            if self.received > size:
                raise HubTooLarge(f"{filename} sent more than the {size} bytes declared for it")
            super().update(n)
            if report is not None:
                report(self.received)

        def close(self):
            super().close()
            if report is not None and not draw and self.fp and not self.fp.closed:
                self.fp.close()

    return Bounded


def fetch(name: HubName, report: Callable[[str], None] | None = None,
          progress: Callable[[int, int], None] | None = None,
          needed: Callable[[Path], set[str] | None] | None = None) -> Path:
    """The snapshot folder of ``name``: the cached one offline (or for a pinned commit), else downloaded after
    ``report`` (default: stderr) was told its size. HubError (one line) for anything that stops it."""
    cached = cached_snapshot(name)
    if _offline() or (cached is not None and name.revision and _COMMIT.fullmatch(name.revision)):
        if cached is None:
            raise HubError(f"{name} is neither a file or folder here nor in the Hugging Face cache "
                           f"({cache_dir()}), and HF_HUB_OFFLINE is set; unset it to download the model")
        return cached
    try:
        wanted = plan(name)
    except HubUnreachable:
        if cached is not None:
            return cached  # no network: the copy we have
        raise
    wanted = only_needed_shards(wanted, progress, needed)
    if wanted.files:
        check_size(wanted)  # only what is still to fetch counts against the bound
        (report or _to_stderr)(f"downloading {wanted.summary} into the Hugging Face cache ({cache_dir()})")
    return download(wanted, progress)


def only_needed_shards(plan_: Download, progress: Callable[[int, int], None] | None = None,
                       needed: Callable[[Path], set[str] | None] | None = None) -> Download:
    """``plan_`` less the shards opening will not read: of a sharded vision-language model, its config.json and shard
    index (kilobytes; not its other JSON files, a tokenizer's megabytes, which a page fetched in its own run before
    offering the download) are fetched first, then only the shards its index lists for the tower (``needed``:
    opening passes ``vit.sources.open.needed_shards``, which reads those two), never the language model's gigabytes.
    Any other model, or no ``needed``: ``plan_``."""
    if needed is None:
        return plan_
    if not any(f.endswith(".index.json") for f, _ in plan_.files) and not any(
            (snapshot_folder(plan_.name.repo_id, plan_.commit) / f).is_file() for f in INDEXES):
        return plan_
    small = tuple((f, s) for f, s in plan_.files if f in ("config.json", *INDEXES))
    folder = download(Download(plan_.name, plan_.commit, small), progress)
    keep = needed(folder)
    if keep is None:
        return Download(plan_.name, plan_.commit, tuple(f for f in plan_.files if f not in small))
    weights = (".safetensors", ".bin", ".pth", ".pt")
    return Download(plan_.name, plan_.commit, tuple(
        (f, s) for f, s in plan_.files if (f, s) not in small and (not f.endswith(weights) or f in keep)))


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def resolve(source: str | os.PathLike, report: Callable[[str], None] | None = None,
            progress: Callable[[int, int], None] | None = None,
            needed: Callable[[Path], set[str] | None] | None = None) -> Path:
    """``source`` as a local path: itself when it exists (or names no Hub model), else the Hub model's snapshot in
    the HF cache, downloaded when needed (of a sharded model, only the shards ``needed`` names from its JSON files)."""
    path = Path(source).expanduser()
    if path.exists() or not looks_like_name(source):
        return path
    name = parse_name(str(source))
    if name is None:
        return path  # open_source says it is not found
    return fetch(name, report, progress, needed)


# SAEs on the Hub: a repository often holds many (SAELens's releases keep one per folder), so the name says which.
SAE_LENS_FILES = ("cfg.json", "sae_weights.safetensors")  # vit.features.autoencoder's CFG_FILE and WEIGHTS_FILE
PRISMA_SAE_CONFIG = "config.json"


def parse_sae_name(text: str) -> tuple[HubName, str] | None:
    """``ORG/NAME[/PATH/IN/REPO][@REVISION]`` -> the repository and the SAE's folder or file in it ('' for its top),
    or None when ``text`` is no such name; HubError (one line) when its revision is no branch, tag or commit."""
    body, at, revision = str(text).strip().removeprefix(HF_HUB_PREFIX).partition("@")
    parts = body.split("/")
    if len(parts) < 2 or any(not part or part in (".", "..") for part in parts):
        return None
    repo = "/".join(parts[:2])
    if not valid_repo_id(repo):
        return None
    if at:
        check_revision(revision, str(text).strip())
    return HubName(repo, revision or None, str(text).strip()), "/".join(parts[2:])


def looks_like_sae_name(text: str) -> bool:
    """Whether ``text`` should be fetched as an SAE from the Hub: nothing here has that path and it reads as one
    (with a bad revision too: fetching it says what is wrong)."""
    if not text.strip() or Path(text).expanduser().exists():
        return False
    try:
        return parse_sae_name(text) is not None
    except HubError:
        return True


def sae_files(tree: dict[str, int], sub: str, name: HubName) -> dict[str, int]:
    """Of a repository's ``{path: bytes}``, the files of the SAE at ``sub``: a file itself (a saev or Prisma
    ``.pt``, with Prisma's ``config.json`` beside it); in a folder SAELens's two files, or Prisma's ``config.json``
    and its one checkpoint. HubError when ``sub`` holds no SAE."""
    if sub in tree:
        beside = f"{sub.rpartition('/')[0]}/{PRISMA_SAE_CONFIG}".lstrip("/")
        return {sub: tree[sub], **({beside: tree[beside]} if beside in tree and sub.endswith(".pt") else {})}
    prefix = f"{sub}/" if sub else ""
    here = {p[len(prefix):]: s for p, s in tree.items() if p.startswith(prefix) and "/" not in p[len(prefix):]}
    if all(f in here for f in SAE_LENS_FILES):
        return {prefix + f: here[f] for f in SAE_LENS_FILES}
    checkpoints = sorted(f for f in here if f.endswith(".pt") and not f.endswith("_log_feature_sparsity.pt"))
    if PRISMA_SAE_CONFIG in here and len(checkpoints) == 1:
        return {prefix + f: here[f] for f in (PRISMA_SAE_CONFIG, checkpoints[0])}
    where = f"{name.repo_id}/{sub}" if sub else name.repo_id
    if checkpoints:
        raise HubError(f"{where} holds {len(checkpoints)} checkpoints; name one: {where}/{checkpoints[0]} "
                       f"({', '.join(checkpoints)[:120]})")
    folders = sorted({p[len(prefix):].split("/")[0] for p in tree if p.startswith(prefix) and
                      p.endswith("/" + SAE_LENS_FILES[0])})
    raise HubError(f"{where} holds no SAE (SAELens's {' and '.join(SAE_LENS_FILES)}, or Prisma's "
                   f"{PRISMA_SAE_CONFIG} and a .pt)" + (f"; its SAEs are in {', '.join(folders)[:150]}: add one to "
                                                        "the name" if folders else ""))


def cached_sae(text: str) -> Path | None:
    """The HF cache's copy of the SAE ``text`` names on the Hub (its folder or file in the snapshot), without the
    network; None when the cache does not hold it or ``text`` names no SAE."""
    try:
        parsed = parse_sae_name(text)
    except HubError:
        return None
    if parsed is None:
        return None
    name, sub = parsed
    cached = cached_snapshot(name)
    local = None if cached is None else cached / sub
    return local if local is not None and local.exists() else None


def plan_sae(text: str) -> tuple[Download, Path]:
    """(the files of the SAE ``text`` names that the HF cache lacks, with their size; where the SAE will lie once
    they are there), from the Hub's file list (no download). HubError (one line) for a name that is no SAE."""
    parsed = parse_sae_name(text)
    if parsed is None:
        raise HubError(f"{text!r} names no SAE on the Hub; give ORG/NAME[/PATH/IN/REPO][@REVISION]")
    name, sub = parsed
    commit, tree = repo_files(name)
    files = sae_files(tree, sub, name)
    snapshot = snapshot_folder(name.repo_id, commit)
    missing = tuple((f, s) for f, s in files.items() if not (snapshot / f).is_file())
    return Download(name, commit, missing), snapshot / sub


def fetch_sae(text: str, report: Callable[[str], None] | None = None) -> Path:
    """The local path (folder or file, in the HF cache) of the SAE ``text`` names on the Hub, its files downloaded
    when needed after ``report`` (default: stderr) was told their size; the cached copy offline."""
    if parse_sae_name(text) is None:
        raise HubError(f"{text!r} names no SAE on the Hub; give ORG/NAME[/PATH/IN/REPO][@REVISION]")
    local = cached_sae(text)
    if _offline():
        if local is None:
            raise HubError(f"{text} is neither a file or folder here nor in the Hugging Face cache ({cache_dir()}), "
                           "and HF_HUB_OFFLINE is set; unset it to download the SAE")
        return local
    try:
        wanted, path = plan_sae(text)
    except HubUnreachable:
        if local is not None:
            return local
        raise
    if wanted.files:
        check_size(wanted)
        (report or _to_stderr)(f"downloading {wanted.summary} into the Hugging Face cache ({cache_dir()})")
        download(wanted)
    return path
