"""Runs on a Ray cluster, from the client's side: submit one as a Ray job, follow its logs, stop it.

``submit_job`` and ``follow_to_the_end`` are what every command with ``--ray`` shares (``vit.train``,
``vit.analyze``): the allow-listed code with its upload limit, the retried submission, the
followed log, Ctrl-C as a job stop and the failed job's one-line error.

What a job uploads is an allow-list, never the repository minus exceptions: ``code_package`` copies the ``vit``
package's Python files (``PACKAGE``, ``UPLOADED``) into a fresh folder, and that folder is the job's
``working_dir``. Secrets beside the code (``.streamlit/secrets.toml`` with the training token, ``.env``), data,
weights and anything else a checkout gathers stay on this machine.

``python -m vit.train … --ray ADDRESS --workers N [--gpus-per-worker G]`` submits the run as a
job whose ``submission_id`` is the run's id (its folder's name; a resume gets a suffix), whose
``working_dir`` is the allow-listed code, and whose entrypoint is ``vit.runs.ray_train``. The
run folder must lie on storage every node sees: paths are made absolute before submitting.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shlex
import shutil
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from vit.core.cli import UsageError, usage_error
from vit.core.runfiles import ROOT, lies_inside, now_iso
from vit.training.options import parse_args, without_ray_options

# Ray's default is 3 s between SIGTERM and SIGKILL: too short for a checkpoint of a large model.
STOP_WAIT_SECONDS = 120
MAX_UPLOAD_BYTES = 20 * 2**20  # the package is ~2 MB; more means something large slipped in
PACKAGE = "vit"  # everything a job runs (python -m vit.runs.ray_train, vit.analyze) is in it
UPLOADED = "*.py"  # the package holds no other file a job reads
AGENT_WAIT_SECONDS = 60  # a head that has just started answers "No available agent" for a few seconds
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
# Options whose value is a path: the job runs in an unpacked copy of the code elsewhere.
PATH_OPTIONS = ("--out", "--resume", "--data-dir", "--cache-dir", "--init")


class RayRunError(UsageError):
    """Something about the cluster the user can fix; the message says what."""


def package_files(root: Path = ROOT) -> list[Path]:
    """The files a job uploads, relative to ``root``: the ``vit`` package's Python files, no links (one could
    point anywhere) and no ``__pycache__``."""
    package = root / PACKAGE
    return sorted(path.relative_to(root) for path in package.rglob(UPLOADED)
                  if path.is_file() and not path.is_symlink() and "__pycache__" not in path.parts
                  and lies_inside(path, package))


@contextlib.contextmanager
def code_package(root: Path = ROOT, limit: int = MAX_UPLOAD_BYTES) -> Iterator[dict]:
    """The job's runtime_env while the ``with`` lasts: a fresh folder holding ``package_files`` as working_dir,
    and the stop grace; RayRunError over ``limit`` bytes. Ray packs and uploads the folder when the job is
    submitted, so submit inside the ``with``."""
    files = package_files(root)
    size = sum((root / f).stat().st_size for f in files)
    if size > limit:
        raise RayRunError(f"the code to upload to the cluster is {size / 2**20:.1f} MB, over the "
                          f"{limit / 2**20:.0f} MB limit: move large files out of {root / PACKAGE}")
    with tempfile.TemporaryDirectory(prefix="vit-job-code-") as folder:
        for file in files:
            (Path(folder) / file).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / file, Path(folder) / file)
        yield {"working_dir": folder,
               "env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": str(STOP_WAIT_SECONDS), "OMP_NUM_THREADS": "1",
                            "PYTHONUNBUFFERED": "1"}}


def absolute_paths(argv: list[str]) -> list[str]:
    """``argv`` with every path option and ``folder:PATH`` dataset made absolute."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in PATH_OPTIONS + ("--dataset",) and (eq or i + 1 < len(argv)):
            if not eq:
                i += 1
                value = argv[i]
            out += [name, _absolute(name, value)]
        else:
            out.append(arg)
        i += 1
    return out


def _absolute(option: str, value: str) -> str:
    if option == "--dataset":
        return f"folder:{Path(value[7:]).expanduser().resolve()}" if value.startswith("folder:") else value
    if value.startswith("s3://") or "://" in value:
        raise RayRunError(f"{option} {value}: runs on a cluster need a folder that every node mounts (a shared "
                          "filesystem path); object stores such as S3 are not supported yet")
    return str(Path(value).expanduser().resolve())


def job_id(run_dir: Path, resume: bool) -> str:
    """The run's id as a Ray submission id; a resume is a new job, so it gets the time as a suffix."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", run_dir.name) or "run"
    return f"{name}-resume-{now_iso().replace(':', '').replace('+0000', '')}" if resume else name


def client(address: str):
    """A JobSubmissionClient, or RayRunError in one line when the head cannot be reached."""
    import logging

    from ray.job_submission import JobSubmissionClient

    # Ray's client logs each file it skips while packing the code, the upload, the log stream's end ... on
    # stderr: a command's own lines are what the user reads there (the job's log comes on stdout). Two of
    # its modules set their own level, so the package's alone would not quiet them.
    for name in ("ray", "ray.dashboard.modules.dashboard_sdk", "ray.dashboard.modules.job.sdk"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        return JobSubmissionClient(address)
    except Exception as e:  # noqa: BLE001 - Ray raises ConnectionError, ValueError, RuntimeError …
        raise RayRunError(f"cannot reach the Ray cluster at {address} ({_first_line(e)}); check the address "
                          "(http://HEAD:8265) and that the head is running") from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__


def submit(address: str, argv: list[str], workers: int, gpus_per_worker: float) -> tuple[object, str]:
    """Submit the run of ``argv`` (vit.train's arguments); returns (client, submission id)."""
    if workers < 1:
        raise RayRunError(f"--workers must be 1 or more (got {workers})")
    if gpus_per_worker < 0:
        raise RayRunError(f"--gpus-per-worker must be 0 or more (got {gpus_per_worker:g})")
    # The same checks as a local run, before anything reaches the cluster, but for the devices: the workers'.
    args = parse_args(argv, device_here=False)
    argv = absolute_paths(argv)
    if not args.resume and "--data-dir" not in argv:  # "data" would mean the job's copy of the code
        argv += ["--data-dir", str(Path(args.data_dir).resolve())]
    if "--device" not in argv:  # the workers' devices are what Ray gives them
        argv += ["--device", "cuda" if gpus_per_worker > 0 else "cpu"]
    run_dir = Path(args.resume or args.out).expanduser().resolve()
    sid = job_id(run_dir, bool(args.resume))
    entrypoint = shlex.join(["python", "-m", "vit.runs.ray_train", "--workers", str(workers),
                             "--gpus-per-worker", f"{gpus_per_worker:g}", "--name", sid, "--", *argv])
    jobs = submit_job(address, entrypoint, sid, {"vit_run": str(run_dir), "vit_workers": str(workers),
                                                 "vit_gpus_per_worker": f"{gpus_per_worker:g}"}, what="run")
    return jobs, sid


def submit_job(address: str, entrypoint: str, sid: str, metadata: dict[str, str], what: str):
    """Submit ``entrypoint`` (run in the allow-listed code, ``code_package``) as job ``sid``; returns the client.

    The upload size is checked before the cluster is contacted; a head that has just started is retried
    while it has no agent. RayRunError in one line (``what``: "run", "analysis") when the cluster refuses."""
    with code_package() as env:
        jobs = client(address)
        deadline = time.monotonic() + AGENT_WAIT_SECONDS
        while True:
            try:
                jobs.submit_job(entrypoint=entrypoint, submission_id=sid, runtime_env=dict(env), metadata=metadata)
                return jobs
            except Exception as e:  # noqa: BLE001
                text = _first_line(e)
                if "No available agent" in text and time.monotonic() < deadline:  # a head that has just started
                    time.sleep(1.0)
                    continue
                if "already exists" in text:
                    raise RayRunError(f"the cluster already has a job {sid}: choose another --out name") from None
                raise RayRunError(f"the cluster refused the {what}: {text}") from None


def follow(jobs, sid: str, write: Callable[[str], object], poll: float = 1.0) -> str:
    """Print the job's log until it ends; returns its final status (SUCCEEDED, FAILED, STOPPED).

    ``tail_job_logs`` may end silently when the connection drops: the status is checked again
    and, once the job has ended, the rest of the full log is printed."""
    printed = 0

    async def tail() -> None:
        nonlocal printed
        seen = 0
        async for chunk in jobs.tail_job_logs(sid):  # from the start of the log each time
            new = chunk[max(0, printed - seen):] if seen + len(chunk) > printed else ""
            seen += len(chunk)
            if new:
                write(new)
                printed = seen

    while True:
        try:
            with warnings.catch_warnings():
                # Ray's SDK opens the log's websocket with ssl=None, aiohttp's deprecated spelling of its default
                # (verify certificates): a DeprecationWarning at every job followed, that only Ray can fix.
                warnings.filterwarnings("ignore", "ssl=None is deprecated", DeprecationWarning)
                asyncio.run(tail())
        except Exception:  # noqa: BLE001 - a dropped stream: the status below decides
            pass
        status = str(jobs.get_job_status(sid).value)
        if status in TERMINAL:
            rest = jobs.get_job_logs(sid)[printed:]
            if rest:
                write(rest)
            return status
        time.sleep(poll)


def job_error(jobs, sid: str, prog: str = "vit.train") -> str:
    """The one-line error of a failed job: the last ``PROG:`` line of its log, else what a node's Python lacks (the
    cluster runs another environment), else Ray's message."""
    log = jobs.get_job_logs(sid)
    lines = [line for line in log.splitlines() if f"{prog}:" in line]
    if lines:
        return lines[-1][lines[-1].index(f"{prog}:"):]
    missing = re.findall(r"No module named '([\w.]+)'", log)
    if missing:
        here = Path(sys.executable).parent
        return (f"{prog}: the cluster's Python has no module {missing[-1]!r}: its nodes run the job with the python "
                f"on their PATH, which must be this project's environment; start every node with it, e.g. "
                f"PATH={here}:$PATH ray start --head (and ... ray start --address HEAD:6379 on the others)")
    message = jobs.get_job_info(sid).message or "no message"
    return f"{prog}: the job failed: {message.strip().splitlines()[-1] if message.strip() else message}"


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def follow_to_the_end(jobs, sid: str, prog: str, on_stop: str) -> int:
    """Print the job's log until it ends, as a command does: 0 succeeded, 1 failed (its one-line error on
    stderr), 130 stopped. The first Ctrl-C stops the job (``on_stop`` says what the job then does), a second
    leaves it running without this command. SIGTERM (the Train page's Stop) counts as a Ctrl-C.

    Both raise KeyboardInterrupt where the command is, through a handler of our own: with Python's default one,
    ``asyncio.run`` (the log's tail) turns Ctrl-C into a cancellation of its task, and a log stream that ends
    quietly when cancelled lost the Ctrl-C, so the job ran on to the end."""
    previous = signal.signal(signal.SIGINT, _interrupt), signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _follow_to_the_end(jobs, sid, prog, on_stop)
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])


def _follow_to_the_end(jobs, sid: str, prog: str, on_stop: str) -> int:

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    stopping = False
    while True:
        try:
            status = follow(jobs, sid, write)
            break
        except KeyboardInterrupt:
            if stopping:
                print(f"{prog}: still stopping; the job {sid} goes on without this command", file=sys.stderr)
                return 130
            stopping = True
            print(f"{prog}: stopping job {sid}: {on_stop} (Ctrl-C again to leave it)", file=sys.stderr, flush=True)
            jobs.stop_job(sid)
    if status == "FAILED":
        print(job_error(jobs, sid, prog), file=sys.stderr)
        return 1
    print(f"{prog}: job {sid} {status.lower()}", flush=True)
    return 0 if status == "SUCCEEDED" else 130


def main(argv: list[str]) -> int:
    """``vit.train … --ray ADDRESS``: submit, follow until the end; Ctrl-C (or SIGTERM) stops the job gracefully."""
    try:
        ray_args = parse_args(argv)  # vit.train's one parser: --ray, --workers and --gpus-per-worker are its own
        jobs, sid = submit(ray_args.ray, without_ray_options(argv), ray_args.workers, ray_args.gpus_per_worker)
    except UsageError as e:
        return usage_error("vit.train", e)
    print(f"vit.train: submitted job {sid} to {ray_args.ray} ({ray_args.workers} worker(s)); Ctrl-C stops it",
          flush=True)
    return follow_to_the_end(jobs, sid, "vit.train", "the run writes last.pt and ends cancelled")


# ---------------------------------------------------------------------------------------------
# What the cluster has, and a Ray run's state: Ray's job status merged with the run files


def cluster_resources(address: str, timeout: float = 5.0) -> dict:
    """{"nodes": n, "CPU": (used, total), "GPU": (used, total)} read from the dashboard; RayRunError
    when the head cannot be reached."""
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(f"{address.rstrip('/')}/api/cluster_status", timeout=timeout) as response:
            data = json.loads(response.read(4 * 2**20))["data"]["clusterStatus"]
        usage = data["loadMetricsReport"]["usage"]
        nodes = sum((data["autoscalerReport"].get("activeNodes") or {}).values())
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RayRunError(f"cannot read the Ray cluster's resources at {address} ({_first_line(e)}); check "
                          "that the head is running") from None
    return {"nodes": nodes, **{name: tuple(usage.get(name, (0.0, 0.0))) for name in ("CPU", "GPU")}}


def pending_reason(address: str, workers: int, gpus_per_worker: float) -> str:
    """Why a PENDING job may wait: what the run asks for against what the cluster has free."""
    try:
        have = cluster_resources(address)
    except RayRunError as e:
        return str(e)
    free_cpu = have["CPU"][1] - have["CPU"][0]
    free_gpu = have["GPU"][1] - have["GPU"][0]
    need_cpu, need_gpu = workers, workers * gpus_per_worker  # 1 CPU per worker; the driver takes none
    if need_cpu > free_cpu or need_gpu > free_gpu:
        return (f"waiting for resources: the run needs {need_cpu} CPU(s) and {need_gpu:g} GPU(s), the cluster has "
                f"{free_cpu:g} CPU(s) and {free_gpu:g} GPU(s) free of {have['CPU'][1]:g} and {have['GPU'][1]:g}")
    return "waiting for Ray to start the job"


def run_state(address: str, sid: str, file_state: str | None) -> tuple[str, str]:
    """(state, detail) of a Ray run from its job and ``file_state`` (status.json's state, if any).

    States: pending, running, completed, failed, cancelled (the run files), stopped (Ray stopped the
    job before the run wrote its end), lost (Ray no longer knows the job: the head restarted) and
    unreachable (the head cannot be reached: nothing is lost, the files say where the run stood)."""
    try:
        jobs = client(address)
        info = jobs.get_job_info(sid)
    except RayRunError as e:
        return "unreachable", str(e)
    except Exception as e:  # noqa: BLE001 - Ray raises RuntimeError for an unknown job
        if "does not exist" in str(e) or "404" in str(e):
            return (file_state, "Ray no longer knows the job") if file_state in ("completed", "failed", "cancelled") \
                else ("lost", f"Ray no longer knows job {sid} (the head restarted?); resume the run")
        return "unreachable", f"cannot read job {sid}: {_first_line(e)}"
    status = str(info.status.value)
    if status == "PENDING":
        meta = info.metadata or {}
        return "pending", pending_reason(address, int(meta.get("vit_workers", 1)),
                                         float(meta.get("vit_gpus_per_worker", 0)))
    if status == "RUNNING":
        if file_state is None:  # Ray Train waits for its workers' resources with the job RUNNING
            meta = info.metadata or {}
            reason = pending_reason(address, int(meta.get("vit_workers", 1)), float(meta.get("vit_gpus_per_worker", 0)))
            if reason.startswith("waiting for resources"):
                return "pending", reason
        return "running", f"job {sid} running"
    if status == "SUCCEEDED":
        return file_state or "completed", f"job {sid} succeeded"
    if status == "FAILED":
        return "failed", job_error(jobs, sid)
    return ("cancelled" if file_state == "cancelled" else "stopped"), f"job {sid} stopped"
