"""Training runs on disk: launch, status, stop, resume and delete, for the app's training page.

The truth lives in the runs folder; nothing here keeps state in memory, so every tab, reload
and server restart sees the same runs. The layout::

    runs/NAME/                 the training CLI's run folder (its --out), written only by the CLI
    runs/.launch/NAME/         ours: launch.json (request, queue state, one entry per process
                               started) and output.log (the processes' stdout and stderr)
    runs/.launch/.lock         serialises launches, stops and queue dispatch between tabs

Our files live beside the run folder rather than in it because the CLI refuses an --out
folder that already holds files, and output.log must be open before the process starts.
Run folders made by the CLI outside the app (no launch.json) are listed too.

States: ``queued`` (waiting for its device, persisted in launch.json), ``running``,
``completed``, ``failed`` (status.json's error, or the CLI's one-line usage error when it
exited before writing status.json), ``cancelled`` (stopped by the user) and ``crashed`` (the
process is gone, or its heartbeat is stale, without a final state: SIGKILL, OOM, reboot).

Devices: a run asks for ``cpu``, one GPU ``cuda:N`` or several GPUs (started under torchrun).
A run whose device is used by another running run of this runs folder, or wanted by an earlier
queued one, is queued unless sharing is allowed; this holds for the CPU too, because two
trainings on a two-core machine only slow each other down. Queued runs start when the manager
is polled (``RunManager.poll``; the training page polls every few seconds) and their devices are
free: with no page open nothing starts them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAUNCH_DIR = ".launch"
STATES = ("queued", "running", "completed", "failed", "cancelled", "crashed")
ACTIVE_STATES = ("queued", "running")
STALE_SECONDS = 60.0  # the CLI beats every 5 s; a minute of silence means it is gone or hung
STOP_GRACE_SECONDS = 30.0  # the CLI finishes its step and saves last.pt; a step is far shorter
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")

# Figures the seed reproduces with a preset; shown next to it in the form.
PRESET_FIGURES = {
    "tintn-cifar10": "75.5 % CIFAR-10 (seed blog)",
    "cifar10-p8": "~69 % CIFAR-10 (seed notebook)",
    "mnist-p7": "98.5 % MNIST (seed)",
}


def default_runs_dir() -> Path:
    """The runs folder: $VIT_RUNS_DIR when set, else the repository's runs/ folder."""
    env = os.environ.get("VIT_RUNS_DIR")
    if env:
        return Path(env).expanduser()
    return ROOT / "runs"


def default_data_dir() -> Path:
    """Where built-in datasets and decoded caches live: $VIT_DATA_DIR when set, else the repository's data/."""
    env = os.environ.get("VIT_DATA_DIR")
    if env:
        return Path(env).expanduser()
    return ROOT / "data"


class RunError(ValueError):
    """An operation a run's state does not allow (stop a finished run, delete a running one, ...)."""


class ValidationError(ValueError):
    """Launch parameters that the CLI would refuse; ``errors`` maps each bad field to its message."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


# ---------------------------------------------------------------------------------------------
# Launch parameters


@dataclass
class RunParams:
    """What the form asks for. ``None`` leaves a field to the preset or the --recipe."""

    name: str
    dataset: str  # cifar10, cifar100, mnist, fashion-mnist or folder:PATH (relative to the repository)
    preset: str = "tintn-cifar10"
    image_size: int | None = None
    patch_size: int | None = None
    hidden_size: int | None = None
    num_layers: int | None = None
    num_heads: int | None = None
    mlp_size: int | None = None
    recipe: str = "ours"
    epochs: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    weight_decay: float | None = None
    warmup_epochs: float | None = None
    label_smoothing: float | None = None
    augment: str | None = None
    aug_magnitude: int | None = None
    ema: float | None = None
    seed: int = 0
    devices: tuple[str, ...] = ("cpu",)  # ("cpu",), ("cuda:N",) or several GPUs for torchrun


# RunParams fields passed to the CLI as --field-name VALUE.
CLI_FIELDS = ("preset", "image_size", "patch_size", "hidden_size", "num_layers", "num_heads", "mlp_size",
              "recipe", "epochs", "batch_size", "lr", "weight_decay", "warmup_epochs", "label_smoothing",
              "augment", "aug_magnitude", "ema", "seed")
MODEL_SIZE_FIELDS = ("image_size", "patch_size", "hidden_size", "num_layers", "num_heads", "mlp_size")
CROSS_FIELDS = (*MODEL_SIZE_FIELDS, "warmup_epochs")  # fields whose validity depends on others


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def resolve_dataset(spec: str) -> str:
    """``folder:`` paths made absolute (relative ones are relative to the repository)."""
    spec = spec.strip()
    if spec.startswith("folder:") and len(spec) > len("folder:"):
        path = Path(spec[len("folder:"):]).expanduser()
        if not path.is_absolute():
            path = ROOT / path
        return f"folder:{path}"
    return spec


def cli_args(params: RunParams, out: Path, data_dir: Path) -> list[str]:
    """The ``vit.train`` arguments of a new run (device arguments excluded)."""
    argv = ["--dataset", resolve_dataset(params.dataset), "--out", str(out), "--data-dir", str(data_dir)]
    for name in CLI_FIELDS:
        value = getattr(params, name)
        if value is not None:
            argv += [_flag(name), str(value)]
    return argv


def device_argument(devices: tuple[str, ...]) -> str:
    """The CLI's --device: cpu, cuda:N, or cuda when torchrun gives each rank its GPU."""
    return devices[0] if len(devices) == 1 else "cuda"


def launch_command(argv: list[str], devices: tuple[str, ...], nice: int = 0) -> tuple[list[str], dict[str, str]]:
    """(command, extra environment) starting ``vit.train argv``: torchrun for several GPUs."""
    prefix = ["nice", "-n", str(nice)] if nice > 0 and shutil.which("nice") else []
    argv = [*argv, "--device", device_argument(devices)]
    if len(devices) == 1:
        return [*prefix, sys.executable, "-m", "vit.train", *argv], {}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    indices = [int(d.split(":")[1]) for d in devices]
    if visible:  # our indices count the GPUs this process sees; map them back to the machine's
        physical = [v.strip() for v in visible.split(",")]
        ids = [physical[i] for i in indices]
    else:
        ids = [str(i) for i in indices]
    command = [*prefix, sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={len(devices)}", "-m", "vit.train", *argv]
    return command, {"CUDA_VISIBLE_DEVICES": ",".join(ids)}


def _usage_message(text: str) -> tuple[str | None, str]:
    """(field, message) for one of the CLI's UsageError texts; field None when none is named."""
    match = re.match(r"argument (--[a-z-]+): (.*)", text)
    if match:
        return _field_of_flag(match.group(1)), match.group(2)
    match = re.search(r"ViTConfig\.([a-z_]+)", text)
    if match:
        return match.group(1), text
    match = re.search(r"--[a-z-]+", text)
    if match:
        return _field_of_flag(match.group(0)), text
    return None, text


def _field_of_flag(flag: str) -> str | None:
    name = flag[2:].replace("-", "_")
    return {"out": "name", "device": "devices"}.get(name, name)


def validate_params(params: RunParams, runs_dir: Path, data_dir: Path,
                    gpu_count: int | None = None) -> dict[str, str]:
    """Every problem the CLI would report for ``params``, as {field: message}; empty when fine.

    Each field is checked alone through ``vit.train.parse_args`` (the CLI's own rules and
    messages), then all together for rules that span fields (warmup below epochs, patch size
    dividing image size, ...), plus what only we know: the run name and the devices.
    """
    from vit.data import DataError, check_dataset
    from vit.train import UsageError, parse_args

    errors: dict[str, str] = {}
    name = (params.name or "").strip()
    if not name:
        errors["name"] = "give the run a name"
    elif not NAME_PATTERN.match(name):
        errors["name"] = "use letters, digits, '.', '_' and '-' only, starting with a letter or digit (at most 100)"
    elif (runs_dir / name).exists() or (runs_dir / LAUNCH_DIR / name).exists():
        errors["name"] = f"a run named {name!r} already exists; choose another name"

    dataset = resolve_dataset(params.dataset or "")
    if not dataset:
        errors["dataset"] = "choose a dataset"
    else:
        try:
            check_dataset(dataset, data_dir)
        except DataError as e:
            errors["dataset"] = str(e)

    device_error = _device_problem(tuple(params.devices), gpu_count)
    if device_error:
        errors["devices"] = device_error

    out = str(runs_dir / LAUNCH_DIR / ".validate-nonexistent")  # parse_args only checks it is empty
    base = ["--dataset", "cifar10", "--out", out, "--device", "cpu"]
    for name_ in CLI_FIELDS:
        value = getattr(params, name_)
        if value is None:
            continue
        try:
            parse_args([*base, _flag(name_), str(value)])
        except UsageError as e:
            if name_ in CROSS_FIELDS and not str(e).startswith("argument "):
                continue  # e.g. patch size vs image size: judged below with all fields together
            errors[name_] = _usage_message(str(e))[1]
    if errors:
        return errors
    try:
        argv = cli_args(params, Path(out), data_dir)
        parse_args([*argv, "--device", "cpu"])
    except UsageError as e:
        field_, message = _usage_message(str(e))
        if field_ is None and "preset" in str(e):
            field_ = "preset"
        errors[field_ if field_ in {f.name for f in fields(RunParams)} else "form"] = message
    return errors


def _device_problem(devices: tuple[str, ...], gpu_count: int | None) -> str | None:
    if not devices:
        return "choose a device"
    if len(set(devices)) != len(devices):
        return "a device is listed twice"
    if devices == ("cpu",):
        return None
    if "cpu" in devices:
        return "train on the CPU or on GPUs, not both"
    if gpu_count is None:
        gpu_count = _gpu_count()
    for device in devices:
        match = re.fullmatch(r"cuda:(\d+)", device)
        if not match:
            return f"{device!r} is not a device; use cpu or cuda:N"
        if int(match.group(1)) >= gpu_count:
            if gpu_count == 0:
                return "this machine has no CUDA GPU; train on the CPU"
            return f"{device} does not exist; this machine has {gpu_count} GPU(s), cuda:0 to cuda:{gpu_count - 1}"
    return None


def preset_summary(name: str) -> str:
    """'tintn-cifar10 · 0.12 M parameters · reproduces 75.5 % CIFAR-10 (seed blog)'."""
    parts = [name, f"{preset_parameters(name) / 1e6:.2f} M parameters"]
    if name in PRESET_FIGURES:
        parts.append(f"reproduces {PRESET_FIGURES[name]}")
    return " · ".join(parts)


def preset_parameters(name: str) -> int:
    """Parameter count of a preset as defined (its own classes and channels), built on the meta device."""
    import torch

    from vit.model import PRESETS, ViT, count_parameters

    with torch.device("meta"):  # no memory, even for vit-huge-14
        return count_parameters(ViT(PRESETS[name]))


def suggest_name(dataset: str, preset: str, now: float | None = None) -> str:
    """A fresh run name such as 'cifar10-tintn-cifar10-20261120-2251'."""
    short = dataset.rstrip("/").split("/")[-1].removeprefix("folder:") or "run"
    stamp = dt.datetime.fromtimestamp(now if now is not None else time.time()).strftime("%Y%m%d-%H%M%S")
    return re.sub(r"[^A-Za-z0-9._-]", "-", f"{short}-{preset}-{stamp}")


# ---------------------------------------------------------------------------------------------
# Devices


@dataclass(frozen=True)
class DeviceInfo:
    key: str  # "cpu" or "cuda:N"
    name: str
    total_bytes: int | None = None  # GPUs only
    free_bytes: int | None = None

    @property
    def label(self) -> str:
        if self.total_bytes is None:
            return f"CPU ({self.name})"
        used = (self.total_bytes - (self.free_bytes or 0)) / 2**30
        return f"GPU {self.key.split(':')[1]} · {self.name} · {used:.1f} of {self.total_bytes / 2**30:.0f} GiB in use"


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def list_devices() -> list[DeviceInfo]:
    """Every CUDA GPU with its name and memory (total, free right now), then the CPU."""
    import torch

    found = []
    for i in range(_gpu_count()):
        props = torch.cuda.get_device_properties(i)
        free, total = torch.cuda.mem_get_info(i)
        found.append(DeviceInfo(f"cuda:{i}", props.name, total, free))
    import platform

    found.append(DeviceInfo("cpu", f"{os.cpu_count()} cores, {platform.machine()}"))
    return found


def device_choices(devices: list[DeviceInfo], users: dict[str, list[str]] | None = None
                   ) -> list[tuple[tuple[str, ...], str]]:
    """The form's device options as (devices, label): each GPU, all GPUs under torchrun, the CPU.

    ``users`` ({device: running run names}, see ``RunManager.device_users``) adds who uses each.
    """
    users = users or {}

    def label(device: DeviceInfo, text: str) -> str:
        names = users.get(device.key)
        return f"{text} · used by {', '.join(names)}" if names else text

    gpus = [d for d in devices if d.key != "cpu"]
    choices = [((d.key,), label(d, d.label)) for d in gpus]
    if len(gpus) > 1:
        choices.append((tuple(d.key for d in gpus), f"All {len(gpus)} GPUs (torchrun, one process per GPU)"))
    cpu = next((d for d in devices if d.key == "cpu"), DeviceInfo("cpu", "CPU"))
    choices.append((("cpu",), label(cpu, cpu.label if gpus else f"{cpu.label}: no CUDA GPU on this machine")))
    return choices


def _overlap(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Whether two device requests share a device; 'cuda:*' (a run of unknown GPUs) meets every GPU."""
    return any(x == y or ("cuda:*" in (x, y) and x.startswith("cuda") and y.startswith("cuda")) for x in a for y in b)


# ---------------------------------------------------------------------------------------------
# Files and processes


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):  # missing, or caught mid-write on a non-atomic filesystem
        return None
    return value if isinstance(value, dict) else None


def _write_json(path: Path, value: dict) -> None:
    """Atomic: a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w") as f:
        json.dump(value, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _timestamp(iso: str | None) -> float | None:
    if not iso:
        return None
    try:
        return dt.datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return None


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds")


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _proc_start(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) of a process, from /proc; None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return rest[0], int(rest[19])


# The launched processes of this server, so that they are reaped (a zombie looks alive) and
# their exit codes known. Only a cache: after a restart the processes are found through /proc.
_children: dict[int, subprocess.Popen] = {}


def _process_alive(session: dict) -> tuple[bool | None, int | None]:
    """(alive, exit code if we saw it) of a session's process; alive None when it ran on another host."""
    pid = session.get("pid")
    if not pid:
        return False, None
    if session.get("host") != socket.gethostname():
        return None, None
    if session.get("boot_id") and session["boot_id"] != _boot_id():
        return False, None  # rebooted since
    child = _children.get(pid)
    if child is not None:
        code = child.poll()
        if code is not None:
            return False, code
        return True, None
    with contextlib.suppress(ChildProcessError, OSError):
        done, status = os.waitpid(pid, os.WNOHANG)  # ours from before a module reload
        if done == pid:
            return False, os.waitstatus_to_exitcode(status)
    info = _proc_start(pid)
    if info is None:
        if sys.platform.startswith("linux"):
            return False, None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False, None
        except PermissionError:
            pass
        return True, None
    state, started = info
    if state in ("Z", "X") or (session.get("proc_start") is not None and started != session["proc_start"]):
        return False, None  # a zombie, or the pid now belongs to another process
    return True, None


def _tail(path: Path, lines: int = 40, offset: int = 0, max_bytes: int = 64_000) -> str:
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


def _usage_line(output: str) -> str | None:
    """The CLI's one-line error ('vit.train: error: ...') in a process's output, without the prefix."""
    for line in reversed(output.splitlines()):
        if line.startswith("vit.train: error: "):
            return line[len("vit.train: error: "):]
    return None


# ---------------------------------------------------------------------------------------------
# Reconciling what the files say with what the processes do


def reconcile(record: dict | None, status: dict | None, alive: bool | None, exit_code: int | None,
              output: str, now: float, stale_seconds: float = STALE_SECONDS) -> tuple[str, str | None]:
    """(state, detail) of a run from its launch record, its status.json and its process.

    ``alive`` is whether the last started process runs (None: unknown, on another host);
    ``output`` the tail of that process's output. ``detail`` is the error of a failed run or
    the reason for a crashed, cancelled or queued one.
    """
    updated = _timestamp(status.get("updated_time")) if status else None
    stale = updated is None or now - updated > stale_seconds
    if record is None:  # a run the CLI was started for outside the app
        if status is None:
            return "crashed", "no status.json: the run never started training"
        state = status.get("state")
        if state == "failed":
            return "failed", status.get("error")
        if state in ("completed", "cancelled"):
            return state, None
        if alive is False:
            return "crashed", f"process {status.get('pid')} is gone without a final state"
        if stale:
            return "crashed", f"no heartbeat for {now - (updated or now):.0f} s"
        return "running", None

    if record.get("state") == "queued":
        return "queued", record.get("queue_reason")
    if record.get("state") == "cancelled":
        return "cancelled", "cancelled while queued"
    if record.get("state") == "error":
        return "failed", record.get("start_error")
    session = record["sessions"][-1]
    started = session["started_at"]
    # status.json may still be the previous session's (a resume rewrites it once training starts).
    current = status is not None and (status.get("pid") == session.get("pid") or
                                      (updated is not None and updated >= started))
    stop_requested = record.get("stop_requested_at") is not None
    if current:
        state = status.get("state")
        if state == "failed":
            return "failed", status.get("error") or "failed without a message; see the log"
        if state in ("completed", "cancelled"):
            return state, None
        if alive is False:
            if stop_requested:
                return "cancelled", "killed after the stop grace period; resumes from the last saved epoch"
            return "crashed", _gone(exit_code, output)
        if stale:
            return "crashed", f"no heartbeat for {now - updated:.0f} s"
        return "running", None
    if alive is True or (alive is None and now - started < stale_seconds):
        return "running", "starting"
    usage = _usage_line(output)
    if usage is not None:
        return "failed", usage
    if stop_requested:
        return "cancelled", "stopped before training started"
    return "crashed", _gone(exit_code, output)


def _gone(exit_code: int | None, output: str) -> str:
    if exit_code is not None and exit_code < 0:
        reason = f"killed by {signal.Signals(-exit_code).name}" if -exit_code in signal.valid_signals() \
            else f"killed by signal {-exit_code}"
    elif exit_code is not None:
        reason = f"exited with code {exit_code}"
    else:
        reason = "the process is gone"
    last = next((line for line in reversed(output.splitlines()) if line.strip()), None)
    return f"{reason} without a final state" + (f"; last output: {last.strip()}" if last else "")


# ---------------------------------------------------------------------------------------------
# What the page shows


@dataclass
class RunInfo:
    """One run as the page shows it: its reconciled state and its numbers."""

    name: str
    state: str
    detail: str | None  # the error of a failed run, the reason for a crashed/queued/cancelled one
    run_dir: Path
    devices: tuple[str, ...]
    epoch: int = 0
    total_epochs: int | None = None
    progress: float = 0.0  # [0, 1]
    best_val_acc: float | None = None
    eta_seconds: float | None = None
    elapsed_seconds: float | None = None
    started_at: float | None = None  # first start (or queueing), seconds since the epoch
    pid: int | None = None
    managed: bool = True  # launched through this module (it has a launch.json)
    settings: dict = field(default_factory=dict)  # the CLI arguments (resolved once config.json exists)

    @property
    def best_checkpoint(self) -> Path:
        return self.run_dir / "best.pt"

    @property
    def resumable(self) -> bool:
        return self.state not in ACTIVE_STATES and (self.run_dir / "last.pt").is_file()

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def can_resume(self) -> bool:
        """From last.pt, or from scratch for a launched run that ended before saving one."""
        return not self.active and self.state != "completed" and (self.resumable or self.managed)

    @property
    def can_open(self) -> bool:
        return self.best_checkpoint.is_file()


def dataset_spec(choice: str, folder: str) -> str:
    """The --dataset value of the form's dataset choice: a built-in name, or folder:PATH."""
    return f"folder:{folder.strip()}" if choice == "folder" else choice


def launch_notice(info: RunInfo, gpu_count: int) -> str:
    """What the page says after a launch: where it runs, or what it waits for."""
    where = device_label(info.devices)
    if info.devices == ("cpu",):
        where = "the CPU" + (" (no CUDA GPU on this machine)" if gpu_count == 0 else "")
    if info.state == "queued":
        return f"Queued {info.name} for {where}: {info.detail}. It starts when the device is free."
    if info.state == "running":
        return f"Started {info.name} on {where}."
    return f"{info.name} is {info.state}: {info.detail}"


def device_label(devices: tuple[str, ...]) -> str:
    if devices == ("cpu",):
        return "CPU"
    if len(devices) == 1:
        return devices[0].replace("cuda:", "GPU ")
    return f"{len(devices)} GPUs (" + ", ".join(d.split(":")[1] for d in devices) + ")"


def table_rows(runs: list[RunInfo]) -> list[dict]:
    """Rows for the runs table: numbers stay numbers (progress in [0, 1], times as timedelta) so it sorts."""
    rows = []
    for run in runs:
        s = run.settings
        rows.append({
            "Name": run.name,
            "State": run.state,
            "Progress": run.progress,
            "Epoch": f"{run.epoch}/{run.total_epochs}" if run.total_epochs else str(run.epoch or ""),
            "Best val acc": run.best_val_acc,
            "Elapsed": dt.timedelta(seconds=round(run.elapsed_seconds)) if run.elapsed_seconds is not None else None,
            "ETA": dt.timedelta(seconds=round(run.eta_seconds)) if run.eta_seconds is not None else None,
            "Device": device_label(run.devices),
            "Preset": s.get("preset"),
            "Dataset": _short_dataset(s.get("dataset")),
            "Epochs": s.get("epochs"),
            "Batch": s.get("batch_size"),
            "LR": s.get("lr"),
            "Weight decay": s.get("weight_decay"),
            "Started": dt.datetime.fromtimestamp(run.started_at) if run.started_at else None,
            "Detail": run.detail or "",
        })
    return rows


def _short_dataset(spec: str | None) -> str | None:
    if not spec:
        return None
    if spec.startswith("folder:"):
        return "folder:" + Path(spec[len("folder:"):]).name
    return spec


METRIC_CURVES = {  # chart -> [(split label, metrics.jsonl key)]
    "loss": [("train", "train_loss"), ("val", "val_loss")],
    "accuracy": [("train", "train_acc"), ("val", "val_acc")],
    "learning rate": [("end of epoch", "lr")],
    "images per second": [("train", "images_per_second")],
}


def curve_rows(metrics: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Long-format rows per chart ({run, epoch, split, value}) from each run's metrics.jsonl rows."""
    charts: dict[str, list[dict]] = {chart: [] for chart in METRIC_CURVES}
    for run, rows in metrics.items():
        for row in rows:
            for chart, series in METRIC_CURVES.items():
                for split, key in series:
                    if row.get(key) is not None and row.get("epoch") is not None:
                        charts[chart].append({"run": run, "epoch": row["epoch"], "split": split, "value": row[key]})
    return charts


# ---------------------------------------------------------------------------------------------
# The manager


class RunManager:
    """Launch, list, stop, resume and delete the runs of one runs folder.

    ``nice`` starts the training processes at that niceness; ``env`` adds environment
    variables to them (e.g. OMP_NUM_THREADS). Cheap to create: it holds no run state.
    """

    def __init__(self, runs_dir: str | os.PathLike | None = None, data_dir: str | os.PathLike | None = None,
                 nice: int = 0, env: dict[str, str] | None = None, stale_seconds: float = STALE_SECONDS,
                 stop_grace_seconds: float = STOP_GRACE_SECONDS) -> None:
        self.runs_dir = Path(runs_dir) if runs_dir is not None else default_runs_dir()
        self.data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
        self.nice, self.env = nice, dict(env or {})
        self.stale_seconds, self.stop_grace_seconds = stale_seconds, stop_grace_seconds

    # -- paths and files -------------------------------------------------------------------------

    @property
    def launch_root(self) -> Path:
        return self.runs_dir / LAUNCH_DIR

    def run_dir(self, name: str) -> Path:
        return self.runs_dir / name

    def _record_path(self, name: str) -> Path:
        return self.launch_root / name / "launch.json"

    def output_path(self, name: str) -> Path:
        return self.launch_root / name / "output.log"

    def _record(self, name: str) -> dict | None:
        return _read_json(self._record_path(name))

    def _save_record(self, record: dict) -> None:
        path = self._record_path(record["name"])
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_json(path, record)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One launcher at a time across tabs, threads and server processes."""
        self.launch_root.mkdir(parents=True, exist_ok=True)
        with open(self.launch_root / ".lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def names(self) -> list[str]:
        """Every run: launch records and CLI run folders (with a config.json or status.json)."""
        found = set()
        if self.launch_root.is_dir():
            found |= {p.name for p in self.launch_root.iterdir()
                      if p.is_dir() and not p.name.startswith(".") and (p / "launch.json").is_file()}
        if self.runs_dir.is_dir():
            found |= {p.name for p in self.runs_dir.iterdir() if p.is_dir() and not p.name.startswith(".")
                      and ((p / "config.json").is_file() or (p / "status.json").is_file())}
        return sorted(found)

    # -- reading ---------------------------------------------------------------------------------

    def get(self, name: str) -> RunInfo:
        """One run's reconciled state; RunError if there is no such run."""
        record = self._record(name)
        run_dir = self.run_dir(name)
        status = _read_json(run_dir / "status.json")
        config = _read_json(run_dir / "config.json")
        if record is None and status is None and config is None:
            raise RunError(f"there is no run named {name!r} in {self.runs_dir}")
        now = time.time()
        alive, exit_code, output = None, None, ""
        if record is not None and record.get("sessions") and record.get("state") == "started":
            session = record["sessions"][-1]
            alive, exit_code = _process_alive(session)
            output = _tail(self.output_path(name), 20, offset=session.get("log_offset", 0))
        elif record is None and status is not None and status.get("host") == socket.gethostname():
            alive = status.get("state") == "running" and _proc_start(status.get("pid") or 0) is not None
        state, detail = reconcile(record, status, alive, exit_code, output, now, self.stale_seconds)

        settings = dict((config or {}).get("args") or {})
        if not settings and record is not None:
            settings = {k: v for k, v in record["params"].items() if k in CLI_FIELDS or k == "dataset"}
        if record is not None:
            devices = tuple(record["devices"])
        else:
            devices = _status_devices(status, settings)
        info = RunInfo(name=name, state=state, detail=detail, run_dir=run_dir, devices=devices,
                       managed=record is not None, settings=settings)
        if status is not None:
            info.epoch = int(status.get("epoch") or 0)
            info.total_epochs = status.get("total_epochs")
            info.progress = float(status.get("progress") or 0.0)
            info.best_val_acc = status.get("best_val_acc")
            info.pid = status.get("pid")
        info.total_epochs = info.total_epochs or settings.get("epochs")
        if state == "running":
            info.eta_seconds = status.get("eta_seconds") if status else None
        elif state == "completed":
            info.progress = 1.0
        if record is not None:
            info.started_at = record["sessions"][0]["started_at"] if record.get("sessions") else record["queued_at"]
            if record.get("sessions"):
                info.pid = record["sessions"][-1]["pid"]
            info.elapsed_seconds = self._elapsed(record, status, state, now)
        elif status is not None:
            start = _timestamp(status.get("start_time"))
            end = now if state == "running" else _timestamp(status.get("updated_time"))
            info.started_at = start
            info.elapsed_seconds = max(0.0, end - start) if start and end else None
        return info

    def _elapsed(self, record: dict, status: dict | None, state: str, now: float) -> float | None:
        if not record.get("sessions"):
            return None
        total = sum(s.get("seconds") or 0.0 for s in record["sessions"][:-1])
        last = record["sessions"][-1]
        if state == "running":
            end = now
        else:
            end = self._session_end(record["name"], last, status)
        return total + max(0.0, end - last["started_at"])

    def _session_end(self, name: str, session: dict, status: dict | None) -> float:
        """When a finished session stopped: its last status update, else the last write to its output."""
        candidates = [session["started_at"]]
        updated = _timestamp(status.get("updated_time")) if status else None
        if updated is not None and updated >= session["started_at"]:
            candidates.append(updated)
        with contextlib.suppress(OSError):
            candidates.append(self.output_path(name).stat().st_mtime)
        return max(candidates)

    def list_runs(self) -> list[RunInfo]:
        """Every run, newest first; reads only (see ``poll`` to start queued runs)."""
        runs = []
        for name in self.names():
            with contextlib.suppress(RunError):
                runs.append(self.get(name))
        return sorted(runs, key=lambda r: (r.started_at or 0.0, r.name), reverse=True)

    def log_tail(self, name: str, lines: int = 40) -> str:
        """The last lines the run's processes printed (all sessions), else the CLI's train.log."""
        text = _tail(self.output_path(name), lines)
        return text or _tail(self.run_dir(name) / "train.log", lines)

    def metrics(self, name: str) -> list[dict]:
        """The run's metrics.jsonl rows (one per finished epoch)."""
        rows = []
        with contextlib.suppress(OSError):
            for line in (self.run_dir(name) / "metrics.jsonl").read_text().splitlines():
                with contextlib.suppress(ValueError):
                    rows.append(json.loads(line))
        return rows

    def curves(self, names: list[str]) -> dict[str, list[dict]]:
        """Chart rows for several runs overlaid; see ``curve_rows``."""
        return curve_rows({name: self.metrics(name) for name in names})

    def device_users(self, runs: list[RunInfo] | None = None) -> dict[str, list[str]]:
        """{device key: names of the running runs on it}."""
        users: dict[str, list[str]] = {}
        for run in runs if runs is not None else self.list_runs():
            if run.state == "running":
                for device in run.devices:
                    users.setdefault(device, []).append(run.name)
        return users

    # -- changing --------------------------------------------------------------------------------

    def validate(self, params: RunParams) -> dict[str, str]:
        """{field: message} for everything wrong with ``params``; empty when it can be launched."""
        return validate_params(params, self.runs_dir, self.data_dir)

    def launch(self, params: RunParams, allow_sharing: bool = False) -> RunInfo:
        """Validate, then start the run (or queue it behind the runs using its device).

        Raises ValidationError with per-field messages when the CLI would refuse the parameters.
        """
        errors = self.validate(params)
        if errors:
            raise ValidationError(errors)
        name = params.name.strip()
        with self._locked():
            if self._record(name) is not None or self.run_dir(name).exists():
                raise ValidationError({"name": f"a run named {name!r} already exists; choose another name"})
            record = {"name": name, "params": {**asdict(params), "name": name, "devices": list(params.devices)},
                      "devices": list(params.devices), "allow_sharing": allow_sharing, "state": "queued",
                      "queued_at": time.time(), "queue_reason": None, "resume": False, "resume_epochs": None,
                      "stop_requested_at": None, "sessions": []}
            self._save_record(record)
            self._dispatch()
        return self.get(name)

    def poll(self) -> list[RunInfo]:
        """Start queued runs whose devices are free, finish overdue stops, then list every run."""
        with self._locked():
            self._escalate_stops()
            self._dispatch()
        return self.list_runs()

    def stop(self, name: str) -> RunInfo:
        """Ask a running run to stop (SIGTERM to its process group; SIGKILL after the grace period).

        The CLI finishes its step, saves last.pt and ends ``cancelled``; a queued run is just
        taken off the queue. Runs started outside the app get SIGTERM to their process only.
        """
        with self._locked():
            info = self.get(name)
            record = self._record(name)
            if info.state == "queued" and record is not None:
                record.update(state="cancelled", queue_reason=None)
                self._save_record(record)
                return self.get(name)
            if info.state != "running":
                raise RunError(f"{name} is {info.state}, not running; there is nothing to stop")
            if record is None:
                if info.pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(info.pid, signal.SIGTERM)
                return self.get(name)
            session = record["sessions"][-1]
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(session["pgid"], signal.SIGTERM)
            record["stop_requested_at"] = time.time()
            self._save_record(record)
        timer = threading.Timer(self.stop_grace_seconds + 0.5, self._escalate_later)
        timer.daemon = True  # escalates even when no page polls; poll() does it too
        timer.start()
        return self.get(name)

    def _escalate_later(self) -> None:
        with contextlib.suppress(OSError), self._locked():
            self._escalate_stops()

    def _escalate_stops(self) -> None:
        now = time.time()
        for name in self.names():
            record = self._record(name)
            if not record or record.get("state") != "started" or record.get("stop_requested_at") is None:
                continue
            session = record["sessions"][-1]
            if now - record["stop_requested_at"] < self.stop_grace_seconds or session.get("killed_at"):
                continue
            if _process_alive(session)[0]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(session["pgid"], signal.SIGKILL)
                session["killed_at"] = now
                self._save_record(record)

    def resume(self, name: str, epochs: int | None = None, allow_sharing: bool = False) -> RunInfo:
        """Start a finished run again: from its last.pt with --resume (optionally to ``epochs`` in
        total), or from scratch when it stopped before saving one. Queued like a launch."""
        with self._locked():
            info = self.get(name)
            if info.active:
                raise RunError(f"{name} is {info.state}; stop it before resuming")
            done = len(self.metrics(name))
            total = epochs or info.total_epochs or info.settings.get("epochs")
            if info.state == "completed" and (epochs is None or epochs <= done):
                raise RunError(f"{name} has completed {done} epochs; give more epochs in total to train it further")
            if epochs is not None and epochs <= done:
                raise RunError(f"{name} has already trained {done} epochs; give more than {done} epochs")
            record = self._record(name)
            if record is None:  # a run started outside the app: adopt it
                known = {f.name for f in fields(RunParams)}
                params = {k: v for k, v in info.settings.items() if k in known}
                record = {"name": name, "params": {**params, "name": name}, "devices": list(info.devices),
                          "allow_sharing": False, "queued_at": time.time(), "sessions": []}
            has_last = (self.run_dir(name) / "last.pt").is_file()
            if not has_last and not record["params"].get("dataset"):
                raise RunError(f"{name} has no last.pt and no recorded launch; start a new run instead")
            record.update(state="queued", queued_at=time.time(), queue_reason=None, resume=has_last,
                          resume_epochs=epochs if has_last else None, allow_sharing=allow_sharing,
                          stop_requested_at=None)
            if not has_last and total:
                record["params"]["epochs"] = total
            self._save_record(record)
            self._dispatch()
        return self.get(name)

    def delete(self, name: str) -> None:
        """Remove a run that is not running: its run folder and our launch files."""
        with self._locked():
            info = self.get(name)
            if info.state == "running":
                raise RunError(f"{name} is running; stop it before deleting it")
            for path in (self.run_dir(name), self.launch_root / name):
                if path.resolve().parent not in (self.runs_dir.resolve(), self.launch_root.resolve()):
                    raise RunError(f"refusing to delete {path}: it is outside {self.runs_dir}")
                if path.is_dir():
                    shutil.rmtree(path)

    # -- starting processes (with the lock held) -------------------------------------------------

    def _dispatch(self) -> None:
        """Start queued runs in queue order when no running run (or earlier queued one) wants their devices."""
        runs = self.list_runs()
        running = [(r.devices, r.name) for r in runs if r.state == "running"]
        waiting: list[tuple[str, ...]] = []  # devices of earlier queued runs still waiting
        queued = [record for r in runs if r.state == "queued"
                  if (record := self._record(r.name)) is not None and record.get("state") == "queued"]
        for record in sorted(queued, key=lambda r: r["queued_at"]):
            devices = tuple(record["devices"])
            users = [name for used, name in running if _overlap(used, devices)]
            behind = any(_overlap(w, devices) for w in waiting)
            if (users or behind) and not record.get("allow_sharing"):
                reason = (f"waiting for {device_label(devices)}: in use by {', '.join(users)}" if users
                          else f"waiting for {device_label(devices)}: earlier queued runs go first")
                if record.get("queue_reason") != reason:
                    record["queue_reason"] = reason
                    self._save_record(record)
                waiting.append(devices)
                continue
            try:
                self._start(record)
            except (RunError, OSError) as e:  # e.g. the interpreter vanished: the run fails, the queue goes on
                record.update(state="error", start_error=f"could not start: {e}")
                self._save_record(record)
                continue
            running.append((devices, record["name"]))

    def _start(self, record: dict) -> None:
        name = record["name"]
        run_dir = self.run_dir(name)
        devices = tuple(record["devices"])
        if record.get("resume"):
            argv = ["--resume", str(run_dir)]
            if record.get("resume_epochs"):
                argv += ["--epochs", str(record["resume_epochs"])]
        else:
            if run_dir.exists():  # left by a process stopped before it saved anything; the CLI wants it empty
                if (run_dir / "last.pt").exists() or (run_dir / "best.pt").exists():
                    raise RunError(f"{run_dir} holds checkpoints; resume it instead of starting it again")
                shutil.rmtree(run_dir)
            params = RunParams(**{**record["params"], "devices": devices})
            argv = cli_args(params, run_dir, self.data_dir)
        command, extra_env = launch_command(argv, devices, self.nice)
        env = {**os.environ, **self.env, **extra_env, "PYTHONUNBUFFERED": "1"}
        output = self.output_path(name)
        output.parent.mkdir(parents=True, exist_ok=True)
        if record["sessions"]:
            previous = record["sessions"][-1]
            previous.setdefault("seconds", None)
            if previous["seconds"] is None:
                previous["seconds"] = self._session_end(name, previous, _read_json(run_dir / "status.json")) \
                    - previous["started_at"]
        with open(output, "ab") as log:
            offset = log.tell()
            started = time.time()
            log.write(f"=== {_iso(started)} {'resume' if record.get('resume') else 'start'}: "
                      f"{' '.join(command)}\n".encode())
            log.flush()
            process = subprocess.Popen(command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        _children[process.pid] = process
        proc = _proc_start(process.pid)
        record["sessions"].append({
            "pid": process.pid, "pgid": process.pid,  # start_new_session: the process leads its own group
            "command": command, "env": extra_env, "devices": list(devices), "started_at": started,
            "host": socket.gethostname(), "boot_id": _boot_id(), "proc_start": proc[1] if proc else None,
            "resume": bool(record.get("resume")), "log_offset": offset, "seconds": None})
        record.update(state="started", queue_reason=None, stop_requested_at=None)
        self._save_record(record)


def _status_devices(status: dict | None, settings: dict) -> tuple[str, ...]:
    """The devices of a run started outside the app, from its status.json (or its arguments)."""
    device = (status or {}).get("device") or settings.get("device") or "cpu"
    if device.startswith("cuda"):
        if (status or {}).get("world_size", 1) > 1 or device == "auto":
            return ("cuda:*",)
        return (device if ":" in device else "cuda:0",)
    return ("cpu",) if device in ("cpu", "auto") else (device,)
