"""The views (burla/protocol/views.py) of what the head holds live: a job's and a node's."""

from __future__ import annotations

from burla.head.scheduling.eligibility import image_of
from burla.head.scheduling.records import JobRecord, NodeRecord
from burla.protocol.states import JobStatus
from burla.protocol.views import DESCRIPTION_FIELDS, USAGE_FIELDS, JobView, NodeView


def job_view(job: JobRecord, nodes: dict[str, NodeRecord], times: tuple[float | None, float | None],
             booting: int) -> JobView:
    """A job the head holds. `times`: when it started and ended; `booting`: the nodes a driver is
    starting (a running job with no node waits for them)."""
    spec = job.spec
    running = job.status == JobStatus.RUNNING
    return JobView(
        job_id=job.job_id, function_name=spec.function_name, status=job.status, reason=job.reason,
        end_kind=job.end_kind, n_inputs=job.n_inputs, n_done=job.n_done, n_failed=job.n_failed,
        parent_job_id=spec.parent_job_id, started_at=times[0], ended_at=times[1], n_uploaded=job.received,
        stolen=job.stolen, running=job.running(nodes) if running else 0, nodes=sorted(job.assignments),
        waiting_for_booting_nodes=booting if running and not job.assignments else 0,
        max_parallelism=spec.max_parallelism, detach=spec.detach,
    )


def node_view(node: NodeRecord) -> NodeView:
    """A node the head holds: its description and usage, field by field, and its jobs. A node
    without an image is described as running `python:3.X` of its interpreter."""
    shown = {name: getattr(node, name) for name in _SHOWN}
    shown["image"] = image_of(node)
    return NodeView(**shown, jobs=sorted(node.running_by_job))


_SHOWN = DESCRIPTION_FIELDS + USAGE_FIELDS
