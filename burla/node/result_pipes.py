"""The clients' connections that take large results straight from this node
(burla.protocol.direct_results): the route (node/direct_route.py) opens one per client
connection; the oldest open one of a job takes its results, the others only carry inputs."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from burla.errors import ProtocolError
from burla.node.dispatcher import Dispatcher
from burla.protocol import wire
from burla.web import ws_bulk

log = logging.getLogger("burla.node")

# A client that takes results sent to it and says nothing this long is given up on: the connection
# closes and what it did not receipt goes through the head (a dead connection that never closed,
# a laptop asleep, would otherwise hold them, and the node's result window, for good).
RECEIPT_TIMEOUT_S = 60.0


class ResultPipe:
    """One client connection and its one writer: `run` (its route's task) sends the route's
    answers (`answer`) and the job's large results, in order, as the dispatcher keeps them
    (`NodeJob.direct_out`), each result frame a chunk at a time (nothing else may come between
    them: only this task writes); `sent` of them are out and not yet receipted."""

    def __init__(self, job_id: str, ws: Any) -> None:
        self.job_id = job_id
        self.ws = ws
        self.sent = 0
        self.active = False  # the job's large results go on this one
        self.heard_at = time.monotonic()  # the last receipt, or the first send after none was out
        self._wake = asyncio.Event()
        self._answers: list[bytes] = []  # the route's small frames, to be written
        self._closing: bytes | None = None  # the route ends it (refused, or idle): its last answer, then the close

    def wake(self) -> None:
        self._wake.set()

    def answer(self, frame: bytes | None, close: bytes | None = None) -> None:
        """Write this frame of the route's (then close the connection with the reason `close`)."""
        if frame is not None:
            self._answers.append(frame)
        self._closing = close if close is not None else self._closing
        self._wake.set()

    def receipted(self) -> None:
        self.sent -= 1
        self.heard_at = time.monotonic()

    async def run(self, dispatcher: Dispatcher) -> None:
        try:
            await self._send_all(dispatcher)
        except Exception as e:  # its route's reader ends, and what is unreceipted goes through the head
            log.info("job %s: its client's connection ends (%s)", self.job_id, e)
            ws_bulk.drop(self.ws)  # not a close handshake: the peer may never answer

    async def _send_all(self, dispatcher: Dispatcher) -> None:
        while True:
            try:  # asyncio.timeout, not wait_for: 3.11's wait_for may swallow a cancel that meets a wake-up
                async with asyncio.timeout(RECEIPT_TIMEOUT_S / 4):
                    await self._wake.wait()
            except TimeoutError:
                if self.sent > 0 and time.monotonic() - self.heard_at > RECEIPT_TIMEOUT_S:
                    raise ConnectionError(f"no receipt for {RECEIPT_TIMEOUT_S:g} s") from None
                continue
            self._wake.clear()
            while self._answers:
                await self.ws.send_bytes(self._answers.pop(0))
            if self._closing is not None:
                await self.ws.close(message=self._closing)
                return
            job = dispatcher.jobs.get(self.job_id)
            while self.active and job is not None and self.sent < len(job.direct_out):
                _, direct = job.direct_out[self.sent]
                if self.sent == 0:
                    self.heard_at = time.monotonic()
                self.sent += 1
                frame = wire.DirectResults.of(self.job_id, direct).encode_parts()
                # A peer that takes nothing more (gone silent) leaves the frame undrained for good.
                async with asyncio.timeout(RECEIPT_TIMEOUT_S):
                    await ws_bulk.send_bulk_alone(self.ws, frame, masked=False)
                while self._answers:  # receipts for inputs between result frames
                    await self.ws.send_bytes(self._answers.pop(0))


class ResultPipes:
    def __init__(self, dispatcher: Dispatcher, freed: Callable[[], None]) -> None:
        """`freed`: results held here went on (the node's result window has room again)."""
        self._dispatcher = dispatcher
        self._freed = freed
        self._pipes: dict[str, list[ResultPipe]] = {}
        dispatcher.on_direct = self.wake
        dispatcher.on_assigned = self._activate

    def opened(self, job_id: str, ws: Any) -> ResultPipe:
        pipe = ResultPipe(job_id, ws)
        pipes = self._pipes.setdefault(job_id, [])
        pipes.append(pipe)
        self._activate(job_id)
        return pipe

    def closed(self, pipe: ResultPipe) -> None:
        """Its connection ended: what it did not get a receipt for goes through the head."""
        pipes = self._pipes.get(pipe.job_id, [])
        if pipe in pipes:
            pipes.remove(pipe)
        if not pipes:
            self._pipes.pop(pipe.job_id, None)
        if pipe.active:
            pipe.active = False
            self._dispatcher.direct_closed(pipe.job_id)
            self._activate(pipe.job_id)
            self._freed()

    def received(self, pipe: ResultPipe, msg: wire.DirectResultsReceived) -> None:
        """The client holds the oldest results sent on `pipe` (ProtocolError: a receipt for others)."""
        if pipe.active:
            if pipe.sent <= 0:
                raise ProtocolError("a receipt for results not sent on this connection")
            self._dispatcher.direct_received(pipe.job_id, msg.indices)  # raises first if it is wrong
            pipe.receipted()
            self._freed()

    def wake(self, job_id: str) -> None:
        for pipe in self._pipes.get(job_id, ()):
            if pipe.active:
                pipe.wake()

    def held_bytes(self) -> int:
        """Of the large results waiting for their client's receipt, or to be sent to it."""
        return sum(len(direct.data) for job in self._dispatcher.jobs.values() for _, direct in job.direct_out)

    def _activate(self, job_id: str) -> None:
        """The job's oldest open connection takes its large results, if the job lets them go so
        (when a connection opens or closes, and when the job is assigned here: a client may connect
        first, or stay connected while the node's record of the job is dropped and made again)."""
        job = self._dispatcher.jobs.get(job_id)
        pipes = self._pipes.get(job_id)
        if job is None or not job.direct_results or not pipes or job.result_pipe:
            return
        active = next((pipe for pipe in pipes if pipe.active), pipes[0])
        active.active = True
        active.sent = 0  # a record of the job without results out: none is awaited on any connection
        job.result_pipe = True
        active.wake()
