"""A frozen node is declared dead and its inputs rerun elsewhere; detached jobs outlive their client."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3

import aiohttp
import psutil
import pytest

from burla import DetachRequiresDeployedCluster
from burla.protocol import wire
from burla.protocol.values.packed_inputs import PackedInputs
from tests.conftest import own_head, start_head, wait_for_nodes
from tests.support import functions
from tests.support.helpers import get_json, post_json, start_detached, wait_until


def _node_processes(head) -> list[psutil.Process]:
    """The head's local nodes: its children (forked from it, or started as `burla node join`)."""
    return psutil.Process(head.process.pid).children()


@pytest.fixture
def two_node_head(tmp_path):
    with own_head(tmp_path, local_nodes=2, workers=1, extra=["--node-deadline", "3"]) as head:
        try:
            yield head
        finally:
            for process in _node_processes(head):
                process.send_signal(signal.SIGCONT)


def test_frozen_node_is_declared_dead_and_its_inputs_rerun(two_node_head, tmp_path):
    head = two_node_head
    out = tmp_path / "calls"
    out.mkdir()
    client = head.client()
    stream = client.remote_parallel_map(
        functions.record_interval, [(str(out), i, 0.3) for i in range(12)], generator=True, spinner=False
    )
    first = next(stream)  # the job is running on both nodes
    frozen = _node_processes(head)[0]
    frozen.send_signal(signal.SIGSTOP)
    rest = list(stream)
    assert sorted([first, *rest]) == list(range(12))  # every input exactly once
    assert "silent for" in head.log()
    assert len(get_json(head, "/v1/cluster")["nodes"]) == 1
    # Thawed, the node comes back by itself and serves the next job.
    frozen.send_signal(signal.SIGCONT)
    wait_until(lambda: len(get_json(head, "/v1/cluster")["nodes"]) == 2, what="node re-registered")
    assert client.remote_parallel_map(functions.double, range(10), spinner=False) == [x * 2 for x in range(10)]


def test_losing_the_only_node_fails_the_job_clearly(tmp_path):
    head = start_head(tmp_path / "config", local_nodes=1, workers=1)
    try:
        wait_for_nodes(head, 1)
        stream = head.client().remote_parallel_map(functions.sleep_then_return, [(i, 0.5) for i in range(6)],
                                                   generator=True, spinner=False)
        next(stream)
        [node_id] = [node["node_id"] for node in get_json(head, "/v1/cluster")["nodes"]]
        for process in _node_processes(head):
            os.killpg(process.pid, signal.SIGKILL)
        from burla import NodeDisconnected

        with pytest.raises(NodeDisconnected, match="inputs have no result"):
            list(stream)
        # A node that ran and died was lost; it did not fail to boot (the previous code said so).
        wait_until(lambda: "lost" in _events(head, node_id), what="the node recorded as lost")
        assert "failed to boot" not in _events(head, node_id)
    finally:
        head.stop()


def _events(head, node_id: str) -> list[str]:
    return [event["event"] for event in get_json(head, f"/v1/nodes/{node_id}/events")["events"]]


def test_detached_job_runs_on_after_its_client_exits(cluster, tmp_path):
    out = tmp_path / "calls"
    out.mkdir()
    # The client is killed the moment it says its inputs are up.
    job_id = start_detached(f"remote_parallel_map(functions.record_interval, [({str(out)!r}, i, 0.5) "
                            "for i in range(4)], detach=True, spinner=False)", cluster.env())
    wait_until(lambda: get_json(cluster, f"/v1/jobs/{job_id}")["status"] == "COMPLETED", what="detached job done")
    assert sorted(p.name for p in out.iterdir()) == [f"{i}.txt" for i in range(4)]


def test_detach_needs_a_head_that_outlives_the_client(embedded_client):
    with pytest.raises(DetachRequiresDeployedCluster, match="get_cluster_dashboard_url"):
        embedded_client.remote_parallel_map(functions.double, [1], detach=True)


def test_idle_nodes_are_removed_and_come_back_for_the_next_job(tmp_path):
    head = start_head(tmp_path / "config", local_nodes=1, workers=1, extra=["--inactivity-timeout", "1"])
    try:
        wait_for_nodes(head, 1)
        first = _node_processes(head)[0]
        wait_until(lambda: not get_json(head, "/v1/cluster")["nodes"], what="idle node removed")
        first.wait(30)  # the driver stopped its process
        # The next job starts the local node again and runs.
        assert head.client().remote_parallel_map(functions.double, [4], spinner=False) == [8]
        assert "idle for" in head.log()
    finally:
        head.stop()


def test_a_detaching_client_leaves_only_once_its_inputs_are_saved(tmp_path):
    # Fails on the previous code: the client left as soon as its last input was sent, before the
    # head had written it to history (a head crash in between lost it).
    from burla.protocol.values.serialization import dumps, dumps_function
    from tests.security.test_security_and_bad_input import open_job

    n = 5
    spec = open_job(n_inputs=n, detach=True, function_bytes=dumps_function(functions.sleep_then_return))
    items = [[i, dumps((i, 120))] for i in range(n)]

    async def detach() -> int:
        async with aiohttp.ClientSession(headers=head.headers()) as session:
            async with session.ws_connect(head.url + "/v1/jobs/ws") as ws:
                await ws.send_bytes(spec.encode())
                assert isinstance(wire.decode((await ws.receive()).data), wire.JobAccepted)
                await ws.send_bytes(wire.InputBatch.of(spec.job_id, PackedInputs.of(items[:2])).encode())
                await ws.send_bytes(wire.InputBatch.of(spec.job_id, PackedInputs.of(items[2:])).encode())
                while True:
                    msg = wire.decode((await asyncio.wait_for(ws.receive(), 60)).data)
                    if isinstance(msg, wire.InputsKept):
                        # Saved means committed: another connection to the database sees them.
                        with sqlite3.connect(head.config_dir / "history.db") as raw:
                            return raw.execute("SELECT count(*) FROM kept_inputs WHERE job_id = ?",
                                               (spec.job_id,)).fetchone()[0]

    with own_head(tmp_path) as head:
        assert asyncio.run(detach()) == n
        assert get_json(head, f"/v1/jobs/{spec.job_id}")["status"] == "RUNNING"  # it runs on without its client


def test_a_detached_job_that_ended_with_nothing_to_collect_is_not_taken_up_again(tmp_path):
    # Fails on the previous code: every new head took the cancelled job up again (and logged it).
    config_dir = tmp_path / "config"
    head = start_head(config_dir, local_nodes=1, workers=1)
    try:
        wait_for_nodes(head, 1)
        job_id = start_detached("remote_parallel_map(functions.sleep_then_return, [(i, 60) for i in range(2)], "
                                "detach=True, spinner=False)", head.env())
        post_json(head, f"/v1/jobs/{job_id}/cancel", {})
        wait_until(lambda: get_json(head, f"/v1/jobs/{job_id}")["status"] == "CANCELED", what="job canceled")
    finally:
        head.stop()
    again = start_head(config_dir, local_nodes=1, workers=1)
    try:
        wait_for_nodes(again, 1)
        assert job_id not in again.log()
        assert get_json(again, f"/v1/jobs/{job_id}")["status"] == "CANCELED"  # still in history, as it ended
    finally:
        again.stop()
