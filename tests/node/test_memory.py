"""Memory per call: func_ram is enforced; "dynamic" lowers parallelism before failing a call."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from burla import OutOfMemory
from tests.conftest import REPO, start_head, wait_for_nodes
from tests.support import functions


def test_a_call_past_its_func_ram_fails_clearly_and_the_node_survives(client):
    results = client.remote_parallel_map(functions.hog, [10, 700, 10], func_ram=0.25, raise_errors=False, spinner=False)
    assert results[0] == 10 and results[2] == 10
    error = results[1]
    assert isinstance(error, OutOfMemory) and error.burla_input_index == 1 and error.per_call
    assert "func_ram=0.25" in str(error)
    assert client.remote_parallel_map(functions.double, [1, 2, 3], spinner=False) == [2, 4, 6]


@pytest.fixture
def small_node(tmp_path):
    """A head and one two-worker node that may use only 0.7 GB for calls."""
    head = start_head(tmp_path / "config", local_nodes=0)
    log_path = tmp_path / "node.log"
    with open(log_path, "wb") as log:
        node = subprocess.Popen(
            [sys.executable, "-m", "burla", "node", "join", "--head", head.url, "--workers", "2",
             "--memory-limit-gb", "0.7"],
            env=dict(os.environ, **head.env()), stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
        )
    try:
        wait_for_nodes(head, 1)
        yield head, log_path
    finally:
        node.terminate()
        node.wait(15)
        head.stop()


def test_dynamic_memory_lowers_parallelism_and_reruns_the_input(small_node):
    head, log_path = small_node
    # Two at once need about 0.8 GB: over the budget together, fine alone.
    results = head.client().remote_parallel_map(functions.hog, [400, 400, 400], spinner=False)
    assert results == [400, 400, 400]
    assert "running 1 at a time" in log_path.read_text()


def test_dynamic_memory_fails_a_call_too_big_to_run_alone(small_node):
    head, log_path = small_node
    client = head.client()
    results = client.remote_parallel_map(functions.hog, [900, 5], raise_errors=False, spinner=False)
    assert results[1] == 5
    assert isinstance(results[0], OutOfMemory) and not results[0].per_call
    assert results[0].burla_input_index == 0
    # The node is back to two workers and serves the next job.
    assert client.remote_parallel_map(functions.double, [1, 2], spinner=False) == [2, 4]
