"""Stealing: an idle node takes half of a busy peer's queued inputs, safely under lost acks."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from burla.protocol import wire
from tests.conftest import REPO, start_head, wait_for_nodes
from tests.support import functions
from tests.support.helpers import get_json, wait_until
from tests.support.http_proxy import DroppingProxy


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Nodes:
    """`burla node join` processes started by a test, stopped however the test ends."""

    def __init__(self, head, log_dir, env: dict[str, str] | None = None) -> None:
        self.head = head
        self.log_dir = log_dir
        self.env = {**os.environ, **head.env(), **(env or {})}
        self.processes: list[subprocess.Popen] = []

    def join(self, name: str, *extra: str) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "burla", "node", "join", "--head", self.head.url, "--node-id", name,
             "--workers", "1", *extra],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
        )
        log.close()
        self.processes.append(process)
        return process

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture
def bare_head(tmp_path):
    head = start_head(tmp_path / "config", local_nodes=0)
    nodes = Nodes(head, tmp_path)
    try:
        yield head, nodes
    finally:
        nodes.stop()
        head.stop()


def _skewed_job(client, out_dir, slow_s: float = 1.5, gate: str | None = None):
    # The first four inputs are 30x slower; they land on the first node before the second joins.
    # A call per CPU: calls that wait would otherwise share the first node's CPUs, which would
    # then run its queue itself instead of leaving it to a thief. With a gate, the slow calls
    # wait for it, so the queue stays however long the second node takes to start.
    inputs = [(str(out_dir), i, slow_s if i < 4 else 0.05, gate if i < 4 else None) for i in range(12)]
    return client.remote_parallel_map(functions.record_interval, inputs, generator=True, func_cpu=1, spinner=False)


def _run_while_node_b_joins(client, nodes: Nodes, tmp_path, *node_args: str,
                            context: ssl.SSLContext | None = None) -> None:
    """The skewed job on node-a; node-b joins idle and steals. Every result arrives once. The slow
    calls wait until node-b is ready (a loaded machine may start it later than they would end)."""
    out = tmp_path / "calls"
    out.mkdir()
    gate = tmp_path / "gate"
    stream = _skewed_job(client, out, gate=str(gate))
    wait_until(lambda: any(out.glob("*.started")), timeout=120, what="node-a running the job")
    nodes.join("node-b", *node_args)
    wait_until(lambda: "node-b" in {n["node_id"] for n in _ready_nodes(nodes.head, context)}, timeout=120,
               what="node-b ready")
    gate.touch()
    assert sorted(stream) == list(range(12))


def _ready_nodes(head, context: ssl.SSLContext | None = None) -> list[dict]:
    """The head's nodes with a worker alive."""
    request = urllib.request.Request(head.url + "/v1/cluster", headers=head.headers())
    with urllib.request.urlopen(request, timeout=30, context=context) as response:
        return [n for n in json.load(response)["nodes"] if n["workers_alive"] >= 1]


def test_idle_node_steals_from_a_busy_peer(bare_head, tmp_path):
    head, nodes = bare_head
    nodes.join("node-a")
    wait_for_nodes(head, 1)
    _run_while_node_b_joins(head.client(), nodes, tmp_path)
    job = get_json(head, "/v1/cluster")["jobs"][0]
    assert job["stolen"] >= 1, head.log()
    assert "stole" in nodes.log("node-b") and "gave" in nodes.log("node-a")


def test_a_lost_steal_ack_still_gives_every_result_exactly_once(bare_head, tmp_path):
    head, nodes = bare_head
    port = _free_port()
    proxy = DroppingProxy(f"http://127.0.0.1:{port}", drop_suffix="/steal/ack")
    try:
        nodes.join("node-a", "--port", str(port), "--advertise-url", proxy.url, "--steal-ack-timeout", "0.5")
        wait_for_nodes(head, 1)
        out = tmp_path / "calls"
        out.mkdir()
        stream = _skewed_job(head.client(), out, slow_s=2.0)
        nodes.join("node-b")
        results = list(stream)
    finally:
        proxy.stop()
    assert sorted(results) == list(range(12))  # delivered exactly once each
    assert proxy.dropped >= 1
    deadline = time.monotonic() + 30
    while "never acknowledged" not in nodes.log("node-a") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "never acknowledged" in nodes.log("node-a")


def _post_to_node(node_url: str, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(node_url + path, data=body, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {}
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_token_alone_cannot_take_a_nodes_inputs(bare_head):
    # Fails on the previous code: any token holder could steal a node's queued inputs and ack them.
    head, nodes = bare_head
    nodes.join("node-a")
    [node] = wait_for_nodes(head, 1)
    expires = time.time() + 60
    forged = [
        wire.StealRequest("job-1", "node-x-1", "node-x", 100, expires, b"\0" * 32),  # made up
        wire.StealRequest("job-1", "node-x-1", "node-x", 100, expires, b""),
    ]
    for request in forged:
        for headers in ({}, {"Authorization": f"Bearer {head.token}"}):
            status, body = _post_to_node(node["url"], "/v1/jobs/job-1/steal", request.encode(), headers)
            assert status == 403 and body["error"] == "GrantRefused", body
            assert "not the head's" in body["message"]
    status, body = _post_to_node(node["url"], "/v1/jobs/job-1/steal/ack",
                                 wire.StealAck("job-1", "node-x-1", b"\0" * 32).encode())
    assert status == 404, body  # no such transfer was ever opened
    # The node's other routes still want the token.
    status, body = _post_to_node(node["url"], "/v1/jobs/job-1/steal/other", b"")
    assert status == 401


def test_nodes_of_an_https_head_steal_over_https_pinned_by_the_head(tmp_path):
    head = start_head(tmp_path / "config", local_nodes=0, extra=["--tls-self-signed"])
    cert = head.config_dir / "head-cert.pem"
    nodes = Nodes(head, tmp_path, env={"BURLA_HEAD_CERT": str(cert)})
    try:
        nodes.join("node-a")
        context = ssl.create_default_context(cafile=str(cert))

        def ready_nodes() -> list[dict]:
            return _ready_nodes(head, context)

        wait_until(lambda: len(ready_nodes()) == 1, timeout=120, what="node-a joined the https head")
        _run_while_node_b_joins(head.client(head_cert=str(cert)), nodes, tmp_path, context=context)
        assert all(n["url"].startswith("https://127.0.0.1:") for n in ready_nodes())
        assert "stole" in nodes.log("node-b") and "gave" in nodes.log("node-a"), nodes.log("node-b")
        # The node serves https only, with its own certificate (not the head's).
        node_url = ready_nodes()[0]["url"]
        with pytest.raises(OSError):  # a plain-http request gets no answer
            urllib.request.urlopen(node_url.replace("https://", "http://") + "/health", timeout=30)
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(node_url + "/health", timeout=30, context=context)
    finally:
        nodes.stop()
        head.stop()


def test_nodes_other_machines_can_reach_steal_over_https_even_behind_an_http_head(tmp_path):
    """A laptop's head serves http (its cloud nodes reach it through SSH tunnels); the nodes' own
    transfers cross the cloud's network, so a node bound beyond loopback serves https with a
    certificate of its own, which the head hands thieves to pin."""
    head = start_head(tmp_path / "config", local_nodes=0)
    nodes = Nodes(head, tmp_path)
    reachable = ("--host", "0.0.0.0", "--advertise-host", "127.0.0.1")  # bound wide, dialled on loopback here
    try:
        assert head.url.startswith("http://")
        nodes.join("node-a", *reachable)

        def ready_nodes() -> list[dict]:
            return _ready_nodes(head)

        wait_until(lambda: len(ready_nodes()) == 1, timeout=120, what="node-a joined")
        _run_while_node_b_joins(head.client(), nodes, tmp_path, *reachable)
        assert all(n["url"].startswith("https://127.0.0.1:") for n in ready_nodes())
        assert "stole" in nodes.log("node-b") and "gave" in nodes.log("node-a"), nodes.log("node-b")
        with pytest.raises(OSError):  # a plain-http request gets no answer
            urllib.request.urlopen(ready_nodes()[0]["url"].replace("https://", "http://") + "/health", timeout=30)
    finally:
        nodes.stop()
        head.stop()
