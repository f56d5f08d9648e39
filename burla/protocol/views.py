"""What the API, the dashboard and the CLI show of a job and of a node: typed views.

The head builds them from its live records (`burla/head/routes/view_builders.py`) or from a job's row in
history (`JobView.from_history`); the API sends `to_json()`, and the CLI reads answers back
with `from_json`, so every field has one name and one type wherever it is shown.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from burla.protocol.states import EndKind, JobStatus, NodeStatus, parse_state


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


@dataclass
class NodeDescription:
    """What a node says of itself when it registers: `RegisterNode`'s fields of these names."""

    node_id: str
    url: str
    slots: int
    cpus: int
    ram_gb: float
    gpu: str | None
    gpu_count: int
    image: str | None
    region: str
    python_version: str


@dataclass
class NodeUsage:
    """How busy a node is, as its last state push said: `NodeState`'s fields of these names."""

    status: NodeStatus = NodeStatus.READY
    workers_alive: int = 0
    cpu_percent: float = 0.0
    mem_percent: float = 0.0
    net_sent_bps: float = 0.0
    net_recv_bps: float = 0.0
    gpu_percent: float = 0.0
    gpu_mem_percent: float = 0.0
    held_back: str = ""  # why it runs fewer calls than its jobs could use now (the governor's word)


DESCRIPTION_FIELDS = tuple(f.name for f in dataclasses.fields(NodeDescription))
USAGE_FIELDS = tuple(f.name for f in dataclasses.fields(NodeUsage))


@dataclass
class NodeView(NodeUsage, NodeDescription):
    """A node as the API, the dashboard and the CLI show it: its description, its usage, its jobs."""

    jobs: list[str] = field(default_factory=list)  # the jobs it runs calls of

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in NODE_FIELDS}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeView:
        values = {key: value for key, value in data.items() if key in NODE_FIELDS}
        values["status"] = parse_state(NodeStatus, values.get("status"), NodeStatus.READY)
        return cls(**values)


_JOB_FIELDS = tuple(f.name for f in dataclasses.fields(JobView))
_JOB_OPTIONAL = frozenset({"n_uploaded", "stolen", "arguments"})
NODE_FIELDS = tuple(f.name for f in dataclasses.fields(NodeView))
