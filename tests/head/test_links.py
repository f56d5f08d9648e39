"""The head's outgoing links over a real WebSocket on 127.0.0.1: a node's frames written straight
to its socket arrive whole and in order, also when the socket backs up and they wait for the
writer task, and a client's results go out in bounded frames and again after a resume."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from burla.head import links
from burla.head.links import ClientLink, NodeLink
from burla.protocol import limits, wire
from burla.protocol.values.packed_inputs import PackedInputs


class OneSocket:
    """A server on an ephemeral port whose one WebSocket is handed to the test."""

    def __init__(self) -> None:
        self.ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def _handler(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=limits.MAX_FRAME_BYTES)
        await ws.prepare(request)
        self.ready.set_result((ws, request.transport))
        async for _ in ws:  # until the client closes (its close is answered here)
            pass
        return ws

    async def __aenter__(self) -> OneSocket:
        app = web.Application()
        app.router.add_get("/ws", self._handler)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/ws"
        return self

    async def __aexit__(self, *exc) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


async def _read(ws: aiohttp.ClientWebSocketResponse, count: int) -> list[wire.Message]:
    got = []
    while len(got) < count:
        frame = await asyncio.wait_for(ws.receive(), 60)
        assert frame.type == aiohttp.WSMsgType.BINARY, frame
        got.append(wire.decode(frame.data))
    return got


@pytest.mark.asyncio
async def test_node_frames_written_directly_arrive_in_order_also_when_the_socket_backs_up(monkeypatch):
    monkeypatch.setattr(links, "DIRECT_WRITE_LIMIT", 64 * 1024)  # back up after a few frames
    sent_in_parts: list[int] = []  # frames the writer task wrote from their parts, never joined
    real_send = links.ws_bulk.send_bulk_from_server

    async def counting(ws, parts):
        sent_in_parts.append(len(parts))
        await real_send(ws, parts)

    monkeypatch.setattr(links.ws_bulk, "send_bulk_from_server", counting)
    async with OneSocket() as server, aiohttp.ClientSession() as session:
        async with session.ws_connect(server.url, max_msg_size=limits.MAX_FRAME_BYTES) as client:
            ws, transport = await server.ready
            link = NodeLink("n", ws, transport)
            writer = asyncio.create_task(link.run())
            # Sizes that take each header form (1, 3 and 9 length bytes) and both write paths.
            sizes = [0, 100, 20_000, 70_000, 1_000_000] * 20  # 20 MB: more than the kernel buffers
            for number, size in enumerate(sizes):
                link.send(wire.InputBatch.of("j", PackedInputs.of([[number, b"x" * size]])))
            assert link._frames, "the socket never backed up: the writer task's path went untested"
            got = await _read(client, len(sizes))
            assert [(i, len(data)) for m in got for i, data in m.part().items()] == list(enumerate(sizes))
            assert sent_in_parts and min(sent_in_parts) > 1
            link.send(wire.ReleaseJob("j"))  # and straight to the socket again once it drained
            assert not link._frames
            assert await _read(client, 1) == [wire.ReleaseJob("j")]
            link.close()  # nothing more goes out (closing the WebSocket is its handler's part)
            await asyncio.wait_for(writer, 60)
            link.send(wire.ReleaseJob("j"))
            assert not link._frames and not ws.closed


@pytest.mark.asyncio
async def test_a_client_gets_results_in_bounded_frames_and_the_unacknowledged_ones_again():
    async with OneSocket() as server, aiohttp.ClientSession() as session:
        link = ClientLink("j")
        total = 3 * limits.BATCH_ITEMS + 5
        for start in range(0, total, 1000):  # as node frames deliver them
            link.deliver([], [[i, True, i.to_bytes(4, "big")] for i in range(start, min(total, start + 1000))])
        async with session.ws_connect(server.url, max_msg_size=limits.MAX_FRAME_BYTES) as client:
            ws, _ = await server.ready
            link.attach(ws)
            batches = await _read(client, 4)
            # Whole deliveries per frame, up to limits.BATCH_ITEMS (a node's frame is never bigger).
            assert [len(b.items) for b in batches] == [4000, 4000, 4000, total - 12_000]
            assert [item[0] for b in batches for item in b.items] == list(range(total))
            assert link.ack(batches[1].seq) == 8000 and link.unacked_results() == total - link.acked
            await link.detach(ws, 0.0)
        server.ready = asyncio.get_running_loop().create_future()
        async with session.ws_connect(server.url, max_msg_size=limits.MAX_FRAME_BYTES) as client:
            ws, _ = await server.ready
            link.attach(ws)  # a resuming client: the two batches it did not acknowledge, as they were
            again = await _read(client, 2)
            assert [(b.seq, b.items) for b in again] == [(b.seq, b.items) for b in batches[2:]]
            await link.detach(ws, 0.0)


def test_the_idle_collector_collects_once_after_a_change_and_never_during_a_job():
    from burla.head.idle_collector import QUIET_BEFORE_S, IdleCollector

    running = [False]
    collector = IdleCollector(lambda: running[0])
    assert not collector.collect_if_due(0.0)  # nothing changed
    collector.changed()
    running[0] = True
    assert not collector.collect_if_due(100.0)  # a job runs
    running[0] = False
    assert not collector.collect_if_due(101.0)  # quiet only since now
    assert collector.collect_if_due(101.0 + QUIET_BEFORE_S)
    assert not collector.collect_if_due(200.0)  # once per change


@pytest.mark.asyncio
async def test_a_fan_out_goes_out_over_several_turns_in_order_per_node(monkeypatch):
    monkeypatch.setattr(links.WriteTurns, "FRAMES_PER_TURN", 3)
    turns = links.WriteTurns()
    async with OneSocket() as first, OneSocket() as second, aiohttp.ClientSession() as session:
        async with session.ws_connect(first.url) as client_a, session.ws_connect(second.url) as client_b:
            (ws_a, transport_a), (ws_b, transport_b) = await first.ready, await second.ready
            link_a, link_b = NodeLink("a", ws_a, transport_a, turns), NodeLink("b", ws_b, transport_b, turns)
            for number in range(5):  # ten frames in one step: three go now, the rest wait for turns
                link_a.send(wire.Credit("j", number))
                link_b.send(wire.Credit("j", number))
            assert len(link_a._frames) + len(link_b._frames) == 7
            got_a, got_b = await _read(client_a, 5), await _read(client_b, 5)
            assert [m.inputs for m in got_a] == [m.inputs for m in got_b] == list(range(5))
            assert not link_a._frames and not link_b._frames
