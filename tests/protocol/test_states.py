"""Job, node and machine states, and the kinds a job ends with: one set of names everywhere."""

from __future__ import annotations

import pytest

from burla import errors
from burla.errors import BurlaError, ProtocolError, error_from_wire
from burla.protocol import wire
from burla.protocol.states import EndKind, JobStatus, NodeStatus


@pytest.mark.parametrize("kind", [k for k in EndKind if k is not EndKind.NONE])
def test_every_end_kind_names_an_exception_a_client_raises(kind):
    cls = errors.WIRE_ERRORS[kind]
    assert issubclass(cls, BurlaError) and cls.__name__ == kind
    raised = error_from_wire(kind, "why")
    assert type(raised) is cls and str(raised) == "why"


def test_errors_users_meet_are_inside_the_one_tree():
    assert issubclass(errors.SettingsError, errors.InvalidArgument)
    assert issubclass(errors.SettingsError, ValueError)
    assert issubclass(errors.CallFailed, errors.JobError)


def test_states_travel_as_their_names():
    ended = wire.JobEnded("j-1", JobStatus.FAILED, EndKind.CALL_FAILED, "input 3 raised")
    decoded = wire.decode(ended.encode())
    assert decoded == wire.JobEnded("j-1", "FAILED", "CallFailed", "input 3 raised")
    assert decoded.status == JobStatus.FAILED


def test_a_node_state_with_an_unknown_status_is_refused():
    good = wire.NodeState("n", NodeStatus.RUNNING, 2, [["j-1", 2, 5, 9]], 50.0, 10.0, 1024.0, 2048.0)
    assert wire.decode(good.encode(), wire.NODE_TO_HEAD) == good
    bad = good.replace(status="ASLEEP")
    with pytest.raises(ProtocolError, match="NodeState.status must be one of READY, RUNNING"):
        wire.decode(bad.encode(), wire.NODE_TO_HEAD)


def test_a_history_row_reads_whatever_its_states_and_takes_its_options_from_its_arguments():
    from burla.protocol.views import JobView

    row = {"job_id": "j", "parent_job_id": None, "function_name": "f", "status": "PAUSED", "reason": "",
           "n_inputs": 3, "n_done": 1, "n_failed": 0, "started_at": 1.0, "ended_at": None, "end_kind": "Newer",
           "arguments": {"detach": True, "max_parallelism": 3}, "a_column_from_later": 1}
    view = JobView.from_history(row)
    assert (view.status, view.end_kind) == (JobStatus.FAILED, EndKind.NONE)  # unknown here: not a crash
    assert (view.detach, view.max_parallelism) == (True, 3)
    shown = view.to_json()
    assert "n_uploaded" not in shown and "stolen" not in shown  # only a head holding the job knows them
    assert shown["arguments"] == {"detach": True, "max_parallelism": 3}
