"""The client's side of large inputs sent straight to their node (burla.protocol.direct_inputs),
and of large results taken straight from it (burla.protocol.direct_results).

The head says where each placeholder went (`UploadDirect`); this sends the inputs' bytes there,
one WebSocket per node, frame after frame, each answered by the node once its inputs are queued.
A node the head gives no address for, or that can't be reached or refuses, gets the bytes
through the head instead (`DirectFallback`), and so it does for this process's jobs for ten
minutes (a job should not wait out a connection each time). The same connection brings the
job's large results from that node (opened for them alone where the head offers it:
`DirectOffer`): each is unpickled as it comes and kept in `arrived` until the head's record of
it, a placeholder, comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from burla.client.loop import ClientLoop
from burla.errors import ProtocolError
from burla.protocol import limits, wire
from burla.protocol.direct_inputs import EXPIRES_HEADER, GRANT_HEADER
from burla.protocol.direct_results import arrived_value
from burla.protocol.values.packed_inputs import PackedInputs, pack_uints, unpack_uints
from burla.protocol.values.pickle_parts import PickleParts

log = logging.getLogger("burla.client")

PIPELINE_FRAMES = 4  # inputs sent to a node ahead of its receipts
CONNECT_TIMEOUT_S = 5.0  # a node that does not answer this soon gets its inputs through the head
UNREACHABLE_FOR_S = 600.0  # and so do this process's later jobs' inputs for it, this long
RECEIPT_TIMEOUT_S = 60.0  # a node that takes a frame and says nothing this long is given up on
CLOSE_TIMEOUT_S = 2.0  # a node's connection closes this fast, or is dropped


class DirectSender:
    """Sends one job's large inputs to their nodes. `pending` (the uploader's) holds each input
    sent as a placeholder until its result is in; `via_head` sends a message on the job's
    connection to the head; `shared` is this process's client loop (its HTTP session, and the
    nodes it could not reach)."""

    def __init__(self, job_id: str, pending: dict[int, bytes | PickleParts],
                 encode: Callable[[int], bytes | PickleParts], via_head: Callable[[wire.Message], Awaitable[None]],
                 shared: Callable[[], ClientLoop], taken: Callable[[int], bool] = lambda index: False) -> None:
        self.job_id = job_id
        self._taken = taken  # whether an input's result was handed over already
        self._pending = pending
        self._encode = encode
        self._via_head = via_head
        self._shared = shared
        self._queues: dict[str, deque[wire.UploadDirect | wire.DirectOffer]] = {}
        self._tasks: dict[str, asyncio.Task] = {}
        self._pipes: dict[str, _Pipe] = {}  # per node: the connection its inputs go on
        self.arrived: dict[int, Any] = {}  # large results' values that came straight, until the head's record of each

    def on_upload(self, msg: wire.UploadDirect | wire.DirectOffer) -> None:
        """The head pushed these placeholders to `msg.node_id`: send their bytes after the ones
        that node is owed already. An offer: open the connection, for the node's results."""
        self._queues.setdefault(msg.node_id, deque()).append(msg)
        task = self._tasks.get(msg.node_id)
        if task is None or task.done():
            self._tasks[msg.node_id] = asyncio.create_task(self._serve(msg.node_id), name=f"direct-{msg.node_id}")

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        for pipe in self._pipes.values():
            await pipe.close()
        self._pipes.clear()
        self.arrived.clear()

    async def _serve(self, node_id: str) -> None:
        """Send what the head said went to this node, in order (its connection stays open for the
        job's next pushes there)."""
        queue = self._queues[node_id]
        while queue:
            msg = queue.popleft()
            if isinstance(msg, wire.DirectOffer):
                await self._open_for_results(msg)
                continue
            inputs = self._still_pending(msg)
            if not inputs:
                continue  # none of them is this process's to send (it collects a job another opened)
            if msg.url and self._reachable(msg.url):
                pipe = self._pipes.get(node_id)
                fresh, sent = pipe is None, 0
                try:
                    if pipe is None:
                        pipe = await self._open(msg)
                    for index, data in inputs:
                        sent += 1
                        await pipe.send(index, data)
                    if not queue:  # nothing more to send for now: the node's word for what is out
                        await pipe.confirm(0)
                    inputs = pipe.take_not_taken()
                except Exception as e:  # unreachable, refused, cut: this node's inputs go through the head
                    log.info("job %s: sending inputs to node %s through the head instead (%s)", self.job_id, node_id,
                             e)
                    if fresh:  # a kept connection may just have been closed
                        self._note_unreachable(msg.url, e)
                    inputs = [*(pipe.take_not_taken() if pipe is not None else ()),
                              *(pipe.unconfirmed if pipe is not None else ()), *inputs[sent:]]
                    if pipe is not None:
                        del self._pipes[node_id]
                        await pipe.close()
            await self._through_head(node_id, inputs)

    async def _open_for_results(self, msg: wire.DirectOffer) -> None:
        """The node has large results for this job: take them there (unless a connection to it is
        open already, or it could not be reached lately: they come through the head then)."""
        if msg.node_id in self._pipes or not self._reachable(msg.url):
            return
        try:
            await self._open(msg)
        except Exception as e:
            log.info("job %s: results of node %s come through the head (%s)", self.job_id, msg.node_id, e)
            self._note_unreachable(msg.url, e)

    async def _open(self, msg: wire.UploadDirect | wire.DirectOffer) -> _Pipe:
        pipe = self._pipes[msg.node_id] = _Pipe(await self._connect(msg), self.job_id, self.arrived, self._taken)
        return pipe

    def _note_unreachable(self, url: str, error: BaseException) -> None:
        """This process's jobs don't wait out a connection to that node again for a while; a node
        that answered with a refusal is reachable (only the head's path is needed this time)."""
        if not _refused_at_the_door(error):
            self._shared().unreachable_nodes[url] = time.monotonic() + UNREACHABLE_FOR_S

    async def _through_head(self, node_id: str, inputs: list[tuple[int, bytes | PickleParts]]) -> None:
        for index, data in inputs:
            try:
                part = PackedInputs.of_lists([index], [data])  # one segment: as it is, never joined
                await self._via_head(wire.DirectFallback(self.job_id, part.indices, part.sizes, part.data, node_id))
            except Exception:  # the connection to the head is down: the head tells again when the client is back
                return

    def _reachable(self, url: str) -> bool:
        """Not known to fail from this process: a node it could not reach is tried again only
        after UNREACHABLE_FOR_S."""
        until = self._shared().unreachable_nodes.get(url)
        return until is None or time.monotonic() > until

    def _still_pending(self, msg: wire.UploadDirect) -> list[tuple[int, bytes | PickleParts]]:
        """The inputs named, as they were sent; one whose result is in (so it is no longer kept) is
        encoded again: its node awaits it all the same (a node may run an input twice, and the head
        takes the first result)."""
        pending, found = self._pending, []
        for index in unpack_uints(msg.indices):
            data = pending.get(index)
            if data is None:
                try:
                    data = self._encode(index)
                except Exception:  # not this process's input (it collects a job another opened)
                    continue
            found.append((index, data))
        return found

    async def _connect(self, msg: wire.UploadDirect | wire.DirectOffer) -> Any:
        import aiohttp

        from burla.web import ws_bulk

        pin = aiohttp.Fingerprint(msg.cert_sha256) if msg.cert_sha256 else True
        headers = {GRANT_HEADER: msg.grant.hex(), EXPIRES_HEADER: repr(msg.expires_at)}
        ws = await asyncio.wait_for(self._shared().session(None).ws_connect(
            f"{msg.url}/v1/jobs/{self.job_id}/direct", ssl=pin, headers=headers, max_msg_size=limits.MAX_FRAME_BYTES,
            heartbeat=None), CONNECT_TIMEOUT_S)
        ws_bulk.install_client(ws, limits.MAX_FRAME_BYTES)
        return ws


class _Pipe:
    """One node's connection: a frame per input, up to PIPELINE_FRAMES of them sent ahead of the
    node's receipts, which come in order; and the node's large results, each receipted once its
    value is in `arrived`. Its reader task reads both and never waits for a write (the node may be
    waiting for it to read before it takes the rest of an input's frame): its receipts go out from
    a task of their own, between input frames."""

    def __init__(self, ws: Any, job_id: str, arrived: dict[int, Any], taken: Callable[[int], bool]) -> None:
        self.ws = ws
        self.job_id = job_id
        self.unconfirmed: deque[tuple[int, bytes | PickleParts]] = deque()
        # Confirmed by a receipt that does not name them: the node was not awaiting them (their
        # placeholders had not reached it yet), so they go through the head, behind the push.
        self.not_taken: list[tuple[int, bytes | PickleParts]] = []
        self.mid_frame = False  # a frame is partly written (a cancel left it so)
        self._arrived = arrived
        self._taken = taken
        self._receipts: deque[bytes] = deque()  # the node's, for inputs
        self._news = asyncio.Event()  # a receipt came, or the connection ended
        self._ended: BaseException | None = None
        self._writing = asyncio.Lock()  # an input's frame goes out in chunks: nothing may come between
        self._to_receipt: list[bytes] = []  # this client's receipts for results, to be written
        self._receipt_due = asyncio.Event()
        self._tasks = [asyncio.create_task(self._read(), name=f"direct-reader-{job_id}"),
                       asyncio.create_task(self._write_receipts(), name=f"direct-receipts-{job_id}")]

    async def send(self, index: int, data: bytes | PickleParts) -> None:
        from burla.web import ws_bulk

        part = PackedInputs.of_lists([index], [data])  # one segment: as it is, never joined
        frame = wire.DirectInputs.of(self.job_id, part)
        self.unconfirmed.append((index, data))
        async with self._writing:
            self.mid_frame = True
            await ws_bulk.send_bulk_alone(self.ws, frame.encode_parts())
            self.mid_frame = False
        await self.confirm(PIPELINE_FRAMES)

    def take_not_taken(self) -> list[tuple[int, bytes | PickleParts]]:
        taken, self.not_taken = self.not_taken, []
        return taken

    async def confirm(self, ahead: int) -> None:
        """Wait for the node's receipts until at most `ahead` frames are unconfirmed."""
        while len(self.unconfirmed) > ahead:
            if not self._receipts:
                if self._ended is not None:
                    raise ConnectionError(f"the connection to the node ended: {self._ended}")
                self._news.clear()
                async with asyncio.timeout(RECEIPT_TIMEOUT_S):
                    await self._news.wait()
                continue
            indices = self._receipts.popleft()
            sent = self.unconfirmed[0]
            if indices not in (b"", pack_uints([sent[0]])):
                raise ProtocolError("the node's receipt is not for the next input")
            self.unconfirmed.popleft()
            if not indices:
                self.not_taken.append(sent)

    async def _read(self) -> None:
        from burla.web import ws_bulk

        try:
            while True:
                self._take(await self.ws.receive())  # no name keeps the frame: its buffer serves the next
        except Exception as e:  # over: the node sends what this did not receipt through the head
            self._ended = e
            self._news.set()
            ws_bulk.drop(self.ws)  # a connection that answered wrongly is not kept open, nor one closed

    def _take(self, reply: Any) -> None:
        import aiohttp

        if reply.type != aiohttp.WSMsgType.BINARY:
            raise ConnectionError(f"the node closed the connection ({reply.type.name})")
        answer = wire.decode(reply.data, wire.NODE_TO_CLIENT)
        if isinstance(answer, wire.ErrorReply):
            raise ConnectionError(f"the node refused: {answer.message}")
        if isinstance(answer, wire.DirectResults):
            if answer.job_id != self.job_id:
                raise ProtocolError("the node sent results of another job")
            for index, data in answer.part().items():
                if not self._taken(index):  # a result that came twice (an input run twice) is not kept
                    self._arrived[index] = arrived_value(data)
            self._to_receipt.append(wire.DirectResultsReceived(self.job_id, answer.indices).encode())
            self._receipt_due.set()
        else:
            assert isinstance(answer, wire.DirectReceived)  # the channel's last message
            self._receipts.append(answer.indices)
            self._news.set()

    async def _write_receipts(self) -> None:
        from burla.web import ws_bulk

        while True:
            await self._receipt_due.wait()
            self._receipt_due.clear()
            async with self._writing:
                if self.mid_frame:  # an input's frame was cut short: the connection is of no more use
                    ws_bulk.drop(self.ws)
                    return
                receipts, self._to_receipt = self._to_receipt, []
                for receipt in receipts:
                    await self.ws.send_bytes(receipt)

    async def close(self) -> None:
        from burla.web import ws_bulk

        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.mid_frame:  # a close frame now would land inside the frame: drop the connection
            ws_bulk.drop(self.ws)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(), CLOSE_TIMEOUT_S)


def _refused_at_the_door(error: BaseException) -> bool:
    """A node that answered the handshake with a refusal (a grant that expired, or a key that
    changed when it registered again) is reachable: only the head's path is needed this time."""
    import aiohttp

    return isinstance(error, aiohttp.WSServerHandshakeError) and 400 <= error.status < 500
