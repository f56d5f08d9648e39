"""History: jobs, failed calls, call output and node events, kept in SQLite by the head."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from tests.support import functions
from tests.support.helpers import get_json


def _status_of(head, path: str) -> tuple[int, dict]:
    try:
        return 200, get_json(head, path)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _last_job(head, function_name: str) -> dict:
    return next(j for j in get_json(head, "/v1/jobs?limit=50")["jobs"] if j["function_name"] == function_name)


def test_jobs_failures_and_output_are_recorded(cluster, client):
    client.remote_parallel_map(functions.fail_on, range(5), raise_errors=False, spinner=False)
    job = _last_job(cluster, "fail_on")
    assert job["status"] == "COMPLETED" and job["n_done"] == 5 and job["n_failed"] == 1
    assert job["arguments"]["raise_errors"] is False
    failures = get_json(cluster, f"/v1/jobs/{job['job_id']}/failures")["failures"]
    assert [f["input_index"] for f in failures] == [3]
    assert failures[0]["exception_type"].endswith("ValueError") and "input 3 is bad" in failures[0]["traceback"]


def test_each_calls_output_is_kept(cluster, client):
    client.remote_parallel_map(functions.chatty, [7, 8], spinner=False)
    job = _last_job(cluster, "chatty")
    output = get_json(cluster, f"/v1/jobs/{job['job_id']}/calls/1/output")["output"]
    text = "".join(row["text"] for row in output)
    assert "stdout line from 8" in text and "stderr line from 8" in text and "from 7" not in text


def test_node_events_are_kept(cluster):
    node_id = get_json(cluster, "/v1/cluster")["nodes"][0]["node_id"]
    events = get_json(cluster, f"/v1/nodes/{node_id}/events")["events"]
    assert "registered" in [e["event"] for e in events]


def test_listing_filters_by_status(cluster, client):
    client.remote_parallel_map(functions.double, [1], spinner=False)
    jobs = get_json(cluster, "/v1/jobs?status=completed&limit=5")["jobs"]
    assert jobs and all(j["status"] == "COMPLETED" for j in jobs) and len(jobs) <= 5


@pytest.mark.parametrize(
    "path, status, words",
    [
        ("/v1/jobs?limit=abc", 400, "integer"),
        ("/v1/jobs?limit=0", 400, "between"),
        ("/v1/jobs?status=DONE", 400, "status must be one of"),
        ("/v1/jobs/nope", 404, "no job 'nope'"),
        ("/v1/jobs/nope/failures", 404, "no job"),
        ("/v1/jobs/nope/calls/0/output", 404, "no job"),
        ("/v1/nodes/nope/events", 404, "no node"),
    ],
)
def test_bad_queries_are_4xx_with_a_message(cluster, path, status, words):
    code, body = _status_of(cluster, path)
    assert code == status and words in body["message"]


def test_output_index_out_of_range(cluster, client):
    client.remote_parallel_map(functions.double, [1, 2], spinner=False)
    job = _last_job(cluster, "double")
    code, body = _status_of(cluster, f"/v1/jobs/{job['job_id']}/calls/9/output")
    assert code == 400 and "0..1" in body["message"]


def test_counts_are_current_while_a_job_runs(cluster, client):
    stream = client.remote_parallel_map(functions.sleep_then_return, [(i, 0.3) for i in range(6)], generator=True,
                                        spinner=False)
    first = next(stream)
    deadline = time.monotonic() + 30
    while True:
        job = _last_job(cluster, "sleep_then_return")
        if job["status"] == "RUNNING" and job["n_done"] >= 1:
            break
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    assert sorted([first, *stream]) == list(range(6))
