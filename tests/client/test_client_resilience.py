"""Clients that lose their connection, vanish, or come back later for a detached job's results."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import aiohttp
import pytest

from burla import JobNotFound
from burla.protocol import wire
from burla.protocol.values.inline_values import VALUE
from burla.protocol.values.packed_inputs import PackedInputs
from burla.protocol.values.serialization import dumps, dumps_function
from tests.conftest import REPO, own_head
from tests.security.test_security_and_bad_input import open_job
from tests.support import functions
from tests.support.helpers import PRELUDE, get_json, result_value, start_detached, wait_until
from tests.support.proxy import CuttableProxy


@pytest.fixture
def quick_head(tmp_path):
    """A head that gives a vanished client one second to come back."""
    with own_head(tmp_path, extra=["--client-deadline", "1"]) as head:
        yield head


def test_client_resumes_after_the_connection_is_cut(cluster, tmp_path):
    parsed = urllib.parse.urlsplit(cluster.url)
    proxy = CuttableProxy(parsed.hostname, parsed.port)
    client = cluster.client(head_url=proxy.url)
    out = tmp_path / "calls"
    out.mkdir()
    try:
        stream = client.remote_parallel_map(
            functions.record_interval, [(str(out), i, 0.1) for i in range(30)], generator=True, spinner=False
        )
        results = [next(stream)]
        proxy.cut()  # a network outage of about a second
        time.sleep(1.0)
        proxy.restore()
        results.extend(stream)
    finally:
        proxy.close()
    assert sorted(results) == list(range(30))  # every result exactly once
    assert proxy.connections >= 2  # it really reconnected


def test_a_job_canceled_while_it_connects_never_opens(cluster, monkeypatch):
    parsed = urllib.parse.urlsplit(cluster.url)
    proxy = CuttableProxy(parsed.hostname, parsed.port)
    client = cluster.client(head_url=proxy.url)

    def ctrl_c_while_connecting(event, runner, cancel_on_interrupt=True):  # what _wait does on Ctrl-C
        time.sleep(0.3)
        runner.cancel("Ctrl-C in the client")
        raise KeyboardInterrupt

    jobs_before = len(get_json(cluster, "/v1/cluster")["jobs"])
    monkeypatch.setattr("burla.client.session._wait", ctrl_c_while_connecting)
    proxy.hold()  # the head is slow to answer the connection
    try:
        with pytest.raises(KeyboardInterrupt):
            client.remote_parallel_map(functions.double, [1, 2], spinner=False)
        proxy.release()
        wait_until(lambda: proxy.connections >= 1, what="the job's connection went through")
        time.sleep(1.0)  # time for a job it would (wrongly) open to show
    finally:
        proxy.close()
    assert len(get_json(cluster, "/v1/cluster")["jobs"]) == jobs_before


def test_outage_during_upload_resends_only_what_was_lost(cluster):
    parsed = urllib.parse.urlsplit(cluster.url)
    proxy = CuttableProxy(parsed.hostname, parsed.port)
    client = cluster.client(head_url=proxy.url)
    try:
        stream = client.remote_parallel_map(functions.double, range(20_000), generator=True, spinner=False)
        first = next(stream)
        proxy.cut()
        time.sleep(0.5)
        proxy.restore()
        results = [first, *stream]
    finally:
        proxy.close()
    assert sorted(results) == [x * 2 for x in range(20_000)]


def test_vanished_client_gets_its_job_cancelled_after_the_deadline(quick_head):
    script = PRELUDE + "remote_parallel_map(functions.sleep_then_return, [(i, 60) for i in range(4)], spinner=False)\n"
    client = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env={**os.environ, **quick_head.env()})
    try:
        wait_until(lambda: any(j["running"] for j in get_json(quick_head, "/v1/cluster")["jobs"]), what="job running")
    finally:
        client.send_signal(signal.SIGKILL)
        client.wait()
    wait_until(lambda: get_json(quick_head, "/v1/cluster")["jobs"][0]["status"] == "CANCELED", what="job canceled")
    job = get_json(quick_head, "/v1/cluster")["jobs"][0]
    assert "did not come back" in job["reason"]
    # The node is free again: a new job runs right away.
    assert quick_head.client().remote_parallel_map(functions.double, [1, 2], spinner=False) == [2, 4]


def test_detached_results_are_kept_until_collected(cluster, client):
    job_id = start_detached("remote_parallel_map(functions.fail_on, range(6), detach=True, raise_errors=False, "
                            "spinner=False)", cluster.env())
    results = client.get_results(job_id, raise_errors=False, spinner=False)
    assert [r for i, r in enumerate(results) if i != 3] == [0, 1, 2, 4, 5]
    assert isinstance(results[3], ValueError) and results[3].burla_input_index == 3
    with pytest.raises(JobNotFound, match="already collected"):
        client.get_results(job_id, spinner=False)


def test_get_results_of_an_unknown_job(client):
    with pytest.raises(JobNotFound, match="no-such-job"):
        client.get_results("no-such-job", spinner=False)


def test_jobs_in_a_row_share_one_connection(cluster):
    parsed = urllib.parse.urlsplit(cluster.url)
    proxy = CuttableProxy(parsed.hostname, parsed.port)
    client = cluster.client(head_url=proxy.url)
    try:
        for round_ in range(5):
            inputs = list(range(round_ * 10, round_ * 10 + 1 + round_ * 20))
            assert client.remote_parallel_map(functions.double, inputs, spinner=False) == [2 * x for x in inputs]
        with pytest.raises(ValueError):  # a failed call with every result in: the connection is kept
            # (one input: with several, another's result may still be on its way when it raises)
            client.remote_parallel_map(functions.fail_on, [3], spinner=False)
        # A caller that leaves mid-job closes its connection; the next job opens another.
        stream = client.remote_parallel_map(functions.pause_then_double, [(i, 0.5) for i in range(20)],
                                            generator=True, spinner=False)
        next(stream)
        stream.close()
        assert client.remote_parallel_map(functions.double, [7], spinner=False) == [14]
    finally:
        proxy.close()
    assert proxy.connections == 2


def test_a_kept_connection_that_went_silent_is_replaced(cluster):
    parsed = urllib.parse.urlsplit(cluster.url)
    proxy = CuttableProxy(parsed.hostname, parsed.port)
    client = cluster.client(head_url=proxy.url)
    jobs_before = {job["job_id"] for job in get_json(cluster, "/v1/cluster")["jobs"]}

    def statuses() -> list[str]:
        return [job["status"] for job in get_json(cluster, "/v1/cluster")["jobs"] if job["job_id"] not in jobs_before]

    try:
        assert client.remote_parallel_map(functions.double, [1], spinner=False) == [2]
        wait_until(lambda: statuses() == ["COMPLETED"], what="the head has the job's last acknowledgement")
        proxy.stall()  # the kept connection is still open but leads nowhere
        assert client.remote_parallel_map(functions.double, [2, 3], spinner=False) == [4, 6]
        # The opening sent into the silence never made a job; the one sent again did.
        wait_until(lambda: statuses() == ["COMPLETED", "COMPLETED"], what="both jobs completed")
    finally:
        proxy.close()
    assert proxy.connections == 2


def test_an_opening_on_a_connection_leaves_the_job_it_carried(quick_head):
    """A client opens its next job on the connection of the last one; if that job still runs,
    the client is gone from it as if it had closed the connection."""
    long_job = open_job(function_bytes=dumps_function(functions.sleep_then_return))
    short_job = open_job(n_inputs=1, function_bytes=dumps_function(functions.double))

    async def both_on_one_connection() -> list:
        async with aiohttp.ClientSession(headers=quick_head.headers()) as session:
            async with session.ws_connect(quick_head.url + "/v1/jobs/ws") as ws:
                await ws.send_bytes(long_job.encode())
                inputs = [[0, dumps((0, 60))], [1, dumps((1, 60))]]
                await ws.send_bytes(wire.InputBatch.of(long_job.job_id, PackedInputs.of(inputs)).encode())
                assert isinstance(wire.decode((await ws.receive()).data), wire.JobAccepted)
                await ws.send_bytes(short_job.encode())
                await ws.send_bytes(wire.InputBatch.of(short_job.job_id, PackedInputs.of([[0, dumps(21)]])).encode())
                while True:
                    msg = wire.decode((await asyncio.wait_for(ws.receive(), 60)).data)
                    if isinstance(msg, wire.ResultBatch) and msg.job_id == short_job.job_id:
                        await ws.send_bytes(wire.ResultAck(short_job.job_id, msg.seq).encode())
                        return msg.items

    [[index, ok, payload]] = asyncio.run(both_on_one_connection())
    assert (index, ok, result_value(ok, payload)) == (0, VALUE, 42)
    wait_until(lambda: get_json(quick_head, f"/v1/jobs/{long_job.job_id}")["status"] == "CANCELED",
               what="the job left behind canceled")
    assert "did not come back" in get_json(quick_head, f"/v1/jobs/{long_job.job_id}")["reason"]
    assert get_json(quick_head, f"/v1/jobs/{short_job.job_id}")["status"] == "COMPLETED"
