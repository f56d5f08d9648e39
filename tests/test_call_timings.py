"""Each call's record says when it started, how long it ran and on which worker: a worker keeps
one boundary per call and builds the records per report (`worker._timings_of`)."""

from __future__ import annotations

from array import array

from burla.node.worker import _timings_of
from burla.protocol.packed_results import read_timings
from tests import functions
from tests.helpers import get_json, wait_until


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
