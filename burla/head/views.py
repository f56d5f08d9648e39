"""What the API, the dashboard and the CLI show of a job and of a node: typed views.

The head builds them from its live records (`job_view`, `node_view`) or from a job's row in
history (`JobView.from_history`); the API sends `to_json()`, and the CLI reads answers back
with `from_json`, so every field has one name and one type wherever it is shown.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from burla.states import EndKind, JobStatus, NodeStatus

if TYPE_CHECKING:  # the CLI reads views without importing the head
    from burla.head.scheduler import JobRecord, NodeRecord, Scheduler


@dataclass(frozen=True)
class JobView:
    job_id: str
    function_name: str
    status: JobStatus
    reason: str
    end_kind: EndKind
    n_inputs: int
    n_done: int
    n_failed: int
    parent_job_id: str | None
    started_at: float | None
    ended_at: float | None
    # What only a head holding the job knows (a job read from history shows them empty).
    n_uploaded: int = 0
    stolen: int = 0
    running: int = 0  # calls running now
    nodes: list[str] = field(default_factory=list)
    waiting_for_booting_nodes: int = 0
    max_parallelism: int | None = None
    detach: bool = False
    # What history keeps of the call that started it (absent from a live-only view).
    arguments: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if self.arguments is None:
            del data["arguments"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobView:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        values["status"] = JobStatus(values["status"])
        values["end_kind"] = EndKind(values.get("end_kind") or "")
        return cls(**values)

    @classmethod
    def from_history(cls, row: dict[str, Any]) -> JobView:
        """A job's row in history (status and end kind as text there)."""
        return cls.from_json(row)

    def merged_with(self, live: JobView | None) -> JobView:
        """This history record, with what a head still holding the job knows now."""
        if live is None:
            return self
        return dataclasses.replace(live, arguments=self.arguments)


@dataclass(frozen=True)
class NodeView:
    node_id: str
    url: str
    status: NodeStatus
    slots: int
    cpus: int
    ram_gb: float
    gpu: str | None
    gpu_count: int
    image: str | None
    region: str
    python_version: str
    workers_alive: int
    cpu_percent: float
    mem_percent: float
    net_sent_bps: float
    net_recv_bps: float
    gpu_percent: float
    gpu_mem_percent: float
    jobs: list[str]  # the jobs it runs calls of

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeView:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        values["status"] = NodeStatus(values["status"])
        return cls(**values)


def job_view(job: JobRecord, scheduler: Scheduler, times: tuple[float | None, float | None],
             booting: int) -> JobView:
    """A job the head holds. `times`: when it started and ended; `booting`: the nodes a driver is
    starting (a running job with no node waits for them)."""
    spec = job.spec
    running = job.status == JobStatus.RUNNING
    return JobView(
        job_id=job.job_id, function_name=spec.function_name, status=job.status, reason=job.reason,
        end_kind=job.end_kind, n_inputs=job.n_inputs, n_done=job.n_done, n_failed=job.n_failed,
        parent_job_id=spec.parent_job_id, started_at=times[0], ended_at=times[1], n_uploaded=job.received,
        stolen=job.stolen, running=job.running(scheduler.nodes) if running else 0, nodes=sorted(job.assignments),
        waiting_for_booting_nodes=booting if running and not job.assignments else 0,
        max_parallelism=spec.max_parallelism, detach=spec.detach,
    )


def node_view(node: NodeRecord) -> NodeView:
    return NodeView(
        node_id=node.node_id, url=node.url, status=node.status, slots=node.slots, cpus=node.cpus,
        ram_gb=node.ram_gb, gpu=node.gpu, gpu_count=node.gpu_count, image=node.image, region=node.region,
        python_version=node.python_version, workers_alive=node.workers_alive, cpu_percent=node.cpu_percent,
        mem_percent=node.mem_percent, net_sent_bps=node.net_sent_bps, net_recv_bps=node.net_recv_bps,
        gpu_percent=node.gpu_percent, gpu_mem_percent=node.gpu_mem_percent, jobs=sorted(node.running_by_job),
    )
