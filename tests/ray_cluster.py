"""A real local Ray cluster for tests: ``ray start --head`` and a second node joining it, each in
its own process group and temp dir, stopped by those groups (never by name: other people's Ray
processes may share the machine). The venv's bin comes first on PATH: a job's ``python`` is
whatever the cluster's PATH finds."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from helpers import free_port
from ray_groups import _members, _signal_group, _wait_until, stop_groups

BIN = Path(sys.executable).parent
RAY = BIN / "ray"




def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def ray_port() -> int:
    """A free port below the kernel's ephemeral range, for the cluster's nodes: a port picked by ``bind(0)`` (the
    other tests' servers, every client socket) comes from that range, and one taken between our pick and Ray's bind
    left the head's job agent unbound in a whole-suite run (every job submission then refused: "No available
    agent"); below the range only another explicit pick can take it."""
    import random

    top = _ephemeral_start()
    for _ in range(200):
        port = random.randrange(max(1024, top - 12000), top)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()

class RayClusterError(RuntimeError):
    """The cluster did not start; the message ends with the tail of the node's log."""


class RayCluster:
    def __init__(self, root: Path, cpus_per_node: int = 1, object_store_bytes: int = 200 * 2**20) -> None:
        self.root, self.cpus, self.object_store = root, cpus_per_node, object_store_bytes
        self.processes: list[subprocess.Popen] = []
        self.temp: Path | None = None
        self.start_seconds: float | None = None
        self._ports()

    def _ports(self) -> None:
        self.port, self.dashboard = ray_port(), ray_port()
        self.address = f"http://127.0.0.1:{self.dashboard}"

    def _env(self) -> dict:
        # Each Ray Train job starts ~6 processes on two shared cores (its supervisor and driver, Train's controller
        # and synchronization actor, the workers: vit.runs.ray_train leaves out the two others Train starts);
        # a cluster of one machine is never drained for preemption, so its watcher (one more process per job) is
        # left out, and the controller looks at its workers every 0.5 s instead of 2 s: a finished or stopped run
        # is seen ~1 s sooner (a test waits for it).
        # What no test reads is left out or slowed, each a few seconds of CPU per job on two shared cores: the
        # metrics every process records for Prometheus, the dashboard agent's per-process stats every 5 s (60 s
        # here; the nodes and resources the tests read come from the GCS), the log monitor's glob of a logs folder
        # that grows by every worker's files every 0.1 s (0.5 s here: a new worker's first lines reach its driver
        # up to 0.5 s later) and the Train state actor's 30 s poll of every run's controller for the dashboard.
        # A job's driver connecting no longer has the raylet start a worker for it ahead of need: with the job's
        # runtime_env it could only serve that job's tasks, and a Train job's actors each want an env of their own,
        # so it stayed idle (ray::IDLE, ~1 s of CPU a job, importing Ray).
        return {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", "RAY_USAGE_STATS_ENABLED": "0",
                "OMP_NUM_THREADS": "1", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
                "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5", "RAY_enable_metrics_collection": "0",
                "REPORTER_UPDATE_INTERVAL_MS": "60000", "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0",
                "RAY_TRAIN_ENABLE_STATE_ACTOR_RECONCILIATION": "0", "RAY_prestart_worker_first_driver": "0"}

    def _start(self, name: str, *args: str) -> None:
        # Ray's unix sockets live under its temp dir (session_<date>_<pid>/sockets/...), and a socket path
        # has 107 bytes at most: a pytest basetemp is too deep for it on some machines, /tmp/vray-XXXX is not.
        if self.temp is None:
            self.temp = Path(tempfile.mkdtemp(prefix="vray-", dir="/tmp" if os.path.isdir("/tmp") else None))
        temp = self.temp / name
        temp.mkdir(parents=True, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root / f"{name}.log", "w")  # noqa: SIM115 - kept open for the process's life
        # Every port free, not Ray's defaults: another cluster on this machine must not clash with ours.
        ports = [f"--{name}={ray_port()}" for name in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                        "metrics-export-port", "runtime-env-agent-port",
                                                        "node-manager-port", "object-manager-port")]
        self.processes.append(subprocess.Popen(
            [str(RAY), "start", "--block", "--disable-usage-stats", "--num-cpus", str(self.cpus), "--num-gpus", "0",
             "--object-store-memory", str(self.object_store), "--temp-dir", str(temp), *ports, *args],
            stdout=log, stderr=subprocess.STDOUT, env=self._env(),
            start_new_session=True))

    def start(self, timeout: float = 180.0, attempts: int = 3) -> None:
        """Start the head and the second node; a node that exits is retried on new ports (a port picked
        free can be taken before Ray binds it), and the last failure raises with its log's tail."""
        began = time.monotonic()
        for attempt in range(attempts):
            try:
                self._start_once(timeout)
                break
            except RayClusterError:
                self.stop()
                if attempt == attempts - 1:
                    raise
                self.processes, self.temp = [], None
                self._ports()
        self.start_seconds = time.monotonic() - began
        # A pytest killed from outside never reaches stop(); the watchdog, in a session of its own, stops the
        # cluster then (its nodes lead their own process groups, so they outlive the test process).
        subprocess.Popen([sys.executable, str(Path(__file__).with_name("ray_groups.py")), str(os.getpid()),
                          str(self.temp), *(str(p.pid) for p in self.processes)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def restart(self) -> None:
        """Start again after ``stop``, on new ports and a new temp dir."""
        self.stop()
        self.processes, self.temp = [], None
        self._ports()
        self.start()

    def _start_once(self, timeout: float) -> None:
        self._start("head", "--head", "--node-ip-address", "127.0.0.1", "--port", str(self.port),
                    "--dashboard-host", "127.0.0.1", "--dashboard-port", str(self.dashboard),
                    "--ray-client-server-port", str(ray_port()), "--include-dashboard", "true")
        self._wait(lambda: self._nodes() >= 1, timeout, "the Ray head")
        self._start("worker", "--address", f"127.0.0.1:{self.port}", "--node-ip-address", "127.0.0.1")
        self._wait(lambda: self._nodes() >= 2, timeout, "the second Ray node")
        # The commands read the cluster's CPUs from the dashboard's /api/cluster_status (the autoscaler monitor's
        # report), which counts a node seconds after /nodes lists it alive: a test run just after the start was
        # refused "the Ray cluster has 1 CPU(s); an SAE run needs at least 2" (a run of test_sae_ray under load).
        self._wait(lambda: self._cpus() >= 2 * self.cpus, timeout, "both nodes' CPUs in the cluster's status")
        self._agents_bound()

    def _agents_bound(self) -> None:
        """RayClusterError (so ``start`` retries on new ports) where a node's dashboard agent could not bind its
        port: the node stays alive, but the head's job agent is then never registered and every job submission
        is refused ("No available agent")."""
        for log in sorted(self.temp.glob("*/session_latest/logs/dashboard_agent.log")):
            if "address already in use" in log.read_text(errors="replace"):
                raise RayClusterError(f"a Ray node's dashboard agent could not bind its port ({log})")

    def _nodes(self) -> int:
        import json

        try:
            with urllib.request.urlopen(f"{self.address}/nodes?view=summary", timeout=5) as r:
                data = json.load(r)
        except (OSError, ValueError):
            return 0
        summary = data.get("data", {}).get("summary", [])
        return sum(1 for node in summary if node.get("raylet", {}).get("state") == "ALIVE")

    def _cpus(self) -> float:
        """The cluster's CPUs as the commands read them (vit.runs.ray_jobs.cluster_resources); 0 while unknown."""
        import json

        try:
            with urllib.request.urlopen(f"{self.address}/api/cluster_status", timeout=5) as r:
                usage = json.load(r)["data"]["clusterStatus"]["loadMetricsReport"]["usage"]
            return float(usage.get("CPU", (0.0, 0.0))[1])
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            return 0.0

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            dead = [p for p in self.processes if p.poll() is not None]
            if dead:
                raise RayClusterError(f"{what} exited with code {dead[0].returncode}{self._log_tail()}")
            time.sleep(0.5)
        raise RayClusterError(f"{what} did not start within {timeout:.0f} s{self._log_tail()}")

    def _log_tail(self, lines: int = 25) -> str:
        """The last lines of every node's log and of Ray's own session logs that name an error."""
        parts = []
        for log in sorted(self.root.glob("*.log")):
            text = log.read_text(errors="replace").strip().splitlines()[-lines:]
            parts.append(f"--- {log.name}:\n" + "\n".join(text))
        if self.temp is not None:
            logs = sorted(self.temp.glob("*/session_*/logs/*.err")) + sorted(self.temp.glob("*/session_*/logs/*.out"))
            for log in logs:
                text = log.read_text(errors="replace")
                if any(word in text for word in ("Error", "error", "FATAL", "Traceback")):
                    parts.append(f"--- {log.name}:\n" + "\n".join(text.strip().splitlines()[-10:]))
        return ("\n" + "\n".join(parts)) if parts else ""

    def stop(self) -> None:
        """Stop the nodes, each by its process group (even where its leader has exited: Ray's processes it started
        are in that group and outlive it), in the order Ray needs: the other nodes, then every head process but the
        GCS, then the GCS. Signalled together, the head's ``ray start`` and autoscaler monitor spend ~30 s retrying
        a GCS that is already gone (each tells it of its end). SIGKILL to what is left after a minute."""
        deadline = time.monotonic() + 60
        if not self.processes:
            return
        head, *others = [process.pid for process in self.processes]
        stop_groups(head, others, deadline)
        for process in self.processes:
            try:
                process.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process.pid, signal.SIGKILL)
                process.wait()
        # a zombie nobody reaps would count as alive for ever
        _wait_until(lambda: not any(_members(p.pid) for p in self.processes), min(deadline, time.monotonic() + 15))
        for process in self.processes:
            _signal_group(process.pid, signal.SIGKILL)
        if self.temp is not None:
            shutil.rmtree(self.temp, ignore_errors=True)
        self.processes = []  # stopped: a second stop has nothing to signal
