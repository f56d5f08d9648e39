"""The node's reader of a worker's socket: frames of every size arrive whole and in order, large
ones in buffers of their own; a frame over the limit and an end mid-frame are told apart."""

from __future__ import annotations

import asyncio
import socket

import pytest

from burla.errors import ProtocolError
from burla.node.workers import worker_link
from burla.node.workers.worker_link import WorkerLink
from burla.protocol.worker_wire import FRAME_HEADER


def _frame(body: bytes) -> bytes:
    return FRAME_HEADER.pack(len(body)) + body


_OPEN: list = []  # every test's transports and sockets, closed after it (closing_links)


@pytest.fixture(autouse=True)
async def closing_links():
    yield
    while _OPEN:
        _OPEN.pop().close()
    await asyncio.sleep(0)  # the transports' closing callbacks run


async def _link(max_frame: int = 1 << 30) -> tuple[WorkerLink, socket.socket]:
    node_end, worker_end = socket.socketpair()
    transport, link = await asyncio.get_running_loop().connect_accepted_socket(lambda: WorkerLink(max_frame),
                                                                               sock=node_end)
    _OPEN.extend([worker_end, transport])
    return link, worker_end


async def _send(sock: socket.socket, data: bytes, piece: int) -> None:
    loop = asyncio.get_running_loop()
    sock.setblocking(False)
    for start in range(0, len(data), piece):
        await loop.sock_sendall(sock, data[start:start + piece])


@pytest.mark.parametrize("piece", [1, 7, 4096, 1 << 20])
async def test_frames_of_every_size_arrive_whole_and_in_order(piece):
    sizes = [0, 1, 5, 1000, worker_link.SCRATCH_BYTES - 4, worker_link.SCRATCH_BYTES, 3 * worker_link.SCRATCH_BYTES + 3,
             64 * 1024 - 1, 64 * 1024, 2, 3, 10 * 2**20]
    if piece == 1:
        sizes = [size for size in sizes if size < 300_000]  # a byte at a time: keep it short
    bodies = [bytes([n % 251]) * size for n, size in enumerate(sizes)]
    link, worker_end = await _link()
    sender = asyncio.create_task(_send(worker_end, b"".join(map(_frame, bodies)), piece))
    received = [await asyncio.wait_for(link.read(), 60) for _ in bodies]
    await sender
    assert [bytes(frame) for frame in received] == bodies
    worker_end.close()
    assert await asyncio.wait_for(link.read(), 60) is None


async def test_a_worker_that_sends_many_frames_at_once_is_paused_and_resumed():
    bodies = [bytes([n % 256]) * 2000 + b"%d" % n for n in range(10_000)]  # 20 MB: more than the socket holds
    link, worker_end = await _link()
    sender = asyncio.create_task(_send(worker_end, b"".join(map(_frame, bodies)), 1 << 16))
    deadline = asyncio.get_running_loop().time() + 60
    while not link._paused:  # nothing reads: the link stops reading once 64 frames wait
        assert asyncio.get_running_loop().time() < deadline, "the link never paused its socket"
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    assert not sender.done()  # held back by the paused socket, not buffered in the node
    assert len(link._frames) < 1000
    received = [await asyncio.wait_for(link.read(), 60) for _ in bodies]
    await asyncio.wait_for(sender, 60)
    assert received == bodies and not link._paused


async def test_large_frames_pause_the_socket_by_their_bytes_not_their_count():
    bodies = [bytes([n]) * (3 * 2**20) for n in range(12)]  # 36 MB in 12 frames, far below 64 frames
    link, worker_end = await _link()
    sender = asyncio.create_task(_send(worker_end, b"".join(map(_frame, bodies)), 1 << 20))
    deadline = asyncio.get_running_loop().time() + 60
    while not link._paused:  # nothing reads: the link stops reading once 8 MB of frames wait
        assert asyncio.get_running_loop().time() < deadline, "the link never paused its socket"
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    assert not sender.done()
    assert sum(map(len, link._frames)) < 12 * 2**20  # the rest waits in the worker, not in the node
    received = [await asyncio.wait_for(link.read(), 60) for _ in bodies]
    await asyncio.wait_for(sender, 60)
    assert [bytes(frame) for frame in received] == bodies and not link._paused


async def test_a_frame_over_the_limit_is_a_protocol_error():
    link, worker_end = await _link(max_frame=1000)
    await _send(worker_end, _frame(b"ok") + _frame(b"x" * 1001), 1 << 16)
    assert await asyncio.wait_for(link.read(), 60) == b"ok"
    with pytest.raises(ProtocolError, match="1001 bytes is over the limit of 1000"):
        await asyncio.wait_for(link.read(), 60)
    worker_end.close()


async def test_a_worker_that_ends_mid_frame_ends_the_stream():
    link, worker_end = await _link()
    await _send(worker_end, _frame(b"whole") + _frame(b"y" * 200_000)[:100_000], 1 << 16)
    worker_end.close()
    assert await asyncio.wait_for(link.read(), 60) == b"whole"
    assert await asyncio.wait_for(link.read(), 60) is None
