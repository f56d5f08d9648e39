"""Outgoing sides of the head's WebSockets: sync code queues frames, one writer task sends them.

Scheduling code stays synchronous (it only appends and wakes); each connection's writer task
coalesces what piled up while the previous send was in flight, which is where batching comes
from when the cluster is busy.
"""

from __future__ import annotations

import asyncio
from collections import deque

from aiohttp import web

from burla import wire

MAX_BATCH_BYTES = 8 * 1024 * 1024  # results per frame to a client
MAX_BATCH_RESULTS = 200_000  # well inside wire.HEAD_TO_CLIENT's array limit


class NodeLink:
    def __init__(self, node_id: str, ws: web.WebSocketResponse) -> None:
        self.node_id = node_id
        self.ws = ws
        self._frames: deque[bytes] = deque()
        self._wake = asyncio.Event()
        self._closing = False

    def send(self, msg: wire.Message) -> None:
        if not self._closing:
            self._frames.append(msg.encode())
            self._wake.set()

    def close(self) -> None:
        """Drop the connection (the node was declared dead); the writer task closes it."""
        self._closing = True
        self._frames.clear()
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._closing:
                await self.ws.close()
                return
            while self._frames:
                await self.ws.send_bytes(self._frames.popleft())


class ClientLink:
    """One job's client side. It outlives connections: results stay until acknowledged and are
    sent again to a client that resumes, and output always goes out before the results it
    belongs with."""

    MAX_BUFFERED_OUTPUT = 100_000  # output chunks kept while no client is attached

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.ws: web.WebSocketResponse | None = None
        self.outputs: list = []
        self.results: list = []  # produced, not yet sent in a batch
        self._control: deque[bytes] = deque()
        self._wake = asyncio.Event()
        self._seq = 0
        self._unacked: dict[int, list] = {}  # batch seq -> its results, until the client acks
        self._resend: list[int] = []
        self.acked = 0
        self.dropped_output = 0
        self.last_progress: tuple[int, int, int, int] | None = None
        self.detached_since: float | None = None  # monotonic time the client left
        self.patience_s: float | None = None  # how long to wait for it to come back (None: the head's default)
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
            self.results.extend(results)
        self._wake.set()

    def send(self, msg: wire.Message) -> None:
        self._control.append(msg.encode())
        self._wake.set()

    def ack(self, seq: int) -> int:
        """Record the client's acknowledgement; returns how many results it newly covers."""
        covered = 0
        for done_seq in [s for s in self._unacked if s <= seq]:
            covered += len(self._unacked.pop(done_seq))
        self.acked += covered
        return covered

    def forget_results(self, client_states: bytes) -> None:
        """Drop queued results for inputs the client already holds (a nonzero state byte)."""
        self.results = [item for item in self.results if not client_states[item[0]]]

    def continue_after(self, seq: int) -> None:
        """Number batches after the client's last acknowledged one (this head restarted and
        started counting again), so its acknowledgements never cover batches it has not seen."""
        self._seq = max(self._seq, seq)

    def pending_frames(self) -> bool:
        """Anything still waiting to go out to an attached client."""
        return bool(self._control or self.results or self.outputs or self._resend)

    def unacked_results(self) -> int:
        return sum(len(items) for items in self._unacked.values()) + len(self.results)

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

    def _take_batch(self) -> list:
        """The next results to send: at most MAX_BATCH_BYTES (unless a single one is bigger) and
        MAX_BATCH_RESULTS (tiny results would otherwise overflow the client's frame limits)."""
        size = 0
        for count, item in enumerate(self.results):
            size += len(item[2])
            if (size > MAX_BATCH_BYTES and count > 0) or count >= MAX_BATCH_RESULTS:
                break
        else:
            count = len(self.results)
        batch, self.results = self.results[:count], self.results[count:]
        return batch

    async def _run(self, ws: web.WebSocketResponse) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._resend:
                seq = self._resend.pop(0)
                if seq in self._unacked:
                    await ws.send_bytes(wire.ResultBatch(self.job_id, seq, self._unacked[seq]).encode())
            while self.outputs:
                outputs, self.outputs = self.outputs[:MAX_BATCH_RESULTS], self.outputs[MAX_BATCH_RESULTS:]
                await ws.send_bytes(wire.OutputBatch(self.job_id, outputs).encode())
            while self.results:
                results = self._take_batch()
                self._seq += 1
                self._unacked[self._seq] = results
                await ws.send_bytes(wire.ResultBatch(self.job_id, self._seq, results).encode())
            while self._control:
                await ws.send_bytes(self._control.popleft())
