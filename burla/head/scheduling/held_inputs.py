"""What a head restart leaves behind, reconciled with a job's record: the inputs a returning node
still holds, and the results a returning client already has. Pure functions of the record."""

from __future__ import annotations

import itertools
import zlib

from burla.errors import ProtocolError
from burla.head.scheduling.records import RUNNING, JobRecord
from burla.protocol import limits
from burla.protocol.values.packed_inputs import PackedInputs
from burla.protocol.values.packed_results import unpack_indices

_ANY_RESULT = bytes([0] + [1] * 255)  # bytes.translate table: any nonzero state -> 1


def _nonzero(flags: bytearray) -> list[int]:
    """Indices of the set bytes, skipping zero runs at C speed."""
    found = []
    index = flags.find(1)
    while index >= 0:
        found.append(index)
        index = flags.find(1, index + 1)
    return found


def take_up_held(jobs: dict[str, JobRecord], node_id: str, held: list) -> list[str]:
    """What a node registering again kept running while it had no head (`RegisterNode.held`):
    inputs of jobs this head runs with that node stay on it (`adopt_held`); returns the ids of the
    other jobs (ended, or unknown here), which the node must stop."""
    foreign = []
    for job_id, packed in held:
        job = jobs.get(job_id)
        if job is None or job.status != RUNNING or node_id not in job.assignments:
            foreign.append(job_id)
        else:
            adopt_held(job, node_id, unpack_indices(packed))
    return foreign


def claimable(job: JobRecord, node_id: str, indices: list[int]) -> set[int]:
    """What of `indices` a node registering again may say it holds: inputs this head gave it (in
    flight on it, or back in the queue since it was lost). A job taken up after a restart has no
    such record: there, at most a node's full window of them. Nothing done already."""
    n, done = job.n_inputs, job.done
    wanted = (i for i in indices if 0 <= i < n and not (i < len(done) and done[i]))
    given = job.lost_holdings.pop(node_id, set())
    if job.taken_up:
        return set(itertools.islice(wanted, limits.MAX_NODE_WINDOW))
    inflight = job.assignments[node_id].inflight
    return {i for i in wanted if i in given or i in inflight}


def adopt_held(job: JobRecord, node_id: str, indices: list[int]) -> None:
    """A node registering again still holds these inputs (queued, running, or with results on
    their way): they count as in flight on it, not to be pushed anywhere else."""
    assignment = job.assignments[node_id]
    holding = claimable(job, node_id, indices)
    if not holding:
        return
    if job.pending:  # queued here again meanwhile (the node's inputs came back when it dropped)
        rest = []
        for index, data in job.pending:
            if index in holding:
                assignment.inflight.add(index, PackedInputs.of_lists([index], [data]))
                holding.discard(index)
                losses = job.node_losses.pop(index, 0)  # its node was not lost after all
                if losses > 1:
                    job.node_losses[index] = losses - 1
            else:
                rest.append((index, data))
        job.pending.keep(rest)
    # Already pushed elsewhere: both run it, first wins.
    holder, mine = job.holders.holder, assignment.inflight.number
    holding = {index for index in holding if holder(index) in (0, mine)}
    seen = job.seen
    for index in holding:
        if index in assignment.inflight:
            continue
        if index < len(seen) and seen[index]:  # uploaded but in no queue and on no node: a result is on its way
            continue
        job.node_held[index] = node_id


def mark_client_held(job: JobRecord, held: bytes) -> tuple[int, bytes]:
    """A restored job's client has these results already (one byte per input: 0 none, 1 a
    result, 2 a failure): count them done and uploaded. Returns how many it holds, and the
    per-input states it sent."""
    n = job.n_inputs
    try:
        inflater = zlib.decompressobj()
        states = inflater.decompress(held, n + 1)  # bounded: a frame can't inflate past n bytes
    except zlib.error as e:
        raise ProtocolError(f"ResumeJob.held is not zlib data ({e})") from None
    if len(states) != n or inflater.unconsumed_tail:
        raise ProtocolError(f"ResumeJob.held must describe exactly {n} inputs")
    flags = bytearray(bytes(states).translate(_ANY_RESULT))
    held_count = n - states.count(0)
    failed = states.count(2)
    done_here = 0
    if job.n_done:  # results nodes sent before the client was back: they are on their way to it
        for index in _nonzero(job.done):
            if not flags[index]:
                flags[index] = 1
                done_here += 1
                failed += index in job.failed_here
    job.failed_here.clear()
    job.seen = bytearray(flags)
    job.done = flags
    job.holders.cover(n)  # `cover` extends them together from here on
    job.n_done = held_count + done_here
    job.n_failed = failed
    job.received = job.n_done
    first_missing = job.seen.find(0)
    job.upload_prefix = n if first_missing < 0 else first_missing
    job.restored = False
    job.lenient_uploads = True  # it may send again what a node's result already covers
    return held_count, bytes(states)


def load_kept(job: JobRecord, inputs: list, results: list) -> list:
    """A detached job taken up after a restart: its kept results count as done, and a client still
    uploading may resend. Returns its kept inputs without a result, to be queued again."""
    kept = [item[0] for item in [*results, *inputs] if 0 <= item[0] < job.n_inputs]
    job.cover(max(kept, default=-1) + 1)
    for index, ok, _ in results:
        if 0 <= index < job.n_inputs and not job.done[index]:
            job.done[index] = job.seen[index] = 1
            job.n_done += 1
            job.n_failed += 0 if ok else 1
    job.received = job.n_done
    job.restored = False
    job.lenient_uploads = True
    return [item for item in inputs if 0 <= item[0] < job.n_inputs and not job.done[item[0]]]
