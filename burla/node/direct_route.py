"""The node's side of a client's connection for a job (burla.protocol.direct_inputs and
direct_results): one WebSocket per client and job, opened with the head's upload grant. Each
DirectInputs frame is answered with a DirectReceived once its inputs are queued here; the job's
large results go the other way (node/result_pipes.py), each DirectResults frame answered by the
client's DirectResultsReceived."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Protocol

from aiohttp import WSMsgType, web

from burla.errors import ProtocolError
from burla.node.dispatcher import Dispatcher
from burla.node.result_pipes import ResultPipe, ResultPipes
from burla.protocol import grants, limits, wire
from burla.protocol.direct_inputs import EXPIRES_HEADER, GRANT_HEADER
from burla.protocol.values.packed_inputs import PackedInputs, pack_uints
from burla.web import ws_bulk
from burla.web.json_io import error_response

log = logging.getLogger("burla.node")

IDLE_CHECK_S = 60.0  # a connection quiet this long is closed once the node no longer runs its job


class Receiver(Protocol):
    """What the route uses of the node (node/service.py's `NodeService`)."""

    def upload_key(self) -> tuple[str, bytes]:
        """This node's id and the key its head signs grants for it with (b"": not registered)."""

    @property
    def spent_grants(self) -> grants.SpentGrants:
        """The upload grants that opened a connection here (each opens one)."""

    def inputs_arrived(self, job_id: str, part: PackedInputs, straight: bool) -> list[int]:
        """Queue the awaited inputs among these (sent `straight` here, or through the head); which were."""

    def runs(self, job_id: str) -> bool:
        """Whether the node holds this job now (assigned, not released)."""

    @property
    def dispatcher(self) -> Dispatcher: ...

    @property
    def result_pipes(self) -> ResultPipes: ...


async def direct_socket(request: web.Request, receiver: Receiver) -> web.StreamResponse:
    """`GET /v1/jobs/{job_id}/direct`: the upload grant in its headers is the authentication (no
    token), checked before a frame is read."""
    job_id = request.match_info["job_id"]
    refused = _refusal(request, job_id, receiver)
    if refused is not None:
        return refused
    ws = web.WebSocketResponse(max_msg_size=limits.MAX_FRAME_BYTES, heartbeat=None)
    try:
        await ws.prepare(request)
    except ValueError as e:  # aiohttp's word for a malformed handshake
        raise web.HTTPBadRequest(text=f"malformed WebSocket handshake: {e}") from None
    ws_bulk.install_server(ws, request, limits.MAX_FRAME_BYTES)  # large frames read with one copy
    pipe = receiver.result_pipes.opened(job_id, ws)
    sender = asyncio.create_task(pipe.run(receiver.dispatcher), name=f"results-to-client-{job_id}")
    try:
        if await _serve(ws, job_id, receiver, pipe):
            with contextlib.suppress(Exception):  # its answer, then the close (the client's reply, or 10 s)
                async with asyncio.timeout(15):
                    await asyncio.shield(sender)
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await sender
        receiver.result_pipes.closed(pipe)
    return ws


async def _serve(ws: web.WebSocketResponse, job_id: str, receiver: Receiver, pipe: ResultPipe) -> bool:
    """Read the client's frames until it closes (False), or is refused or quiet past its job (True:
    the pipe's writer answers it and closes the connection)."""
    while True:
        try:
            frame = await ws.receive(timeout=IDLE_CHECK_S)
        except TimeoutError:  # a client gone without a word leaves no connection behind its job
            if receiver.runs(job_id):
                continue
            pipe.answer(None, close=b"idle")
            return True
        if frame.type != WSMsgType.BINARY:
            return False
        try:
            msg = wire.decode(frame.data, wire.CLIENT_TO_NODE)
            if getattr(msg, "job_id", None) != job_id:
                raise ProtocolError("the frame's job_id does not match the URL")
            if isinstance(msg, wire.DirectResultsReceived):
                receiver.result_pipes.received(pipe, msg)
                continue
        except ProtocolError as e:
            pipe.answer(wire.ErrorReply("ProtocolError", str(e), 400).encode(), close=b"refused")
            return True
        assert isinstance(msg, wire.DirectInputs)  # the channel's other message
        part = msg.part()
        taken = receiver.inputs_arrived(job_id, part, straight=True)
        if len(taken) < part.count:
            log.info("job %s: %d of %d inputs sent here were not awaited (sent twice, pushed elsewhere since, or "
                     "here before their placeholders)", job_id, part.count - len(taken), part.count)
        # Only what it took: the client sends the rest through the head, behind their placeholders.
        pipe.answer(wire.DirectReceived(job_id, pack_uints(taken), b"", b"").encode())  # its writer's turn


def _refusal(request: web.Request, job_id: str, receiver: Receiver) -> web.Response | None:
    """The answer to a connection without the head's grant for this node and job (None: it has one)."""
    try:
        grant = bytes.fromhex(request.headers.get(GRANT_HEADER, ""))
        expires_at = float(request.headers.get(EXPIRES_HEADER, ""))
    except ValueError:
        return error_response(400, "ProtocolError", f"send the upload grant in {GRANT_HEADER} (hex) and its "
                              f"expiry in {EXPIRES_HEADER} (seconds), as the head gave them")
    node_id, key = receiver.upload_key()
    now = time.time()
    problem = grants.upload_refusal(key, grant, job_id, node_id, expires_at, now)
    if problem is None:
        problem = receiver.spent_grants.spend(grant, expires_at, now)
    if problem is None:
        return None
    log.warning("job %s: refused a direct connection from %s: %s", job_id, request.remote, problem)
    return error_response(403, "GrantRefused", problem)
