"""The runs as the Train page shows them: ``RunInfo`` (one run's reconciled state and numbers, which
``vit.runs.manager.RunManager`` builds from the runs folder), the runs table's rows and column widths, the curves'
long-format rows (metrics per epoch, the training loss every few seconds, an SAE's statistics per step, where each
resume took over), and what the page says after a launch and of the Ray cluster. Plain values in, plain values
out: nothing here reads a run's files.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from pathlib import Path

from vit.core.runfiles import BEST_CHECKPOINT, LAST_CHECKPOINT
from vit.core.text import visible
from vit.runs.devices import device_label
from vit.runs.state import ACTIVE_STATES


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
    kind: str = "vit"  # "vit": a vit.train run; "sae": a sparse autoencoder's (vit.sae train)

    @property
    def sae_folder(self) -> Path | None:
        """The finished SAE (SAELens's cfg.json and weights, metrics.json, features.npz) the explorer opens."""
        return self.run_dir if self.kind == "sae" and (self.run_dir / "cfg.json").is_file() else None

    @property
    def best_checkpoint(self) -> Path:
        return self.run_dir / BEST_CHECKPOINT

    @property
    def resumable(self) -> bool:
        return self.state not in ACTIVE_STATES and (self.run_dir / LAST_CHECKPOINT).is_file()

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def can_resume(self) -> bool:
        """From last.pt, or from scratch for a launched run that ended before saving one."""
        return not self.active and self.state not in ("completed", "damaged") and (self.resumable or self.managed)

    @property
    def restarts(self) -> bool:
        """Whether resuming it starts it again from scratch (it ended before it saved a last.pt): only then is its
        button "Restart". A running run is neither resumed nor restarted."""
        return self.can_resume and not self.resumable

    @property
    def can_open(self) -> bool:
        return self.best_checkpoint.is_file()


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


def ray_cluster_label(address: str, users: list[str] | None = None) -> str:
    """The Ray cluster as the form's device list shows it: nodes, CPUs and GPUs free of the total (read from
    Ray's dashboard), or why they cannot be read; and the page's runs on it. The address is not shown: it is
    the server's, and whoever reaches it owns the cluster."""
    from vit.runs import ray_jobs

    try:
        have = ray_jobs.cluster_resources(address, timeout=2.0)
    except ray_jobs.RayRunError:
        text = "the Ray cluster: cannot reach it now (runs launched on it wait in Ray until it is back)"
    else:
        (cpu_used, cpus), (gpu_used, gpus) = have["CPU"], have["GPU"]
        text = (f"the Ray cluster: {have['nodes']} node(s), {cpus - cpu_used:g} of {cpus:g} CPUs and "
                f"{gpus - gpu_used:g} of {gpus:g} GPUs free")
    return f"{text} · used by {', '.join(users)}" if users else text


def table_rows(runs: list[RunInfo]) -> list[dict]:
    """Rows for the runs table: numbers stay numbers (progress in [0, 1], times as timedelta) so it sorts; names
    from folders (the run's, its dataset's) and the detail show their control characters (``vit.core.text.visible``)."""
    rows = []
    for run in runs:
        s = run.settings
        dataset = _short_dataset(s.get("dataset"))
        rows.append({
            "Name": visible(run.name),
            "State": run.state,
            "Progress": run.progress,
            "Epoch": f"{run.epoch}/{run.total_epochs}" if run.total_epochs else str(run.epoch or ""),
            "Best val acc": run.best_val_acc,
            "Elapsed": _duration(run.elapsed_seconds),
            "ETA": _duration(run.eta_seconds),
            "Device": device_label(run.devices),
            "Preset": s.get("preset"),
            "Dataset": visible(dataset) if dataset is not None else None,
            "Epochs": s.get("epochs"),
            "Batch": s.get("batch_size"),
            "LR": s.get("lr"),
            "Weight decay": s.get("weight_decay"),
            "Started": _moment(run.started_at),
            "Detail": visible(run.detail or ""),
        })
    return rows


# The runs table's columns in order, with their headers; what went wrong (Detail) right after the state.
TABLE_HEADERS = {"Name": "Name", "State": "State", "Detail": "Detail", "Progress": "Progress", "Epoch": "Epoch",
                 "Best val acc": "Best acc", "Elapsed": "Elapsed", "ETA": "ETA", "Device": "Device",
                 "Preset": "Preset", "Dataset": "Dataset", "LR": "LR", "Started": "Started"}
# Pixels per character (Streamlit's 14 px Source Sans averages about 6), a cell's padding, and the page's main
# column at a 1400-px window with the sidebar open: the whole table fits it, so no column is out of sight.
CHAR_PX, CELL_PADDING_PX, TABLE_PX = 6.2, 24, 940
SHOWN_AS = {"Elapsed": "a few seconds", "ETA": "a few seconds", "Started": "11-23 23:59"}  # as the table writes them


def table_widths(rows: list[dict], budget: int = TABLE_PX) -> dict[str, int]:
    """{column: px} of the runs table: each as wide as its header and its longest cell as the table writes them
    (set widths cut names, durations and datasets short); where that is more than ``budget`` in all, the detail and
    the name give way first (shown whole on hover and in the run's controls), then the widest others, never below
    their header."""
    def text(column: str, value) -> str:
        if value is None:
            return ""
        if column in SHOWN_AS:
            return SHOWN_AS[column]
        if column in ("Progress", "Best val acc"):
            return f"{value:.1%}"
        return f"{value:g}" if column == "LR" else str(value)

    def px(length: int) -> int:
        return round(CELL_PADDING_PX + CHAR_PX * length)

    floor = {column: px(len(header)) for column, header in TABLE_HEADERS.items()}
    wanted = {column: max([floor[column], *(px(len(text(column, row.get(column)))) for row in rows)])
              for column in TABLE_HEADERS}
    for column in ("Detail", "Name"):  # shown whole in the run's controls below the table
        over = sum(wanted.values()) - budget
        if over > 0:
            wanted[column] = max(floor[column], wanted[column] - over)
    cap = max(wanted.values())
    while cap > 0 and sum(max(floor[c], min(w, cap)) for c, w in wanted.items()) > budget:
        cap -= 1  # still too wide: the widest others give way alike
    return {c: max(floor[c], min(w, cap)) for c, w in wanted.items()}


def _duration(seconds: float | None) -> dt.timedelta | None:
    """A time span for the table; None when unknown or beyond a calendar (a damaged file's 1e300)."""
    if seconds is None or not 0 <= seconds < 1e10:
        return None
    return dt.timedelta(seconds=round(seconds))


def _moment(timestamp: float | None) -> dt.datetime | None:
    try:
        return dt.datetime.fromtimestamp(timestamp) if timestamp else None
    except (OverflowError, OSError, ValueError):
        return None


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
                    epoch, value = row.get("epoch"), row.get(key)
                    if _is_number(epoch) and _is_number(value):  # a damaged line plots nothing, not an error
                        charts[chart].append({"run": run, "epoch": epoch, "split": split, "value": value})
    return charts


def resume_marks(run: str, config: dict | None) -> list[dict]:
    """Where each later session of ``run`` took over, from config.json's "resumes"
    (``vit.core.runfiles.record_resume``): {run, epoch (epochs done, the x of a ViT run's curves), step (the x of an
    SAE run's), time (as the runs table writes it)}, None where the entry does not say. A ViT run's entry written
    before "at_epoch" gives the epoch it took over in (a resume mid-epoch is drawn at that epoch's start); an entry
    that is no object is skipped."""
    marks = []
    for resume in (config or {}).get("resumes") or []:
        if not isinstance(resume, dict):
            continue
        epoch = resume.get("at_epoch", resume.get("from_epoch"))
        step = resume.get("step", resume.get("from_step"))
        try:
            moment = dt.datetime.fromisoformat(resume["time"]).astimezone() if isinstance(resume.get("time"), str) \
                else None
        except ValueError:
            moment = None
        marks.append({"run": run, "epoch": epoch if _is_number(epoch) else None,
                      "step": step if _is_number(step) else None,
                      "time": moment.strftime("%m-%d %H:%M") if moment is not None else None})
    return marks


SAE_CURVES = {"explained_variance": "explained variance", "l0": "L0 (latents per token)",
              "dead_fraction": "dead fraction"}  # steps.jsonl key of an SAE run -> chart


def sae_curve_rows(steps: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Long-format rows per chart ({run, step, value}) from each SAE run's steps.jsonl rows."""
    charts: dict[str, list[dict]] = {chart: [] for chart in SAE_CURVES.values()}
    for run, rows in steps.items():
        for row in rows:
            for key, chart in SAE_CURVES.items():
                step, value = row.get("step"), row.get(key)
                if _is_number(step) and _is_number(value):  # a torn or damaged line plots nothing
                    charts[chart].append({"run": run, "step": step, "value": value})
    return charts


def step_curve_rows(steps: dict[str, list[dict]]) -> list[dict]:
    """Long-format rows ({run, epoch, value}) of each run's training loss every few seconds (its steps.jsonl rows),
    so a curve moves before the first epoch ends."""
    rows = []
    for run, found in steps.items():
        for row in found:
            epoch, loss = row.get("epoch"), row.get("train_loss")
            if _is_number(epoch) and _is_number(loss):  # a torn or damaged line plots nothing
                rows.append({"run": run, "epoch": epoch, "value": loss})
    return rows


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

