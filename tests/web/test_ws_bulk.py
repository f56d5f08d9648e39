"""Large WebSocket frames read and written with one copy (burla.web.ws_bulk): the reader in
front of aiohttp's hands on exactly the messages aiohttp's alone would, in the same order,
however the bytes are cut into reads; the writer's frames are what aiohttp reads back; and the
real head, node and client connections use both."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import ssl
import struct

import aiohttp
import pytest
from aiohttp import web
from aiohttp._websocket.reader import WebSocketDataQueue, WebSocketReader

from burla.web import ws_bulk


class _Protocol:
    _reading_paused = False

    def pause_reading(self) -> None:
        self._reading_paused = True

    def resume_reading(self) -> None:
        self._reading_paused = False


def _frame(opcode: int, payload: bytes, fin: bool = True, masked: bool = True) -> bytes:
    first = (0x80 if fin else 0) | opcode
    length = len(payload)
    mask_bit = 0x80 if masked else 0
    if length < 126:
        header = struct.pack("!BB", first, mask_bit | length)
    elif length < 65536:
        header = struct.pack("!BBH", first, mask_bit | 126, length)
    else:
        header = struct.pack("!BBQ", first, mask_bit | 127, length)
    if not masked:
        return header + payload
    key = os.urandom(4)
    masked_payload = bytes(b ^ key[i % 4] for i, b in enumerate(payload)) if length < 70_000 else \
        (int.from_bytes(payload, "little") ^ int.from_bytes(key * (length // 4 + 1), "little")
         % (1 << (8 * length))).to_bytes(length, "little")
    return header + key + masked_payload


def _stream(rng: random.Random, masked: bool) -> bytes:
    frames = []
    for _ in range(30):
        kind = rng.choice(["small", "large", "text", "ping", "fragments", "large_text", "empty"])
        if kind == "small":
            frames.append(_frame(0x2, rng.randbytes(rng.choice([0, 1, 125, 126, 1000, 65535])), masked=masked))
        elif kind == "large":
            frames.append(_frame(0x2, rng.randbytes(rng.choice([65536, 70_000, 300_000])), masked=masked))
        elif kind == "large_text":
            frames.append(_frame(0x1, b"t" * 100_000, masked=masked))
        elif kind == "text":
            frames.append(_frame(0x1, "héllo".encode(), masked=masked))
        elif kind == "ping":
            frames.append(_frame(0x9, b"p", masked=masked))
        elif kind == "empty":
            frames.append(_frame(0x2, b"", masked=masked))
        else:  # a fragmented message with a large middle part and a ping between its fragments
            frames += [_frame(0x2, rng.randbytes(10), fin=False, masked=masked),
                       _frame(0x9, b"q", masked=masked),
                       _frame(0x0, rng.randbytes(80_000), fin=False, masked=masked),
                       _frame(0x0, rng.randbytes(5), masked=masked)]
    return b"".join(frames)


def _messages(stream: bytes, cuts: list[int], bulk: bool) -> list:
    loop = asyncio.new_event_loop()
    try:
        queue = WebSocketDataQueue(_Protocol(), 2**30, loop=loop)
        reader = WebSocketReader(queue, 2**30, compress=False, decode_text=True)
        parser = ws_bulk.BulkReader(reader, queue, 2**30, ws_bulk._mask) if bulk else reader
        start = 0
        for cut in [*cuts, len(stream)]:
            assert parser.feed_data(stream[start:cut]) == (False, b"")
            start = cut
        return [(m.type, bytes(m.data) if isinstance(m.data, (bytes, bytearray)) else m.data, m.extra)
                for m, _ in queue._buffer]
    finally:
        loop.close()


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("masked", [True, False])
def test_the_reader_hands_on_what_aiohttps_alone_would(seed, masked):
    rng = random.Random(seed)
    stream = _stream(rng, masked)
    cuts = sorted(rng.sample(range(1, len(stream)), 200)) if seed % 2 else \
        list(range(1, min(len(stream), 3000))) + sorted(rng.sample(range(3000, len(stream)), 50))
    expected = _messages(stream, [], bulk=False)
    assert _messages(stream, cuts, bulk=True) == expected
    assert _messages(stream, [], bulk=True) == expected
    assert any(t == aiohttp.WSMsgType.BINARY and len(d) >= ws_bulk.LARGE_FRAME for t, d, _ in expected)


def test_a_frame_over_the_limit_is_refused_by_aiohttps_reader():
    loop = asyncio.new_event_loop()
    try:
        queue = WebSocketDataQueue(_Protocol(), 2**30, loop=loop)
        parser = ws_bulk.BulkReader(WebSocketReader(queue, 100_000, compress=False, decode_text=True), queue,
                                    100_000, ws_bulk._mask)
        assert parser.feed_data(_frame(0x2, b"x" * 100_000)) == (False, b"")
        assert parser.feed_data(_frame(0x2, b"x" * 100_001)) == (True, b"")
        assert bytes(queue._buffer[0][0].data) == b"x" * 100_000
        assert "exceeds limit" in str(queue.exception()) or "too big" in str(queue.exception()).lower()
    finally:
        loop.close()


def test_a_bad_frame_after_a_large_one_fails_as_aiohttp_fails_it():
    stream = _frame(0x2, b"x" * 100_000) + _frame(0x3, b"reserved opcode")
    loop = asyncio.new_event_loop()
    try:
        queue = WebSocketDataQueue(_Protocol(), 2**30, loop=loop)
        parser = ws_bulk.BulkReader(WebSocketReader(queue, 2**30, compress=False, decode_text=True), queue, 2**30,
                                    ws_bulk._mask)
        assert parser.feed_data(stream) == (True, b"")
        assert bytes(queue._buffer[0][0].data) == b"x" * 100_000
        assert queue.exception() is not None
    finally:
        loop.close()


def test_a_frames_buffer_is_reused_only_once_nothing_refers_to_it():
    loop = asyncio.new_event_loop()
    try:
        queue = WebSocketDataQueue(_Protocol(), 2**30, loop=loop)
        parser = ws_bulk.BulkReader(WebSocketReader(queue, 2**30, compress=False, decode_text=True), queue, 2**30,
                                    ws_bulk._mask)

        def frame_of(byte: bytes, size: int) -> bytearray:
            assert parser.feed_data(_frame(0x2, byte * size)) == (False, b"")
            return queue._buffer.popleft()[0].data

        first = frame_of(b"a", 100_000)
        view = memoryview(first)[10:20]
        del first  # only a view of it is left
        second = frame_of(b"b", 100_000)
        assert bytes(view) == b"a" * 10  # not written over
        second_id = id(second)
        third = frame_of(b"c", 100_000)  # the last frame is still held: a new buffer
        assert id(third) != second_id and bytes(second) == b"b" * 100_000
        third_id = id(third)
        del second, third, view  # the last one stays alive in the reader, held by nothing else
        fourth = frame_of(b"d", 90_000)  # so it is reused, cut to size
        assert bytes(fourth) == b"d" * 90_000 and len(fourth) == 90_000
        assert id(fourth) == third_id or ws_bulk._only_here is ws_bulk._never
        fifth = frame_of(b"e", 300_000)  # larger than the last: a new buffer
        assert bytes(fifth) == b"e" * 300_000 and bytes(fourth) == b"d" * 90_000
    finally:
        loop.close()


async def test_client_frames_sent_in_parts_arrive_whole_on_a_real_server():
    received: list[bytes] = []
    installed: list[bool] = []

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=64 * 2**20)
        await ws.prepare(request)
        installed.append(ws_bulk.install_server(ws, request, 64 * 2**20))
        async for message in ws:
            received.append(message.data)
            await ws.send_bytes(b"k" * 100_000 if len(received) % 2 else b"k")
        return ws

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    sizes = [10, 65_535, 65_536, 3 * 2**20 + 1, 200, 20 * 2**20]
    payloads = [os.urandom(size) for size in sizes]
    try:
        async with aiohttp.ClientSession() as session, session.ws_connect(f"http://127.0.0.1:{port}/",
                                                                           max_msg_size=64 * 2**20) as ws:
            assert ws_bulk.install_client(ws, 64 * 2**20)
            answers = []
            for payload in payloads:
                await ws_bulk.send_bulk(ws, [payload[:7], memoryview(payload)[7:]])
                answers.append((await asyncio.wait_for(ws.receive(), 60)).data)
            assert [len(a) for a in answers] == [100_000 if n % 2 == 0 else 1 for n in range(len(sizes))]
            # The large answers were collected by the client's BulkReader (aiohttp's reader makes bytes).
            assert [type(a) for a in answers] == [bytearray if n % 2 == 0 else bytes for n in range(len(sizes))]
    finally:
        await runner.cleanup()
    assert installed == [True]
    assert received == payloads
    assert [type(r) for r in received] == [bytearray if len(p) >= ws_bulk.LARGE_FRAME else bytes for p in payloads]


class _PassThrough(asyncio.Protocol):
    """A protocol in front of aiohttp's that only passes everything on (as the head's connection
    guard does): frames are still read straight into their buffers behind it."""

    def __init__(self, inner: asyncio.Protocol) -> None:
        self.inner = inner

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.inner.connection_lost(exc)


async def _server(handler, wrapped: bool = False, tls: ssl.SSLContext | None = None
                  ) -> tuple[tuple[web.AppRunner, asyncio.Server], int]:
    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    loop = asyncio.get_running_loop()
    factory = runner.server
    assert factory is not None
    server = await loop.create_server((lambda: _PassThrough(factory())) if wrapped else factory, "127.0.0.1", 0,
                                      ssl=tls)
    return (runner, server), server.sockets[0].getsockname()[1]


async def _bulk_ws(request: web.Request) -> web.WebSocketResponse:
    """The server's side of a test connection, prepared, with its BulkReader in place."""
    ws = web.WebSocketResponse(max_msg_size=64 * 2**20)
    await ws.prepare(request)
    assert ws_bulk.install_server(ws, request, 64 * 2**20)
    return ws


async def _stop(serving: tuple[web.AppRunner, asyncio.Server]) -> None:
    runner, server = serving
    server.close()
    await runner.cleanup()


@pytest.mark.parametrize("wrapped", [False, True])
async def test_the_rest_of_a_large_frame_is_read_straight_into_its_buffer(filled, wrapped):
    received: list[bytes] = []
    protocols_after: list[bool] = []

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = await _bulk_ws(request)
        async for message in ws:
            received.append(message.data)
            transport = request.transport
            assert transport is not None
            outer = transport.get_protocol()
            protocols_after.append(outer is request.protocol or getattr(outer, "inner", None) is request.protocol)
            await ws.send_bytes(b"ok")
        return ws

    runner, port = await _server(handler, wrapped)
    payloads = [os.urandom(size) for size in (8 * 2**20, 100, 3 * 2**20, 70_000)]
    try:
        async with aiohttp.ClientSession() as session, session.ws_connect(f"http://127.0.0.1:{port}/",
                                                                           max_msg_size=64 * 2**20) as ws:
            for payload in payloads:
                await ws_bulk.send_bulk(ws, [payload])
                assert (await asyncio.wait_for(ws.receive(), 60)).data == b"ok"
    finally:
        await _stop(runner)
    assert received == payloads
    assert protocols_after == [True] * len(payloads)  # the connection's own protocol is back after each
    # Most of the 11 MB of large frames came through the filler, each read into the frame itself.
    assert sum(filled) > 8 * 2**20


async def test_a_large_frame_written_in_small_pieces_is_read_in_few_large_reads(filled):
    """A writer that sends a frame in 32 KB pieces (an sshd forwarding its packets) wakes the
    reader once per WAKE_AFTER bytes, not per piece; the frame's tail, shorter than that, still
    comes at once, and after the frame the connection wakes for each byte again (a small frame
    next is answered)."""
    received: list[bytes] = []
    low_water_after: list[int] = []

    def low_water(request: web.Request) -> int:
        sock = request.transport.get_extra_info("socket")  # type: ignore[union-attr]
        return int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT))

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = await _bulk_ws(request)
        async for message in ws:
            received.append(message.data)
            low_water_after.append(low_water(request))
            await ws.send_bytes(b"ok")
        return ws

    runner, port = await _server(handler)
    payload = os.urandom(4 * 2**20 + 1000)
    frame = _frame(0x2, payload)
    pieces = range(0, len(frame), 32 * 1024)
    try:
        async with aiohttp.ClientSession() as session, session.ws_connect(f"http://127.0.0.1:{port}/",
                                                                           max_msg_size=64 * 2**20) as ws:
            transport = ws._writer.transport  # type: ignore[attr-defined]
            for start in pieces:
                transport.write(frame[start:start + 32 * 1024])
                await asyncio.sleep(0.001)
            assert (await asyncio.wait_for(ws.receive(), 60)).data == b"ok"
            await ws.send_bytes(b"small")
            assert (await asyncio.wait_for(ws.receive(), 60)).data == b"ok"
    finally:
        await _stop(runner)
    assert received == [payload, b"small"]
    assert ws_bulk.WAKE_AFTER == 256 * 1024
    assert len(pieces) == 129 and len(filled) <= 20, filled  # 4 MB in reads of 256 KB or more, not 129
    assert low_water_after == [1, 1]


async def test_a_connection_lost_inside_a_large_frame_ends_the_server_side():
    ended = asyncio.Event()
    messages: list[object] = []

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = await _bulk_ws(request)
        async for message in ws:
            messages.append(message.type)
        ended.set()
        return ws

    runner, port = await _server(handler)
    try:
        async with aiohttp.ClientSession() as session, session.ws_connect(f"http://127.0.0.1:{port}/") as ws:
            transport = ws._writer.transport  # type: ignore[attr-defined]
            # Half of a 4 MB masked frame, then the connection drops.
            frame = _frame(0x2, b"z" * (4 * 2**20))
            transport.write(frame[:2 * 2**20])
            await asyncio.sleep(0.2)
            transport.abort()
        await asyncio.wait_for(ended.wait(), 60)
    finally:
        await _stop(runner)
    assert messages == []  # the partial frame was never handed on


async def test_frames_sent_back_to_back_reuse_the_mask_buffer_and_arrive_as_sent():
    received: list[bytes] = []
    done = asyncio.Event()
    sizes = [5 * 2**20, 5 * 2**20, 4 * 2**20, 3 * 2**20 + 7, 5 * 2**20, 100_000, 5 * 2**20]

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = await _bulk_ws(request)
        async for message in ws:
            await asyncio.sleep(0.05)  # a slow reader: the client's socket backs up
            received.append(bytes(message.data))
            if len(received) == len(sizes):
                done.set()
        return ws

    serving, port = await _server(handler)
    payloads = [bytes([n + 1]) * size for n, size in enumerate(sizes)]
    reused = []
    try:
        async with aiohttp.ClientSession() as session, session.ws_connect(f"http://127.0.0.1:{port}/",
                                                                           max_msg_size=64 * 2**20) as ws:
            transport = ws._writer.transport  # type: ignore[attr-defined]
            for payload in payloads:  # no waiting for answers: each frame's buffer may still be unsent
                before = ws_bulk._mask_buffers.get(transport)
                await ws_bulk.send_bulk(ws, [payload])
                reused.append(ws_bulk._mask_buffers.get(transport) is before)
            await asyncio.wait_for(done.wait(), 60)
    finally:
        await _stop(serving)
    assert received == payloads
    if ws_bulk._COPIES_UNSENT:  # Python 3.11: its transport never keeps the buffer, so it is reused
        assert reused == [False, True, True, True, False, False, False]


@pytest.mark.parametrize("compress", [False, True])
async def test_a_servers_frame_sent_in_parts_arrives_whole(compress, monkeypatch):
    headers: list[int] = []  # frames written by hand, part by part (their lengths)
    real_header = ws_bulk._frame_header
    monkeypatch.setattr(ws_bulk, "_frame_header", lambda length, masked: headers.append(length) or
                        real_header(length, masked))
    rng = random.Random(5)
    frames = [[rng.randbytes(3), memoryview(rng.randbytes(4 * 2**20)), rng.randbytes(70_000)],
              [b"tiny", b"parts"],  # under LARGE_FRAME: aiohttp's own writer
              [rng.randbytes(2 * 2**20)] * 3]

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=64 * 2**20, compress=compress)
        await ws.prepare(request)
        for parts in frames:
            await ws_bulk.send_bulk_from_server(ws, parts)
        await ws.receive()  # until the client closes
        return ws

    serving, port = await _server(handler)
    try:
        async with aiohttp.ClientSession() as session, session.ws_connect(
                f"http://127.0.0.1:{port}/", max_msg_size=64 * 2**20, compress=15 if compress else 0) as ws:
            assert bool(ws.compress) == compress
            received = [bytes((await asyncio.wait_for(ws.receive(), 60)).data) for _ in frames]
    finally:
        await _stop(serving)
    assert received == [b"".join(bytes(part) for part in parts) for parts in frames]
    # Uncompressed, the large frames went part by part; compressed, all through aiohttp's writer.
    assert headers == ([] if compress else [len(received[0]), len(received[2])])


async def test_large_frames_over_tls_are_read_straight_into_their_buffers(filled):
    from burla.web.tls import node_server_context

    received: list[bytes] = []

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = await _bulk_ws(request)
        async for message in ws:
            received.append(bytes(message.data))
            await ws_bulk.send_bulk_from_server(ws, [b"echo:", message.data])
        return ws

    context, _ = node_server_context("127.0.0.1")
    serving, port = await _server(handler, tls=context)
    payloads = [os.urandom(6 * 2**20), os.urandom(100), os.urandom(300_000)]
    try:
        async with aiohttp.ClientSession() as session, session.ws_connect(
                f"https://127.0.0.1:{port}/", max_msg_size=64 * 2**20, ssl=False) as ws:
            assert ws_bulk.install_client(ws, 64 * 2**20)
            echoes = []
            for payload in payloads:
                await ws_bulk.send_bulk(ws, [payload])
                echoes.append(bytes((await asyncio.wait_for(ws.receive(), 60)).data))
    finally:
        await _stop(serving)
    assert received == payloads and echoes == [b"echo:" + payload for payload in payloads]
    assert sum(filled) > 2 * 6 * 2**20 * 0.8  # both ends read most of the large frames through the filler


async def test_a_lone_writers_frames_go_masked_a_chunk_at_a_time_and_arrive_as_sent():
    """Parts of any length, crossing chunk boundaries anywhere, to a slow reader (the client's
    socket backs up, so each chunk waits for the one before to leave): every frame arrives whole,
    with nothing else between, and the chunk buffer stays one per connection."""
    received: list[bytes] = []
    done = asyncio.Event()
    chunk = ws_bulk.CHUNK
    frames = [[os.urandom(chunk)], [os.urandom(3), os.urandom(2 * chunk + 5), os.urandom(chunk - 1)],
              [os.urandom(7 * chunk + 1)], [os.urandom(100_000)], [os.urandom(10)], [os.urandom(chunk + 2)]]

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = await _bulk_ws(request)
        async for message in ws:
            await asyncio.sleep(0.05)
            received.append(bytes(message.data))
            if len(received) == len(frames):
                done.set()
        return ws

    serving, port = await _server(handler)
    try:
        async with aiohttp.ClientSession() as session, session.ws_connect(f"http://127.0.0.1:{port}/",
                                                                           max_msg_size=64 * 2**20) as ws:
            transport = ws._writer.transport  # type: ignore[attr-defined]
            buffers = set()
            for parts in frames:
                await ws_bulk.send_bulk_alone(ws, parts)
                buffers.add(id(ws_bulk._chunk_buffers.get(transport)))
            await asyncio.wait_for(done.wait(), 60)
    finally:
        await _stop(serving)
    assert received == [b"".join(parts) for parts in frames]
    assert len(buffers - {id(None)}) == 1
