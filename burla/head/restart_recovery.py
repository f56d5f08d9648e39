"""Taking up, after a restart, the jobs a head kept in history.

An attached job waits for its client to come back and say which results it already has
(RESTORED_CLIENT_GRACE_S); a detached one runs its kept inputs and keeps its results for
get_results. Nodes join them as they register. The nodes that were connected when the head
stopped come back holding inputs they kept running: until they are back (at most
RESTORE_SETTLE_S), nothing of these jobs is pushed to other nodes. A job no node joins within
REJOIN_GRACE_S of the restart ends saying so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Protocol

from burla.errors import BurlaError, ProtocolError
from burla.head.client_watch import ClientWatch
from burla.head.history.recorder import Recorder
from burla.head.history.store import KeptJob
from burla.head.links import ClientLink, NodeLink
from burla.head.machines.interface import Machines
from burla.head.scheduling.held_inputs import load_kept
from burla.head.scheduling.records import JobRecord
from burla.head.scheduling.scheduler import Scheduler
from burla.protocol import wire
from burla.protocol.states import EndKind, JobStatus


class RecoveringCluster(Protocol):
    """What taking up kept jobs uses of the cluster (head/cluster.py's `Cluster`)."""

    scheduler: Scheduler
    machines: Machines
    clients: ClientWatch
    node_links: dict[str, NodeLink]
    client_links: dict[str, ClientLink]
    job_times: dict[str, tuple[float, float | None]]
    record: Recorder

    def assign(self, job: JobRecord) -> None: ...

    def pump(self) -> None: ...

    def end_job(self, job: JobRecord, status: JobStatus, kind: EndKind, reason: str,
                tell_client: bool = True) -> None: ...

log = logging.getLogger("burla.head")

# A node whose connection dropped may be back after its SSH tunnel is re-established (a laptop
# changing networks): jobs wait this long for it, or the node deadline if longer. Jobs taken up
# after a restart wait as long for a node to join them.
REJOIN_GRACE_S = 120.0
RESTORED_CLIENT_GRACE_S = 60.0  # how long a job taken up after a restart waits for its client (its retry window)
# How long a job taken up after a restart holds its inputs back for the nodes that were connected
# when the head stopped: they come back holding inputs, which must not be pushed to others meanwhile.
RESTORE_SETTLE_S = 10.0


class RestartRecovery:
    def __init__(self, cluster: RecoveringCluster) -> None:
        self._cluster = cluster
        self.done = asyncio.Event()  # set once jobs kept in history are taken up (resumes wait for it)
        self._restored_at: dict[str, float] = {}  # jobs taken up after a restart, until nodes join them
        self.expected_back: set[str] = set()  # nodes connected when the head last stopped, not yet back
        self._settle_until = 0.0  # restored jobs push nothing before this (or before expected_back is empty)

    def restore_jobs(self, kept_jobs: list[KeptJob], expected_back: Sequence[str] = ()) -> None:
        """Take up the jobs that were running (or, detached, not yet collected) when this head last
        stopped; `expected_back`: the nodes connected then."""
        cluster = self._cluster
        self.expected_back = set(expected_back) - set(cluster.node_links)
        self._settle_until = time.monotonic() + RESTORE_SETTLE_S
        for kept in kept_jobs:
            try:
                spec = wire.decode(kept.opening, wire.CLIENT_TO_HEAD)
            except ProtocolError as e:
                log.warning("a job kept in history can't be read (%s); dropping it", e)
                continue
            if not isinstance(spec, wire.OpenJob) or spec.job_id in cluster.scheduler.jobs:
                continue
            self._take_up(kept, spec)

    def _take_up(self, kept: KeptJob, spec: wire.OpenJob) -> None:
        cluster = self._cluster
        ended = kept.status != JobStatus.RUNNING  # a detached job that ended: only its results remain
        if ended and not kept.results:  # nothing for anyone to collect: it is over
            cluster.record.job_closed(spec.job_id)
            return
        if not ended:  # boot only for what will run
            try:
                cluster.machines.prepare_job(spec)
            except BurlaError as e:
                log.warning("job %s can't get nodes again: %s", spec.job_id, e)
        job = cluster.scheduler.restore(spec)
        job.waits_for_nodes = bool(self.expected_back)
        link = ClientLink(spec.job_id)
        link.detached_since = time.monotonic()
        link.patience_s = RESTORED_CLIENT_GRACE_S
        cluster.client_links[spec.job_id] = link
        cluster.job_times[spec.job_id] = (kept.started_at or time.time(), None)
        if spec.detach:
            cluster.scheduler.add_inputs(job, load_kept(job, kept.inputs, kept.results))
            link.deliver([], kept.results)
        cluster.assign(job)
        if ended:
            log.info("job %s ended %s; %d results wait for `burla jobs results`", spec.job_id, kept.status,
                     len(kept.results))
        else:
            log.info("job %s taken up again after a restart (%d of %d results kept)", spec.job_id, job.n_done,
                     job.n_inputs)
        self._restored_at[spec.job_id] = time.monotonic()
        cluster.clients.record_job(job)
        self._end_or_run(job, kept)

    def _end_or_run(self, job: JobRecord, kept: KeptJob) -> None:
        cluster = self._cluster
        if kept.status in (JobStatus.FAILED, JobStatus.CANCELED):  # a detached job that ended: only its results remain
            kind = kept.end_kind or (EndKind.JOB_FAILED if kept.status == JobStatus.FAILED else EndKind.JOB_CANCELED)
            cluster.end_job(job, kept.status, kind, kept.reason)
        elif job.spec.detach and job.n_done >= job.n_inputs:
            cluster.end_job(job, JobStatus.COMPLETED, EndKind.NONE, "")  # its results wait for get_results
        else:
            cluster.pump()

    def node_back(self, node_id: str) -> None:
        """A node registered (and reported what it held)."""
        self.expected_back.discard(node_id)
        self.release(time.monotonic())

    def release(self, now: float) -> None:
        """Restored jobs push again once the nodes expected back are back, or the wait is over."""
        if self.expected_back and now < self._settle_until:
            return
        self.expected_back.clear()
        released = False
        for job in self._cluster.scheduler.running.values():
            if job.waits_for_nodes:
                job.waits_for_nodes = False
                released = True
        if released:
            self._cluster.pump()

    def end_jobs_without_nodes(self, now: float) -> None:
        """A job taken up after a restart waits for nodes to come back (as for a dropped node);
        if none has joined it by then and none is booting, it ends saying so."""
        cluster = self._cluster
        for job_id, since in list(self._restored_at.items()):
            job = cluster.scheduler.jobs.get(job_id)
            if job is None or job.status != JobStatus.RUNNING or job.assignments:
                del self._restored_at[job_id]
            elif now - since > REJOIN_GRACE_S and cluster.scheduler.booting == 0:
                del self._restored_at[job_id]
                cluster.end_job(job, JobStatus.FAILED, EndKind.NO_NODES,
                                f"no node could run this job within {REJOIN_GRACE_S:g} s of the head's restart; "
                                "start nodes and run it again")
