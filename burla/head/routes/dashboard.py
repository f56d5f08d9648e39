"""The web dashboard: pages, the one-time login link, and live updates over server-sent events.

Pages are plain HTML and JavaScript from `burla/head/routes/static` (no third-party code). Each page
opens one event stream that sends a fresh snapshot whenever what it shows changes.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

from aiohttp import web

from burla.head.cluster import Cluster
from burla.head.keys import CLUSTER, HEAD_URL, SESSIONS
from burla.head.routes.api import int_param, job_view_of, jobs_listing, metrics_of
from burla.head.routes.view_builders import node_view
from burla.web.auth import JOB_SESSION, SESSION_COOKIE, Sessions, same_origin_path
from burla.web.json_io import dumps, json_response
from burla.web.login_links import LINK_PARAM, SESSION_TTL_S

STATIC = Path(__file__).parent / "static"
STREAM_EVERY_S = 0.5
PAGES = {"cluster": "Cluster", "jobs": "Jobs", "job": "Job", "settings": "Settings"}


def _page(name: str) -> web.Response:
    """Every page is the same shell; app.js draws the one named in <body data-page>."""
    html = (STATIC / "page.html").read_text().replace("{{page}}", name).replace("{{title}}", PAGES[name])
    return web.Response(text=html, content_type="text/html", headers={"Cache-Control": "no-store"})


async def cluster_page(request: web.Request) -> web.StreamResponse:
    return _page("cluster")


async def jobs_page(request: web.Request) -> web.StreamResponse:
    return _page("jobs")


async def job_page(request: web.Request) -> web.StreamResponse:
    return _page("job")


async def settings_page(request: web.Request) -> web.StreamResponse:
    return _page("settings")


async def login_needed(request: web.Request) -> web.Response:
    """What a browser without a session sees: the page, if its link carries a valid sign-in
    code (a job's link as the client prints it); else how to get in."""
    code = request.query.get(LINK_PARAM)
    job_id = request.match_info.get("job_id") if request.match_info.route.resource is not None else None
    if code and job_id is not None and request.path.startswith("/jobs/"):
        session = request.app[SESSIONS].redeem_link(request.path, code, job_id)
        if session is not None:
            from urllib.parse import urlencode

            rest = {key: value for key, value in request.query.items() if key != LINK_PARAM}
            raise _signed_in(request, session, request.path + (f"?{urlencode(rest)}" if rest else ""))
    html = (STATIC / "login.html").read_text()
    return web.Response(text=html, content_type="text/html", status=401)


async def login(request: web.Request) -> web.StreamResponse:
    """Trade a one-time code for a session cookie, then go where the link pointed."""
    code = request.query.get("code", "")
    target = request.query.get("next", "/")
    if not same_origin_path(target):
        target = "/"
    session = request.app[SESSIONS].redeem(code) if code else None
    if session is None:
        return await login_needed(request)
    raise _signed_in(request, session, target)


def _signed_in(request: web.Request, session: str, target: str) -> web.HTTPFound:
    """A redirect to `target` that sets the session cookie (the code leaves the address bar)."""
    response = web.HTTPFound(target)
    response.set_cookie(SESSION_COOKIE, session, httponly=True, samesite="Strict", path="/",
                        max_age=int(SESSION_TTL_S), secure=request.secure)
    return response


async def login_link(request: web.Request) -> web.Response:
    """A one-time link that logs a browser in (minted with the token, valid five minutes)."""
    target = request.query.get("next", "/")
    if not same_origin_path(target):
        raise web.HTTPBadRequest(text="next must be a path on this head, e.g. /jobs")
    code = request.app[SESSIONS].new_code()
    from urllib.parse import urlencode

    url = f"{request.app[HEAD_URL]}/login?{urlencode({'code': code, 'next': target})}"
    return json_response({"url": url, "expires_in_s": 300})


STATIC_NAME = re.compile(r"[a-z][a-z0-9_-]{0,50}\.(?:js|css)")


async def static_file(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    # Checked before the file system sees it: no NUL, no overlong or path-like names.
    path = STATIC / name if STATIC_NAME.fullmatch(name) else None
    if path is None or not path.is_file():
        raise web.HTTPNotFound(text=f"no static file {name[:100]!r}")
    return web.FileResponse(path, headers={"Cache-Control": "no-store"})


# --- live snapshots ------------------------------------------------------------------------


async def _cluster_snapshot(cluster: Cluster, request: web.Request) -> dict:
    s = cluster.scheduler
    return {
        "version": cluster.version,
        "booting": s.booting,
        "booting_stages": {n: cluster.machines.boot_stage(n) for n in sorted(cluster.booting_ids)},
        "nodes": [node_view(n).to_json() for n in s.nodes.values()],
        "jobs": await jobs_listing(cluster, None, 10),
    }


async def _jobs_snapshot(cluster: Cluster, request: web.Request) -> dict:
    limit = int_param(request, "limit", 200, 1, 1000)
    return {"jobs": await jobs_listing(cluster, None, limit)}


async def _job_snapshot(cluster: Cluster, request: web.Request) -> dict:
    job_id = request.match_info["job_id"]
    view = await job_view_of(cluster, job_id)
    if view is None:
        raise web.HTTPNotFound(text=f"no job {job_id!r} on this head or in its history")
    failures = await cluster.history.failures_of(job_id, 50) if cluster.history else []
    children = await jobs_listing(cluster, None, 200, parent=job_id)
    parent = None
    if view.parent_job_id and cluster.history is not None:
        parent = await cluster.history.get_job(view.parent_job_id)
    return {"job": view.to_json(), "metrics": await metrics_of(cluster, view), "failures": failures,
            "children": children, "parent": parent, "read_only": JOB_SESSION in request, "now": time.time()}


def _stream(build):
    async def handler(request: web.Request) -> web.StreamResponse:
        cluster = request.app[CLUSTER]
        first = await build(cluster, request)  # a 404 or 400 before the stream starts
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
        await response.prepare(request)
        last = None
        snapshot = first
        try:
            while True:
                text = dumps({k: v for k, v in snapshot.items() if k != "now"}, default=str)
                if text != last:
                    await response.write(f"data: {dumps(snapshot, default=str)}\n\n".encode())
                    last = text
                await asyncio.sleep(STREAM_EVERY_S)
                snapshot = await build(cluster, request)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return response

    return handler


def add_dashboard_routes(app: web.Application, sessions: Sessions, head_url: str) -> None:
    app[SESSIONS] = sessions
    app[HEAD_URL] = head_url
    app.router.add_get("/", cluster_page)
    app.router.add_get("/jobs", jobs_page)
    app.router.add_get("/jobs/{job_id}", job_page)
    app.router.add_get("/settings", settings_page)
    app.router.add_get("/login", login)
    app.router.add_get("/static/{name}", static_file)
    app.router.add_post("/v1/login-link", login_link)
    app.router.add_get("/v1/stream/cluster", _stream(_cluster_snapshot))
    app.router.add_get("/v1/stream/jobs", _stream(_jobs_snapshot))
    app.router.add_get("/v1/stream/jobs/{job_id}", _stream(_job_snapshot))
