"""The head's aiohttp application: authentication, HTTP routes and the two WebSockets.

Every route but `/health` needs `Authorization: Bearer <cluster token>` (compared in constant
time); errors are JSON `{"error": kind, "message": what to fix}` with a 4xx status.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from aiohttp import web

from burla.auth import error_response, token_middleware
from burla.head.channels import CLUSTER, job_channel, node_channel
from burla.head.cluster import Cluster

MAX_HTTP_BODY = 1024 * 1024
STOP = web.AppKey("stop", asyncio.Event)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge:
        return error_response(413, "RequestTooLarge", f"the body is over the {MAX_HTTP_BODY} byte limit")
    except web.HTTPException as e:
        if e.status >= 400:
            return error_response(e.status, e.reason.replace(" ", ""), e.text or e.reason)
        raise


async def health(request: web.Request) -> web.Response:
    cluster: Cluster = request.app[CLUSTER]
    return web.json_response({"ok": True, "version": cluster.version})


async def cluster_state(request: web.Request) -> web.Response:
    cluster: Cluster = request.app[CLUSTER]
    s = cluster.scheduler
    return web.json_response(
        {
            "version": cluster.version,
            "booting": s.booting,
            "nodes": [cluster.node_view(n) for n in s.nodes.values()],
            "jobs": [cluster.job_view(j) for j in reversed(list(s.jobs.values()))],
        }
    )


def _job_or_404(request: web.Request):
    cluster: Cluster = request.app[CLUSTER]
    job_id = request.match_info["job_id"]
    job = cluster.scheduler.jobs.get(job_id)
    if job is None:
        raise web.HTTPNotFound(text=f"no job {job_id!r} on this head; `GET /v1/cluster` lists jobs")
    return cluster, job


async def get_job(request: web.Request) -> web.Response:
    cluster, job = _job_or_404(request)
    return web.json_response(cluster.job_view(job))


async def cancel_job(request: web.Request) -> web.Response:
    cluster, job = _job_or_404(request)
    reason = "canceled over HTTP"
    if request.can_read_body:
        try:
            body = json.loads(await request.read() or b"{}")
        except ValueError:
            return error_response(400, "BadRequest", "the body must be JSON, e.g. {\"reason\": \"...\"}")
        if not isinstance(body, dict) or not isinstance(body.get("reason", ""), str):
            return error_response(400, "BadRequest", "the body must be an object whose 'reason' is a string")
        reason = body.get("reason") or reason
    if not cluster.cancel(job.job_id, reason):
        return error_response(409, "Conflict", f"job {job.job_id} already ended ({job.status})")
    return web.json_response(cluster.job_view(job))


async def shutdown(request: web.Request) -> web.Response:
    request.app[STOP].set()
    return web.json_response({"ok": True})


def build_app(cluster: Cluster, token: str, stop_event: asyncio.Event) -> web.Application:
    app = web.Application(
        client_max_size=MAX_HTTP_BODY, middlewares=[_errors_middleware, token_middleware(token)]
    )
    app[CLUSTER] = cluster
    app[STOP] = stop_event
    app.router.add_get("/health", health)
    app.router.add_get("/v1/cluster", cluster_state)
    app.router.add_get("/v1/jobs/ws", job_channel)
    app.router.add_get("/v1/jobs/{job_id}", get_job)
    app.router.add_post("/v1/jobs/{job_id}/cancel", cancel_job)
    app.router.add_get("/v1/nodes/ws", node_channel)
    app.router.add_post("/v1/shutdown", shutdown)
    return app
