"""Local clusters of real processes for tests and tox: a head plus `burla node join` nodes.

As a program it starts a cluster, runs a command against it (with BURLA_CLUSTER_DASHBOARD_URL,
BURLA_CLUSTER_TOKEN and BURLA_CONFIG_DIR set), and tears the cluster down however the
command ends:

    python -m tests.cluster_runner --nodes 3 --workers 2 -- python -m pytest -m cluster
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


class LocalCluster:
    """A head and nodes as separate processes (nodes are not the head's children, so they
    outlive a head restart and re-register by themselves)."""

    def __init__(self, config_dir: Path, nodes: int = 2, workers: int = 1, head_args: list[str] | None = None,
                 node_args: list[str] | None = None, token: str | None = None) -> None:
        self.config_dir = config_dir
        self.config_dir.mkdir(parents=True, exist_ok=True)
        self.token = token or secrets.token_urlsafe(16)
        self.head_args = head_args or []
        self.node_args = node_args or []
        self.workers = workers
        self.head: subprocess.Popen | None = None
        self.url = ""
        self.port = 0
        self.nodes: dict[str, subprocess.Popen] = {}
        self._node_count = nodes
        self._logs: list = []

    # --- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        try:
            self.start_head()
            for i in range(self._node_count):
                self.add_node(f"node-{i}")
            self.wait_for_nodes(self._node_count)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def env(self) -> dict[str, str]:
        """The environment a client or CLI subprocess needs to use this cluster."""
        return {"BURLA_CLUSTER_DASHBOARD_URL": self.url, "BURLA_CLUSTER_TOKEN": self.token,
                "BURLA_CONFIG_DIR": str(self.config_dir)}

    def client(self, head_url: str | None = None, **settings: Any):
        """A burla client for this cluster's head (or the head behind `head_url`, e.g. a proxy),
        whatever the environment says; `settings` are ClientSettings' others."""
        from burla.client.api import Client
        from burla.config import ClientSettings

        return Client(settings=ClientSettings(config_dir=self.config_dir, head_url=head_url or self.url,
                                              token=self.token, parent_job_id=None, **settings))

    def _spawn(self, command: list[str], log_name: str, pass_fds: tuple[int, ...] = (),
               env_extra: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.config_dir / log_name, "ab")
        env = dict(os.environ, BURLA_CLUSTER_TOKEN=self.token, BURLA_CONFIG_DIR=str(self.config_dir),
                   **(env_extra or {}))
        env.pop("BURLA_CLUSTER_DASHBOARD_URL", None)
        process = subprocess.Popen([sys.executable, "-m", "burla", *command], env=env, stdout=log,
                                   stderr=subprocess.STDOUT, cwd=REPO, pass_fds=pass_fds, start_new_session=True)
        log.close()
        return process

    def start_head(self) -> None:
        read_fd, write_fd = os.pipe()
        port = ["--port", str(self.port)]  # 0 the first time; the same port after a restart
        self.head = self._spawn(["head", "serve", *port, "--ready-fd", str(write_fd), *self.head_args],
                                "head.log", pass_fds=(write_fd,))
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as ready:
            line = ready.readline().decode().strip()
        if not line:
            raise RuntimeError(f"the head did not start:\n{self.log('head')}")
        self.url = line
        self.port = int(line.rsplit(":", 1)[1])

    def add_node(self, node_id: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        command = ["node", "join", "--head", self.url, "--node-id", node_id, "--workers", str(self.workers),
                   *self.node_args, *extra]
        self.nodes[node_id] = self._spawn(command, f"{node_id}.log", env_extra=env)
        return self.nodes[node_id]

    def stop_head(self, sig: int = signal.SIGTERM) -> None:
        if self.head is not None and self.head.poll() is None:
            self.head.send_signal(sig)
            self.head.wait(30)

    def restart_head(self) -> None:
        self.stop_head()
        self.start_head()

    def signal_node(self, node_id: str, sig: int) -> None:
        """Signal a node and its workers (its whole process group)."""
        os.killpg(self.nodes[node_id].pid, sig)

    def stop(self) -> None:
        for process in self.nodes.values():
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGCONT)  # a frozen node must run to stop
                    process.terminate()  # the node stops its own workers
                except ProcessLookupError:
                    pass
        for process in self.nodes.values():
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            try:
                os.killpg(process.pid, signal.SIGKILL)  # anything the node left behind
            except (ProcessLookupError, PermissionError):
                pass
        self.stop_head()

    # --- looking at it -------------------------------------------------------------------

    def get(self, path: str) -> dict:
        request = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)

    def ready_nodes(self) -> list[dict]:
        return [n for n in self.get("/v1/cluster")["nodes"] if n["workers_alive"] >= 1]

    def wait_for_nodes(self, count: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if len(self.ready_nodes()) >= count:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {count} nodes ready after {timeout} s:\n{self.log('head')}")
            time.sleep(0.05)

    def log(self, name: str) -> str:
        try:
            return (self.config_dir / f"{name}.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    with tempfile.TemporaryDirectory(prefix="burla-cluster-") as directory:
        with LocalCluster(Path(directory), nodes=args.nodes, workers=args.workers) as cluster:
            print(f"cluster: {cluster.url} with {args.nodes} nodes x {args.workers} workers", flush=True)
            child = subprocess.Popen(command, env=dict(os.environ, **cluster.env(), BURLA_TEST_CLUSTER="1"))
            try:
                return child.wait()
            except KeyboardInterrupt:
                child.send_signal(signal.SIGINT)
                return child.wait()


if __name__ == "__main__":
    sys.exit(main())
