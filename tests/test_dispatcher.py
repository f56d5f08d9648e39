"""A node's Dispatcher on its own (no workers attached: inputs stay queued)."""

from __future__ import annotations

from collections import deque

from burla import wire
from burla.node.dispatcher import Dispatcher
from burla.node.worker_pool import Batch


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


class _DeadWorker:
    """A worker handle (the attributes the dispatcher reads) whose process died between calls:
    its shared index says it was in no call."""

    def __init__(self, batches: list) -> None:
        self.batches = deque(batches)
        self.killed_for = None
        self.pid = 4242

    def current_index(self) -> int:
        return -1


def test_a_worker_that_keeps_dying_between_calls_fails_the_call_it_was_about_to_run():
    outgoing = []
    dispatcher = Dispatcher(lambda: [], lambda: outgoing.append(1), "node-a", "host-a")
    _assign(dispatcher, "j")
    dispatcher.add_inputs("j", [[0, b"a"], [1, b"b"]])
    job = dispatcher.jobs["j"]
    for _ in range(2):  # MAX_CRASH_ATTEMPTS: each death takes the two queued inputs back
        items = [job.queue.popleft() for _ in range(len(job.queue))]
        job.inflight += len(items)
        dispatcher.on_worker_exit(_DeadWorker([Batch("j", dict(items), 0.0)]), 0)
    [(index, ok, payload)] = job.out_results  # it did not loop forever: input 0 failed
    record = wire.read_error(payload)
    assert (index, ok, record.type_name, record.node_id, record.worker_pid) == (0, False, "WorkerCrashed", "node-a",
                                                                                4242)
    assert [item[0] for item in job.queue] == [1]  # the other runs again
