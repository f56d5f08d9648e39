"""Fault injection against real clusters: every input's result arrives exactly once, or the job
ends with a clear error. Each trial is counted in the fault ledger printed after the run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.parse

import psutil
import pytest

from burla.node.workers.fork_server import PROCESS_NAME as FORK_SERVER_NAME
from tests.cluster_runner import LocalCluster
from tests.conftest import REPO, record_fault_trial
from tests.support import functions
from tests.support.helpers import PRELUDE, start_detached, wait_until
from tests.support.proxy import CuttableProxy

pytestmark = pytest.mark.faults

INPUTS = 60
TRIALS = range(2)


def _stream(client, seconds: float = 0.05):
    inputs = [(i, seconds) for i in range(INPUTS)]
    return client.remote_parallel_map(functions.sleep_then_return, inputs, generator=True, spinner=False)


def _assert_exactly_once(delivered: list[int]) -> None:
    assert sorted(delivered) == list(range(INPUTS))


@pytest.mark.parametrize("trial", TRIALS)
def test_sigkill_a_node_mid_job(tmp_path, trial):
    with LocalCluster(tmp_path / "c", nodes=2, workers=2) as cluster:
        client = cluster.client()
        stream = _stream(client)
        delivered = [next(stream)]
        cluster.signal_node("node-0", signal.SIGKILL)
        delivered.extend(stream)
        record_fault_trial("SIGKILL a node mid-job", INPUTS, delivered)
        _assert_exactly_once(delivered)


@pytest.mark.parametrize("trial", TRIALS)
def test_sigstop_a_node_then_sigcont(tmp_path, trial):
    with LocalCluster(tmp_path / "c", nodes=2, workers=2, head_args=["--node-deadline", "3"]) as cluster:
        client = cluster.client()
        stream = _stream(client)
        delivered = [next(stream)]
        cluster.signal_node("node-0", signal.SIGSTOP)
        delivered.extend(stream)
        record_fault_trial("SIGSTOP a node (declared dead), then SIGCONT", INPUTS, delivered)
        _assert_exactly_once(delivered)
        cluster.signal_node("node-0", signal.SIGCONT)
        cluster.wait_for_nodes(2)  # it rejoins by itself
        assert client.remote_parallel_map(functions.double, range(8), spinner=False) == [x * 2 for x in range(8)]


@pytest.mark.parametrize("trial", TRIALS)
def test_kill_workers_mid_job(tmp_path, trial):
    with LocalCluster(tmp_path / "c", nodes=2, workers=2) as cluster:
        client = cluster.client()
        stream = _stream(client, 0.1)
        delivered = [next(stream)]
        for node_id in cluster.nodes:
            # Forked by the node or its fork server, or started as -m; the governor may have added some.
            workers = [p for p in psutil.Process(cluster.nodes[node_id].pid).children(recursive=True)
                       if p.name() != FORK_SERVER_NAME]
            assert len(workers) >= 2
            workers[0].kill()
        delivered.extend(stream)
        record_fault_trial("SIGKILL a worker on every node mid-job", INPUTS, delivered)
        _assert_exactly_once(delivered)


@pytest.mark.parametrize("trial", TRIALS)
def test_cut_the_client_connection(tmp_path, trial):
    with LocalCluster(tmp_path / "c", nodes=2, workers=2) as cluster:
        parsed = urllib.parse.urlsplit(cluster.url)
        proxy = CuttableProxy(parsed.hostname, parsed.port)
        client = cluster.client(head_url=proxy.url)
        try:
            stream = _stream(client)
            delivered = [next(stream)]
            proxy.cut()
            time.sleep(1.0)
            proxy.restore()
            delivered.extend(stream)
        finally:
            proxy.close()
        record_fault_trial("cut client<->head for a second", INPUTS, delivered)
        _assert_exactly_once(delivered)


@pytest.mark.parametrize("trial", TRIALS)
def test_kill_the_client(tmp_path, trial):
    with LocalCluster(tmp_path / "c", nodes=2, workers=2, head_args=["--client-deadline", "1"]) as cluster:
        script = PRELUDE + "remote_parallel_map(functions.sleep_then_return, [(i, 60) for i in range(8)])\n"
        client = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=dict(os.environ, **cluster.env()),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_until(lambda: any(j["running"] for j in cluster.get("/v1/cluster")["jobs"]), what="job running")
        finally:
            client.kill()
            client.wait()
        wait_until(lambda: cluster.get("/v1/cluster")["jobs"][0]["status"] == "CANCELED", what="job canceled")
        job = cluster.get("/v1/cluster")["jobs"][0]
        assert "did not come back" in job["reason"]
        record_fault_trial("SIGKILL the client (job canceled, nodes freed)", 8, None, job["reason"])
        # Its calls were stopped: a new job gets every slot at once.
        wait_until(lambda: not any(j["running"] for j in cluster.get("/v1/cluster")["jobs"]), what="calls stopped")


RESTARTS = [signal.SIGTERM, signal.SIGKILL, signal.SIGTERM, signal.SIGKILL, signal.SIGTERM]


@pytest.mark.parametrize("trial, how", list(enumerate(RESTARTS)), ids=lambda v: getattr(v, "name", str(v)))
def test_restart_the_head(tmp_path, trial, how):
    # Fails on the previous code: a running job was lost with the head's memory (JobFailed).
    with LocalCluster(tmp_path / "c", nodes=2, workers=2) as cluster:
        client = cluster.client()
        assert client.remote_parallel_map(functions.fail_on, range(5), raise_errors=False, spinner=False)[0] == 0
        finished = cluster.get("/v1/jobs")["jobs"][0]
        stream = _stream(client, 0.2)
        delivered = [next(stream)]
        running = cluster.get("/v1/jobs")["jobs"][0]
        cluster.stop_head(how)
        cluster.start_head()
        # The restarted head takes the job up from history; the client resumes it and the inputs
        # whose results it lacks run again: every result arrives, once.
        delivered += list(stream)
        _assert_exactly_once(delivered)
        record_fault_trial("restart the head mid-job (job completes)", INPUTS, delivered, how.name)
        # History survives: the finished job with its failure, the interrupted one completed.
        kept = cluster.get(f"/v1/jobs/{finished['job_id']}")
        assert kept["status"] == "COMPLETED" and kept["n_failed"] == 1
        assert cluster.get(f"/v1/jobs/{finished['job_id']}/failures")["failures"][0]["input_index"] == 3
        resumed = cluster.get(f"/v1/jobs/{running['job_id']}")
        assert resumed["status"] == "COMPLETED" and resumed["n_done"] == INPUTS, resumed
        assert resumed["started_at"] == running["started_at"]
        cluster.wait_for_nodes(2)  # nodes re-register by themselves
        assert client.remote_parallel_map(functions.double, range(8), spinner=False) == [x * 2 for x in range(8)]


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_nodes_keep_their_calls_through_a_head_restart(tmp_path, how):
    # Fails on the previous code: nodes dropped what they held when the head went away, and the
    # restarted head ran those inputs again. Now they keep running, report what they hold when
    # they register again, and the head adopts it: every input runs once.
    runs = tmp_path / "runs"
    runs.mkdir()
    n = 8  # 2 nodes x 2 workers run 4 at once and hold all 8 (each asks for twice its slots)
    with LocalCluster(tmp_path / "c", nodes=2, workers=2) as cluster:
        client = cluster.client()
        stream = client.remote_parallel_map(functions.count_runs, [(str(runs), i, 4.0) for i in range(n)],
                                            generator=True, spinner=False)
        wait_until(lambda: len(list(runs.iterdir())) >= 4, timeout=60, what="4 calls running")
        cluster.stop_head(how)
        cluster.start_head()
        delivered = list(stream)
        assert sorted(delivered) == list(range(n))
        counts = {i: (runs / f"{i}.runs").read_text().count("\n") for i in range(n)}
        assert counts == {i: 1 for i in range(n)}, counts
        record_fault_trial("restart the head under running calls (none runs again)", n, delivered, how.name)


@pytest.mark.parametrize("how, when", [(signal.SIGTERM, "running"), (signal.SIGKILL, "running"),
                                       (signal.SIGKILL, "detached")], ids=["sigterm", "sigkill", "sigkill-at-once"])
def test_restart_the_head_under_a_detached_job(tmp_path, how, when):
    # Fails on the previous code: a detached job's inputs lived only in the head's memory.
    with LocalCluster(tmp_path / "c", nodes=2, workers=2) as cluster:
        client = cluster.client()
        job_id = start_detached(f"remote_parallel_map(functions.sleep_then_return, [(i, 0.2) for i in "
                                f"range({INPUTS})], detach=True, spinner=False)", cluster.env())
        if when == "running":
            wait_until(lambda: cluster.get(f"/v1/jobs/{job_id}")["n_done"] >= 4, timeout=120, what="some results in")
        cluster.stop_head(how)  # "detached": the moment the client is gone, which it is only once inputs are saved
        cluster.start_head()
        # The restarted head takes the job up from history: kept results wait, kept inputs run.
        delivered = client.get_results(job_id, spinner=False)
        assert delivered == list(range(INPUTS))
        record_fault_trial("restart the head under a detached job", INPUTS, delivered, f"{how.name} {when}")
        assert cluster.get(f"/v1/jobs/{job_id}")["status"] == "COMPLETED"
