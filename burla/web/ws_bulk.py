"""Large WebSocket frames read and written with one copy of their payload.

aiohttp's reader keeps each read of a large frame as a slice, joins the slices, and for a masked frame (every frame
from a client: RFC 6455 §5.3) copies the joined payload into a bytearray to unmask it and once more into bytes: up
to four copies of every byte, most of the head's CPU when inputs and results of 10 MB went through it. Its client
writer copies a frame to mask it and again to put the header in front of it.

`BulkReader` sits in front of aiohttp's reader on one connection. It reads each frame's header itself; a final,
uncompressed binary frame of LARGE_FRAME bytes or more is collected into one bytearray of its size, unmasked in
place and queued as aiohttp would queue it. Once the read that began the frame is used up, the rest of the frame is
read straight into that bytearray: the connection's transport reads through a `_FrameFiller` (asyncio's
BufferedProtocol) until the frame is whole, so those bytes are never a bytes object of their own nor copied out of
one. Everything else (small frames, control frames, fragments, compressed frames, frames over the size limit) goes
through to aiohttp's reader byte for byte, which answers it as always.

`send_bulk` writes a client's large frame from its parts: copied once into the masked buffer, written after its
header; `send_bulk_alone` writes one a chunk at a time for a connection with one writer. All fall back to aiohttp's
own path wherever its internals are not as expected (another aiohttp version), which costs speed, never correctness.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import sys
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
from aiohttp import web

from burla.protocol.values.buffers import unfilled

try:  # aiohttp >= 3.11
    from aiohttp._websocket.helpers import websocket_mask as _mask
except ImportError:  # pragma: no cover - older aiohttp
    try:
        from aiohttp.http_websocket import _websocket_mask as _mask  # type: ignore[attr-defined,no-redef]
    except ImportError:
        _mask = None  # type: ignore[assignment]

LARGE_FRAME = 64 * 1024  # smaller frames take aiohttp's path, which is quick for them
KEEP_BUFFERS_UP_TO = 64 * 1024 * 1024  # a larger frame's buffer is not kept for the next one
DRAIN_ABOVE = 4 * 1024 * 1024  # a client's large frames wait for its socket to drain past this
WAKE_AFTER = 256 * 1024  # while a large frame is read, its connection wakes once this much came
_OP_BINARY = 0x2
_NOT_HANDLED = (False, b"")
_Mask = Callable[[bytes, bytearray], None]


class BulkReader:
    """A connection's frame reader: large binary frames here, the rest through `inner` (aiohttp's reader, which shares
    our queue). Frames are handed on in the order they came. Only frames within `max_msg_size` are collected here (none
    if it is 0, unlimited): a larger one goes to aiohttp's reader, which refuses it as always."""

    def __init__(self, inner: Any, queue: Any, max_msg_size: int, mask: _Mask, protocol: Any = None) -> None:
        self._inner = inner
        self._protocol = protocol  # the connection's aiohttp protocol; None: frames only fed
        self._queue = queue
        self._max = max_msg_size
        self._mask = mask
        self._head = b""  # the start of a frame whose header is not all in yet
        self._pass = 0  # bytes of the current frame still to go to the inner reader
        self._frame: bytearray | None = None  # the large frame being collected
        self._got = 0
        self._key = b""  # its mask key (b"": unmasked)
        self._fragmented = False  # the inner reader is inside a fragmented message
        self._spare: bytearray | None = None  # the last large frame, reused once nobody holds it

    def feed_eof(self) -> None:
        self._inner.feed_eof()

    def feed_data(self, data: bytes | bytearray | memoryview) -> tuple[bool, bytes]:
        result = self._feed(data)
        if self._frame is not None and not result[0]:
            self._fill_directly()
        return result

    def _feed(self, data: bytes | bytearray | memoryview) -> tuple[bool, bytes]:
        view = memoryview(data)
        at, end = 0, len(view)
        while at < end:
            if self._frame is not None:
                at = self._collect(view, at)
                continue
            # A run of frames for the inner reader, fed to it in one piece: up to the next large
            # frame, the end of the data, or a header not all in yet.
            # A header begun in the last data (`_head`) goes to the inner reader with the rest of
            # its frame, unless the frame is collected here.
            start, prefix, collect = at, self._head, False
            while at < end:
                if self._pass:
                    size = min(self._pass, end - at)
                    self._pass -= size
                    at += size
                    continue
                head = self._head + bytes(view[at:at + 14 - len(self._head)])
                parsed = _header(head)
                if parsed is None:  # kept until the rest of the header comes
                    self._head = head
                    end_of_run, at = at, end
                    break
                header_size, first, length, key = parsed
                header_here = header_size - len(self._head)
                self._head = b""
                if self._collects(first, length):
                    end_of_run = at
                    if at == start:
                        prefix = b""  # the header it began is this frame's
                    self._frame, self._got, self._key = self._buffer_for(length), 0, key
                    at += header_here
                    collect = True
                    break
                if first & 0x0F in (0x0, 0x1, 0x2):
                    self._fragmented = not first & 0x80
                self._pass = length
                at += header_here
            else:
                end_of_run = at
            if end_of_run > start or (prefix and not self._head and not collect):
                # The whole read goes through as it came (the usual case: small frames only).
                run = data if start == 0 and end_of_run == end and not prefix else \
                    prefix + bytes(view[start:end_of_run])
                result = self._inner.feed_data(run)
                if result[0]:
                    return result  # the inner reader failed the connection
            if not collect and self._head:
                break
        return _NOT_HANDLED

    def _buffer_for(self, length: int) -> bytearray:
        """A buffer for a frame of `length` bytes: the last frame's once nothing else refers to it (every view of it
        gone: CPython's reference count says so), if it is large enough and not twice too large; else a new one. A
        client's new 10 MB buffer cost more in page faults than reading the frame into it."""
        spare, self._spare = self._spare, None
        if spare is not None and length <= len(spare) < 2 * length and _only_here(spare):
            del spare[length:]
            buffer = spare
        else:
            del spare
            buffer = unfilled(length)
        if _only_here is not _never and length <= KEEP_BUFFERS_UP_TO:
            self._spare = buffer
        return buffer

    def _fill_directly(self) -> None:
        """Have the transport read the rest of the frame being collected straight into it."""
        transport = getattr(self._protocol, "transport", None)
        if transport is None or transport.is_closing():
            return
        outer = transport.get_protocol()  # aiohttp's, or a wrapper that only passes reads on to it
        if outer is not self._protocol and getattr(outer, "inner", None) is not self._protocol:
            return
        filler = _FrameFiller(self, self._protocol, outer, transport)
        try:
            transport.set_protocol(filler)
        except (AttributeError, NotImplementedError):  # a transport that cannot change its protocol
            return
        filler.wake_later(self._left())

    def _rest(self) -> memoryview:
        """The part of the frame being collected that is not read yet."""
        assert self._frame is not None
        return memoryview(self._frame)[self._got:]

    def _left(self) -> int:
        """Bytes of the frame being collected that are not read yet."""
        return len(self._frame) - self._got if self._frame is not None else 0

    def _filled(self, size: int) -> bool:
        """`size` more bytes of the frame were read into `_rest()`; True once it is whole (and queued)."""
        self._got += size
        if self._frame is None or self._got < len(self._frame):
            return False
        self._finish()
        return True

    def _collects(self, first: int, length: int) -> bool:
        """Whether the frame with this first byte and length is collected here."""
        return bool(first & 0x80 and not first & 0x70 and first & 0x0F == _OP_BINARY and length >= LARGE_FRAME
                and not self._fragmented and length <= self._max and not _stalled(self._queue))

    def _collect(self, view: memoryview, at: int) -> int:
        frame = self._frame
        assert frame is not None
        size = min(len(frame) - self._got, len(view) - at)
        frame[self._got:self._got + size] = view[at:at + size]
        self._got += size
        if self._got == len(frame):
            self._finish()
        return at + size

    def _finish(self) -> None:
        frame = self._frame
        assert frame is not None
        if self._key:
            self._mask(self._key, frame)
        self._frame = None
        self._queue.feed_data(aiohttp.WSMessage(aiohttp.WSMsgType.BINARY, frame, ""), len(frame))


class _FrameFiller(asyncio.BufferedProtocol):
    """The connection's protocol while the rest of a large frame is read: each read lands in the frame's own buffer.
    When the frame is whole, the connection's own protocol (aiohttp's, or the head's connection guard in front of it)
    is put back, so the bytes after the frame reach it as before. Everything else a transport tells a protocol goes on
    to that one, and each read counts as aiohttp's progress (its read timeout and heartbeat), as its own reads do."""

    def __init__(self, reader: BulkReader, protocol: Any, outer: Any, transport: asyncio.BaseTransport) -> None:
        self._reader = reader
        self._protocol = protocol  # aiohttp's: told of each read's progress
        self._outer = outer  # the transport's own protocol, given back after the frame
        self._transport = transport
        self._socket: Any = None  # the TCP socket whose low-water mark is raised while filling
        self._low_water = 1

    def wake_later(self, left: int) -> None:
        """Have the loop wake this connection only once WAKE_AFTER bytes of the frame (or all it still lacks) are in
        the socket (SO_RCVLOWAT, which epoll honours for TCP), rather than at each arrival: a writer that sends a frame
        in small pieces (an sshd forwarding 32 KB packets) had cost a loop turn and a read per piece. Plain TCP sockets
        only: a TLS socket's bytes are not the frame's, and a channel has no socket."""
        sock = self._transport.get_extra_info("socket")
        if sock is None or self._transport.get_extra_info("sslcontext") is not None \
                or sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
            return
        self._socket = sock
        self._lower_water(left)

    def _lower_water(self, left: int) -> None:
        """Set the socket's low-water mark to what the frame still lacks, at most WAKE_AFTER: it
        never waits for bytes the frame will not bring."""
        mark = max(1, min(WAKE_AFTER, left))
        if mark != self._low_water and self._socket is not None:
            try:
                self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, mark)
            except OSError:  # a socket that refuses it is read at each arrival, as before
                self._socket = None
                return
            self._low_water = mark

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reader._rest()

    def buffer_updated(self, nbytes: int) -> None:
        for progress in ("_reschedule_timeout", "_data_received_cb"):
            callback = getattr(self._protocol, progress, None)
            if callback is not None:
                callback()
        if self._reader._filled(nbytes):
            self._give_back()
        elif self._socket is not None:
            self._lower_water(self._reader._left())

    def _give_back(self) -> None:
        self._lower_water(1)
        if self._transport.get_protocol() is self:
            self._transport.set_protocol(self._outer)

    def eof_received(self) -> bool | None:
        self._give_back()
        return self._outer.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._give_back()
        self._outer.connection_lost(exc)

    def pause_writing(self) -> None:
        self._outer.pause_writing()

    def resume_writing(self) -> None:
        self._outer.resume_writing()


def _never(buffer: bytearray) -> bool:
    return False


def _references(buffer: bytearray) -> int:
    return sys.getrefcount(buffer)


def _alone_count() -> int:
    """What `_references` says, called with a local name, of a buffer nothing else refers to
    (interpreters differ in what they count)."""
    buffer = bytearray(1)
    return _references(buffer)


def _held_by_the_caller_alone(buffer: bytearray) -> bool:
    """Whether nothing but the caller's local name refers to `buffer`: a view of it, a message, a
    list would each hold a reference. This frame's name for it counts like `_references`' own."""
    return sys.getrefcount(buffer) == _ALONE


# Reuse needs CPython's exact reference counts; elsewhere each frame gets a new buffer.
_ALONE = _alone_count() if sys.implementation.name == "cpython" else -1
_only_here = _held_by_the_caller_alone if _ALONE > 0 else _never


def _header(data: bytes) -> tuple[int, int, int, bytes] | None:
    """(header size, first byte, payload length, mask key) of the frame `data` starts, or None if
    `data` does not hold its whole header."""
    if len(data) < 2:
        return None
    first, second = data[0], data[1]
    size, length = 2, second & 0x7F
    if length == 126:
        if len(data) < 4:
            return None
        size, length = 4, struct.unpack_from("!H", data, 2)[0]
    elif length == 127:
        if len(data) < 10:
            return None
        size, length = 10, struct.unpack_from("!Q", data, 2)[0]
    key = b""
    if second & 0x80:
        if len(data) < size + 4:
            return None
        key, size = data[size:size + 4], size + 4
    return size, first, length, key


def _stalled(queue: Any) -> bool:
    """aiohttp (3.14) parks a reader whose queue is full and parses its tail later: while it is
    parked, frames go through it so that they keep their order."""
    return getattr(queue, "_stalled_reader", None) is not None


def install(protocol: Any, queue: Any, max_msg_size: int) -> bool:
    """Put a BulkReader in front of the WebSocket reader of this aiohttp connection (its server's RequestHandler or its
    client's ResponseHandler; `queue` its WebSocket's message queue), right after the handshake. False (and nothing
    changed) where aiohttp's internals are not as this module expects."""
    inner = getattr(protocol, "_payload_parser", None)
    if _mask is None or inner is None or not hasattr(queue, "feed_data") or isinstance(inner, BulkReader) \
            or os.environ.get("BURLA_WS_BULK") == "0":
        return False
    protocol._payload_parser = BulkReader(inner, queue, max_msg_size, _mask, protocol)
    return True


def install_server(ws: web.WebSocketResponse, request: web.BaseRequest, max_msg_size: int) -> bool:
    """`install` on the server's side of a WebSocket `ws` just prepared for `request`."""
    return install(request.protocol, getattr(ws, "_reader", None), max_msg_size)


def install_client(ws: aiohttp.ClientWebSocketResponse, max_msg_size: int) -> bool:
    """`install` on a client's connection (its writer's protocol is the connection's)."""
    return install(getattr(getattr(ws, "_writer", None), "protocol", None), getattr(ws, "_reader", None),
                   max_msg_size)


# Python 3.11's plain socket transports copy what a socket did not take into a buffer of their own;
# 3.12's keep a view of the caller's buffer until it is sent, and TLS transports keep it until
# they encrypt it.
_COPIES_UNSENT = {"asyncio.selector_events._SelectorSocketTransport"} if sys.version_info < (3, 12) else set()
_mask_buffers: weakref.WeakKeyDictionary[Any, bytearray] = weakref.WeakKeyDictionary()
_chunk_buffers: weakref.WeakKeyDictionary[Any, bytearray] = weakref.WeakKeyDictionary()  # send_bulk_alone's
CHUNK = 1024 * 1024


def _mask_buffer(transport: Any, length: int) -> bytearray:
    """A buffer for a frame's masked payload: the connection's last one when the transport holds nothing of it any more
    and it is large enough (cut to `length`, which keeps its memory when it shrinks by less than half), else a new one.
    A new buffer of 10 MB cost more in page faults than the copy into it."""
    try:
        buffer = _mask_buffers.get(transport)
    except TypeError:
        buffer = None
    kind = type(transport)
    reusable = buffer is not None and length <= len(buffer) < 2 * length and (
        transport.get_write_buffer_size() == 0 or f"{kind.__module__}.{kind.__qualname__}" in _COPIES_UNSENT)
    if reusable:
        assert buffer is not None
        del buffer[length:]
        return buffer
    buffer = unfilled(length)
    if length <= KEEP_BUFFERS_UP_TO:
        with contextlib.suppress(TypeError):  # a transport that cannot be weakly referred to keeps none
            _mask_buffers[transport] = buffer
    return buffer


async def _hand_writer(ws: Any, parts: Sequence[bytes | memoryview]) -> tuple[Any, Any, int] | None:
    """(transport, protocol, length) of `ws` to write the frame of these parts to by hand; or None
    once aiohttp's own writer sent it (a small frame, compression, internals not as expected)."""
    length = sum(map(len, parts))
    writer = getattr(ws, "_writer", None)
    transport = getattr(writer, "transport", None)
    protocol = getattr(writer, "protocol", None)
    if (length < LARGE_FRAME or _mask is None or transport is None or getattr(protocol, "_drain_helper", None) is None
            or ws.compress or os.environ.get("BURLA_WS_BULK") == "0"):
        await ws.send_bytes(parts[0] if len(parts) == 1 else b"".join(parts))
        return None
    if ws.closed or transport.is_closing():
        raise ConnectionResetError("Cannot write to closing transport")
    return transport, protocol, length


def drop(ws: Any) -> None:
    """Cut a WebSocket's connection without a close frame: one written now could land inside a
    frame partly written, and a peer that went silent would never answer it."""
    transport = getattr(getattr(ws, "_writer", None), "transport", None)
    if transport is not None:
        transport.abort()


def _frame_header(length: int, masked: bool) -> bytes:
    """A final binary frame's header (RFC 6455 §5.2) for a payload of LARGE_FRAME bytes or more."""
    mask_bit = 0x80 if masked else 0
    if length < 65536:
        return struct.pack("!BBH", 0x80 | _OP_BINARY, mask_bit | 126, length)
    return struct.pack("!BBQ", 0x80 | _OP_BINARY, mask_bit | 127, length)


async def _drained(transport: Any, protocol: Any) -> None:
    if transport.get_write_buffer_size() > DRAIN_ABOVE and getattr(protocol, "_paused", False):
        await protocol._drain_helper()


async def send_bulk(ws: aiohttp.ClientWebSocketResponse, parts: Sequence[bytes | memoryview]) -> None:
    """Send one binary frame made of these parts from a client: masked with a fresh random key
    (RFC 6455 §5.3) in one buffer, the only copy of the payload."""
    found = await _hand_writer(ws, parts)
    if found is None:
        return
    transport, protocol, length = found
    payload = _mask_buffer(transport, length)
    at = 0
    for part in parts:
        payload[at:at + len(part)] = part
        at += len(part)
    key = os.urandom(4)
    _mask(key, payload)
    transport.write(_frame_header(length, masked=True) + key)
    # A view: what a socket does not take at once is sliced off it without a copy (Python 3.11's
    # transport slices its argument, then copies the slice into its own buffer).
    transport.write(memoryview(payload))
    await _drained(transport, protocol)


async def send_bulk_alone(ws: Any, parts: Sequence[bytes | memoryview], masked: bool = True) -> None:
    """`send_bulk` for a connection no other task writes to: the payload a CHUNK at a time (from a client, masked in
    one small buffer warm in the CPU's cache), each written once the socket took the one before, so it is neither
    copied whole into a new buffer nor again by the transport (3.11's keeps what a socket did not take as a copy). Only
    a lone writer may: the frame's writes are apart in time, and another frame between them would cut it."""
    found = await _hand_writer(ws, parts)
    if found is None:
        return
    transport, protocol, length = found
    transport.set_write_buffer_limits(high=0)  # paused while anything is unsent: a drain waits for all of it
    if not masked:  # a server's frame: the parts' own bytes, a chunk at a time
        transport.write(_frame_header(length, masked=False))
        for part in parts:
            view = memoryview(part).cast("B")
            for at in range(0, len(view), CHUNK):
                transport.write(view[at:at + CHUNK])
                if transport.get_write_buffer_size():
                    await protocol._drain_helper()
        return
    buffer = _chunk_buffers.get(transport)
    if buffer is None:
        buffer = _chunk_buffers[transport] = bytearray(CHUNK)
    key = os.urandom(4)
    transport.write(_frame_header(length, masked=True) + key)
    filled = 0
    for part in parts:
        view, at = memoryview(part).cast("B"), 0
        while at < len(view):
            take = min(CHUNK - filled, len(view) - at)
            buffer[filled:filled + take] = view[at:at + take]
            filled, at = filled + take, at + take
            if filled == CHUNK:  # a multiple of 4 from the payload's start: the key's phase holds
                await _write_masked(transport, protocol, key, buffer)
                filled = 0
    if filled:
        await _write_masked(transport, protocol, key, bytearray(buffer[:filled]))


async def _write_masked(transport: Any, protocol: Any, key: bytes, chunk: bytearray) -> None:
    _mask(key, chunk)
    transport.write(chunk)
    if transport.get_write_buffer_size():
        await protocol._drain_helper()  # the buffer is filled again only once the socket took this


async def send_bulk_from_server(ws: web.WebSocketResponse, parts: Sequence[bytes | memoryview]) -> None:
    """Send one binary frame made of these parts from a server: unmasked (RFC 6455 §5.1), so its
    header and then each part as it is, with no copy at all."""
    found = await _hand_writer(ws, parts)
    if found is None:
        return
    transport, protocol, length = found
    transport.write(_frame_header(length, masked=False))
    for part in parts:
        transport.write(memoryview(part))
    await _drained(transport, protocol)
