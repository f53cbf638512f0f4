"""The runs folder's files: their names, atomic writes, readers and the status heartbeat.

One run folder per training run, written by the training CLI (``vit.train``) and read by the
run manager (``vit.runs``), the checkpoint catalog (``vit.catalog``) and the training page::

    runs/NAME/config.json      every argument, the model config, the dataset and its class names
    runs/NAME/metrics.jsonl    one line per finished epoch
    runs/NAME/status.json      state and a heartbeat (rewritten every HEARTBEAT_SECONDS while running)
    runs/NAME/last.pt          the latest weights with everything needed to resume
    runs/NAME/best.pt          the weights with the best validation accuracy so far
    runs/NAME/train.log        the log, with the traceback when training failed
    runs/.launch/NAME/         the manager's launch.json and output.log (see ``vit.runs``)

Every JSON and JSONL file is replaced atomically (train.log is appended to), so a reader sees
the old file or the new one, never half of one, and a SIGKILL leaves every file readable.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import threading
import traceback
from pathlib import Path

log = logging.getLogger("vit.train")

ROOT = Path(__file__).resolve().parent.parent

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
STATUS_FILE = "status.json"
LAST_CHECKPOINT = "last.pt"
BEST_CHECKPOINT = "best.pt"
LOG_FILE = "train.log"
LAUNCH_DIR = ".launch"  # the manager's folder beside the run folders
LAUNCH_FILE = "launch.json"
OUTPUT_FILE = "output.log"

STATES = ("running", "completed", "failed", "cancelled")  # status.json's state
HEARTBEAT_SECONDS = 5.0  # status.json is rewritten at least this often while running
STALE_SECONDS = 60.0  # a "running" status without a heartbeat for this long belongs to a dead (or hung) process


def default_runs_dir() -> Path:
    """The runs folder: $VIT_RUNS_DIR when set, else the repository's runs/ folder."""
    env = os.environ.get("VIT_RUNS_DIR")
    if env:
        return Path(env).expanduser()
    return ROOT / "runs"


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


# ---------------------------------------------------------------------------------------------
# Writing


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temporary file beside ``path``, fsync, then rename over it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: Path, value: dict) -> None:
    """Atomic: a reader sees the old file or the new one, never half of one."""
    atomic_write_text(path, json.dumps(value, indent=2) + "\n")


def write_metrics(path: Path, rows: list[dict]) -> None:
    """metrics.jsonl: one JSON object per line, the whole file replaced atomically."""
    atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in rows))


def record_resume(config_file: Path, args: dict, resume: dict) -> None:
    """config.json keeps the run's arguments current (``args`` updates them) and lists every resume."""
    record = json.loads(config_file.read_text())
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


def read_json(path: Path) -> dict | None:
    """A JSON object file; None when missing, unreadable or not an object."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):  # missing, or caught mid-write on a non-atomic filesystem
        return None
    return value if isinstance(value, dict) else None


def read_metrics(path: Path) -> list[dict]:
    """metrics.jsonl's rows (one per finished epoch); unreadable lines and a missing file give none."""
    rows = []
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                rows.append(json.loads(line))
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
