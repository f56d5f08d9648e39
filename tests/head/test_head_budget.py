"""A head that bounds itself: a job costs nothing per input until its inputs come, and past the
head's limits on running jobs and on job connections per credential it refuses, naming the limit."""

from __future__ import annotations

import aiohttp
import psutil

from burla.protocol import wire
from tests.conftest import start_head, wait_for_nodes
from tests.security.test_security_and_bad_input import open_job

HUGE = 100_000_000  # the most inputs a job may have


async def _open(session: aiohttp.ClientSession, head, n_inputs: int) -> tuple[aiohttp.ClientWebSocketResponse,
                                                                              wire.Message]:
    ws = await session.ws_connect(head.url + "/v1/jobs/ws", headers=head.headers())
    await ws.send_bytes(open_job(n_inputs=n_inputs).encode())
    message = await ws.receive(timeout=60)
    assert message.type == aiohttp.WSMsgType.BINARY, message
    return ws, wire.decode(message.data)


async def test_three_openings_of_the_most_inputs_leave_the_head_within_50_mb(tmp_path):
    head = start_head(tmp_path / "config", workers=1)
    try:
        wait_for_nodes(head, 1)
        process = psutil.Process(head.process.pid)
        before = process.memory_info().rss
        async with aiohttp.ClientSession() as session:
            opened = [await _open(session, head, HUGE) for _ in range(3)]
            assert all(isinstance(reply, wire.JobAccepted) for _, reply in opened)
            grown = process.memory_info().rss - before
            for ws, _ in opened:
                await ws.close()
        assert grown < 50 * 2**20, f"the head grew {grown / 2**20:.0f} MB"
    finally:
        head.stop()


async def test_past_its_limits_the_head_refuses_and_names_the_limit(tmp_path):
    head = start_head(tmp_path / "config", workers=1, extra=["--max-open-jobs", "2", "--max-client-connections", "3"])
    upgrade = {**head.headers(), "Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
               "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
    try:
        wait_for_nodes(head, 1)
        async with aiohttp.ClientSession() as session:
            sockets = [await session.ws_connect(head.url + "/v1/jobs/ws", headers=head.headers()) for _ in range(3)]
            async with session.get(head.url + "/v1/jobs/ws", headers=upgrade) as refused:
                assert refused.status == 429
                assert "--max-client-connections 3" in (await refused.json())["message"]
            replies = []
            for ws in sockets:
                await ws.send_bytes(open_job(n_inputs=10).encode())
                message = await ws.receive(timeout=60)
                replies.append(wire.decode(message.data))
            assert [type(reply) for reply in replies[:2]] == [wire.JobAccepted, wire.JobAccepted]
            assert isinstance(replies[2], wire.ErrorReply) and replies[2].kind == "Overloaded"
            assert "--max-open-jobs 2" in replies[2].message
            for ws in sockets:
                await ws.close()
    finally:
        head.stop()
