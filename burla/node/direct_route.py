"""The node's side of a client's large inputs sent straight to it (burla.protocol.direct_inputs):
one WebSocket per client and job, each frame a DirectInputs under the head's upload grant, each
answered with a DirectReceived once its inputs are queued here."""

from __future__ import annotations

import logging
import time
from typing import Protocol

from aiohttp import WSMsgType, web

from burla.errors import GrantRefused, ProtocolError
from burla.protocol import grants, limits, wire
from burla.protocol.packed_inputs import PackedInputs, unpack_uints
from burla.web import ws_bulk

log = logging.getLogger("burla.node")


class Receiver(Protocol):
    """What the route uses of the node (node/service.py's `NodeService`)."""

    def upload_key(self) -> tuple[str, bytes]:
        """This node's id and the key its head signs grants for it with (b"": not registered)."""

    def inputs_arrived(self, job_id: str, part: PackedInputs, straight: bool) -> int:
        """Queue the awaited inputs among these (sent `straight` here, or through the head); how many were."""


async def direct_socket(request: web.Request, receiver: Receiver) -> web.WebSocketResponse:
    """`GET /v1/jobs/{job_id}/direct`: the grant in each frame is the authentication (no token)."""
    job_id = request.match_info["job_id"]
    ws = web.WebSocketResponse(max_msg_size=limits.MAX_FRAME_BYTES, heartbeat=None)
    try:
        await ws.prepare(request)
    except ValueError as e:  # aiohttp's word for a malformed handshake
        raise web.HTTPBadRequest(text=f"malformed WebSocket handshake: {e}") from None
    ws_bulk.install_server(ws, request, limits.MAX_FRAME_BYTES)  # large frames read with one copy
    async for frame in ws:
        if frame.type != WSMsgType.BINARY:
            break
        try:
            msg = _granted(frame.data, job_id, receiver)
        except (ProtocolError, GrantRefused) as e:
            status = 403 if isinstance(e, GrantRefused) else 400
            await ws.send_bytes(wire.ErrorReply(type(e).__name__, str(e), status).encode())
            await ws.close(message=b"refused")
            break
        taken = receiver.inputs_arrived(job_id, msg.part(), straight=True)
        if taken < msg.part().count:
            log.info("job %s: %d of %d inputs sent here were not awaited (sent twice, or pushed elsewhere since)",
                     job_id, msg.part().count - taken, msg.part().count)
        await ws.send_bytes(wire.DirectReceived(job_id, msg.indices, b"", b"").encode())
    return ws


def _granted(data: bytes, job_id: str, receiver: Receiver) -> wire.DirectInputs:
    msg = wire.decode(data, wire.CLIENT_TO_NODE)
    assert isinstance(msg, wire.DirectInputs)  # the channel's only message
    if msg.job_id != job_id:
        raise ProtocolError("the frame's job_id does not match the URL")
    node_id, key = receiver.upload_key()
    problem = grants.upload_refusal(key, msg.grant, job_id, node_id, msg.granted, msg.expires_at, time.time())
    if problem is None and not set(unpack_uints(msg.indices)) <= set(unpack_uints(msg.granted)):
        problem = "the frame carries inputs its grant does not name"
    if problem is not None:
        raise GrantRefused(problem)
    return msg
