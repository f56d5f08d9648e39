"""Each call's record says when it started, how long it ran and on which worker: a worker keeps
one boundary per call and builds the records per report (`worker._timings_of`)."""

from __future__ import annotations

from array import array

from burla.node.workers.worker import _timings_of
from burla.protocol.values.packed_results import read_timings
from tests.support import functions
from tests.support.helpers import get_json, wait_until


def test_timings_are_built_from_the_calls_boundaries_report_by_report():
    marks = array("d", [1010.0, 1011.0, 1013.0, 1016.0])  # the first call's start, then each call's end
    assert read_timings(_timings_of(marks, 42, 2)) == [(1010.0, 1.0, 42), (1011.0, 2.0, 42)]
    assert list(marks) == [1013.0, 1016.0]  # the next report's first call starts where the last one ended
    assert read_timings(_timings_of(marks, 42, 1)) == [(1013.0, 3.0, 42)]
    assert list(marks) == [1016.0]


def test_each_calls_record_covers_its_call_and_a_workers_calls_do_not_overlap(cluster, client):
    seconds = 0.2
    inputs = [(i, seconds) for i in range(6)]
    assert client.remote_parallel_map(functions.sleep_then_return, inputs, spinner=False) == list(range(6))
    job_id = next(j["job_id"] for j in get_json(cluster, "/v1/jobs?limit=50")["jobs"]
                  if j["function_name"] == "sleep_then_return")
    wait_until(lambda: get_json(cluster, f"/v1/jobs/{job_id}/metrics")["calls"]["recorded"] == 6,
               what="every call recorded")
    calls = get_json(cluster, f"/v1/jobs/{job_id}/calls")["calls"]
    by_worker: dict[int, list[dict]] = {}
    for call in calls:
        assert call["duration_s"] >= seconds and call["started_at"] > 0 and call["worker_pid"] > 0, call
        assert abs(call["ended_at"] - call["started_at"] - call["duration_s"]) < 1e-3, call
        by_worker.setdefault(call["worker_pid"], []).append(call)
    for runs in by_worker.values():
        runs.sort(key=lambda call: call["started_at"])
        for before, after in zip(runs, runs[1:]):
            assert after["started_at"] >= before["ended_at"] - 1e-3, (before, after)


def test_reports_cut_from_a_batch_name_their_own_results(cluster, client):
    # Each call outlasts a worker's flush interval, so a batch goes out in many reports: each
    # names its results' inputs by a slice of the batch's indices, and the inputs that failed.
    inputs = list(range(300))
    results = client.remote_parallel_map(functions.pause_then_answer, inputs, raise_errors=False, spinner=False)
    for x, result in zip(inputs, results):
        if x % 7 == 3:
            assert isinstance(result, ValueError) and result.burla_input_index == x, (x, result)
        else:
            assert result == ([x] if x % 5 == 1 else x * 2), (x, result)
    job = next(j for j in get_json(cluster, "/v1/jobs?limit=50")["jobs"] if j["function_name"] == "pause_then_answer")
    assert job["n_failed"] == sum(x % 7 == 3 for x in inputs)  # the head counted each report's failures
