"""A node's Dispatcher on its own (no workers attached: inputs stay queued)."""

from __future__ import annotations

from burla import wire
from burla.node.dispatcher import Dispatcher


def _dispatcher() -> Dispatcher:
    return Dispatcher(lambda: [], lambda: None)


def _assign(dispatcher: Dispatcher, job_id: str) -> None:
    dispatcher.assign(wire.AssignJob(job_id, "f", b"fn", 2, None, None, b"", {}, 4))


def test_held_lists_queued_inputs_and_cancelled_jobs_empty():
    dispatcher = _dispatcher()
    _assign(dispatcher, "kept")
    _assign(dispatcher, "cancelled")
    dispatcher.add_inputs("kept", [[0, b"a"], [1, b"b"]])
    dispatcher.add_inputs("cancelled", [[0, b"a"]])
    dispatcher.cancel("cancelled")
    held = {job_id: wire.unpack_indices(packed) for job_id, packed in dispatcher.held()}
    # A cancelled job the head has not released yet is listed with nothing: the head then releases it.
    assert held == {"kept": [0, 1], "cancelled": []}
    dispatcher.release("cancelled")
    assert [job_id for job_id, _ in dispatcher.held()] == ["kept"]
