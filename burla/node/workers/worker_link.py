"""The node's end of a worker's socket: length-prefixed frames (worker_wire.FRAME_HEADER) read
with as few copies as the size of each allows.

Small frames (a no-op call's report) are cut out of one reusable buffer that a single read
fills with many of them. A large frame (a big result) is read by the kernel straight into a
buffer of its own size: asyncio's StreamReader copied each such frame twice, into its buffer
and out of it, which was a fifth of a node's CPU when results of 10 MB went through it.
"""

from __future__ import annotations

import asyncio
from collections import deque

from burla.errors import ProtocolError
from burla.protocol import worker_wire
from burla.protocol.values.buffers import unfilled

_HEADER = worker_wire.FRAME_HEADER
SCRATCH_BYTES = 256 * 1024
_OWN_BUFFER_FROM = 64 * 1024  # a frame this big whose bytes are not all in yet gets a buffer of its own
assert _OWN_BUFFER_FROM + worker_wire.FRAME_HEADER.size <= SCRATCH_BYTES
_PAUSE_AT = 64  # frames read but not yet taken: past this the socket is not read until they are
_PAUSE_BYTES = 8 * 1024 * 1024  # or past this many bytes of them (a large result pauses it alone)


class WorkerLink(asyncio.BufferedProtocol):
    """Frames from one worker, taken in order with `read`; written to it through `transport`."""

    def __init__(self, max_frame: int) -> None:
        self._max_frame = max_frame
        self._scratch = bytearray(SCRATCH_BYTES)
        self._filled = 0  # bytes of _scratch holding data not yet cut into frames
        self._frame: bytearray | None = None  # the large frame being read into, and how far
        self._frame_got = 0
        self._frames: deque[bytes | bytearray] = deque()
        self._frames_bytes = 0  # their bytes
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False
        self._error: ProtocolError | None = None
        self._paused = False
        self.transport: asyncio.Transport | None = None

    # --- asyncio's side -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            return memoryview(self._frame)[self._frame_got:]
        return memoryview(self._scratch)[self._filled:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._frame is not None:
            self._frame_got += nbytes
            if self._frame_got == len(self._frame):
                self._frames.append(self._frame)
                self._frames_bytes += len(self._frame)
                self._frame = None
                self._wake()
            return
        self._filled += nbytes
        try:
            self._cut_frames()
        except ProtocolError as e:
            self._error = e
            self._end()
            assert self.transport is not None
            self.transport.close()

    def eof_received(self) -> bool:
        self._end()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()

    # --- the node's side ------------------------------------------------------------------

    async def read(self) -> bytes | bytearray | None:
        """The next frame, or None once the worker's end closed (ProtocolError: it sent a frame
        over the limit)."""
        while not self._frames:
            if self._ended:
                if self._error is not None:
                    raise self._error
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        frame = self._frames.popleft()
        self._frames_bytes -= len(frame)
        if self._paused and len(self._frames) < _PAUSE_AT // 2 and self._frames_bytes < _PAUSE_BYTES // 2 \
                and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return frame

    # --- framing --------------------------------------------------------------------------

    def _cut_frames(self) -> None:
        scratch, start, filled = self._scratch, 0, self._filled
        view = memoryview(scratch)
        while filled - start >= _HEADER.size:
            (size,) = _HEADER.unpack_from(scratch, start)
            if size > self._max_frame:
                raise ProtocolError(f"a worker's frame of {size} bytes is over the limit of {self._max_frame}")
            body = start + _HEADER.size
            have = filled - body
            if have >= size:
                self._frames.append(bytes(view[body:body + size]))
                self._frames_bytes += size
                start = body + size
                continue
            if size >= _OWN_BUFFER_FROM:  # smaller frames always fit the scratch buffer
                frame = unfilled(size)
                frame[:have] = view[body:filled]
                self._frame, self._frame_got = frame, have
                start = filled
            break
        view.release()
        if start:  # what is left (part of a frame) moves to the front
            scratch[:filled - start] = scratch[start:filled]
        self._filled = filled - start
        if self._frames:
            self._wake()

    def _wake(self) -> None:
        if (len(self._frames) >= _PAUSE_AT or self._frames_bytes >= _PAUSE_BYTES) and not self._paused \
                and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _end(self) -> None:
        self._ended = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
