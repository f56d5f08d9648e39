"""Large inputs and results on the path between machines (a node that does not share the client's
input files, so every byte crosses the head and the node in bulk frames): they arrive intact in
every size around the thresholds, a node lost with large inputs in flight loses none of them, a
detached job's large inputs survive its client, and a node whose head stops taking results holds
a window of them, not all its workers make."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import threading
import time

import psutil
import pytest

from burla.protocol.framing import BULK_MIN_BYTES
from burla.web.ws_bulk import LARGE_FRAME
from tests.cluster_runner import LocalCluster
from tests.support import functions
from tests.support.helpers import get_json, start_detached, wait_until


def _inline_cluster(tmp_path, nodes: int, workers: int = 2, node_deadline_s: int = 3) -> LocalCluster:
    """A cluster whose nodes have input-file directories of their own: inputs travel inline."""
    cluster = LocalCluster(tmp_path / "cluster", nodes=0, workers=workers,
                           head_args=["--node-deadline", str(node_deadline_s)])
    cluster.__enter__()
    for i in range(nodes):
        cluster.add_node(f"node-{i}", env={"BURLA_INPUT_FILES_DIR": str(tmp_path / f"machine-{i}")})
    cluster.wait_for_nodes(nodes)
    return cluster


def _expected(data: bytes) -> tuple[str, bytes]:
    return hashlib.sha256(data).hexdigest(), data[::-1]


def test_payloads_of_every_size_cross_every_hop_intact(tmp_path):
    rng = random.Random(7)
    sizes = [0, 1, BULK_MIN_BYTES - 1, BULK_MIN_BYTES, LARGE_FRAME + 1, 300_000, 3 * 2**20 + 5, 9 * 2**20, 17]
    inputs = [rng.randbytes(size) for size in sizes]
    cluster = _inline_cluster(tmp_path, nodes=1)
    try:
        results = cluster.client().remote_parallel_map(functions.reversed_with_digest, inputs, spinner=False)
        seen = cluster.client().remote_parallel_map(functions.input_files_seen, inputs[5:7], spinner=False)
    finally:
        cluster.stop()
    assert results == [_expected(data) for data in inputs]
    assert all(files is None for _, _, files in seen)  # they went inline, not by file


def test_a_node_lost_with_large_inputs_in_flight_loses_none(tmp_path):
    inputs = [bytes([i]) * (2 * 2**20 + i) for i in range(16)]
    cluster = _inline_cluster(tmp_path, nodes=2, workers=1)
    try:
        outcome: list = []
        job = threading.Thread(target=lambda: outcome.append(cluster.client().remote_parallel_map(
            functions.reversed_with_digest, [(data, 0.3) for data in inputs], spinner=False)))
        job.start()

        def two_calls_done() -> bool:
            running = [j for j in get_json(cluster, "/v1/jobs")["jobs"] if j["status"] == "RUNNING"]
            return bool(running) and running[0]["n_done"] >= 2

        wait_until(two_calls_done, timeout=120, what="two calls done")
        cluster.signal_node("node-1", signal.SIGKILL)  # its inputs in flight are views of the client's frames
        job.join(240)
        assert not job.is_alive(), "the job did not end after its node was lost"
    finally:
        cluster.stop()
    assert outcome == [[_expected(data) for data in inputs]]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs a head that outlives the client")
def test_a_detached_jobs_large_inputs_outlive_its_client(tmp_path):
    cluster = _inline_cluster(tmp_path, nodes=1)
    try:
        call = ("remote_parallel_map(functions.reversed_with_digest, "
                "[bytes([i]) * (1_000_000 + i) for i in range(6)], detach=True, spinner=False)")
        job_id = start_detached(call, cluster.env())
        wait_until(lambda: get_json(cluster, f"/v1/jobs/{job_id}")["status"] == "COMPLETED", timeout=120,
                   what="the detached job done")
        results = cluster.client().get_results(job_id, spinner=False)
    finally:
        cluster.stop()
    assert results == [_expected(bytes([i]) * (1_000_000 + i)) for i in range(6)]


def test_a_node_holds_a_window_of_results_while_its_head_is_stopped(tmp_path):
    """60 results of 8 MB (480 MB) while the head is stopped: the node stops reading its workers
    once it holds its window (node/result_window.py), so its memory grows by far less than the
    results its workers could make meanwhile; when the head goes on, every result arrives, none
    stopped by its call timeout while it waited."""
    size, count = 8 * 2**20, 60
    cluster = _inline_cluster(tmp_path, nodes=1, node_deadline_s=120)  # a stopped head declares nobody dead
    node = psutil.Process(cluster.nodes["node-0"].pid)
    try:
        cluster.client().remote_parallel_map(functions.large_result, [(0, size)] * 2, spinner=False)  # workers warm
        baseline = node.memory_info().rss
        outcome: list = []
        # A call timeout shorter than the stop: a worker whose report waits on the window is not
        # running a call, and must not be stopped for it.
        # Results through the head (straight to the client, they would not wait on it).
        job = threading.Thread(target=lambda: outcome.append(cluster.client(direct_results=False).remote_parallel_map(
            functions.large_result, [(i, size) for i in range(count)], spinner=False, timeout=1.0)))
        job.start()

        def one_done() -> bool:
            running = [j for j in get_json(cluster, "/v1/jobs")["jobs"] if j["status"] == "RUNNING"]
            return bool(running) and running[0]["n_done"] >= 1

        wait_until(one_done, timeout=120, what="a result back")
        os.kill(cluster.head.pid, signal.SIGSTOP)
        peak = baseline
        try:
            # Long enough for the workers to make every result twice over (about 20 ms each here).
            until = time.monotonic() + 3.0
            while time.monotonic() < until:
                peak = max(peak, node.memory_info().rss)
                time.sleep(0.02)
        finally:
            os.kill(cluster.head.pid, signal.SIGCONT)
        job.join(240)
        assert not job.is_alive(), "the job did not end after its head went on"
    finally:
        cluster.stop()
    assert len(outcome) == 1 and [(len(r), r[:1]) for r in outcome[0]] == [(size, bytes([i])) for i in range(count)]
    assert peak - baseline < 200 * 2**20, f"the node grew by {(peak - baseline) / 2**20:.0f} MB"
