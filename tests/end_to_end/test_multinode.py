"""Jobs on a cluster of several nodes: by default a 3-node cluster started here, or the one
tests.cluster_runner started (`tox -e cluster`)."""

from __future__ import annotations

import os
import tempfile
import urllib.request
from pathlib import Path

import pytest

from burla.client.api import Client
from burla.config import ENV_CONFIG_DIR, ENV_HEAD_URL, ENV_TOKEN, ClientSettings
from tests.cluster_runner import LocalCluster
from tests.support import functions
from tests.support.helpers import wait_until

pytestmark = pytest.mark.cluster


class External:
    """The cluster tests.cluster_runner started around this pytest run."""

    def __init__(self) -> None:
        self.url = os.environ[ENV_HEAD_URL]
        self.token = os.environ[ENV_TOKEN]
        self.config_dir = Path(os.environ[ENV_CONFIG_DIR])

    def client(self) -> Client:
        return Client(settings=ClientSettings(config_dir=self.config_dir, head_url=self.url, token=self.token,
                                              parent_job_id=None))

    def get(self, path: str) -> dict:
        import json

        request = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)


@pytest.fixture(scope="module")
def multinode():
    if os.environ.get("BURLA_TEST_CLUSTER") == "1":
        yield External()
        return
    with tempfile.TemporaryDirectory(prefix="burla-multinode-") as directory:
        with LocalCluster(Path(directory), nodes=3, workers=1) as cluster:
            yield cluster


def test_every_node_runs_calls_and_results_stay_in_order(multinode):
    n_nodes = len(multinode.get("/v1/cluster")["nodes"])
    results = multinode.client().remote_parallel_map(functions.sleep_then_return, [(i, 0.05) for i in range(120)],
                                                     spinner=False)
    assert results == list(range(120))
    job = multinode.get("/v1/cluster")["jobs"][0]
    assert len(job["nodes"]) == n_nodes


def test_many_instant_calls_over_several_nodes_all_come_back(multinode):
    # Nodes grant credit for thousands of instant calls at once; at the job's tail each credit
    # takes a share of what is left. Credit the head kept back used to sit there with inputs
    # still queued and nobody asking again: the job hung with a few inputs never run.
    client = multinode.client()
    for _ in range(3):
        results = client.remote_parallel_map(functions.double, range(10_000), spinner=False)
        assert results == [2 * i for i in range(10_000)]


def test_max_parallelism_holds_across_nodes(multinode, tmp_path):
    multinode.client().remote_parallel_map(functions.record_interval, [(str(tmp_path), i, 0.3) for i in range(6)],
                                           max_parallelism=2, spinner=False)
    assert functions.max_overlap(tmp_path) <= 2


def test_nested_fan_out_across_nodes(multinode):
    assert multinode.client().remote_parallel_map(functions.nested_sum, [3, 4, 5, 6], spinner=False) == [6, 12, 20, 30]


def test_cancel_stops_running_calls_on_every_node(multinode, tmp_path):
    client = multinode.client()
    stream = client.remote_parallel_map(functions.sleep_then_return, [(i, 60) for i in range(6)], generator=True,
                                        spinner=False)
    try:
        wait_until(lambda: sum(j["running"] for j in multinode.get("/v1/cluster")["jobs"]) >= 2, what="calls running")
        job_id = multinode.get("/v1/cluster")["jobs"][0]["job_id"]
        request = urllib.request.Request(f"{multinode.url}/v1/jobs/{job_id}/cancel", method="POST",
                                         headers={"Authorization": f"Bearer {multinode.token}"})
        urllib.request.urlopen(request, timeout=10).close()
        # Every node stops the calls (they would sleep a minute) and is free for the next job.
        wait_until(lambda: not any(n["jobs"] for n in multinode.get("/v1/cluster")["nodes"]), timeout=30,
                    what="calls stopped on every node")
    finally:
        stream.close()
    assert client.remote_parallel_map(functions.double, range(6), spinner=False) == [0, 2, 4, 6, 8, 10]
