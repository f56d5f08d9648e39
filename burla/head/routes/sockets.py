"""The head's two WebSocket endpoints: one per node (/v1/nodes/ws), one per job (/v1/jobs/ws).

A frame that doesn't decode, or that breaks the protocol, gets an ErrorReply naming the
problem (with the HTTP status it would have had) and the connection is closed with code 1008;
the head keeps serving everyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

from aiohttp import WSCloseCode, WSMessage, WSMsgType, web

from burla.config import MAX_FUNCTION_BYTES, MAX_RAM_GB_PER_CALL, MIN_RAM_GB_PER_CALL
from burla.errors import BurlaError, ProtocolError, VersionMismatch
from burla.head.budget import HeadLimits, check_open_job, check_tree_budget
from burla.head.cluster import Cluster
from burla.head.direct_uploads import is_loopback
from burla.head.keys import CLIENT_CONNECTIONS, CLUSTER, LIMITS, OPEN_SOCKETS
from burla.head.links import ClientLink, NodeLink
from burla.head.messages import accepted_message
from burla.head.routes.access import check_job_message
from burla.head.scheduling.records import JobRecord
from burla.process.loop_supervisor import end_tasks
from burla.protocol import grants, limits, wire
from burla.protocol.job_options import MAX_RETRIES, MAX_TIMEOUT_S, MIN_TIMEOUT_S
from burla.protocol.validation import GPU_CHOICES, IMAGE, JOB_ID, REGION, matches, packages_problem
from burla.web import scoped_tokens, ws_bulk
from burla.web.auth import CREDENTIAL, SCOPE
from burla.web.json_io import error_response
from burla.web.scoped_tokens import Scope

log = logging.getLogger("burla.head")

FIRST_FRAME_TIMEOUT_S = 30.0
T = TypeVar("T")
CLIENT_HEARTBEAT_S = 10.0  # a silently dead client connection is noticed within about this
SHUTDOWN_CLOSE_S = 0.5  # how long a peer gets to answer the close frame of a stopping head
NODE_CLOSE_S = 12.0  # closing a node's connection: above aiohttp's 10 s wait for the node's close frame


def _status_for(error: BurlaError) -> int:
    return {
        "ProtocolError": 400,
        "InvalidArgument": 400,
        "FunctionTooBig": 413,
        "Unauthorized": 401,
        "NoNodes": 503,
        "NoCompatibleNodes": 409,
        "VersionMismatch": 409,
        "JobNotFound": 404,
        "BudgetExceeded": 429,
    }.get(type(error).__name__, 400)


async def _refuse(ws: web.WebSocketResponse, error: BurlaError) -> None:
    with contextlib.suppress(ConnectionError, RuntimeError):
        await ws.send_bytes(wire.ErrorReply(type(error).__name__, str(error), _status_for(error)).encode())
        await ws.close(code=WSCloseCode.POLICY_VIOLATION, message=str(error)[:120].encode())


async def _first_frame(ws: web.WebSocketResponse, allowed: wire.Channel) -> wire.Message | None:
    try:
        frame = await asyncio.wait_for(ws.receive(), FIRST_FRAME_TIMEOUT_S)
    except TimeoutError:
        await _refuse(ws, ProtocolError("no opening frame within 30 s"))
        return None
    if frame.type != WSMsgType.BINARY:
        if frame.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.CLOSING, WSMsgType.ERROR):
            return None
        await _refuse(ws, ProtocolError("frames must be binary msgpack"))
        return None
    try:
        return wire.decode(frame.data, allowed)
    except ProtocolError as e:
        await _refuse(ws, e)
        return None


async def _upgrade(ws: web.WebSocketResponse, request: web.Request) -> None:
    """Answer the WebSocket handshake; a malformed one is a 400 (aiohttp raises a bare ValueError
    for a Sec-WebSocket-Key that is not ASCII)."""
    try:
        await ws.prepare(request)
    except ValueError as e:
        raise web.HTTPBadRequest(text=f"malformed WebSocket handshake: {e}") from None
    ws_bulk.install_server(ws, request, limits.MAX_FRAME_BYTES)  # large frames read with one copy
    sockets = request.app[OPEN_SOCKETS]
    sockets.add(ws)
    request.task.add_done_callback(lambda _: sockets.discard(ws))


async def close_open_sockets(app: web.Application) -> None:
    """The head is stopping: close every WebSocket with "going away". Otherwise the server waits
    out its shutdown timeout for connections that stay open by design (a client keeps its job
    connection for its next job; a node keeps its link), and the user's script waits for it."""
    open_sockets = app[OPEN_SOCKETS]
    sockets = list(open_sockets)
    if sockets:
        await asyncio.wait([asyncio.ensure_future(ws.close(code=WSCloseCode.GOING_AWAY, message=b"head stopping"))
                            for ws in sockets], timeout=SHUTDOWN_CLOSE_S)


def _check_version(theirs: str, ours: str) -> str | None:
    if theirs.split(".")[:2] != ours.split(".")[:2]:
        return (
            f"This head runs burla {ours} and the peer runs burla {theirs}. Run the same burla on both "
            f"(the head installs its own build on the VMs it boots)."
        )
    return None


def _check_build(theirs: str, ours: str) -> str | None:
    if theirs != ours:
        return (
            f"This node runs burla build {theirs} but the head runs build {ours}. Nodes must run the head's "
            "exact build: the head installs it on the VMs it boots; for a node started by hand, install burla "
            "from the same checkout or wheel as the head."
        )
    return None


class TakeTurns:
    """A connection whose frames are already buffered gets them from `receive()` without ever
    suspending, so one busy peer could hold the loop for all of them: after SLICE_S of work,
    let every other connection run once."""

    SLICE_S = 0.002

    def __init__(self) -> None:
        self._since = time.monotonic()

    async def take(self) -> None:
        now = time.monotonic()
        if now - self._since > self.SLICE_S:
            await asyncio.sleep(0)
            self._since = time.monotonic()


async def node_socket(request: web.Request) -> web.WebSocketResponse:
    cluster: Cluster = request.app[CLUSTER]
    ws = web.WebSocketResponse(max_msg_size=limits.MAX_FRAME_BYTES, heartbeat=None)
    await _upgrade(ws, request)
    first = await _first_frame(ws, wire.NODE_OPENING)
    if first is None:
        return ws
    assert isinstance(first, wire.RegisterNode)
    # Who is asking first: a caller that may not speak for this node id changes nothing of it.
    identity = _identity_problem(first, cluster, request.get(SCOPE))
    problem = identity or _registration_problem(first, cluster)
    if problem is not None:
        if identity is None and first.node_id in cluster.booting_ids:  # a VM this head booted that can never join
            cluster.node_boot_failed(first.node_id, f"refused: {problem}")
            cluster.machines.remove_machine(first.node_id, "refused at registration")
        await _refuse(ws, ProtocolError(problem))
        return ws
    # Right after a restart, jobs kept in history are taken up first: what the node kept running
    # belongs to them. If that takes too long, close without an answer; the node tries again.
    try:
        await asyncio.wait_for(cluster.recovery.done.wait(), FIRST_FRAME_TIMEOUT_S)
    except TimeoutError:
        await ws.close()
        return ws
    grant_key = grants.new_key()
    try:
        await ws.send_bytes(wire.NodeRegistered(first.node_id, cluster.version, grant_key,
                                                scoped_tokens.node_token(cluster.token, first.node_id)).encode())
    except (ConnectionError, RuntimeError):  # gone before it heard back: nothing to undo
        return ws
    link = NodeLink(first.node_id, ws, request.transport, cluster.node_writes)
    writer = asyncio.create_task(link.run(), name=f"node-{first.node_id}-writer")
    reader = asyncio.create_task(_node_frames(cluster, ws, first.node_id, link), name=f"node-{first.node_id}-reader")
    link.stop_reading = reader.cancel  # declared dead or leaving: its frames are stale from then on
    cluster.node_registered(first, link, grant_key, request.remote or "")
    try:
        await asyncio.wait({reader})
    finally:
        await end_tasks(log, reader, writer)
        if cluster.node_links.get(first.node_id) is link:
            cluster.node_dropped(first.node_id)
        # Closed here, with no receive pending, aiohttp reads on to the node's own close frame
        # (within its close timeout). Closed from another task while this one read, it would cut
        # the connection at once, with the node's frames unread, and the reset that follows can
        # lose the close frame on its way.
        try:
            await asyncio.wait_for(ws.close(), NODE_CLOSE_S)
        except TimeoutError:  # the send waited on a node that stopped reading: cut, unsent bytes and all
            if request.transport is not None:
                request.transport.abort()
        except (ConnectionError, RuntimeError):
            pass
    return ws


def _registration_problem(first: wire.RegisterNode, cluster: Cluster) -> str | None:
    problem = _check_version(first.version, cluster.version) or _check_build(first.build, cluster.build)
    if problem is None and (not 1 <= first.slots <= MAX_NODE_SLOTS or not 1 <= first.cpus <= MAX_NODE_SLOTS
                            or not first.node_id):
        problem = f"RegisterNode needs a node_id, and slots and cpus from 1 to {MAX_NODE_SLOTS}"
    if problem is None and not (0 < first.ram_gb <= MAX_RAM_GB_PER_CALL and 0 <= first.gpu_count <= MAX_NODE_SLOTS):
        problem = (f"RegisterNode needs ram_gb above 0 and at most {MAX_RAM_GB_PER_CALL:g}, and gpu_count "
                   f"from 0 to {MAX_NODE_SLOTS}")
    if problem is None and len(first.cert_sha256) not in (0, 32):
        problem = "RegisterNode.cert_sha256 must be empty or a 32-byte SHA-256 digest"
    return problem or cluster.machines.registration_problem(first)


def _identity_problem(first: wire.RegisterNode, cluster: Cluster, scope: Scope | None) -> str | None:
    """A node's token registers that node only; the node id of a connected node is taken, except by
    that node itself, proving the session it got at registration (it reconnects before the head
    noticed its old connection end): a token alone, read from the node's files, can't take it over."""
    if scope is not None and first.node_id != scope.subject:
        return f"this token is node {scope.subject}'s: it can't register node {first.node_id}"
    if first.node_id not in cluster.node_links:
        return None
    record = cluster.scheduler.nodes.get(first.node_id)
    if record is not None and record.grant_key and hmac.compare_digest(
            first.session_proof, grants.session_proof(record.grant_key, first.node_id)):
        return None
    log.warning("refused a registration as connected node %s without its session's proof", first.node_id)
    return (f"node {first.node_id} is connected: only that node, proving the session it got at registration, can "
            "register under its id while that session lasts (a token alone can't)")


async def _node_frames(cluster: Cluster, ws: web.WebSocketResponse, node_id: str, link: NodeLink) -> None:
    """A registered node's frames, until its connection ends or it is declared dead."""
    turns = TakeTurns()
    async for frame in ws:
        await turns.take()
        if frame.type != WSMsgType.BINARY:
            break
        try:
            msg = wire.decode(frame.data, wire.NODE_TO_HEAD)
            if cluster.node_links.get(node_id) is not link:
                break  # declared dead meanwhile: whatever it still sends is stale
            cluster.on_node_message(node_id, msg)  # checks packed results where it decodes them
        except ProtocolError as e:
            await _refuse(ws, e)
            break


# Bounds on what one job may ask for: far above any machine, low enough that arithmetic and
# the state kept per job stay small.
MAX_CPUS_PER_CALL = 100_000
MAX_NODE_SLOTS = 100_000  # CPUs, workers or GPUs of one machine
MAX_PARALLELISM = 10_000_000
MAX_DISK_GB = 65536
MAX_NAME_CHARS = 500
MAX_LOCAL_CODE_BYTES = 100 * 1024 * 1024


def _validate_open(spec: wire.OpenJob) -> None:
    """Every field of a new job, before the head changes any state for it."""
    _check_sizes(spec)
    _check_resources(spec)
    _check_names(spec)
    problem = packages_problem(spec.packages)
    if problem is not None:
        raise ProtocolError(problem)


def _check_sizes(spec: wire.OpenJob) -> None:
    if not 1 <= spec.n_inputs <= limits.MAX_INPUTS:
        raise ProtocolError(f"n_inputs must be between 1 and {limits.MAX_INPUTS:,}")
    indices = [index for index, _ in spec.first_inputs]
    in_order = len(indices) <= spec.n_inputs and indices == list(range(len(indices)))  # the common case
    if not in_order and (not all(0 <= index < spec.n_inputs for index in indices)
                         or len(set(indices)) != len(indices)):
        raise ProtocolError(f"first_inputs must have distinct input indices in 0..{spec.n_inputs - 1}")
    if len(spec.function_bytes) > MAX_FUNCTION_BYTES:
        raise ProtocolError(f"the function is over {MAX_FUNCTION_BYTES // 2**20} MB pickled")
    if len(spec.local_code) > MAX_LOCAL_CODE_BYTES:
        raise ProtocolError(f"local_code is over {MAX_LOCAL_CODE_BYTES // 2**20} MB")


def _check_resources(spec: wire.OpenJob) -> None:
    for name, high in (("func_cpu", MAX_CPUS_PER_CALL), ("max_parallelism", MAX_PARALLELISM),
                       ("disk_gb", MAX_DISK_GB)):
        value = getattr(spec, name)
        if value is not None and not 1 <= value <= high:
            raise ProtocolError(f"{name} must be between 1 and {high}")
    if spec.func_ram is not None and not MIN_RAM_GB_PER_CALL <= spec.func_ram <= MAX_RAM_GB_PER_CALL:
        raise ProtocolError(f"func_ram must be a number of GB from {MIN_RAM_GB_PER_CALL:g} to {MAX_RAM_GB_PER_CALL:g}")
    if spec.func_gpu is not None and spec.func_gpu.upper() not in GPU_CHOICES:
        raise ProtocolError(f"func_gpu must be one of {', '.join(GPU_CHOICES)}")
    if not 0 <= spec.retries <= MAX_RETRIES:
        raise ProtocolError(f"retries must be between 0 and {MAX_RETRIES}")
    if spec.timeout is not None and not MIN_TIMEOUT_S <= spec.timeout <= MAX_TIMEOUT_S:
        raise ProtocolError(f"timeout must be a number of seconds from {MIN_TIMEOUT_S:g} to {MAX_TIMEOUT_S:g}")


def _check_names(spec: wire.OpenJob) -> None:
    for name in ("job_id", "parent_job_id"):
        value = getattr(spec, name)
        if (value is not None or name == "job_id") and not matches(JOB_ID, value):
            raise ProtocolError(f"{name} must be 1 to 200 letters, digits and _.-")
    if spec.image is not None and not matches(IMAGE, spec.image):
        raise ProtocolError("image must be a container image reference (letters, digits and ._/:@+-, not "
                            "starting with -)")
    if spec.region is not None and not matches(REGION, spec.region):
        raise ProtocolError("region must be a cloud region name such as us-east-1, us-central1 or eastus")
    for name in ("function_name", "client_version", "python_version"):
        if len(getattr(spec, name)) > MAX_NAME_CHARS:
            raise ProtocolError(f"{name} is over {MAX_NAME_CHARS} characters")


async def job_socket(request: web.Request) -> web.StreamResponse:
    """One client connection, carrying one job at a time: a client keeps its connection for its
    next job, and that job's opening ends its part in the one before (as a close would)."""
    cluster: Cluster = request.app[CLUSTER]
    head_limits, connections = request.app[LIMITS], request.app[CLIENT_CONNECTIONS]
    credential = request.get(CREDENTIAL, "")
    refusal = connections.take(credential, head_limits)
    if refusal is not None:
        return error_response(429, "Too Many Requests", refusal)
    try:
        ws = web.WebSocketResponse(max_msg_size=limits.MAX_FRAME_BYTES, heartbeat=CLIENT_HEARTBEAT_S)
        await _upgrade(ws, request)
        # Handed over in a list the job's code empties: an opening may carry the first inputs, which
        # must not stay referenced here for as long as the job runs.
        handover = [await _first_frame(ws, wire.JOB_OPENING)]
        client_local = is_loopback(request.remote)
        while handover[0] is not None:
            handover = [await _serve_job(cluster, ws, handover, head_limits, request.get(SCOPE), client_local)]
        return ws
    finally:
        connections.give_back(credential)


async def _serve_job(cluster: Cluster, ws: web.WebSocketResponse, handover: list, head_limits: HeadLimits,
                     scope: Scope | None, client_local: bool) -> wire.Message | None:
    """Open or resume the job the message in `handover` names and serve it until the connection
    ends (None) or the client opens its next job on it (that opening is returned)."""
    first = handover.pop()
    early: list[WSMessage] = []  # frames read while the opening waited
    opened = await _open_or_resume(cluster, ws, first, head_limits, scope, early)
    del first  # its inputs are the job's now
    if opened is None:
        return None
    job, link, reply = opened
    if link.ws is not None:  # a half-open older connection: the newer one wins
        await link.ws.close()
        await link.detach(link.ws, time.monotonic())
    try:
        await ws.send_bytes(reply.encode())
    except ConnectionError:  # the client is gone already: the job waits for it as after any cut
        link.attach(ws)
        await link.detach(ws, time.monotonic())
        cluster.client_left(job, link)
        return None
    link.client_local = client_local
    link.attach(ws)
    if isinstance(reply, wire.JobResumed):
        cluster.direct.client_back(job)
    try:
        return await _client_frames(cluster, ws, job, early)
    finally:
        await link.detach(ws, time.monotonic())
        cluster.client_left(job, link)


async def _open_or_resume(cluster: Cluster, ws: web.WebSocketResponse, first: wire.Message, head_limits: HeadLimits,
                          scope: Scope | None, early: list[WSMessage]
                          ) -> tuple[JobRecord, ClientLink, wire.Message] | None:
    """The job, its client link and the answer to send; None if the connection was answered
    (refused) or closed here. A job token's client stays in its job's tree. Frames the client
    sends while the opening waits are read into `early`."""
    try:
        await check_job_message(cluster, scope, first)
        if isinstance(first, wire.OpenJob):
            _validate_open(first)
            problem = _check_version(first.client_version, cluster.version)
            if problem is not None:
                raise VersionMismatch(problem)
            check_open_job(head_limits, len(cluster.scheduler.running))
            if scope is not None:  # a call's nested job: its tree has a budget of its own
                check_tree_budget(head_limits, cluster.scheduler.jobs, scope.subject, first)
            # E.g. the cloud's machine list, for grow: seconds of a cloud's API on a head's first grow job.
            await _reading_meanwhile(ws, cluster.machines.ready_for(first), early)
            job, link = cluster.open_job(first)  # and queues the inputs it carries
            return job, link, accepted_message(job, cluster.token)
        assert isinstance(first, wire.ResumeJob)
        # Right after a restart, the jobs kept in history are being taken up: wait for that;
        # if it takes too long, close without an answer so that the client tries again.
        try:
            await asyncio.wait_for(cluster.recovery.done.wait(), FIRST_FRAME_TIMEOUT_S)
        except TimeoutError:
            await ws.close()
            return None
        # A job's calls may collect the jobs nested in theirs (not their own job: its client is the user's).
        nested = scope is not None and scope.kind == "job" and first.job_id != scope.subject
        return cluster.resume_job(first, nested_in_token=nested)
    except BurlaError as e:
        await _refuse(ws, e)
        return None


async def _reading_meanwhile(ws: web.WebSocketResponse, waited: Coroutine[Any, Any, T], early: list[WSMessage]) -> T:
    """`waited`'s result, the connection's frames read into `early` meanwhile: aiohttp answers a
    client's pings only as its frames are read, and a client that hears no pong within half its
    heartbeat (client.runner.HEARTBEAT_S) takes the head for gone."""
    task = asyncio.create_task(waited)
    try:
        while not task.done() and not (early and early[-1].type != WSMsgType.BINARY):
            reading = asyncio.create_task(ws.receive())
            await asyncio.wait((task, reading), return_when=asyncio.FIRST_COMPLETED)
            if reading.done():
                early.append(reading.result())
            else:  # a pending receive gives up nothing it has not returned
                await end_tasks(log, reading)
        return await task
    finally:
        if not task.done():
            await end_tasks(log, task)


async def _frames(ws: web.WebSocketResponse, early: list[WSMessage]) -> AsyncIterator[WSMessage]:
    while early:
        yield early.pop(0)
    async for frame in ws:
        yield frame


async def _client_frames(cluster: Cluster, ws: web.WebSocketResponse, job: JobRecord,
                         early: list[WSMessage]) -> wire.Message | None:
    """A client's frames for its job (those read while it opened first), until the connection
    ends (None) or it opens its next job."""
    turns = TakeTurns()
    async for frame in _frames(ws, early):
        await turns.take()
        if frame.type != WSMsgType.BINARY:
            break
        try:
            msg = wire.decode(frame.data, wire.CLIENT_TO_HEAD)
            if isinstance(msg, wire.InputBatch):
                cluster.add_inputs(job, msg.part())
            elif isinstance(msg, wire.DirectFallback):
                cluster.direct.fallback(job, msg)
            elif isinstance(msg, wire.ResultAck):
                cluster.ack(job, msg.seq)
            elif isinstance(msg, wire.CancelJob):
                cluster.cancel(job.job_id, msg.reason or "canceled by the client")
            else:  # the client's next job
                return msg
        except ProtocolError as e:
            cluster.cancel(job.job_id, f"protocol error: {e}")
            await asyncio.sleep(0)  # let the writer flush what the cancel queued
            await _refuse(ws, e)
            break
    return None
