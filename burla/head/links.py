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
    """One job's client. Output always goes out before the results it belongs with."""

    def __init__(self, job_id: str, ws: web.WebSocketResponse) -> None:
        self.job_id = job_id
        self.ws = ws
        self.outputs: list = []
        self.results: list = []
        self._control: deque[bytes] = deque()
        self._wake = asyncio.Event()
        self._seq = 0
        self._unacked: dict[int, int] = {}  # batch seq -> results in it
        self.acked = 0
        self.last_progress: tuple[int, int, int, int] | None = None
        self.closed = False

    def deliver(self, outputs: list, results: list) -> None:
        if outputs:
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
            covered += self._unacked.pop(done_seq)
        self.acked += covered
        return covered

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self.outputs:
                outputs, self.outputs = self.outputs, []
                await self.ws.send_bytes(wire.OutputBatch(self.job_id, outputs).encode())
            if self.results:
                results, self.results = self.results, []
                self._seq += 1
                self._unacked[self._seq] = len(results)
                await self.ws.send_bytes(wire.ResultBatch(self.job_id, self._seq, results).encode())
            while self._control:
                await self.ws.send_bytes(self._control.popleft())
