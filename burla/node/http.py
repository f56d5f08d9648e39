"""The node's HTTP endpoints: a health check, its state, the donor side of stealing, and a
client's large inputs sent straight here."""

from __future__ import annotations

import re
import time
from typing import Protocol, TypeVar

from aiohttp import web

from burla.config import NodeSettings
from burla.errors import GrantRefused, ProtocolError
from burla.node.direct_route import Receiver, direct_socket
from burla.node.dispatcher import Dispatcher
from burla.node.steal import Donor, Thief
from burla.protocol import wire
from burla.web.auth import token_middleware
from burla.web.connection_guard import ConnectionGuard
from burla.web.json_io import error_response, json_errors, json_response, read_body, require_text_urls

MAX_BODY = 64 * 1024
# Transfers between nodes, and a client's inputs sent here, carry the head's grant instead of the
# token (burla.protocol.grants).
TRANSFER_PATH = re.compile(r"/v1/jobs/[^/]+/(?:steal|steal/ack|direct)")


class ServedNode(Receiver, Protocol):
    """What the routes use of the node (node/service.py's `NodeService`)."""

    settings: NodeSettings
    donor: Donor
    thief: Thief
    dispatcher: Dispatcher

    def state(self) -> wire.NodeState: ...


SERVICE: web.AppKey[ServedNode] = web.AppKey("service")
M = TypeVar("M", bound=wire.Message)


def build_node_app(service: ServedNode, guard: ConnectionGuard) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY, middlewares=[
        guard.middleware, json_errors(MAX_BODY), require_text_urls,
        token_middleware(service.settings.token, on_authenticated=guard.authenticated,
                         authenticates_itself=lambda path: TRANSFER_PATH.fullmatch(path) is not None)])
    app[SERVICE] = service
    app.router.add_get("/health", health)
    app.router.add_get("/v1/state", state)
    app.router.add_post("/v1/jobs/{job_id}/steal", steal)
    app.router.add_post("/v1/jobs/{job_id}/steal/ack", steal_ack)
    app.router.add_get("/v1/jobs/{job_id}/direct", direct)
    return app


async def direct(request: web.Request) -> web.StreamResponse:
    return await direct_socket(request, request.app[SERVICE])


async def health(request: web.Request) -> web.Response:
    return json_response({"ok": True, "node_id": request.app[SERVICE].settings.node_id})


async def state(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    s = service.state()
    return json_response(
        {
            "node_id": s.node_id,
            "status": s.status,
            "workers_alive": s.workers_alive,
            "jobs": [dict(zip(("job_id", "running", "queued", "done"), j)) for j in s.jobs],
            "cpu_percent": s.cpu_percent,
            "mem_percent": s.mem_percent,
            "stolen": service.thief.stolen,
            "direct_inputs": {"straight": service.dispatcher.filled[True],
                              "through_head": service.dispatcher.filled[False]},
            "direct_results": {"straight": service.dispatcher.results_sent[True],
                               "through_head": service.dispatcher.results_sent[False]},
        }
    )


async def _decode(request: web.Request, kind: type[M]) -> M:
    try:
        body = await read_body(request)
    except web.HTTPRequestEntityTooLarge:
        raise ProtocolError(f"the body is over {MAX_BODY} bytes") from None
    msg = wire.decode(body, wire.NODE_TO_NODE)
    if not isinstance(msg, kind):
        raise ProtocolError(f"{type(msg).__name__} is not accepted here; send a {kind.__name__}")
    if getattr(msg, "job_id", None) != request.match_info["job_id"]:
        raise ProtocolError("the body's job_id does not match the URL")
    return msg


async def steal(request: web.Request) -> web.Response:
    try:
        msg = await _decode(request, wire.StealRequest)
        grant = request.app[SERVICE].donor.give(msg, time.monotonic())
    except GrantRefused as e:
        return error_response(403, "GrantRefused", str(e))
    except ProtocolError as e:
        return error_response(400, "ProtocolError", str(e))
    return web.Response(body=grant.encode(), content_type="application/msgpack")


async def steal_ack(request: web.Request) -> web.Response:
    try:
        msg = await _decode(request, wire.StealAck)
    except ProtocolError as e:
        return error_response(400, "ProtocolError", str(e))
    try:
        acknowledged = request.app[SERVICE].donor.ack(msg)
    except GrantRefused as e:
        return error_response(403, "GrantRefused", str(e))
    if not acknowledged:
        return error_response(404, "NotFound", f"no transfer {msg.transfer_id[:100]!r} here (already expired?)")
    return web.Response(status=204)
