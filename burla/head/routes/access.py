"""What each credential narrower than the cluster token may do on the head.

- A job's dashboard session (from the link its client printed) reads that job and its nested jobs.
- A job token (what the job's calls hold, burla.web.scoped_tokens) reads the same, and opens
  jobs nested in its tree over the job WebSocket; nothing else: no other job, no settings, no
  cluster start or stop, no node registration.
- A node token registers its own node over the node WebSocket; nothing else.
"""

from __future__ import annotations

from aiohttp import web

from burla.errors import Unauthorized
from burla.head.cluster import Cluster
from burla.head.keys import CLUSTER
from burla.head.routes.api import job_view_of
from burla.head.scheduling.records import RUNNING
from burla.protocol import wire
from burla.web.scoped_tokens import Scope

# What a job's session or token may read: the job's page, its API and stream, and the same of its
# nested jobs; the pages' own script and style.
JOB_VIEW_ROUTES = frozenset({"/jobs/{job_id}", "/static/{name}", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/failures",
                             "/v1/jobs/{job_id}/calls/{index}/output", "/v1/jobs/{job_id}/metrics",
                             "/v1/jobs/{job_id}/output", "/v1/jobs/{job_id}/calls", "/v1/stream/jobs/{job_id}"})
MAX_NESTING = 64  # parents followed to find a job's root; deeper trees are read from their own link
JOB_SOCKET = "/v1/jobs/ws"
NODE_SOCKET = "/v1/nodes/ws"
JOB_TOKEN_REACH = ("a job's token (BURLA_JOB_TOKEN, which its calls hold) opens jobs nested in that job and reads "
                   "that job's tree only")


async def job_view(request: web.Request, root: str) -> bool:
    """Whether a holder of job `root`'s session or token may make `request`: a read of `root` or
    of a job nested in it."""
    resource = request.match_info.route.resource
    if resource is None or resource.canonical not in JOB_VIEW_ROUTES:
        return False
    job_id: str | None = request.match_info.get("job_id")
    return job_id is None or await in_tree(request.app[CLUSTER], root, job_id)


async def in_tree(cluster: Cluster, root: str, job_id: str) -> bool:
    """Whether `job_id` is `root` or nested in it, following parents."""
    current: str | None = job_id
    for _ in range(MAX_NESTING):
        if current is None:
            return False
        if current == root:
            return True
        view = await job_view_of(cluster, current)
        current = view.parent_job_id if view is not None else None
    return False


async def scope_check(request: web.Request, scope: Scope) -> str | None:
    """Why a scoped token may not make `request` (None: it may)."""
    if scope.kind == "node":
        if request.path == NODE_SOCKET:
            return None
        return f"a node's token registers node {scope.subject} at {NODE_SOCKET} and does nothing else"
    if request.path == JOB_SOCKET or (request.method in ("GET", "HEAD") and await job_view(request, scope.subject)):
        return None
    return f"{JOB_TOKEN_REACH} (job {scope.subject}); the cluster token is not given to calls"


async def check_job_message(cluster: Cluster, scope: Scope | None, first: wire.Message) -> None:
    """A job token's opening or resumption stays inside its tree (raises Unauthorized if not)."""
    if scope is None:
        return
    if isinstance(first, wire.OpenJob):
        parent = first.parent_job_id
        if parent is None or not await in_tree(cluster, scope.subject, parent):
            raise Unauthorized(f"{JOB_TOKEN_REACH}: job {first.job_id!r} must be opened with parent_job_id "
                               f"{scope.subject!r} or a job nested in it")
        own = cluster.scheduler.jobs.get(scope.subject)
        if own is None or own.status != RUNNING:  # its calls are over: the token opens nothing more
            raise Unauthorized(f"job {scope.subject!r} is not running: its token opens no more jobs")
        if await job_view_of(cluster, first.job_id) is not None:
            raise Unauthorized(f"job id {first.job_id!r} is taken (a job of that id ran here)")
    elif isinstance(first, wire.ResumeJob) and not await in_tree(cluster, scope.subject, first.job_id):
        raise Unauthorized(f"{JOB_TOKEN_REACH}: job {first.job_id!r} is not in job {scope.subject!r}'s tree")
