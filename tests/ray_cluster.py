"""A real local Ray cluster for tests: ``ray start --head`` and a second node joining it, each in
its own process group and temp dir, stopped by those groups (never by name: other people's Ray
processes may share the machine). The venv's bin comes first on PATH: a job's ``python`` is
whatever the cluster's PATH finds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from helpers import free_port

BIN = Path(sys.executable).parent
RAY = BIN / "ray"


class RayCluster:
    def __init__(self, root: Path, cpus_per_node: int = 1) -> None:
        self.root, self.cpus = root, cpus_per_node
        self.processes: list[subprocess.Popen] = []
        self.port, self.dashboard = free_port(), free_port()
        self.address = f"http://127.0.0.1:{self.dashboard}"
        self.start_seconds: float | None = None

    def _env(self) -> dict:
        return {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", "RAY_USAGE_STATS_ENABLED": "0",
                "OMP_NUM_THREADS": "1"}

    def _start(self, name: str, *args: str) -> None:
        temp = self.root / name  # ray wants a short temp path (unix sockets)
        temp.mkdir(parents=True, exist_ok=True)
        log = open(self.root / f"{name}.log", "w")  # noqa: SIM115 - kept open for the process's life
        # Every port free, not Ray's defaults: another cluster on this machine must not clash with ours.
        ports = [f"--{name}={free_port()}" for name in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                        "metrics-export-port", "runtime-env-agent-port",
                                                        "node-manager-port", "object-manager-port")]
        self.processes.append(subprocess.Popen(
            [str(RAY), "start", "--block", "--disable-usage-stats", "--num-cpus", str(self.cpus), "--num-gpus", "0",
             "--temp-dir", str(temp), *ports, *args], stdout=log, stderr=subprocess.STDOUT, env=self._env(),
            start_new_session=True))

    def start(self, timeout: float = 180.0) -> None:
        began = time.monotonic()
        self._start("head", "--head", "--node-ip-address", "127.0.0.1", "--port", str(self.port),
                    "--dashboard-host", "127.0.0.1", "--dashboard-port", str(self.dashboard),
                    "--ray-client-server-port", str(free_port()), "--include-dashboard", "true")
        self._wait(lambda: self._nodes() >= 1, timeout, "the Ray head")
        self._start("worker", "--address", f"127.0.0.1:{self.port}", "--node-ip-address", "127.0.0.1")
        self._wait(lambda: self._nodes() >= 2, timeout, "the second Ray node")
        self.start_seconds = time.monotonic() - began

    def _nodes(self) -> int:
        import json

        try:
            with urllib.request.urlopen(f"{self.address}/nodes?view=summary", timeout=5) as r:
                data = json.load(r)
        except (OSError, ValueError):
            return 0
        summary = data.get("data", {}).get("summary", [])
        return sum(1 for node in summary if node.get("raylet", {}).get("state") == "ALIVE")

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            dead = [p for p in self.processes if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{what} exited; see {self.root}/*.log")
            time.sleep(0.5)
        raise RuntimeError(f"{what} did not start within {timeout:.0f} s; see {self.root}/*.log")

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        for process in self.processes:
            try:
                process.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
