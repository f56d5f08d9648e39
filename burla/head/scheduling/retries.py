"""Per-call retries (`remote_parallel_map(..., retries=N)`), as the head runs them: a call that
failed (it raised, or ran past its timeout) while tries remain is queued again, first in line, and
may run on any worker of any node; its failure is not a result, so the client never sees it. The
last try's failure is the result, and says how many tries there were (`ErrorRecord.attempts`)."""

from __future__ import annotations

from burla.errors import ProtocolError
from burla.head.scheduling.records import Assignment, JobRecord
from burla.protocol import wire
from burla.protocol.values.packed_inputs import gather


def retry(job: JobRecord, assignment: Assignment, index: int) -> bool:
    """A failed try of input `index`: queue it again if the job's retries allow and its bytes are
    still here (in flight on the node that answered); True if it was."""
    tries = job.retried.get(index, 0)
    if tries >= job.spec.retries:
        return False
    run = assignment.inflight.take(index)
    if run is None:
        return False
    job.retried[index] = tries + 1
    job.pending.prepend(gather([(index, run)]))
    return True


def with_attempts(job: JobRecord, items: list) -> list:
    """Results as the client gets them: a failure after retries says how many tries it took (the
    error record is msgpack, read and written here; its pickled exception is left as it is)."""
    if not job.retried:
        return items
    noted = []
    for item in items:
        index, ok, payload = item
        tries = job.retried.get(index)
        if not ok and tries:
            try:
                payload = wire.read_error(payload).replace(attempts=tries + 1).encode()
            except ProtocolError:
                pass  # not an error record the head can read: passed on as it came
        noted.append([index, ok, payload])
    return noted
