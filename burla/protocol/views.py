"""What the API, the dashboard and the CLI show of a job and of a node: typed views.

The head builds them from its live records (`job_view`, `node_view`) or from a job's row in
history (`JobView.from_history`); the API sends `to_json()`, and the CLI reads answers back
with `from_json`, so every field has one name and one type wherever it is shown.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from burla.protocol.states import EndKind, JobStatus, NodeStatus, parse_state

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
    max_parallelism: int | None = None
    detach: bool = False
    running: int = 0  # calls running now
    nodes: list[str] = field(default_factory=list)
    waiting_for_booting_nodes: int = 0
    # What only a head holding the job knows: None (and left out of the JSON) for a job read
    # from history alone.
    n_uploaded: int | None = None
    stolen: int | None = None
    # What history keeps of the call that started it: None for a view of a live job alone.
    arguments: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The view as JSON (a dict per field, built by hand: dataclasses.asdict copies deeply and
        costs ~40 times as much, which a snapshot of 1,000 nodes twice a second would feel)."""
        return {name: value for name in _JOB_FIELDS if (value := getattr(self, name)) is not None
                or name not in _JOB_OPTIONAL}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobView:
        """A view as the API sent it (or a history row): unknown keys are ignored, and a state this
        version does not know reads as FAILED, so one odd job can't break a listing."""
        values = {key: value for key, value in data.items() if key in _JOB_FIELDS}
        values["status"] = parse_state(JobStatus, values.get("status"), JobStatus.FAILED)
        values["end_kind"] = parse_state(EndKind, values.get("end_kind"), EndKind.NONE)
        return cls(**values)

    @classmethod
    def from_history(cls, row: dict[str, Any]) -> JobView:
        """A job's row in history: its options come from the arguments it was started with."""
        view = cls.from_json(row)
        arguments = view.arguments or {}
        return dataclasses.replace(view, detach=bool(arguments.get("detach", False)),
                                   max_parallelism=arguments.get("max_parallelism"))

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
        return {name: getattr(self, name) for name in _NODE_FIELDS}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeView:
        values = {key: value for key, value in data.items() if key in _NODE_FIELDS}
        values["status"] = parse_state(NodeStatus, values.get("status"), NodeStatus.READY)
        return cls(**values)


_JOB_FIELDS = tuple(f.name for f in dataclasses.fields(JobView))
_JOB_OPTIONAL = frozenset({"n_uploaded", "stolen", "arguments"})
_NODE_FIELDS = tuple(f.name for f in dataclasses.fields(NodeView))


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
