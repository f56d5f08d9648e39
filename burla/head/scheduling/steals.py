"""Stealing, as the head sees it: which idle nodes to point at a busy peer (`steal_plan`), whether
a thief's report is one the head granted (`StolenReports`), and whose inputs moved once it is
(`record_steal`). Pure, like the scheduler: the clock is passed in."""

from __future__ import annotations

import hmac

from burla.head.scheduling.records import RUNNING, JobRecord, NodeRecord
from burla.protocol import grants, wire


def steal_plan(running: dict[str, JobRecord], nodes: dict[str, NodeRecord]) -> list[tuple[str, str, str]]:
    """Idle nodes to hint at a peer with queued inputs: [(thief_id, job_id, donor_id)].

    Only for jobs whose queue on the head is empty (else the head just pushes more).
    """
    hints = []
    for job in running.values():
        if job.pending or len(job.assignments) < 2:
            continue
        queued = {n: nodes[n].queued_by_job.get(job.job_id, 0) for n in job.assignments if n in nodes}
        donors = sorted((q, n) for n, q in queued.items() if q >= 1)
        if not donors:
            continue
        for node_id, assignment in job.assignments.items():
            node = nodes.get(node_id)
            if node is None or queued.get(node_id, 0) > 0:
                continue
            if node.running_by_job.get(job.job_id, 0) >= assignment.parallelism:
                continue
            donor_id = donors[-1][1]
            if donor_id != node_id:
                hints.append((node_id, job.job_id, donor_id))
    return hints

def record_steal(thief_id: str, job: JobRecord, donor_id: str, indices: list[int]) -> None:
    """Inputs moved between nodes: if the thief dies, they must be requeued from it."""
    donor = job.assignments.get(donor_id)
    thief = job.assignments.get(thief_id)
    if thief is None or job.status != RUNNING:
        return
    for index in indices:
        if not 0 <= index < job.n_inputs or job.is_done(index):
            continue
        if index in job.node_held:  # its bytes are still to come from the client: they go to the thief
            job.node_held[index] = thief_id
            continue
        data = donor.inflight.take(index) if donor is not None else None
        if data is not None:
            thief.inflight.add(index, data)
            job.stolen += 1


class StolenReports:
    """A thief's report moves inputs only under a grant the head signed for that thief, donor, job
    and transfer, once, and only the inputs the donor's receipt names: a node can't claim inputs
    of another node's it was never given."""

    def __init__(self) -> None:
        self._spent: dict[str, float] = {}  # transfer id -> when its grant can no longer be shown

    def refusal(self, thief_id: str, msg: wire.Stolen, donor: NodeRecord | None, now: float) -> str | None:
        """Why `msg` is not believed (None: it is, and its transfer is spent)."""
        for transfer_id in [t for t, until in self._spent.items() if until < now]:
            del self._spent[transfer_id]
        if donor is None:
            return f"the donor {msg.donor_id!r} is not registered"
        why = grants.refusal(donor.grant_key, msg.grant, msg.job_id, msg.donor_id, thief_id, msg.transfer_id,
                             msg.expires_at, now)
        if why is not None:
            return why
        given = grants.receipt(donor.grant_key, msg.job_id, msg.donor_id, thief_id, msg.transfer_id, msg.indices)
        if not hmac.compare_digest(given, msg.receipt):
            return "the donor's receipt does not name these inputs"
        if msg.transfer_id in self._spent:
            return f"transfer {msg.transfer_id!r} was reported already"
        self._spent[msg.transfer_id] = msg.expires_at + grants.CLOCK_SKEW_S
        return None
