"""The runs folder's files: their names, atomic writes, readers and the status heartbeat.

One run folder per training run, written by the training CLI (``vit.train``) and read by the
run manager (``vit.runs.manager``), the checkpoint catalog (``vit.app.catalog``) and the training page::

    runs/NAME/config.json      every argument, the model config, the dataset and its class names
    runs/NAME/metrics.jsonl    one line per finished epoch
    runs/NAME/status.json      state and a heartbeat (rewritten every HEARTBEAT_SECONDS while running)
    runs/NAME/last.pt          the latest weights with everything needed to resume
    runs/NAME/best.pt          the weights with the best validation accuracy so far
    runs/NAME/train.log        the log, with the traceback when training failed
    runs/NAME/checkpoints/     epoch_0003.pt …: per-epoch checkpoints (--save-every), the K most
                               recent and the best epoch's kept (--keep)
    runs/NAME/probe/           the attention snapshots' probe images (see ``vit.training.snapshots``)
    runs/NAME/attention/       epoch_0003.npz …: one attention snapshot per epoch (``vit.training.snapshots``)
    runs/.launch/NAME/         the manager's launch.json and output.log (see ``vit.runs.manager``), and the
                               launched process's phase.json (what it does before status.json exists)

Every JSON and JSONL file is replaced atomically (train.log is appended to), so a reader sees
the old file or the new one, never half of one, and a SIGKILL leaves every file readable. The
readers ``read_status``, ``read_config`` and ``read_launch`` check every field's type and raise
``RunFileError`` naming the file and the field, so one damaged (or forged) file makes one damaged
run, never an exception in the code that lists every run.

The shipped checkpoints' folder (``default_checkpoints_dir``) and its sample images (``images_in``) are found here
too: the notebook API, the commands and the pages all read them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import glob
import io
import json
import logging
import math
import os
import shutil
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger("vit.train")

ROOT = Path(__file__).resolve().parents[2]
APP_PACKAGE = "vit_explorer"  # where ``pip install`` puts app.py, app_pages/ and checkpoints/ (pyproject.toml)


def app_root() -> Path:
    """The folder of ``app.py``, ``app_pages/`` and ``checkpoints/``: the repository in a checkout, else the installed
    ``vit_explorer`` package data (after ``pip install``, ``ROOT`` is site-packages)."""
    if (ROOT / "app.py").is_file():
        return ROOT
    import importlib.util

    spec = importlib.util.find_spec(APP_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else ROOT

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
STEPS_FILE = "steps.jsonl"  # the training loss every few seconds, for live curves before an epoch ends
STATUS_FILE = "status.json"
LAST_CHECKPOINT = "last.pt"
BEST_CHECKPOINT = "best.pt"
LOG_FILE = "train.log"
EPOCH_CHECKPOINT_DIR = "checkpoints"
PROBE_DIR = "probe"  # the attention snapshots' probe images (vit.snapshots)
ATTENTION_DIR = "attention"  # one attention snapshot per epoch (vit.snapshots)
LAUNCH_DIR = ".launch"  # the manager's folder beside the run folders
LAUNCH_FILE = "launch.json"
OUTPUT_FILE = "output.log"
END_FILE = "end.json"  # beside launch.json: how the last launched process ended before it could write status.json
END_FILE_ENV = "VIT_RUN_END"  # its path, in the environment of a process the run manager launches
PHASE_FILE = "phase.json"  # beside launch.json: what the launched process does before its status.json exists
PHASE_FILE_ENV = "VIT_RUN_PHASE"  # its path, in the environment of a process the run manager launches
MAX_PHASE_CHARS = 120  # a phase is a few words; a longer one (not ours) is cut where it is read

STATES = ("running", "completed", "failed", "cancelled")  # status.json's state
HEARTBEAT_SECONDS = 5.0  # status.json is rewritten at least this often while running
STALE_SECONDS = 60.0  # a "running" status without a heartbeat for this long belongs to a dead (or hung) process


def default_runs_dir() -> Path:
    """The runs folder: $VIT_RUNS_DIR when set, else the repository's runs/ folder."""
    env = os.environ.get("VIT_RUNS_DIR")
    if env:
        return Path(env).expanduser()
    return ROOT / "runs"


SAMPLE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif")  # what counts as a sample image


# What the app opens on and vit.shipped() names: cifar-m trained on one H100, 487 s from launch to last epoch (85.24 %,
# checkpoints/README.md); cifar10-cifar-s.pt, trained on 2 CPU cores, ships beside it.
DEFAULT_CHECKPOINT = "cifar10-cifar-m-gpu.pt"


def default_checkpoints_dir() -> Path:
    """The shipped checkpoints: $VIT_CHECKPOINTS_DIR when set, else the repository's (or the installed
    package's) checkpoints/."""
    env = os.environ.get("VIT_CHECKPOINTS_DIR")
    if env:
        return Path(env).expanduser()
    return app_root() / "checkpoints"


def images_in(folder: Path) -> list[Path]:
    """The sample images directly in ``folder`` (files with a ``SAMPLE_EXTENSIONS`` suffix), sorted; [] without
    the folder."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in SAMPLE_EXTENSIONS)


def epoch_checkpoint_path(run_dir: Path, epoch: int) -> Path:
    """Where ``--save-every`` keeps the checkpoint of ``epoch``."""
    return Path(run_dir) / EPOCH_CHECKPOINT_DIR / f"epoch_{epoch:04d}.pt"


def epoch_checkpoints(run_dir: Path) -> dict[int, Path]:
    """{epoch: path} of a run's per-epoch checkpoints, in increasing epoch order."""
    folder = Path(run_dir) / EPOCH_CHECKPOINT_DIR
    if not folder.is_dir():
        return {}
    found = {}
    for path in folder.glob("epoch_*.pt"):
        number = path.stem[len("epoch_"):]
        if number.isdigit() and path.is_file():
            found[int(number)] = path
    return dict(sorted(found.items()))


def resume_hint(path: Path) -> str:
    """What a run's message on a failed save of ``path`` adds: where the run can go on from, its last.pt, only when
    one is on disk (a failed atomic save leaves the previous one whole); nothing when it has none yet, e.g. a first
    save failed."""
    run = path.parent.parent if path.parent.name == EPOCH_CHECKPOINT_DIR else path.parent
    if not (run / LAST_CHECKPOINT).is_file():
        return ""
    if path.name == LAST_CHECKPOINT and path.parent == run:
        return " (the run's previous last.pt is intact: it resumes from there)"
    return " (the run resumes from its last.pt)"


def epochs_to_prune(epochs: list[int], keep: int, best_epoch: int | None) -> list[int]:
    """The saved epochs ``--keep K`` deletes: all but the K most recent and ``best_epoch``; none when K is 0."""
    if keep <= 0:
        return []
    kept = set(sorted(epochs)[-keep:]) | ({best_epoch} if best_epoch is not None else set())
    return [e for e in sorted(epochs) if e not in kept]


# ---------------------------------------------------------------------------------------------
# Time stamps (status.json's start_time and updated_time)


def now_iso() -> str:
    """The current UTC time as status.json and config.json write it."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def iso(ts: float) -> str:
    """A POSIX time stamp in the same format as ``now_iso``."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds")


def timestamp(text: str | None) -> float | None:
    """The POSIX time of an ISO time stamp; None when missing or malformed."""
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def seconds_since(text: object) -> float | None:
    """Seconds from an ISO time stamp (UTC when it has no zone) until now; None when malformed."""
    try:
        then = dt.datetime.fromisoformat(str(text))
    except ValueError:
        return None
    if then.tzinfo is None:
        then = then.replace(tzinfo=dt.UTC)
    return (dt.datetime.now(dt.UTC) - then).total_seconds()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def still_running(status: dict | None) -> str | None:
    """Who runs the run whose status.json holds ``status`` ('pid P on HOST, heartbeat N s ago'), or None when it
    is not running: not "running", no heartbeat for STALE_SECONDS, or a pid of this host that is gone (a SIGKILL
    leaves "running" behind; the heartbeat alone would refuse a resume for a minute)."""
    if not status or status.get("state") != "running":
        return None
    age = seconds_since(status.get("updated_time"))
    if age is None or age > STALE_SECONDS:
        return None
    pid, host = status.get("pid"), status.get("host")
    if host == socket.gethostname() and isinstance(pid, int) and not isinstance(pid, bool) and not pid_alive(pid):
        return None
    return f"pid {pid} on {host}, heartbeat {age:.0f} s ago"


# ---------------------------------------------------------------------------------------------
# Writing


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temporary file beside ``path``, fsync, then rename over it."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """``atomic_write_text`` for bytes (safetensors, .npz): a reader sees the old file or the new one."""
    _sweep_once(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_files(files: Mapping[Path, bytes], gone: Iterable[Path] = ()) -> None:
    """Several files written as one set (a report's table, plot and JSON): each to its temporary file beside it,
    fsynced, and only once all are, renamed into place in ``files``' order, each of ``gone`` (a file of an earlier
    set this one has not) removed before the last rename. A kill while any is written leaves the earlier set whole;
    only one in the microseconds between the renames mixes two. The last file, whose new version says the set is
    complete, goes last."""
    temps = {}
    for folder in {path.parent for path in files}:
        _sweep_once(folder)
    try:
        for path, data in files.items():
            temps[path] = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            with open(temps[path], "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        *first, last = files
        for path in first:
            os.replace(temps.pop(path), path)
        for path in gone:
            path.unlink(missing_ok=True)
        os.replace(temps.pop(last), last)
    except BaseException:
        for temp in temps.values():
            temp.unlink(missing_ok=True)
        raise


def remove_dead_writers_temp_files(folder: Path, names: Iterable[str] | None = None,
                                   older_than: float = 0.0) -> list[Path]:
    """Delete the temporary files (``.NAME.PID.THREAD.tmp``) that the atomic writes of ``names`` (default: of any
    name) in ``folder`` left when their process was killed: those of a process no longer alive on this host (a live
    writer's file is about to be renamed into place), and last written more than ``older_than`` seconds ago.
    Returns what was removed."""
    removed, now = [], time.time()
    for pattern in [".*.tmp"] if names is None else [f".{glob.escape(name)}.*.tmp" for name in names]:
        with contextlib.suppress(OSError):
            for path in folder.glob(pattern):
                parts = path.name.removesuffix(".tmp").rsplit(".", 2)  # [".NAME", PID, THREAD]
                pid, thread = parts[1:] if len(parts) == 3 else ("", "")
                if not (pid.isdigit() and thread.isdigit()) or int(pid) == os.getpid() or pid_alive(int(pid)):
                    continue
                with contextlib.suppress(OSError):
                    if path.is_file() and not path.is_symlink() and now - path.stat().st_mtime >= older_than:
                        path.unlink()
                        removed.append(path)
    return removed


# A killed writer's temporary file is removed once it is this old: a writer on another host of a shared folder (a Ray
# worker) has a pid this host does not know, and its file, still being written, is newer (each write moves its mtime)
STRAY_SECONDS = 600
_SWEPT: dict[str, float] = {}  # folder -> when this process last removed the killed writers' files there
_SWEPT_LOCK = threading.Lock()


def _sweep_once(folder: Path) -> None:
    """The temporary files killed writers left in ``folder`` (``remove_dead_writers_temp_files``, older than
    ``STRAY_SECONDS``) removed at a write there, once per ``STRAY_SECONDS`` per folder: a write killed by SIGKILL
    leaves its ``.NAME.PID.THREAD.tmp`` beside the file, and listing the folder at every write would cost ~30 ms a
    write in a folder of 10,000 maps."""
    key, now = os.path.abspath(folder), time.monotonic()
    with _SWEPT_LOCK:
        if now - _SWEPT.get(key, -math.inf) < STRAY_SECONDS:
            return
        if len(_SWEPT) >= 4096:  # a long-lived server writing into many folders: held within bounds
            _SWEPT.clear()
        _SWEPT[key] = now
    if not Path(folder).is_symlink():  # a link out of where it writes: never delete where it points
        remove_dead_writers_temp_files(Path(folder), older_than=STRAY_SECONDS)


def atomic_write_with(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """``atomic_write_bytes`` of what ``write`` writes into a binary file object (``image.save(f, format="PNG")``,
    ``np.savez_compressed(f, ...)``, ``figure.savefig(f, format="png")``), rendered in memory first: an error or
    a kill while rendering or writing leaves the earlier file as it was. For files of bounded size;
    ``unnamed_until_done`` streams larger ones."""
    buffer = io.BytesIO()
    write(buffer)
    atomic_write_bytes(Path(path), buffer.getvalue())


@contextlib.contextmanager
def unnamed_until_done(path: Path) -> Iterator[BinaryIO]:
    """A file to write that takes the name ``path`` only once the block ends without an error, for files too large
    to hold in memory (a 1.5 GB ``.npz``). On Linux it has no name until then (``O_TMPFILE``), so no kill, SIGKILL
    included, leaves part of it behind; elsewhere it is ``NAME.part``, removed on an error or Ctrl-C."""
    try:
        fd = os.open(path.parent, os.O_TMPFILE | os.O_RDWR, 0o666)
    except (AttributeError, OSError):  # no O_TMPFILE here (macOS), or a file system without it
        part = path.with_name(path.name + ".part")
        try:
            with open(part, "wb") as f:
                yield f
            os.replace(part, path)
        finally:
            part.unlink(missing_ok=True)
        return
    with os.fdopen(fd, "w+b") as f:
        yield f
        f.flush()
        _sweep_once(path.parent)
        temp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:  # linkat(AT_SYMLINK_FOLLOW) through /proc names the file; link() cannot (EXDEV), hence dst_dir_fd
            folder = os.open(path.parent, os.O_DIRECTORY)
            try:
                os.link(f"/proc/self/fd/{fd}", temp.name, dst_dir_fd=folder)
            finally:
                os.close(folder)
        except OSError:  # /proc not mounted: copy it out (a named temporary file for that long only)
            f.seek(0)
            with open(temp, "wb") as named:
                shutil.copyfileobj(f, named)
        try:
            os.replace(temp, path)
        finally:
            temp.unlink(missing_ok=True)


def remove_stray_temp_files(run_dir: Path) -> list[Path]:
    """Delete the ``.NAME.*.tmp`` files an atomic write leaves when its process is killed mid-write.

    Call it only when no process writes to ``run_dir`` (a run being started or resumed, a finished
    run): a live writer's temporary file is about to be renamed into place.
    """
    removed = []
    for folder in (run_dir, *(run_dir / sub for sub in (EPOCH_CHECKPOINT_DIR, PROBE_DIR, ATTENTION_DIR))):
        if folder.is_symlink():  # a link out of the runs folder: never delete where it points
            continue
        with contextlib.suppress(OSError):
            for path in folder.glob(".*.tmp"):
                with contextlib.suppress(OSError):
                    if path.is_file() and not path.is_symlink():
                        path.unlink()
                        removed.append(path)
    return removed


def write_json(path: Path, value: dict) -> None:
    """Atomic: a reader sees the old file or the new one, never half of one."""
    atomic_write_text(path, json.dumps(value, indent=2) + "\n")


def write_metrics(path: Path, rows: list[dict]) -> None:
    """metrics.jsonl: one JSON object per line, the whole file replaced atomically."""
    atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in rows))


MAX_RUN_FILE_BYTES = 64 * 2**20  # metrics.jsonl of 1,000 epochs is ~1 MB; config and status are a few kB
MAX_JSON_DEPTH = 32  # our run files nest 4 deep; deeper is not ours, and deep nesting breaks whoever walks it


def parse_json(text: str) -> object:
    """``json.loads`` with bounds, the one parser every run-file reader goes through: ValueError past
    ``MAX_RUN_FILE_BYTES`` or ``MAX_JSON_DEPTH`` (200 kB of nested lists raised RecursionError in the page)."""
    if len(text) > MAX_RUN_FILE_BYTES:
        raise ValueError(f"larger than {MAX_RUN_FILE_BYTES // 2**20} MiB")
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    stack = [(value, 1)]
    while stack:  # iterative: the check itself must not recurse
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return value


def read_text_bounded(path: Path, limit: int = MAX_RUN_FILE_BYTES) -> str:
    """A run file's text; ValueError past ``limit`` bytes (checked before reading), OSError as open() raises."""
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size > limit:
            raise ValueError(f"{path.name} is larger than {limit // 2**20} MiB")
        return file.read(limit + 1).decode("utf-8")


def lies_inside(path: str | os.PathLike, folder: str | os.PathLike) -> bool:
    """Whether ``path`` is ``folder`` or lies inside it once links are resolved: a link from inside the folder to
    a file elsewhere does not lie inside it."""
    real, root = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    return real == root or root in real.parents


class NotARegularFile(OSError):
    """A path that is a FIFO, a device, a socket or a folder where a file is read (``open_regular``)."""


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """``path`` opened for reading in binary, links followed, only if it is a regular file: ``NotARegularFile``
    (one line) for anything else, OSError where it cannot be opened. Checked before the open and again on what was
    opened, which is opened without blocking (``O_NONBLOCK``): a FIFO put in its place meanwhile is refused, never
    waited on, nor is /dev/zero read for ever."""
    import stat

    name = os.fspath(path)
    if not stat.S_ISREG(os.stat(name).st_mode):
        raise NotARegularFile(f"{name} is not a regular file (a FIFO, a device or a folder); give a file")
    fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotARegularFile(f"{name} is not a regular file (a FIFO, a device or a folder); give a file")
        if hasattr(os, "set_blocking"):  # reads of a regular file as any other code expects them
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def record_resume(config_file: Path, args: dict, resume: dict) -> None:
    """config.json keeps the run's arguments current (``args`` updates them) and lists every resume."""
    record = parse_json(read_text_bounded(config_file))
    record["args"].update(args)
    record.setdefault("resumes", []).append(resume)
    write_json(config_file, record)


def append_traceback(run_dir: Path) -> None:
    """Append the exception being handled to the run's train.log."""
    with open(run_dir / LOG_FILE, "a") as f:
        f.write(traceback.format_exc())


class Status:
    """``status.json``, rewritten atomically on every change and by a heartbeat thread."""

    def __init__(self, path: Path, initial: dict) -> None:
        self.path, self.values = path, dict(initial)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="status-heartbeat", daemon=True)
        self.failed_beats = 0

    def update(self, **values) -> None:
        """Change ``values``, stamp updated_time and rewrite the file."""
        with self.lock:
            self.values.update(values)
            self.values["updated_time"] = now_iso()
            write_json(self.path, self.values)

    def _beat(self) -> None:
        while not self.stop.wait(HEARTBEAT_SECONDS):
            try:
                self.update()
            except OSError as e:  # a full disk must not end the heartbeat for good
                self.failed_beats += 1
                if self.failed_beats == 1:
                    log.warning("cannot update %s (%s); will keep trying", self.path, e)

    def start(self) -> None:
        """Write the file, then rewrite it every HEARTBEAT_SECONDS until ``close``."""
        self.update()
        self.thread.start()

    def close(self) -> None:
        """Stop the heartbeat (the file stays as last written)."""
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()


# ---------------------------------------------------------------------------------------------
# Reading


class RunFileError(ValueError):
    """A run file that is there but damaged: not a JSON object, or a field of the wrong type."""


_NUMBER = (int, float)
# Field -> accepted type(s); None is accepted for every field, a missing field is None.
STATUS_FIELDS: dict[str, type | tuple[type, ...]] = {
    "state": str, "epoch": int, "step": int, "total_epochs": int, "total_steps": int, "progress": _NUMBER,
    "pid": int, "host": str, "start_time": str, "updated_time": str, "eta_seconds": _NUMBER,
    "elapsed_seconds": _NUMBER, "best_val_acc": _NUMBER, "device": str, "world_size": int, "error": str,
    "phase": str}
CONFIG_FIELDS: dict[str, type | tuple[type, ...]] = {
    "args": dict, "model": dict, "parameters": int, "dataset": dict, "world_size": int, "device": str,
    "created": str, "command": list, "resumes": list}
# The run arguments the manager and the table read (config.json's args, launch.json's params).
ARGS_FIELDS: dict[str, type | tuple[type, ...]] = {
    "dataset": str, "preset": str, "recipe": str, "epochs": int, "batch_size": int, "lr": _NUMBER,
    "weight_decay": _NUMBER, "device": str}
LAUNCH_FIELDS: dict[str, type | tuple[type, ...]] = {
    "name": str, "params": dict, "devices": list, "allow_sharing": bool, "state": str, "queued_at": _NUMBER,
    "queue_reason": str, "resume": bool, "resume_epochs": int, "stop_requested_at": _NUMBER, "start_error": str,
    "sessions": list, "kind": str}
SESSION_FIELDS: dict[str, type | tuple[type, ...]] = {
    "pid": int, "pgid": int, "command": list, "env": dict, "devices": list, "started_at": _NUMBER, "host": str,
    "boot_id": str, "proc_start": int, "resume": bool, "log_offset": int, "seconds": _NUMBER,
    "killed_at": _NUMBER, "secret_hash": str}
LAUNCH_STATES = ("queued", "started", "cancelled", "error")  # launch.json's state


_TYPE_NAMES = {int: "a whole number", float: "a number", str: "text", dict: "an object", list: "a list",
               bool: "true or false"}


def _type_name(types: type | tuple[type, ...]) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return _TYPE_NAMES[float] if float in types else _TYPE_NAMES[types[0]]


def check_fields(values: dict, fields: dict[str, type | tuple[type, ...]], where: str,
                 required: tuple[str, ...] = ()) -> dict:
    """``values`` when each field in ``fields`` is absent, None or of its type; else RunFileError naming it.

    ``True`` is not an integer here (JSON's booleans are not counts), and numbers must be finite.
    """
    for key in required:
        if values.get(key) is None:
            raise RunFileError(f"{where} lacks {key!r}")
    for key, types in fields.items():
        value = values.get(key)
        if value is None:
            continue
        wanted = types if isinstance(types, tuple) else (types,)
        ok = isinstance(value, wanted) and not (isinstance(value, bool) and bool not in wanted)
        if ok and isinstance(value, float) and not math.isfinite(value):
            ok = False
        if not ok:
            shown = json.dumps(value)[:40] if not isinstance(value, (dict, list)) else type(value).__name__
            raise RunFileError(f"{where}: {key!r} is {shown}, not {_type_name(types)}")
    return values


def _read_object(path: Path) -> dict | None:
    try:
        text = read_text_bounded(path)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise RunFileError(f"{path.name} cannot be read ({getattr(e, 'strerror', None) or type(e).__name__})") \
            from None
    except ValueError as e:
        raise RunFileError(str(e)) from None
    try:
        value = parse_json(text)
    except ValueError as e:
        raise RunFileError(f"{path.name} is not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise RunFileError(f"{path.name} holds a JSON {type(value).__name__}, not an object")
    return value


def read_status(path: Path) -> dict | None:
    """status.json with every field checked; None when missing, RunFileError when damaged."""
    status = _read_object(path)
    if status is None:
        return None
    check_fields(status, STATUS_FIELDS, path.name, required=("state",))
    if status["state"] not in STATES:
        raise RunFileError(f"{path.name}: state {status['state'][:40]!r} is not one of {', '.join(STATES)}")
    return status


def read_config(path: Path) -> dict | None:
    """config.json with its fields and the run arguments the manager reads checked; None when missing."""
    config = _read_object(path)
    if config is None:
        return None
    check_fields(config, CONFIG_FIELDS, path.name)
    check_fields(config.get("args") or {}, ARGS_FIELDS, f"{path.name} args")
    return config


def read_launch(path: Path) -> dict | None:
    """The manager's launch.json with every field and session checked; None when missing."""
    record = _read_object(path)
    if record is None:
        return None
    check_fields(record, LAUNCH_FIELDS, path.name, required=("name", "params", "devices", "state", "queued_at",
                                                              "sessions"))
    check_fields(record["params"], ARGS_FIELDS, f"{path.name} params")
    if record["state"] not in LAUNCH_STATES:
        raise RunFileError(f"{path.name}: state {record['state'][:40]!r} is not one of {', '.join(LAUNCH_STATES)}")
    if not record["devices"] or not all(isinstance(d, str) for d in record["devices"]):
        raise RunFileError(f"{path.name}: devices must be a list of device names")
    for i, session in enumerate(record["sessions"]):
        if not isinstance(session, dict):
            raise RunFileError(f"{path.name}: session {i + 1} is not an object")
        check_fields(session, SESSION_FIELDS, f"{path.name} session {i + 1}", required=("pid", "started_at"))
    if record["state"] == "started" and not record["sessions"]:
        raise RunFileError(f"{path.name}: a started run without a session")
    return record


def read_json(path: Path) -> dict | None:
    """A JSON object file; None when missing, unreadable or not an object."""
    try:
        value = parse_json(read_text_bounded(path))
    except (OSError, ValueError):  # missing, caught mid-write on a non-atomic filesystem, or not ours (too big, deep)
        return None
    return value if isinstance(value, dict) else None


def read_metrics(path: Path) -> list[dict]:
    """metrics.jsonl's rows (one per finished epoch); lines that are not JSON objects and a missing file give none."""
    rows = []
    with contextlib.suppress(OSError, ValueError):  # UnicodeDecodeError and a file past the bound are ValueErrors
        for line in read_text_bounded(path).splitlines():
            with contextlib.suppress(ValueError):
                row = parse_json(line)
                if isinstance(row, dict):
                    rows.append(row)
    return rows


def read_tail(path: Path, lines: int = 40, offset: int = 0, max_bytes: int = 64_000) -> str:
    """The last ``lines`` lines of a log file, reading at most its last ``max_bytes`` after ``offset``."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(offset, size - max_bytes)
            f.seek(start)
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def record_run_end(error: str, exit_code: int) -> None:
    """For a process the run manager launched (``VIT_RUN_END`` names the file), the one-line error it ends with
    before its run folder holds a status.json (a usage error): the manager reads the run's end from this record,
    never from the tail of the process's output, where any library may print after it."""
    path = os.environ.get(END_FILE_ENV)
    if not path:
        return
    with contextlib.suppress(OSError):  # the error is printed anyway; the page then says the process is gone
        write_json(Path(path), {"pid": os.getpid(), "exit_code": exit_code, "error": error})


def speaks_for_the_run() -> bool:
    """Whether this process speaks for its run: rank 0 under torchrun (``RANK``), or a run of one process."""
    return int(os.environ.get("RANK", "0")) == 0


def record_run_phase(phase: str) -> None:
    """For a process the run manager launched (``VIT_RUN_PHASE`` names the file), what it does now, before its run
    folder holds a status.json ("reading the data", "building the model"): the page says it instead of a bare
    "starting" that lasted up to 48 s. Afterwards status.json's ``phase`` says it."""
    path = os.environ.get(PHASE_FILE_ENV)
    if not path or not speaks_for_the_run():
        return
    with contextlib.suppress(OSError):  # a phase not said is no reason to stop the run
        write_json(Path(path), {"pid": os.getpid(), "phase": phase, "time": now_iso()})


def read_run_phase(path: Path) -> str | None:
    """The phase a launched process last recorded in ``path`` (``record_run_phase``), or None (none, or not ours)."""
    phase = (read_json(path) or {}).get("phase")
    return phase[:MAX_PHASE_CHARS] if isinstance(phase, str) and phase.strip() else None
