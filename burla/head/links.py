"""Outgoing sides of the head's WebSockets: sync code sends frames without awaiting.

Scheduling code stays synchronous. A node's frames go straight into its socket's buffer from the
code that makes them; a client's are queued for one writer task per connection, which coalesces
what piled up while the previous send was in flight (that is where batching comes from when the
cluster is busy).
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections import deque
from collections.abc import Callable

import msgpack
from aiohttp import web

from burla.protocol import limits, wire
from burla.protocol.framing import Payload
from burla.protocol.values import packed_results
from burla.web import ws_bulk

MAX_BATCH_BYTES = limits.RESULT_FRAME_BYTES  # results per frame to a client
MAX_OUTPUTS_PER_FRAME = 200_000  # output chunks per frame to a client, well inside its array limit
WRITER_SLICE_S = 0.002  # a client's writer lets other connections run after this long
# Bytes a node's socket may hold unsent before its frames wait for the writer task instead (which
# waits for the socket to drain): a node that reads slowly must not grow the head's memory.
DIRECT_WRITE_LIMIT = 1024 * 1024
_JOIN_BELOW = 16 * 1024  # smaller frames are joined to their header: one write instead of two


def binary_frame_header(length: int) -> bytes:
    """The header of an unmasked, uncompressed, final binary WebSocket frame (RFC 6455 §5.2:
    a server never masks)."""
    if length < 126:
        return struct.pack("!BB", 0x82, length)
    if length < 65536:
        return struct.pack("!BBH", 0x82, 126, length)
    return struct.pack("!BBQ", 0x82, 127, length)


class WriteTurns:
    """How many frames all node links together write straight to their sockets per turn of the
    event loop. A fan-out (a job's AssignJob to 1,000 nodes, its end, a plan over every node)
    was thousands of socket writes in one step, which every other connection waited for; past
    FRAMES_PER_TURN, frames wait on their link and go out over the next turns, links in the order
    they began waiting."""

    FRAMES_PER_TURN = 256

    def __init__(self) -> None:
        self._used = 0
        self._turn_ends_soon = False
        self._waiting: deque[NodeLink] = deque()

    def take(self) -> bool:
        """One frame's write in this turn, if any is left."""
        if self._used >= self.FRAMES_PER_TURN:
            return False
        if not self._turn_ends_soon:  # call_soon runs in the next turn: the count starts again there
            asyncio.get_running_loop().call_soon(self._next_turn)
            self._turn_ends_soon = True
        self._used += 1
        return True

    def wait(self, link: NodeLink) -> None:
        if not link.waiting_turn:
            link.waiting_turn = True
            self._waiting.append(link)

    def _next_turn(self) -> None:
        self._used = 0
        self._turn_ends_soon = False
        waiting = self._waiting
        while waiting and self._used < self.FRAMES_PER_TURN:
            link = waiting.popleft()
            link.waiting_turn = False
            link.flush()


class NodeLink:
    """The head's side of one node's connection.

    At 1,000 nodes, waking a writer task per frame per node was a large part of every loop
    iteration, so frames are written to the transport directly, within `turns`. They wait in
    `_frames`: for a later turn (WriteTurns); for the writer task while the socket holds
    DIRECT_WRITE_LIMIT unsent (the writer sends through aiohttp, which waits for the socket to
    drain); or always where the connection negotiated compression (every frame goes through
    aiohttp). Whoever takes a frame from `_frames` writes it at once, so frames keep their order.
    """

    def __init__(self, node_id: str, ws: web.WebSocketResponse, transport: asyncio.WriteTransport | None = None,
                 turns: WriteTurns | None = None) -> None:
        self.node_id = node_id
        self.ws = ws
        self._transport = transport if transport is not None and not ws.compress else None
        self._turns = turns
        self._frames: deque[bytes | list[Payload]] = deque()
        self._wake = asyncio.Event()
        self._closing = False
        self.stop_reading: Callable[[], object] = lambda: None  # set by its connection's handler
        self.waiting_turn = False  # queued in its WriteTurns

    def send(self, msg: wire.Message) -> None:
        parts = msg.encode_parts()
        self.send_frame(parts[0] if len(parts) == 1 else parts)  # type: ignore[arg-type]

    def send_frame(self, frame: bytes | list[Payload]) -> None:
        """Send an encoded message (one encoding may go to many nodes), or a bulk frame's parts
        (its payloads are written as they are: views of the frames they came in)."""
        if self._closing:
            return
        self._frames.append(frame)
        if len(self._frames) == 1:
            self.flush()

    def flush(self) -> None:
        """Write waiting frames straight to the socket while it and this turn have room."""
        transport = self._transport
        frames = self._frames
        while frames and not self._closing:
            if transport is None or transport.get_write_buffer_size() >= DIRECT_WRITE_LIMIT:
                self._wake.set()  # the writer task sends them as the socket drains
                return
            if transport.is_closing():
                frames.clear()  # the connection is ending: its handler deals with the node
                return
            if self._turns is not None and not self._turns.take():
                self._turns.wait(self)
                return
            frame = frames.popleft()
            if isinstance(frame, list):
                transport.write(binary_frame_header(sum(map(len, frame))) + frame[0])
                for payload in frame[1:]:
                    transport.write(payload)
                continue
            header = binary_frame_header(len(frame))
            if len(frame) < _JOIN_BELOW:
                transport.write(header + frame)
            else:
                transport.write(header)
                transport.write(frame)

    def close(self) -> None:
        """Drop the connection (the node left or was declared dead): nothing more is sent or read;
        its handler closes the WebSocket."""
        self._closing = True
        self._frames.clear()
        self._wake.set()
        self.stop_reading()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._closing:
                return
            while self._frames:
                frame = self._frames.popleft()
                if isinstance(frame, list):  # a message's parts: written as they are, never joined
                    await ws_bulk.send_bulk_from_server(self.ws, frame)
                else:
                    await self.ws.send_bytes(frame)
            self.flush()  # anything that came meanwhile, straight to the socket again


class ClientLink:
    """One job's client side. It outlives connections: results stay until acknowledged and are
    sent again to a client that resumes, and output always goes out before the results it
    belongs with.

    Results are kept packed (packed_results.pack_items) from the moment they arrive, and sent batches as
    their frames: bytes, which the cyclic GC does not walk (an object per result was walked
    once at least, and many times when a slow client let them pile up)."""

    MAX_BUFFERED_OUTPUT = 100_000  # output chunks kept while no client is attached

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.ws: web.WebSocketResponse | None = None
        self.outputs: list = []
        self.results: deque[tuple[int, Payload]] = deque()  # (count, packed items) not yet sent
        self.queued_results = 0  # how many results `results` holds
        self._control: deque[bytes] = deque()
        self._wake = asyncio.Event()
        self._seq = 0
        self._unacked: dict[int, tuple[int, list[Payload]]] = {}  # batch seq -> (results, frame's parts) until acked
        self._resend: list[int] = []
        self.acked = 0
        self.dropped_output = 0
        self.last_progress: tuple | None = None  # the last Progress sent (done, failed, ..., stages)
        self.detached_since: float | None = None  # monotonic time the client left
        self.patience_s: float | None = None  # how long to wait for it to come back (None: the head's default)
        self.client_local = False  # its connection comes from this machine's loopback (direct_uploads)
        self._writer: asyncio.Task | None = None

    @property
    def attached(self) -> bool:
        return self.ws is not None

    def deliver(self, outputs: list, results: list) -> None:
        if outputs:
            if self.ws is None and len(self.outputs) + len(outputs) > self.MAX_BUFFERED_OUTPUT:
                self.dropped_output += len(outputs)
            else:
                self.outputs.extend(outputs)
        if results:
            self._queue_results(results)
        self._wake.set()

    def deliver_packed(self, count: int, packed: Payload) -> None:
        """`count` results as a node packed them (wire.NodeResults.packed: a frame's worth at most)."""
        self.results.append((count, packed))
        self.queued_results += count
        self._wake.set()

    def _queue_results(self, results: list) -> None:
        """Pack results in parts that fit a batch (packed_results.item_frames)."""
        for frame in packed_results.item_frames(results):
            self.results.append((len(frame), packed_results.pack_items(frame)))
        self.queued_results += len(results)

    def send(self, msg: wire.Message) -> None:
        self._control.append(msg.encode())
        self._wake.set()

    def ack(self, seq: int) -> int:
        """Record the client's acknowledgement; returns how many results it newly covers."""
        covered = 0
        for done_seq in [s for s in self._unacked if s <= seq]:
            covered += self._unacked.pop(done_seq)[0]
        self.acked += covered
        return covered

    def forget_results(self, client_states: bytes) -> None:
        """Drop queued results for inputs the client already holds (a nonzero state byte)."""
        parts, self.results, self.queued_results = self.results, deque(), 0
        for count, packed in parts:
            items = msgpack.unpackb(b"".join(wire.result_batch_parts("", 0, count, [packed])))[-1]
            kept = [item for item in items if not client_states[item[0]]]
            if kept:
                self._queue_results(kept)

    def continue_after(self, seq: int) -> None:
        """Number batches after the client's last acknowledged one (this head restarted and
        started counting again), so its acknowledgements never cover batches it has not seen."""
        self._seq = max(self._seq, seq)

    def pending_frames(self) -> bool:
        """Anything still waiting to go out to an attached client."""
        return bool(self._control or self.results or self.outputs or self._resend)

    def unacked_results(self) -> int:
        return sum(count for count, _ in self._unacked.values()) + self.queued_results

    def attach(self, ws: web.WebSocketResponse) -> None:
        """A client (new or resuming) is connected: send it everything it has not acknowledged."""
        self.ws = ws
        self.detached_since = None
        self._resend = sorted(self._unacked)
        self._writer = asyncio.create_task(self._run(ws), name=f"job-{self.job_id}-writer")
        self._wake.set()

    async def detach(self, ws: web.WebSocketResponse, now: float) -> None:
        """The connection `ws` ended; a no-op if a newer connection has taken over."""
        if self.ws is not ws:
            return
        self.ws = None
        self.detached_since = now
        if self._writer is not None:
            self._writer.cancel()
            try:
                await self._writer
            except (asyncio.CancelledError, Exception):
                pass
            self._writer = None

    def _take_batch(self) -> tuple[int, list[Payload]]:
        """Packed parts of the next batch: limits.BATCH_ITEMS results at most, and MAX_BATCH_BYTES
        unless a single part is bigger."""
        results = self.results
        count, packed = results.popleft()
        parts, size = [packed], len(packed)
        while results and count + results[0][0] <= limits.BATCH_ITEMS and size + len(results[0][1]) <= MAX_BATCH_BYTES:
            more, packed = results.popleft()
            count += more
            size += len(packed)
            parts.append(packed)
        self.queued_results -= count
        return count, parts

    async def _run(self, ws: web.WebSocketResponse) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            # A send returns without suspending while the socket takes the data: after a slice of
            # frames, let other connections run (a million results are some 250 frames).
            slice_end = time.monotonic() + WRITER_SLICE_S
            while self._resend:
                seq = self._resend.pop(0)
                if seq in self._unacked:
                    await ws_bulk.send_bulk_from_server(ws, self._unacked[seq][1])
                    slice_end = await _take_turn(slice_end)
            while True:
                while self.outputs:  # output goes out before the results that follow it
                    outputs = self.outputs[:MAX_OUTPUTS_PER_FRAME]
                    self.outputs = self.outputs[MAX_OUTPUTS_PER_FRAME:]
                    await ws.send_bytes(wire.OutputBatch(self.job_id, outputs).encode())
                if not self.results:
                    break
                count, parts = self._take_batch()
                self._seq += 1
                # Sent as parts: the results are the nodes' frames as they came, never joined.
                frame = wire.result_batch_parts(self.job_id, self._seq, count, parts)
                self._unacked[self._seq] = (count, frame)
                await ws_bulk.send_bulk_from_server(ws, frame)
                slice_end = await _take_turn(slice_end)
            while self._control and not (self.results or self.outputs):  # after what came before them
                await ws.send_bytes(self._control.popleft())
            if self.pending_frames():
                self._wake.set()


async def _take_turn(slice_end: float) -> float:
    """Yield to the loop if this slice is over; returns when the next one ends."""
    now = time.monotonic()
    if now < slice_end:
        return slice_end
    await asyncio.sleep(0)
    return time.monotonic() + WRITER_SLICE_S
