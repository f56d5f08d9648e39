"""Whose calls a worker process may run: one tenant's, for its whole life.

A job's tenant is its client process (`AssignJob.reuse_key`, which only that process can make),
or the job alone (a detached job). A worker starts fresh (it never ran a
call, forked from the fork server, which never did either) and takes the tenant of the first
call it runs; from then on it runs that tenant's calls only, so nothing a call leaves behind in
its process (a thread, a wrapped function, a module global) meets another client's calls. A
tenant's idle workers stay warm for its next job (a loaded model stays loaded for an agent that
calls in a loop) until another tenant's job needs their slot, or the tenant has had no job on
the node for a while (`WorkerPool.rebalance`).
"""

from __future__ import annotations

from collections.abc import Callable

from burla.node.node_job import NodeJob
from burla.node.workers.worker_pool import WorkerHandle


def may_run(worker: WorkerHandle, job: NodeJob) -> bool:
    """Whether this worker may run the job's calls: it is fresh or the job's tenant's, and it has
    a GPU if the job needs one."""
    return (worker.tenant is None or worker.tenant == job.tenant) and (not job.gpu or worker.gpu is not None)


def wants_worker(job: NodeJob) -> bool:
    """Whether the job has calls queued that one more worker would start."""
    return bool(job.queue) and job.ready and not job.cancelled and len(job.workers) < job.parallelism


class Tenancy:
    """The node's jobs and workers seen by tenant (what the pool asks: `Tenants`)."""

    def __init__(self, jobs: dict[str, NodeJob], workers: Callable[[], list[WorkerHandle]],
                 capacity: Callable[[], int]) -> None:
        self._jobs = jobs
        self._workers = workers
        self._capacity = capacity
        self.fresh_coming: Callable[[], int] = lambda: 0  # fresh workers the pool is starting

    def tenant_live(self, tenant: bytes) -> bool:
        """Whether a job of this tenant is on the node (its workers stay warm for it)."""
        return any(job.tenant == tenant for job in self._jobs.values())

    def yields(self, worker: WorkerHandle) -> bool:
        """Whether this idle worker should give its slot to a fresh worker: a job it may not run
        waits for a worker, no idle or starting one could take it, and this worker's tenant has
        nothing queued or already runs its share of the node's slots."""
        tenant = worker.tenant
        if tenant is None or worker.batches:
            return False  # a fresh worker takes any job; a busy one finishes its batch first
        jobs = self._jobs.values()
        waiting = [job for job in jobs if job.tenant != tenant and wants_worker(job)]
        if not waiting:
            return False
        workers = self._workers()
        idle = [w for w in workers if w.alive and w.ready.is_set() and not w.retired and not w.batches]
        starving = {job.tenant for job in waiting if not any(may_run(w, job) for w in idle)}
        if len(starving) <= self.fresh_coming():
            return False
        if not any(job.tenant == tenant and wants_worker(job) for job in jobs):
            return True
        tenants = {job.tenant for job in jobs if wants_worker(job) or job.workers}
        slots = min(self._capacity(), sum(1 for w in workers if w.alive and not w.retired))
        share = max(1, slots // max(1, len(tenants)))
        return sum(1 for w in workers if w.tenant == tenant and w.batches) >= share
