"""The head's aiohttp application: authentication, the JSON API, the two WebSockets and the
dashboard.

Every route but `/health` and `/login` needs `Authorization: Bearer <cluster token>` (compared
in constant time) or a dashboard session cookie; errors are JSON `{"error": kind, "message":
what to fix}` with a 4xx status.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from burla.auth import Sessions, token_middleware
from burla.connection_guard import ConnectionGuard
from burla.head.api import FLEET, LOOP_MONITOR, add_api_routes
from burla.head.channels import CLUSTER, OPEN_SOCKETS, close_open_sockets, job_channel, node_channel
from burla.head.cluster import Cluster
from burla.head.dashboard import add_dashboard_routes, login_needed
from burla.head.fleet import Fleet
from burla.head.loop_monitor import LoopMonitor
from burla.web_json import json_errors, json_response, require_text_urls

MAX_HTTP_BODY = 1024 * 1024
STOP = web.AppKey("stop", asyncio.Event)


async def health(request: web.Request) -> web.Response:
    cluster: Cluster = request.app[CLUSTER]
    return json_response({"ok": True, "version": cluster.version})


async def shutdown(request: web.Request) -> web.Response:
    request.app[STOP].set()
    return json_response({"ok": True})


def build_app(cluster: Cluster, fleet: Fleet, token: str, stop_event: asyncio.Event, head_url: str,
              guard: ConnectionGuard, loop_monitor: LoopMonitor) -> web.Application:
    sessions = Sessions(token)
    app = web.Application(
        client_max_size=MAX_HTTP_BODY,
        middlewares=[guard.middleware, json_errors(MAX_HTTP_BODY), require_text_urls,
                     token_middleware(token, sessions, login_page=login_needed, on_authenticated=guard.authenticated)],
    )
    app[CLUSTER] = cluster
    app[FLEET] = fleet
    app[LOOP_MONITOR] = loop_monitor
    app[STOP] = stop_event
    app[OPEN_SOCKETS] = set()
    app.on_shutdown.append(close_open_sockets)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/jobs/ws", job_channel)
    app.router.add_get("/v1/nodes/ws", node_channel)
    app.router.add_post("/v1/shutdown", shutdown)
    add_api_routes(app)
    add_dashboard_routes(app, sessions, head_url)
    return app
