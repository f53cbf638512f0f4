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

Its neighbours: ``vit.core.runfiles`` (the run folder's files), ``vit.runs.state`` (the states and how a
run's files are weighed against its process), ``vit.runs.launch`` (the form's parameters, their
validation and the command line), ``vit.runs.devices`` (the devices a run can use) and ``vit.runs.display``
(``RunInfo`` and the runs table's rows and curves, as the page shows them).

Devices: a run asks for ``cpu``, one GPU ``cuda:N`` or several GPUs (started under torchrun).
A run whose device is used by another running run of this runs folder, or wanted by an earlier
queued one, is queued unless sharing is allowed; this holds for the CPU too, because two
trainings on a two-core machine only slow each other down. Queued runs start when the manager
is polled (``RunManager.poll``; the training page polls every few seconds) and their devices are
free: with no page open nothing starts them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, fields
from pathlib import Path

from vit.core.runfiles import (
    BEST_CHECKPOINT,
    CONFIG_FILE,
    END_FILE,
    END_FILE_ENV,
    LAST_CHECKPOINT,
    LAUNCH_DIR,
    LAUNCH_FILE,
    LOG_FILE,
    METRICS_FILE,
    OUTPUT_FILE,
    PHASE_FILE,
    PHASE_FILE_ENV,
    ROOT,
    STALE_SECONDS,
    STATUS_FILE,
    STEPS_FILE,
    RunFileError,
    default_runs_dir,
    iso,
    read_config,
    read_json,
    read_launch,
    read_metrics,
    read_run_phase,
    read_status,
    read_tail,
    remove_stray_temp_files,
    timestamp,
    write_json,
)
from vit.runs.devices import device_label, devices_overlap
from vit.runs.display import (  # noqa: F401 (the page's names, importable where they were)
    SHOWN_AS,
    TABLE_HEADERS,
    RunInfo,
    curve_rows,
    launch_notice,
    ray_cluster_label,
    resume_marks,
    sae_curve_rows,
    step_curve_rows,
    table_rows,
    table_widths,
)
from vit.runs.launch import (
    CLI_FIELDS,
    MAX_EPOCHS,
    RAY,
    RunParams,
    SAEParams,
    ValidationError,
    cli_args,
    default_data_dir,
    default_data_roots,
    launch_command,
    ray_address,
    sae_cli_args,
    sae_command,
    validate_params,
    validate_sae_params,
)
from vit.runs.state import (
    LAUNCH_SECRET_ENV,
    STARTING,
    boot_id,
    cli_process_problem,
    launch_secret_hash,
    proc_start,
    process_alive,
    reconcile,
    remember_child,
    session_problem,
)

STOP_GRACE_SECONDS = 30.0  # the CLI finishes its step and saves last.pt; a step is far shorter
MAX_RUNNING = 4  # runs training at once, shared devices or not
MAX_ACTIVE = 16  # runs queued or running: a launch beyond is refused
JOB_LINE = re.compile(r"vit\.(?:train|sae): submitted job (\S+) to ")  # what a Ray run's follower prints first
# Terminal escape sequences (ECMA-48 CSI such as Ray's colours "\x1b[36m", OSC, and two-character ones).
ANSI_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")


class RunError(ValueError):
    """An operation a run's state does not allow (stop a finished run, delete a running one, ...)."""


# ---------------------------------------------------------------------------------------------
# The manager


class RunManager:
    """Launch, list, stop, resume and delete the runs of one runs folder.

    ``nice`` starts the training processes at that niceness; ``env`` adds environment
    variables to them (e.g. OMP_NUM_THREADS). ``data_roots`` are the folders ``folder:`` datasets
    may come from (default ``vit.runs.launch.default_data_roots``); at most ``max_running`` runs train at
    once and ``max_active`` are queued or running. Cheap to create: it holds no run state.
    """

    def __init__(self, runs_dir: str | os.PathLike | None = None, data_dir: str | os.PathLike | None = None,
                 nice: int = 0, env: dict[str, str] | None = None, stale_seconds: float = STALE_SECONDS,
                 stop_grace_seconds: float = STOP_GRACE_SECONDS,
                 data_roots: tuple[str | os.PathLike, ...] | None = None, max_running: int = MAX_RUNNING,
                 max_active: int = MAX_ACTIVE) -> None:
        self.runs_dir = Path(runs_dir) if runs_dir is not None else default_runs_dir()
        self.data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
        self.data_roots = (tuple(Path(os.path.realpath(r)) for r in data_roots) if data_roots is not None
                           else default_data_roots(self.data_dir))
        self.max_running, self.max_active = max_running, max_active
        self.nice, self.env = nice, dict(env or {})
        self.stale_seconds, self.stop_grace_seconds = stale_seconds, stop_grace_seconds

    # -- paths and files -------------------------------------------------------------------------

    @property
    def launch_root(self) -> Path:
        return self.runs_dir / LAUNCH_DIR

    def run_dir(self, name: str) -> Path:
        return self.runs_dir / name

    def _record_path(self, name: str) -> Path:
        return self.launch_root / name / LAUNCH_FILE

    def output_path(self, name: str) -> Path:
        return self.launch_root / name / OUTPUT_FILE

    def _record(self, name: str) -> dict | None:
        """launch.json, checked; None when there is none, RunFileError when it is damaged."""
        return read_launch(self._record_path(name))

    def _save_record(self, record: dict) -> None:
        path = self._record_path(record["name"])
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, record)

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
                      if p.is_dir() and not p.name.startswith(".") and (p / LAUNCH_FILE).is_file()}
        if self.runs_dir.is_dir():
            found |= {p.name for p in self.runs_dir.iterdir() if p.is_dir() and not p.name.startswith(".")
                      and ((p / CONFIG_FILE).is_file() or (p / STATUS_FILE).is_file())}
        return sorted(found)

    # -- reading ---------------------------------------------------------------------------------

    def get(self, name: str) -> RunInfo:
        """One run's reconciled state; RunError if there is no such run.

        A run whose files are damaged (a field of the wrong type, not JSON, contradictory) is
        returned in the state ``damaged`` with the reason as its detail: it can be deleted.
        """
        run_dir = self.run_dir(name)
        try:
            record = self._record(name)
            status = read_status(run_dir / STATUS_FILE)
            config = read_config(run_dir / CONFIG_FILE)
        except RunFileError as e:
            return self._damaged(name, str(e))
        if record is None and status is None and config is None:
            raise RunError(f"there is no run named {name!r} in {self.runs_dir}")
        try:
            return self._info(name, record, status, config)
        except (LookupError, TypeError, ValueError, AttributeError, OverflowError) as e:
            # Every field has its type; what is left is files that contradict each other.
            return self._damaged(name, f"its files do not fit together ({type(e).__name__}: {e})")

    def _end_record(self, name: str, session: dict) -> dict | None:
        """end.json of the session's process (``vit.core.runfiles.record_run_end``), when that process wrote it."""
        end = read_json(self.launch_root / name / END_FILE)
        if end is not None and end.get("pid") == session.get("pid") and isinstance(end.get("error"), str):
            return end
        return None

    def _damaged(self, name: str, reason: str) -> RunInfo:
        return RunInfo(name=name, state="damaged", detail=reason[:300], run_dir=self.run_dir(name), devices=(),
                       managed=self._record_path(name).is_file())

    def _info(self, name: str, record: dict | None, status: dict | None, config: dict | None) -> RunInfo:
        run_dir = self.run_dir(name)
        now = time.time()
        alive, exit_code, output, problem, end = None, None, "", None, None
        if record is not None and record.get("sessions") and record.get("state") == "started":
            session = record["sessions"][-1]
            alive, exit_code = process_alive(session)
            if alive is False:
                end = self._end_record(name, session)
                if end is None:  # launched by a version without end records
                    output = read_tail(self.output_path(name), 20, offset=session.get("log_offset", 0))
        elif record is None and status is not None and status.get("host") == socket.gethostname():
            if status.get("state") == "running":
                # A reused or forged pid is not this run's process: the run is gone, whatever runs there now.
                problem = cli_process_problem(status.get("pid"), run_dir, timestamp(status.get("start_time")))
                alive = problem is None
        phase = read_run_phase(self.launch_root / name / PHASE_FILE) if alive is not False and record is not None \
            else None
        state, detail = reconcile(record, status, alive, exit_code, output, now, self.stale_seconds, end, phase)
        if state == "crashed" and problem:
            detail = f"{problem}; the run ended without a final state"
        if record is not None and tuple(record["devices"]) == RAY and record.get("sessions") and (
                state == "crashed" or (state == "running" and (detail or "").startswith(STARTING))):
            state, detail = self._ray_state(name, record["sessions"][-1], status, state, detail)

        kind = "sae" if (config or {}).get("kind") == "sae" or (record or {}).get("kind") == "sae" else "vit"
        settings = dict((config or {}).get("args") or {})
        if not settings and record is not None:
            settings = {k: v for k, v in record["params"].items()
                        if k in CLI_FIELDS or k == "dataset" or (kind == "sae" and k not in ("name", "devices"))}
        if record is not None:
            devices = tuple(record["devices"])
        else:
            devices = _status_devices(status, settings)
        info = RunInfo(name=name, state=state, detail=detail, run_dir=run_dir, devices=devices,
                       managed=record is not None, settings=settings, kind=kind)
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
            start = timestamp(status.get("start_time"))
            end = now if state == "running" else timestamp(status.get("updated_time"))
            info.started_at = start
            info.elapsed_seconds = max(0.0, end - start) if start and end else None
        return info

    def _job_id(self, name: str, session: dict) -> str | None:
        """The Ray job a Ray session's follower submitted, from the line it printed first."""
        with contextlib.suppress(OSError), open(self.output_path(name), "rb") as f:
            f.seek(session.get("log_offset", 0))
            match = JOB_LINE.search(f.read(16_384).decode("utf-8", errors="replace"))
            return match.group(1) if match else None
        return None

    def _ray_state(self, name: str, session: dict, status: dict | None, state: str,
                   detail: str | None) -> tuple[str, str | None]:
        """A Ray run's state where the local follower cannot tell: before training starts (pending on the
        cluster: for what) and after the follower ended without a final state (the job may run on)."""
        from vit.runs import ray_jobs

        address, sid = ray_address(), self._job_id(name, session)
        if address is None or sid is None:
            return state, detail
        file_state = (status or {}).get("state")
        ray_state, ray_detail = ray_jobs.run_state(address, sid, file_state)
        if state == "running":  # starting: say what the cluster is waiting for
            return state, ray_detail if ray_state == "pending" else detail
        if ray_state in ("pending", "running"):
            return "running", f"{ray_detail}; the job runs on the cluster without this page's follower"
        if ray_state in ("completed", "failed", "cancelled"):
            return ray_state, ray_detail
        if ray_state == "stopped":
            return "cancelled", f"{ray_detail} before the run wrote its end; resume it"
        return state, f"{detail}; {ray_detail}"  # lost or unreachable: the files say where it stood

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
        updated = timestamp(status.get("updated_time")) if status else None
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
        """The last lines the run's processes printed (all sessions), else the CLI's train.log; without terminal
        escape codes (Ray colours its job logs), which a page would show as raw text."""
        text = read_tail(self.output_path(name), lines)
        return ANSI_ESCAPE.sub("", text or read_tail(self.run_dir(name) / LOG_FILE, lines))

    def metrics(self, name: str) -> list[dict]:
        """The run's metrics.jsonl rows (one per finished epoch)."""
        return read_metrics(self.run_dir(name) / METRICS_FILE)

    def curves(self, names: list[str]) -> dict[str, list[dict]]:
        """Chart rows for several runs overlaid; see ``curve_rows``."""
        return curve_rows({name: self.metrics(name) for name in names})

    def step_curves(self, names: list[str]) -> list[dict]:
        """Each run's training loss every few seconds (steps.jsonl); see ``step_curve_rows``."""
        return step_curve_rows({name: read_metrics(self.run_dir(name) / STEPS_FILE) for name in names})

    def resumes(self, names: list[str]) -> list[dict]:
        """Where each of these runs was resumed (``resume_marks``); a run whose config.json is missing or damaged
        has none."""
        marks = []
        for name in names:
            with contextlib.suppress(RunFileError):
                marks += resume_marks(name, read_config(self.run_dir(name) / CONFIG_FILE))
        return marks

    def sae_curves(self, names: list[str]) -> dict[str, list[dict]]:
        """Chart rows (explained variance, L0, dead fraction per step) of the SAE runs among ``names``."""
        return sae_curve_rows({name: read_metrics(self.run_dir(name) / STEPS_FILE) for name in names
                               if (self.run_dir(name) / "cfg.json").is_file() or self._is_sae(name)})

    def _is_sae(self, name: str) -> bool:
        with contextlib.suppress(RunFileError):
            config = read_config(self.run_dir(name) / CONFIG_FILE)
            record = self._record(name)
            return (config or {}).get("kind") == "sae" or (record or {}).get("kind") == "sae"
        return False

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
        return validate_params(params, self.runs_dir, self.data_dir, data_roots=self.data_roots)

    def launch(self, params: RunParams, allow_sharing: bool = False) -> RunInfo:
        """Validate, then start the run (or queue it behind the runs using its device).

        Raises ValidationError with per-field messages when the CLI would refuse the parameters.
        """
        return self._queue(params, self.validate(params), allow_sharing, {})

    def _queue(self, params: RunParams | SAEParams, errors: dict[str, str], allow_sharing: bool,
               extra: dict) -> RunInfo:
        """Refuse ``errors`` or a name in use, else record the run as queued (with ``extra``) and dispatch."""
        if errors:
            raise ValidationError(errors)
        name = params.name.strip()
        with self._locked():
            self._check_room()
            if self._record(name) is not None or self.run_dir(name).exists():
                raise ValidationError({"name": f"a run named {name!r} already exists; choose another name"})
            record = {"name": name, **extra,
                      "params": {**asdict(params), "name": name, "devices": list(params.devices)},
                      "devices": list(params.devices), "allow_sharing": allow_sharing, "state": "queued",
                      "queued_at": time.time(), "queue_reason": None, "resume": False, "resume_epochs": None,
                      "stop_requested_at": None, "sessions": []}
            self._save_record(record)
            self._dispatch()
        return self.get(name)

    def validate_sae(self, params: SAEParams) -> dict[str, str]:
        """{field: message} for everything wrong with an SAE run's ``params`` the page can see."""
        return validate_sae_params(params, self.runs_dir, self.data_roots)

    def launch_sae(self, params: SAEParams, allow_sharing: bool = False) -> RunInfo:
        """Validate, then start a sparse autoencoder's run (``vit.sae train``), queued like any other."""
        return self._queue(params, self.validate_sae(params), allow_sharing, {"kind": "sae"})

    def _check_room(self) -> None:
        active = sum(1 for run in self.list_runs() if run.active)
        if active >= self.max_active:
            raise ValidationError({"form": f"{active} runs are already queued or running (at most {self.max_active}); "
                                           "wait for one to finish, or stop one"})

    def poll(self) -> list[RunInfo]:
        """Start queued runs whose devices are free, finish overdue stops, then list every run.

        Finished runs lose the temporary files a killed process left behind (no process writes there).
        """
        with self._locked():
            self._escalate_stops()
            self._dispatch()
            runs = self.list_runs()
            for run in runs:
                # A crashed run's process is gone, unless it only stopped beating (hung): it may still write.
                gone = run.state == "crashed" and not (run.detail or "").startswith("no heartbeat")
                if run.state in ("completed", "failed", "cancelled") or gone:
                    remove_stray_temp_files(run.run_dir)
        return runs

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
                # A pid from status.json may be forged or reused: signal only this run's own training process.
                status = read_status(self.run_dir(name) / STATUS_FILE) or {}
                problem = cli_process_problem(info.pid, self.run_dir(name), timestamp(status.get("start_time")))
                if problem:
                    raise RunError(f"not stopping {name}: {problem}; nothing was signalled")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(info.pid, signal.SIGTERM)
                return self.get(name)
            session = record["sessions"][-1]
            if tuple(record["devices"]) == RAY and not process_alive(session)[0]:
                return self._stop_ray_job(name, session)
            problem = session_problem(session, name)
            if problem:
                raise RunError(f"not stopping {name}: {problem}; nothing was signalled")
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(session["pgid"], signal.SIGTERM)
            record["stop_requested_at"] = time.time()
            self._save_record(record)
        timer = threading.Timer(self.stop_grace_seconds + 0.5, self._escalate_later)
        timer.daemon = True  # escalates even when no page polls; poll() does it too
        timer.start()
        return self.get(name)

    def _stop_ray_job(self, name: str, session: dict) -> RunInfo:
        """Stop a Ray run whose follower has ended: the job itself, through the cluster's job API."""
        from vit.runs import ray_jobs

        address, sid = ray_address(), self._job_id(name, session)
        if address is None or sid is None:
            raise RunError(f"not stopping {name}: its Ray job is not known here; stop it with `ray job stop`")
        try:
            ray_jobs.client(address).stop_job(sid)
        except Exception as e:  # noqa: BLE001 - one line, whatever Ray raises
            raise RunError(f"could not stop Ray job {sid}: {ray_jobs._first_line(e)}") from None
        return self.get(name)

    def _escalate_later(self) -> None:
        with contextlib.suppress(OSError), self._locked():
            self._escalate_stops()

    def _escalate_stops(self) -> None:
        now = time.time()
        for name in self.names():
            try:
                record = self._record(name)
            except RunFileError:  # listed as damaged; nothing of it to signal
                continue
            if not record or record.get("state") != "started" or record.get("stop_requested_at") is None:
                continue
            session = record["sessions"][-1]
            if now - record["stop_requested_at"] < self.stop_grace_seconds or session.get("killed_at"):
                continue
            if process_alive(session)[0] and session_problem(session, name) is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(session["pgid"], signal.SIGKILL)
                session["killed_at"] = now
                self._save_record(record)

    def resume(self, name: str, epochs: int | None = None, allow_sharing: bool = False) -> RunInfo:
        """Start a finished run again: from its last.pt with --resume (optionally to ``epochs`` in
        total), or from scratch when it stopped before saving one. Queued like a launch."""
        with self._locked():
            info = self.get(name)
            if info.state == "damaged":
                raise RunError(f"{name} is damaged ({info.detail}); delete it, or repair its files")
            if info.active:
                raise RunError(f"{name} is {info.state}; stop it before resuming")
            if epochs is not None and epochs > MAX_EPOCHS:
                raise RunError(f"at most {MAX_EPOCHS} epochs from this page")
            try:
                self._check_room()
            except ValidationError as e:
                raise RunError(e.errors["form"]) from None
            # An SAE run keeps no epoch rows; its CLI refuses fewer epochs than it has.
            done = (info.total_epochs or 0 if info.state == "completed" else 0) if info.kind == "sae" \
                else len(self.metrics(name))
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
            has_last = (self.run_dir(name) / LAST_CHECKPOINT).is_file()
            if not has_last and not record["params"].get("dataset") and record.get("kind") != "sae":
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
        queued = []
        for run in runs:
            if run.state == "queued":
                with contextlib.suppress(RunFileError):  # damaged meanwhile: listed as such
                    record = self._record(run.name)
                    if record is not None and record.get("state") == "queued":
                        queued.append(record)
        for record in sorted(queued, key=lambda r: r["queued_at"]):
            devices = tuple(record["devices"])
            shared = devices == RAY  # the cluster's own scheduler queues its jobs (pending: for what)
            users = [] if shared else [name for used, name in running if devices_overlap(used, devices)]
            behind = not shared and any(devices_overlap(w, devices) for w in waiting)
            full = len(running) >= self.max_running
            if full or ((users or behind) and not record.get("allow_sharing")):
                if full:
                    reason = f"waiting: {len(running)} runs are training, the most at once"
                else:
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
        sae = record.get("kind") == "sae"
        if record.get("resume"):
            argv = (["train"] if sae else []) + ["--resume", str(run_dir)]
            if record.get("resume_epochs"):
                argv += ["--epochs", str(record["resume_epochs"])]
        else:
            if run_dir.exists():  # left by a process stopped before it saved anything; the CLI wants it empty
                if (run_dir / LAST_CHECKPOINT).exists() or (run_dir / BEST_CHECKPOINT).exists():
                    raise RunError(f"{run_dir} holds checkpoints; resume it instead of starting it again")
                shutil.rmtree(run_dir)
            try:
                params = (SAEParams if sae else RunParams)(**{**record["params"], "devices": devices})
            except TypeError as e:
                raise RunError(f"its launch.json holds parameters this version does not know ({e})") from None
            argv = sae_cli_args(params, run_dir) if sae else cli_args(params, run_dir, self.data_dir)
        params = record["params"]
        if sae:
            command, extra_env = sae_command(argv, devices, self.nice, params.get("workers"))
        else:
            command, extra_env = launch_command(argv, devices, self.nice, params.get("workers"),
                                                params.get("gpus_per_worker"))
        secret = secrets.token_hex(16)  # only the child's environment holds it; launch.json keeps its hash
        end, phase = self.launch_root / name / END_FILE, self.launch_root / name / PHASE_FILE
        end.unlink(missing_ok=True)  # the previous session's
        phase.unlink(missing_ok=True)  # so a phase.json that is there is this session's
        env = {**os.environ, **self.env, **extra_env, "PYTHONUNBUFFERED": "1", LAUNCH_SECRET_ENV: secret,
               END_FILE_ENV: str(end), PHASE_FILE_ENV: str(phase)}
        output = self.output_path(name)
        output.parent.mkdir(parents=True, exist_ok=True)
        if record["sessions"]:
            previous = record["sessions"][-1]
            previous.setdefault("seconds", None)
            if previous["seconds"] is None:
                with contextlib.suppress(RunFileError):
                    previous["seconds"] = self._session_end(name, previous, read_status(run_dir / STATUS_FILE)) \
                        - previous["started_at"]
        with open(output, "ab") as log:
            offset = log.tell()
            started = time.time()
            log.write(f"=== {iso(started)} {'resume' if record.get('resume') else 'start'}: "
                      f"{' '.join(command)}\n".encode())
            log.flush()
            process = subprocess.Popen(command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        remember_child(process)
        proc = proc_start(process.pid)
        record["sessions"].append({
            "pid": process.pid, "pgid": process.pid,  # start_new_session: the process leads its own group
            "command": command, "env": extra_env, "devices": list(devices), "started_at": started,
            "host": socket.gethostname(), "boot_id": boot_id(), "proc_start": proc[1] if proc else None,
            "resume": bool(record.get("resume")), "log_offset": offset, "seconds": None,
            "secret_hash": launch_secret_hash(name, secret)})
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
