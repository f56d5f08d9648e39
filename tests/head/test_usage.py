"""`burla usage`: node-hours per machine type and their cost, from the machines' events."""

from __future__ import annotations

import pytest

from burla.head.history.usage import MACHINE_STARTED, machine_detail, usage

HOUR = 3600.0


def _event(node_id: str, event: str, at: float, detail: str = "") -> dict:
    return {"node_id": node_id, "event": event, "detail": detail, "at": at}


def test_hours_and_cost_per_machine_type_within_the_window():
    m7i = machine_detail("aws", "m7i.2xlarge", "us-east-1", False)
    events = [
        _event("a", MACHINE_STARTED, 0.0, m7i),
        _event("a", "registered", 60.0),
        _event("a", "left", 2 * HOUR),  # a cloud machine bills until it is deleted, not until it leaves
        _event("a", "deleted", 3 * HOUR),
        _event("b", MACHINE_STARTED, 1 * HOUR, m7i),  # still running
        _event("c", MACHINE_STARTED, 0.0, machine_detail("gcp", "mystery-type", "", True)),
        _event("c", "deleted", HOUR),
        _event("l", MACHINE_STARTED, 0.0, machine_detail("local", "", "", False)),
        _event("l", "left", 0.5 * HOUR),  # a local node's process ended
        _event("x", "registered", 0.0),  # a node with no machine event is not counted
    ]
    report = usage(events, since=0.0, now=4 * HOUR)
    rows = {(r["cloud"], r["machine_type"]): r for r in report["machine_types"]}
    aws = rows[("aws", "m7i.2xlarge")]
    assert (aws["machines"], aws["still_running"], aws["node_hours"]) == (2, 1, 6.0)
    assert aws["estimated_usd"] == pytest.approx(6 * 0.4032, abs=0.01)
    mystery = rows[("gcp", "mystery-type")]
    assert mystery["estimated_usd"] is None and mystery["spot_machines"] == 1  # no price to estimate with
    local = rows[("local", None)]
    assert local["node_hours"] == 0.5 and local["estimated_usd"] == 0.0
    assert report["node_hours"] == 7.5 and report["estimated_usd"] == aws["estimated_usd"]
    # Only the part inside the window counts.
    later = usage(events, since=3.5 * HOUR, now=4 * HOUR)
    assert [(r["machine_type"], r["node_hours"]) for r in later["machine_types"]] == [("m7i.2xlarge", 0.5)]
