"""A server's connections over SSH channels (burla.web.channel_server): a remote forward on a real
asyncssh connection delivers each connection to the server's own protocol (the connection guard in
front of aiohttp's), and requests, WebSockets, large frames, flow control both ways and closes
work as on a socket."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import asyncssh
import pytest
from aiohttp import web

from burla.web import ws_bulk
from burla.web.channel_server import ChannelServer, ChannelTransport
from burla.web.connection_guard import ConnectionGuard

MAX_MESSAGE = 64 * 2**20


class _VmSshd(asyncssh.SSHServer):
    """The VM's sshd: no authentication, remote forwards allowed (it listens on their ports)."""

    def begin_auth(self, username: str) -> bool:
        return False

    def server_requested(self, listen_host: str, listen_port: int) -> bool:
        return True


@dataclass
class Tunnel:
    channels: ChannelServer
    guard: ConnectionGuard
    factory: Any  # the server's guarded protocol factory
    port: int  # the forwarded port on the "VM": connecting to it reaches the server over SSH
    connection: Any  # the head's SSH connection to the VM
    handlers: dict[str, Any]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
async def tunnel() -> AsyncIterator[Tunnel]:
    handlers: dict[str, Any] = {}

    async def dispatch(request: web.Request) -> web.StreamResponse:
        return await handlers[request.path](request)

    app = web.Application(client_max_size=MAX_MESSAGE)
    app.router.add_route("*", "/{path:.*}", dispatch)
    runner = web.AppRunner(app)
    await runner.setup()
    assert runner.server is not None
    guard = ConnectionGuard()
    channels = ChannelServer()
    factory = guard.wrap(runner.server)
    channels.serve(factory)
    sshd = await asyncssh.listen("127.0.0.1", 0, server_factory=_VmSshd,
                                 server_host_keys=[asyncssh.generate_private_key("ssh-ed25519")])
    connection = await asyncssh.connect("127.0.0.1", sshd.sockets[0].getsockname()[1], known_hosts=None,
                                        username="head", client_keys=None, agent_path=None)
    listener = await connection.create_server(channels.session_factory("vm-1 over SSH"), "127.0.0.1", 0)
    try:
        yield Tunnel(channels, guard, factory, listener.get_port(), connection, handlers)
    finally:
        listener.close()
        connection.close()
        await connection.wait_closed()
        sshd.close()
        await sshd.wait_closed()
        await runner.cleanup()


async def _bulk_ws(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE)
    await ws.prepare(request)
    assert ws_bulk.install_server(ws, request, MAX_MESSAGE)
    return ws


async def test_requests_and_large_frames_both_ways_reach_the_servers_own_protocol(tunnel, filled):
    seen: dict[str, Any] = {}

    async def hello(request: web.Request) -> web.Response:
        seen["remote"] = request.remote
        seen["transport"] = type(request.transport)
        return web.json_response({"body": len(await request.read())})

    async def echo(request: web.Request) -> web.WebSocketResponse:
        ws = await _bulk_ws(request)
        async for message in ws:
            await ws_bulk.send_bulk_from_server(ws, [b"back:", message.data])
        return ws

    tunnel.handlers.update({"/hello": hello, "/ws": echo})
    payloads = [os.urandom(size) for size in (10, 70_000, 12 * 2**20 + 3, 100, 3 * 2**20)]
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{tunnel.url}/hello", data=b"x" * 300_000) as response:
            assert await response.json() == {"body": 300_000}
        async with session.ws_connect(f"{tunnel.url}/ws", max_msg_size=MAX_MESSAGE) as ws:
            assert ws_bulk.install_client(ws, MAX_MESSAGE)
            for payload in payloads:
                await ws_bulk.send_bulk(ws, [payload])
                answer = await asyncio.wait_for(ws.receive(), 60)
                assert answer.data == b"back:" + payload
    # Served on the channel itself, named by the VM it came through; no socket of this process took it.
    assert seen == {"remote": "vm-1 over SSH", "transport": ChannelTransport}
    # The large frames were read straight into their buffers from the channel's data.
    assert sum(filled) > 12 * 2**20


async def test_a_reader_that_falls_behind_holds_back_the_writer_and_loses_nothing(tunnel):
    """Each side writes 20 frames of 4 MB while the other reads none for a while: the channel's
    flow control pauses the server's writes (its buffer holds about a frame, not all 80 MB), and
    the server's paused reads hold the client back (the SSH window stops its bytes), and
    everything arrives in order."""
    frames = [os.urandom(4 * 2**20) for _ in range(20)]
    buffered: list[int] = []
    sent: list[int] = []  # frames the client has written (each send waits for its socket to drain)
    sent_while_unread: list[int] = []
    received: list[bytes] = []

    async def flood(request: web.Request) -> web.WebSocketResponse:
        ws = await _bulk_ws(request)
        transport = request.transport
        assert isinstance(transport, ChannelTransport)
        for frame in frames:
            await ws_bulk.send_bulk_from_server(ws, [frame])
            buffered.append(transport.get_write_buffer_size())
        await asyncio.sleep(2.0)  # the client floods back meanwhile; nothing reads it
        sent_while_unread.append(len(sent))
        async for message in ws:
            received.append(message.data)
            if len(received) == len(frames):
                await ws.close()
        return ws

    tunnel.handlers["/flood"] = flood
    async with aiohttp.ClientSession() as session, \
            session.ws_connect(f"{tunnel.url}/flood", max_msg_size=MAX_MESSAGE) as ws:
        await asyncio.sleep(1.0)
        got = [(await asyncio.wait_for(ws.receive(), 60)).data for _ in frames]
        assert got == frames
        for frame in frames:
            await ws_bulk.send_bulk(ws, [frame])
            sent.append(len(frame))
        await asyncio.wait_for(ws.receive(), 60)  # the server's close, once it read them all
    assert received == frames
    assert max(buffered) <= 2 * 4 * 2**20 + 2**20, buffered
    # Unread, the server took in a few frames (aiohttp's queue, the SSH window, socket buffers), not 80 MB.
    assert sent_while_unread[0] <= 8, sent_while_unread


async def test_a_channel_is_refused_until_the_server_serves_and_after_it_closes(tunnel):
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hi")

    tunnel.handlers["/"] = hello
    tunnel.channels.close()
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientError):
            async with session.get(tunnel.url + "/") as response:
                await response.text()
    tunnel.channels.serve(tunnel.factory)
    async with aiohttp.ClientSession() as session:
        async with session.get(tunnel.url + "/") as response:
            assert await response.text() == "hi"


async def test_a_closed_connection_and_a_dropped_ssh_connection_end_the_server_side(tunnel):
    ended: list[str] = []
    opened = asyncio.Event()

    async def wait(request: web.Request) -> web.WebSocketResponse:
        ws = await _bulk_ws(request)
        opened.set()
        async for _ in ws:
            pass
        ended.append(request.query["n"])
        return ws

    tunnel.handlers["/wait"] = wait
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(f"{tunnel.url}/wait?n=closed") as ws:
            await ws.send_bytes(b"x")
        await _until(lambda: ended == ["closed"])
        # Every connection the guard counted is gone with it.
        await _until(lambda: not tunnel.guard.connections)
        opened.clear()
        ws = await session.ws_connect(f"{tunnel.url}/wait?n=dropped")
        await asyncio.wait_for(opened.wait(), 60)
        tunnel.connection.abort()  # the SSH connection under the tunnel drops
        await _until(lambda: ended == ["closed", "dropped"])
        await ws.close()
    await _until(lambda: not tunnel.guard.connections and not tunnel.guard.waiting)


async def _until(condition, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)
