"""A head's running jobs as their clients and history see them over time: progress sent every
PROGRESS_INTERVAL_S, counts kept current in history, and jobs whose client left and did not
come back in time canceled (unless detached)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Protocol

from burla.head.history.recorder import Recorder
from burla.head.links import ClientLink
from burla.head.machines.interface import Machines
from burla.head.scheduling.records import CANCELED, RUNNING, JobRecord
from burla.head.scheduling.scheduler import Scheduler
from burla.protocol import wire
from burla.protocol.states import EndKind, JobStatus
from burla.protocol.views import JobView


class WatchedJobs(Protocol):
    """What the client watch uses of the cluster (head/cluster.py's `Cluster`)."""

    client_links: dict[str, ClientLink]
    scheduler: Scheduler
    record: Recorder

    def end_job(self, job: JobRecord, status: JobStatus, kind: EndKind, reason: str,
                tell_client: bool = True) -> None: ...

    def job_view(self, job: JobRecord) -> JobView: ...

    def waiting_for_nodes(self, job: JobRecord) -> int: ...

    @property
    def booting_ids(self) -> set[str]: ...

    @property
    def machines(self) -> Machines: ...

PROGRESS_INTERVAL_S = 0.25


class ClientWatch:
    def __init__(self, cluster: WatchedJobs) -> None:
        self._cluster = cluster

    async def client_reap_loop(self, deadline_s: float) -> None:
        """Cancel jobs whose client left and did not come back in time (unless detached)."""
        cluster = self._cluster
        while True:
            await asyncio.sleep(min(1.0, deadline_s / 4))
            now = time.monotonic()
            for job_id, link in list(cluster.client_links.items()):
                patience = link.patience_s if link.patience_s is not None else deadline_s
                if link.attached or link.detached_since is None or now - link.detached_since < patience:
                    continue
                job = cluster.scheduler.jobs.get(job_id)
                if job is None:
                    cluster.client_links.pop(job_id, None)
                    continue
                if job.spec.detach and job.received >= job.n_inputs:
                    continue  # every input is here: its results wait until collected
                if job.status == RUNNING:
                    missing = f" before uploading {job.n_inputs - job.received} inputs" if job.spec.detach else ""
                    cluster.end_job(
                        job, CANCELED, EndKind.JOB_CANCELED,
                        f"the client disconnected{missing} and did not come back within {patience:g} s",
                    )
                cluster.client_links.pop(job_id, None)
                cluster.record.job_closed(job_id)  # nobody will collect what was kept

    def send_progress(self, job: JobRecord, link: ClientLink, force: bool = False) -> None:
        cluster = self._cluster
        running = job.running(cluster.scheduler.nodes) if job.status == RUNNING else 0
        queued = max(0, job.received - job.n_done - running)
        booting = cluster.waiting_for_nodes(job)
        stages = Counter(cluster.machines.boot_stage(n) for n in cluster.booting_ids) if booting else Counter()
        held = self._held_back(job) if job.status == RUNNING else ""
        snapshot = (job.n_done, job.n_failed, running, queued, booting, tuple(sorted(stages.items())), held)
        if force or snapshot != link.last_progress:
            link.last_progress = snapshot
            link.send(wire.Progress(job.job_id, *snapshot[:5], stages={str(k): v for k, v in stages.items()},
                                    held_back=held))

    def _held_back(self, job: JobRecord) -> str:
        """Why nodes of the job run fewer of its calls than they could, as its client shows it."""
        nodes = self._cluster.scheduler.nodes
        held = [(node_id, nodes[node_id].held_back) for node_id in job.assignments
                if node_id in nodes and nodes[node_id].held_back]
        if not held:
            return ""
        node_id, reason = held[0]
        others = f" (and {len(held) - 1} more node(s))" if len(held) > 1 else ""
        return f"node {node_id}{others} runs fewer calls at once than it could: {reason}"

    def record_job(self, job: JobRecord) -> None:
        cluster = self._cluster
        spec = job.spec
        arguments = {
            "func_cpu": spec.func_cpu, "func_ram": spec.func_ram, "func_gpu": spec.func_gpu, "image": spec.image,
            "grow": spec.grow, "max_parallelism": spec.max_parallelism, "detach": spec.detach,
            "raise_errors": spec.raise_errors, "region": spec.region, "disk_gb": spec.disk_gb,
            "client_version": spec.client_version, "python_version": spec.python_version,
        }
        cluster.record.job(cluster.job_view(job), arguments)

    async def progress_loop(self) -> None:
        cluster = self._cluster
        recorded: dict[str, int] = {}
        while True:
            await asyncio.sleep(PROGRESS_INTERVAL_S)
            running = list(cluster.scheduler.running.values()) if cluster.record.keeps else []
            for job in running:  # keep history's counts current while jobs run
                if recorded.get(job.job_id) != job.n_done:
                    self.record_job(job)
                    running_now = job.running(cluster.scheduler.nodes)
                    cluster.record.job_sample(job.job_id, job.n_done, job.n_failed, running_now)
            recorded = {job.job_id: job.n_done for job in running}
            for job_id, link in list(cluster.client_links.items()):
                linked = cluster.scheduler.jobs.get(job_id)
                if linked is not None and linked.status == RUNNING and link.attached:
                    self.send_progress(linked, link)

