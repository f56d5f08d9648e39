"""The head's JSON API for people and tools: the live cluster, jobs (live or from history),
failed calls, call output and node events. Every route needs the cluster token."""

from __future__ import annotations

import re
import time

from aiohttp import web

from burla.errors import CloudRefused, SettingsError
from burla.head.cluster import Cluster
from burla.head.history.queries import summarize_calls
from burla.head.history.usage import MACHINE_STARTED, usage
from burla.head.keys import CLUSTER, FLEET, LOOP_MONITOR, SUPERVISOR
from burla.head.node_reports import HOLDS_BACK, HOLDS_BACK_NO_MORE
from burla.head.routes.view_builders import node_view
from burla.head.scheduling.records import RUNNING
from burla.protocol.states import JobStatus
from burla.protocol.views import JobView
from burla.web.json_io import error_response, json_response, read_object

MAX_LIMIT = 1000
JOB_STATUSES = tuple(JobStatus)
MAX_REASON_CHARS = 2000
_DECIMAL = re.compile(r"[0-9]{1,18}")  # ASCII digits only: int() also takes "²"-like digits and "1_0"


def parse_index(raw: str) -> int | None:
    return int(raw) if _DECIMAL.fullmatch(raw) else None


def int_param(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    negative = raw.startswith("-")
    value = parse_index(raw[1:] if negative else raw)
    if value is None:
        raise web.HTTPBadRequest(text=f"{name} must be an integer, got {raw[:50]!r}")
    value = -value if negative else value
    if not low <= value <= high:
        raise web.HTTPBadRequest(text=f"{name} must be between {low} and {high}, got {value}")
    return value


async def cluster_state(request: web.Request) -> web.Response:
    cluster: Cluster = request.app[CLUSTER]
    s = cluster.scheduler
    return json_response(
        {
            "version": cluster.version,
            "booting": s.booting,
            "booting_stages": {n: cluster.machines.boot_stage(n) for n in sorted(cluster.booting_ids)},
            "nodes": [node_view(n).to_json() for n in s.nodes.values()],
            "jobs": [cluster.job_view(j).to_json() for j in reversed(list(s.jobs.values()))],
            "loops": request.app[SUPERVISOR].view(),  # the head's background loops, with their restarts
        }
    )


async def head_state(request: web.Request) -> web.Response:
    """The head process itself: CPU time used, memory, and how late its event loop runs."""
    window_s = int_param(request, "window_s", 60, 1, 600)
    return json_response({"version": request.app[CLUSTER].version, **request.app[LOOP_MONITOR].view(window_s),
                          "loops": request.app[SUPERVISOR].view()})


def _job_or_404(request: web.Request):
    cluster: Cluster = request.app[CLUSTER]
    job_id = request.match_info["job_id"]
    job = cluster.scheduler.jobs.get(job_id)
    if job is None:
        raise web.HTTPNotFound(text=f"no running job {job_id!r} on this head; `GET /v1/jobs` lists jobs")
    return cluster, job


async def job_view_of(cluster: Cluster, job_id: str) -> JobView | None:
    """A job's live view if the head holds it, else its record in history (None if neither)."""
    job = cluster.scheduler.jobs.get(job_id)
    if job is not None:
        return cluster.job_view(job)
    record = await cluster.history.get_job(job_id) if cluster.history is not None else None
    return JobView.from_history(record) if record is not None else None


async def _job_view_or_404(request: web.Request) -> JobView:
    job_id = request.match_info["job_id"]
    view = await job_view_of(request.app[CLUSTER], job_id)
    if view is None:
        raise web.HTTPNotFound(text=f"no job {job_id!r} on this head or in its history; `GET /v1/jobs` lists jobs")
    return view


async def get_job(request: web.Request) -> web.Response:
    return json_response((await _job_view_or_404(request)).to_json())


async def jobs_listing(cluster: Cluster, status: str | None, limit: int, parent: str | None = None) -> list[dict]:
    """Jobs from history, most recent first, with live counts for the ones still running; a head
    without history lists the jobs it holds (the last FINISHED_JOBS_KEPT ended ones and those running)."""
    if cluster.history is None:
        views = [cluster.job_view(job) for job in cluster.scheduler.jobs.values()
                 if (status is None or job.status == status) and (parent is None or job.spec.parent_job_id == parent)]
        views.sort(key=lambda view: view.started_at or 0.0, reverse=True)
        return [view.to_json() for view in views[:limit]]
    jobs = await cluster.history.list_jobs(status, limit, parent)
    live = {job.job_id: cluster.job_view(job) for job in cluster.scheduler.jobs.values()}
    return [JobView.from_history(row).merged_with(live.get(row["job_id"])).to_json() for row in jobs]


async def list_jobs(request: web.Request) -> web.Response:
    cluster: Cluster = request.app[CLUSTER]
    status = request.query.get("status")
    if status is not None and status.upper() not in JOB_STATUSES:
        raise web.HTTPBadRequest(text=f"status must be one of {', '.join(JOB_STATUSES)}, got {status!r}")
    limit = int_param(request, "limit", 50, 1, MAX_LIMIT)
    jobs = await jobs_listing(cluster, status.upper() if status else None, limit, request.query.get("parent"))
    return json_response({"jobs": jobs})


async def job_failures(request: web.Request) -> web.Response:
    cluster: Cluster = request.app[CLUSTER]
    view = await _job_view_or_404(request)
    limit = int_param(request, "limit", 1000, 1, 100_000)
    failures = await cluster.history.failures_of(view.job_id, limit) if cluster.history else []
    return json_response({"job_id": view.job_id, "failures": failures})


async def call_output(request: web.Request) -> web.Response:
    cluster: Cluster = request.app[CLUSTER]
    view = await _job_view_or_404(request)
    index = parse_index(request.match_info["index"])
    if index is None or index >= view.n_inputs:
        raise web.HTTPBadRequest(text=f"input index must be 0..{view.n_inputs - 1}, got "
                                      f"{request.match_info['index'][:50]!r}")
    rows = await cluster.history.output_of(view.job_id, index) if cluster.history else []
    return json_response({"job_id": view.job_id, "input_index": index, "output": rows})


async def node_events(request: web.Request) -> web.Response:
    cluster: Cluster = request.app[CLUSTER]
    node_id = request.match_info["node_id"]
    events = await cluster.history.node_events_of(node_id) if cluster.history else []
    if not events and node_id not in cluster.scheduler.nodes:
        raise web.HTTPNotFound(text=f"no node {node_id!r} on this head or in its history")
    return json_response({"node_id": node_id, "events": events})


async def cancel_job(request: web.Request) -> web.Response:
    cluster, job = _job_or_404(request)
    body = await read_object(request)  # validated whole before the job changes
    reason = body.get("reason", "")
    if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
        return error_response(400, "BadRequest", f"'reason' must be a string of at most {MAX_REASON_CHARS} characters")
    reason = reason or "canceled over HTTP"
    if not cluster.cancel(job.job_id, reason):
        return error_response(409, "Conflict", f"job {job.job_id} already ended ({job.status})")
    return json_response(cluster.job_view(job).to_json())




async def get_settings(request: web.Request) -> web.Response:
    return json_response(request.app[FLEET].settings.to_dict())


async def update_settings(request: web.Request) -> web.Response:
    changes = await read_object(request)
    try:
        settings = await request.app[FLEET].update_settings(changes)
    except SettingsError as e:
        return error_response(400, "InvalidSetting", str(e))
    return json_response(settings.to_dict())


async def cluster_start(request: web.Request) -> web.Response:
    try:
        return json_response(await request.app[FLEET].start())
    except CloudRefused as e:
        return _refused(e)


async def cluster_stop(request: web.Request) -> web.Response:
    return json_response(await request.app[FLEET].stop())


async def cluster_restart(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    stopped = await fleet.stop(restarting=True)
    try:
        started = await fleet.start()
    except CloudRefused as e:
        return _refused(e)
    return json_response({**stopped, **started})


def _refused(error: CloudRefused) -> web.Response:
    """502: the head is fine, the cloud behind it said no (its sentence, and what did start)."""
    started = f" Started anyway: {', '.join(error.booted)}." if error.booted else ""
    return error_response(502, "CloudRefused", f"{error}{started}")


async def metrics_of(cluster: Cluster, view: JobView) -> dict:
    """Progress over time and, per node that ran the job, CPU and memory samples, and when it held
    back calls the job could have run (the machine was busy)."""
    import time

    if cluster.history is None:
        return {"job_id": view.job_id, "progress": [], "nodes": {}, "held_back": [], "calls": {"recorded": 0}}
    progress = await cluster.history.job_progress_of(view.job_id)
    # A node's state is kept about once per sample period: a job shorter than that still gets the
    # samples taken around it.
    margin = cluster.watch.sample_period_s()
    since = (view.started_at or 0.0) - margin
    until = (view.ended_at or time.time()) + margin
    node_ids = view.nodes or sorted(await cluster.history.nodes_seen())
    nodes = {}
    held_back = []
    for node_id in node_ids:
        samples = await cluster.history.samples_of(node_id, since, until)
        if samples:
            nodes[node_id] = samples
        for event in await cluster.history.events_between(node_id, (HOLDS_BACK, HOLDS_BACK_NO_MORE), since, until):
            held_back.append({"node_id": node_id, "at": event["at"], "held_back": event["event"] == HOLDS_BACK,
                              "why": event["detail"]})
    calls = summarize_calls(await cluster.history.calls_of(view.job_id), view.started_at or 0.0)
    return {"job_id": view.job_id, "progress": progress, "nodes": nodes,
            "held_back": sorted(held_back, key=lambda e: e["at"]), "calls": calls}


async def job_metrics(request: web.Request) -> web.Response:
    cluster: Cluster = request.app[CLUSTER]
    return json_response(await metrics_of(cluster, await _job_view_or_404(request)))


async def search_output(request: web.Request) -> web.Response:
    """Lines any call of the job printed that contain `search` (all output without it)."""
    cluster: Cluster = request.app[CLUSTER]
    view = await _job_view_or_404(request)
    limit = int_param(request, "limit", 200, 1, MAX_LIMIT)
    text = request.query.get("search", "")
    if len(text) > 500:
        raise web.HTTPBadRequest(text="search text must be at most 500 characters")
    rows = await cluster.history.search_output(view.job_id, text, limit) if cluster.history else []
    return json_response({"job_id": view.job_id, "search": text, "matches": rows})


async def list_calls(request: web.Request) -> web.Response:
    """Each call's state: done, failed or pending (paged)."""
    cluster: Cluster = request.app[CLUSTER]
    view = await _job_view_or_404(request)
    failed_only = request.query.get("failed_only", "false").lower() in ("1", "true", "yes")
    offset = int_param(request, "offset", 0, 0, 10**9)
    limit = int_param(request, "limit", 100, 1, MAX_LIMIT)
    job_id, n_inputs = view.job_id, view.n_inputs
    history = cluster.history
    # Only the page is read: a job may have 100 million inputs.
    if failed_only:
        failures = await history.failures_of(job_id, limit, offset) if history else []
        page: range | list[int] = [f["input_index"] for f in failures]
        total = await history.count_failures(job_id) if history else 0
    else:
        page = range(n_inputs)[offset:offset + limit]
        failures = await history.failures_of(job_id, limit, 0, page[0], page[-1]) if history and page else []
        total = n_inputs
    failed = {f["input_index"]: f for f in failures}
    live = cluster.scheduler.jobs.get(job_id)

    def state(index: int) -> str:
        if index in failed:
            return "failed"
        if live is not None and live.status == RUNNING:
            return "done" if live.is_done(index) else "pending"
        return "done" if view.status == JobStatus.COMPLETED else "unknown"

    ran = {call["input_index"]: call for call in await history.calls_of(job_id)} if history and page else {}
    calls = []
    for index in page:
        call = {"input_index": index, "state": state(index), **_when_and_where(ran.get(index))}
        if index in failed:
            failure = failed[index]
            for key in ("exception_type", "message", "node_id", "host", "worker_pid"):
                call[key] = failure[key]
        calls.append(call)
    return json_response({"job_id": view.job_id, "total": total, "offset": offset, "calls": calls})


def _when_and_where(record: dict | None) -> dict:
    """A call's record (history keeps a job's first 100,000): start, end, node, worker, tries, outcome."""
    if record is None:
        return {}
    return {"started_at": record["started_at"], "ended_at": record["started_at"] + record["seconds"],
            "duration_s": record["seconds"], "node_id": record["node_id"], "worker_pid": record["worker_pid"],
            "attempts": record["attempts"], "outcome": "succeeded" if record["ok"] else "failed"}


async def get_node(request: web.Request) -> web.Response:
    cluster: Cluster = request.app[CLUSTER]
    node_id = request.match_info["node_id"]
    node = cluster.scheduler.nodes.get(node_id)
    events = await cluster.history.node_events_of(node_id, 20) if cluster.history else []
    if node is None and not events:
        raise web.HTTPNotFound(text=f"no node {node_id!r} on this head or in its history; `GET /v1/cluster` lists them")
    view = node_view(node).to_json() if node is not None else {"node_id": node_id, "status": "GONE"}
    return json_response({**view, "recent_events": events})


async def get_usage(request: web.Request) -> web.Response:
    """Node-hours per machine type over the last `since_days` days, with an estimated cost."""
    cluster: Cluster = request.app[CLUSTER]
    raw = request.query.get("since_days", "30")
    try:
        days = float(raw)
    except ValueError:
        days = -1.0
    if not 0 < days <= 3650:
        raise web.HTTPBadRequest(text=f"since_days must be a number of days above 0 and at most 3650, got {raw[:50]!r}")
    if cluster.history is None:
        raise web.HTTPConflict(text="this head keeps no history (--no-history): it has no usage to report")
    since = time.time() - days * 86400
    return json_response({"since_days": days,
                          **usage(await cluster.history.machine_events(MACHINE_STARTED), since)})


def add_api_routes(app: web.Application) -> None:
    app.router.add_get("/v1/cluster", cluster_state)
    app.router.add_get("/v1/head", head_state)
    app.router.add_get("/v1/jobs", list_jobs)
    app.router.add_get("/v1/jobs/{job_id}", get_job)
    app.router.add_post("/v1/jobs/{job_id}/cancel", cancel_job)
    app.router.add_get("/v1/jobs/{job_id}/failures", job_failures)
    app.router.add_get("/v1/jobs/{job_id}/calls/{index}/output", call_output)
    app.router.add_get("/v1/nodes/{node_id}/events", node_events)
    app.router.add_get("/v1/nodes/{node_id}", get_node)
    app.router.add_get("/v1/jobs/{job_id}/metrics", job_metrics)
    app.router.add_get("/v1/jobs/{job_id}/output", search_output)
    app.router.add_get("/v1/jobs/{job_id}/calls", list_calls)
    app.router.add_get("/v1/usage", get_usage)
    app.router.add_get("/v1/settings", get_settings)
    app.router.add_post("/v1/settings", update_settings)
    app.router.add_post("/v1/cluster/start", cluster_start)
    app.router.add_post("/v1/cluster/stop", cluster_stop)
    app.router.add_post("/v1/cluster/restart", cluster_restart)
