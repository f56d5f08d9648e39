"""Stealing, as the head sees it: which idle nodes to point at a busy peer (`steal_plan`), and
whose inputs moved once a thief reports a transfer (`record_steal`). Pure, like the scheduler."""

from __future__ import annotations

from burla.head.records import RUNNING, JobRecord, NodeRecord


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
        data = donor.inflight.pop(index, None) if donor is not None else None
        if data is not None:
            thief.inflight[index] = data
            job.stolen += 1
