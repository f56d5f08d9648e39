"""Clients that lose their connection, vanish, or come back later for a detached job's results."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from burla import JobCanceled, JobNotFound, get_results, remote_parallel_map
from burla.config import ENV_HEAD_URL, ENV_TOKEN
from tests import functions
from tests.conftest import REPO, own_head
from tests.helpers import PRELUDE, get_json, wait_until
from tests.proxy import CuttableProxy


@pytest.fixture
def quick_head(tmp_path, monkeypatch):
    """A head that gives a vanished client one second to come back."""
    with own_head(tmp_path, monkeypatch, extra=["--client-deadline", "1"]) as head:
        yield head


def test_client_resumes_after_the_connection_is_cut(cluster, tmp_path, monkeypatch):
    parsed = urllib.parse.urlsplit(cluster.url)
    proxy = CuttableProxy(parsed.hostname, parsed.port)
    monkeypatch.setenv(ENV_HEAD_URL, proxy.url)
    out = tmp_path / "calls"
    out.mkdir()
    try:
        stream = remote_parallel_map(
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
    monkeypatch.setenv(ENV_HEAD_URL, proxy.url)

    def ctrl_c_while_connecting(event, runner):  # what _wait does on KeyboardInterrupt
        time.sleep(0.3)
        runner.cancel("Ctrl-C in the client")
        raise JobCanceled(f"job {runner.job_id} canceled by Ctrl-C")

    jobs_before = len(get_json(cluster, "/v1/cluster")["jobs"])
    monkeypatch.setattr("burla.client._wait", ctrl_c_while_connecting)
    proxy.hold()  # the head is slow to answer the connection
    try:
        with pytest.raises(JobCanceled):
            remote_parallel_map(functions.double, [1, 2], spinner=False)
        proxy.release()
        wait_until(lambda: proxy.connections >= 1, what="the job's connection went through")
        time.sleep(1.0)  # time for a job it would (wrongly) open to show
    finally:
        proxy.close()
    assert len(get_json(cluster, "/v1/cluster")["jobs"]) == jobs_before


def test_outage_during_upload_resends_only_what_was_lost(cluster, monkeypatch):
    parsed = urllib.parse.urlsplit(cluster.url)
    proxy = CuttableProxy(parsed.hostname, parsed.port)
    monkeypatch.setenv(ENV_HEAD_URL, proxy.url)
    try:
        stream = remote_parallel_map(functions.double, range(20_000), generator=True, spinner=False)
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
    env = {ENV_HEAD_URL: quick_head.url, ENV_TOKEN: quick_head.token}
    client = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env={**__import__("os").environ, **env})
    try:
        wait_until(lambda: any(j["running"] for j in get_json(quick_head, "/v1/cluster")["jobs"]), what="job running")
    finally:
        client.send_signal(signal.SIGKILL)
        client.wait()
    wait_until(lambda: get_json(quick_head, "/v1/cluster")["jobs"][0]["status"] == "CANCELED", what="job canceled")
    job = get_json(quick_head, "/v1/cluster")["jobs"][0]
    assert "did not come back" in job["reason"]
    # The node is free again: a new job runs right away.
    assert remote_parallel_map(functions.double, [1, 2], spinner=False) == [2, 4]


def test_detached_results_are_kept_until_collected(cluster):
    job_id = remote_parallel_map(functions.fail_on, range(6), detach=True, raise_errors=False, spinner=False)
    results = get_results(job_id, raise_errors=False, spinner=False)
    assert [r for i, r in enumerate(results) if i != 3] == [0, 1, 2, 4, 5]
    assert isinstance(results[3], ValueError) and results[3].burla_input_index == 3
    with pytest.raises(JobNotFound, match="already collected"):
        get_results(job_id, spinner=False)


def test_get_results_of_an_unknown_job(cluster):
    with pytest.raises(JobNotFound, match="no-such-job"):
        get_results("no-such-job", spinner=False)
