"""Nested jobs: a call that runs remote_parallel_map reaches the same cluster, never deadlocks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

from tests.conftest import REPO
from tests.support import functions
from tests.support.helpers import PRELUDE, wait_until


def _jobs(head) -> list[dict]:
    request = urllib.request.Request(f"{head.url}/v1/cluster", headers=head.headers())
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)["jobs"]



def test_nested_job_runs_on_the_same_cluster_and_records_its_parent(cluster, client):
    assert client.remote_parallel_map(functions.nested_sum, [3], spinner=False) == [6]
    jobs = _jobs(cluster)
    child, parent = jobs[0], jobs[1]
    assert parent["function_name"] == "nested_sum" and child["function_name"] == "double"
    assert child["parent_job_id"] == parent["job_id"]


def test_parents_holding_every_slot_do_not_deadlock(client):
    # Two workers, four parents: without lending slots, the children could never run.
    assert client.remote_parallel_map(functions.nested_sum, [2, 3, 4, 5], spinner=False) == [2, 6, 12, 20]


def test_a_pipeline_of_two_stages_in_one_parent_job(client):
    words = ["a", "bb", "ccc"]
    assert client.remote_parallel_map(functions.two_stage_pipeline, [(words,)], spinner=False) == [[2, 4, 6]]


def test_the_guides_detached_pipeline_gives_its_answer(client, capsys):
    # The user guide's own example: `remote_parallel_map(pipeline, [(samples,)], detach=True)[0]`.
    # Fails on the previous code: detach=True returned the job id, and [0] its first letter.
    samples = ["ab", "cde"]
    assert client.remote_parallel_map(functions.two_stage_pipeline, [(samples,)], detach=True, spinner=False)[0] \
        == [4, 6]
    assert "Done uploading inputs!" in capsys.readouterr().err


def test_canceling_a_parent_cancels_its_children(cluster, client):
    script = PRELUDE + "remote_parallel_map(functions.nested_sleepers, [0])\n"
    process = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=dict(os.environ, **cluster.env()),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: any(j["parent_job_id"] and j["running"] for j in _jobs(cluster)), what="child running")
        parent = next(j for j in _jobs(cluster) if j["function_name"] == "nested_sleepers")
        request = urllib.request.Request(f"{cluster.url}/v1/jobs/{parent['job_id']}/cancel", method="POST",
                                         headers=cluster.headers())
        urllib.request.urlopen(request, timeout=10).close()
        child = next(j for j in _jobs(cluster) if j["parent_job_id"] == parent["job_id"])
        assert child["status"] == "CANCELED" and "parent" in child["reason"]
    finally:
        process.wait(60)
    # Every slot is free again.
    wait_until(lambda: not any(j["running"] for j in _jobs(cluster)), what="calls stopped")
    assert client.remote_parallel_map(functions.double, [1, 2], spinner=False) == [2, 4]
