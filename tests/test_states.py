"""Job, node and machine states, and the kinds a job ends with: one set of names everywhere."""

from __future__ import annotations

import pytest

from burla import errors, wire
from burla.errors import BurlaError, ProtocolError, error_from_wire
from burla.states import EndKind, JobStatus, NodeStatus


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
