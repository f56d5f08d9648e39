"""Sending plans over raw sockets, so that any byte can go out, and reading what comes back: an
HTTP answer's status (an event stream read for a while), or a WebSocket session's frames, close
code and replies. Each plan's outcome says whether the answer is a finding."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import re
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

from burla.protocol import wire
from tests.security.fuzz.model import PROTOCOL_VIOLATIONS, Finding, Outcome, Plan, describe

TIMEOUT_S = 30.0  # per request or WebSocket session
STREAM_READ_S = 2.0  # how long an event stream is read before it is closed


def ws_frame(rng: random.Random, opcode: int, payload: bytes, fin: bool = True, masked: bool = True,
             rsv: int = 0) -> bytes:
    n = len(payload)
    head = bytes([(0x80 if fin else 0) | (rsv << 4) | opcode])
    length = n if n < 126 else (126 if n < 65536 else 127)
    head += bytes([(0x80 if masked else 0) | length])
    if length == 126:
        head += struct.pack("!H", n)
    elif length == 127:
        head += struct.pack("!Q", n)
    if not masked:
        return head + payload
    key = rng.randbytes(4)
    if n:
        stream = (key * (n // 4 + 1))[:n]
        payload = (int.from_bytes(payload, "big") ^ int.from_bytes(stream, "big")).to_bytes(n, "big")
    return head + key + payload


def _request_bytes(plan: Plan) -> bytes:
    lines = [plan.method + b" " + plan.target + b" HTTP/1.1", *(k + b": " + v for k, v in plan.headers)]
    payload = b""
    if plan.body is not None:
        if plan.chunked:
            lines.append(b"Transfer-Encoding: chunked")
            size = max(1, len(plan.body) // 3)
            for start in range(0, len(plan.body), size):
                chunk = plan.body[start:start + size]
                payload += b"%x\r\n" % len(chunk) + chunk + b"\r\n"
            payload += b"0\r\n\r\n"
        else:
            lines.append(b"Content-Length: %d" % len(plan.body))
            payload = plan.body
    if not plan.frames:
        lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + payload


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, bytes] | None:
    """The status and header block of the response (past any 100 Continue), or None at EOF."""
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as e:
            head = e.partial
            if not head.startswith(b"HTTP/"):
                return None
        parts = head.split(b" ", 2)
        if len(parts) < 2 or not parts[1][:3].isdigit():
            return None
        status = int(parts[1][:3])
        if status != 100:
            return status, head


def _classify(status: int) -> Outcome:
    outcome = Outcome(f"{status // 100}xx")
    if status >= 500:
        outcome.finding = str(status)
    return outcome


async def _send_and_read_head(plan: Plan, reader, writer, awaited: str) -> tuple[int, bytes] | Outcome:
    """Send the request; the answer's status and head, or the Outcome of a connection that ended first."""
    with contextlib.suppress(ConnectionError):  # the server may answer before the whole body arrived
        writer.write(_request_bytes(plan))
        await writer.drain()
    try:
        answer = await _read_head(reader)
    except ConnectionResetError:
        return Outcome("reset", "reset", f"the connection was reset before {awaited}")
    if answer is None:
        return Outcome("reset", "closed", f"the connection closed before {awaited}")
    return answer


async def _http(plan: Plan) -> Outcome:
    reader, writer = await asyncio.open_connection(*plan.address, limit=2**20)
    try:
        answer = await _send_and_read_head(plan, reader, writer, "any answer")
        if isinstance(answer, Outcome):
            return answer
        status, head = answer
        outcome = _classify(status)
        if plan.method == b"HEAD":
            pass  # no body, whatever the headers say
        elif b"text/event-stream" in head.lower():
            with contextlib.suppress(TimeoutError, ConnectionError):
                await asyncio.wait_for(reader.read(4096), STREAM_READ_S)
        else:
            with contextlib.suppress(ConnectionError):
                body = await reader.read()
                if status >= 500:
                    outcome.detail = body[:300].decode("utf-8", "replace")
        return outcome
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _read_frame(reader: asyncio.StreamReader) -> tuple[int, bool, bytes]:
    """One frame from the server: its opcode, whether it is compressed (RSV1), its payload."""
    first, second = await reader.readexactly(2)
    n = second & 0x7F
    if n == 126:
        n = struct.unpack("!H", await reader.readexactly(2))[0]
    elif n == 127:
        n = struct.unpack("!Q", await reader.readexactly(8))[0]
    key = await reader.readexactly(4) if second & 0x80 else b""
    payload = await reader.readexactly(n)
    if key:
        payload = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    return first & 0x0F, bool(first & 0x40), payload


@dataclass
class _WsState:
    close_code: int | None = None
    sent_close: bool = False
    ended: str = ""  # "eof" or "reset" when the connection ended
    error_replies: list[tuple[str, int, str]] = field(default_factory=list)
    replies: collections.Counter = field(default_factory=collections.Counter)
    inflate: Any = field(default_factory=lambda: zlib.decompressobj(-zlib.MAX_WBITS))  # permessage-deflate


async def _ws_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: _WsState,
                   rng: random.Random) -> None:
    while True:
        try:
            opcode, compressed, payload = await _read_frame(reader)
        except asyncio.IncompleteReadError:
            state.ended = "eof"
            return
        except ConnectionError:
            state.ended = "reset"
            return
        if opcode == 8:
            state.close_code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
            if not state.sent_close:
                state.sent_close = True
                with contextlib.suppress(ConnectionError, RuntimeError):
                    writer.write(ws_frame(rng, 8, struct.pack("!H", 1000)))
        elif opcode == 9:
            with contextlib.suppress(ConnectionError, RuntimeError):
                writer.write(ws_frame(rng, 10, payload))
        elif opcode == 2:
            try:
                if compressed:  # the handshake asked for permessage-deflate and the server agreed
                    payload = state.inflate.decompress(payload + b"\x00\x00\xff\xff")
                msg = wire.decode(payload)
            except Exception:
                state.replies["undecodable"] += 1
                continue
            if isinstance(msg, wire.ErrorReply):
                state.replies[f"ErrorReply {msg.kind}"] += 1
                state.error_replies.append((msg.kind, msg.status, msg.message[:200]))
            else:
                state.replies[type(msg).__name__] += 1


async def _websocket(plan: Plan) -> Outcome:
    reader, writer = await asyncio.open_connection(*plan.address, limit=2**20)
    rng = random.Random(plan.index)  # masks of the replies this side sends
    try:
        answer = await _send_and_read_head(plan, reader, writer, "the handshake was answered")
        if isinstance(answer, Outcome):
            return answer
        status, head = answer
        if status != 101:
            return await _refused_upgrade(plan, reader, status, head)
        state = _WsState()
        reading = asyncio.create_task(_ws_read(reader, writer, state, rng))
        cut_off, violated = await _send_frames(plan, writer, state)
        if plan.linger and not cut_off:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(reading), plan.linger)
        if plan.drop and not cut_off:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
            return Outcome("1xx")
        if not cut_off and not state.sent_close and not state.ended:
            state.sent_close = True
            with contextlib.suppress(ConnectionError, RuntimeError):
                writer.write(ws_frame(rng, 8, struct.pack("!H", 1000)))
                await writer.drain()
        await reading
        return _judge(state, cut_off, violated)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _refused_upgrade(plan: Plan, reader: asyncio.StreamReader, status: int, head: bytes) -> Outcome:
    """The handshake was answered without an upgrade. The connection may stay open (no
    Connection: close here): read just the body."""
    outcome = _classify(status)
    length = re.search(rb"\r\ncontent-length:\s*(\d+)", head.lower())
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        body = await reader.readexactly(int(length.group(1))) if length and plan.method != b"HEAD" else b""
        if status >= 500:
            outcome.detail = body[:300].decode("utf-8", "replace")
    return outcome


async def _send_frames(plan: Plan, writer: asyncio.StreamWriter, state: _WsState) -> tuple[bool, bool]:
    """Send the plan's frames until the peer closes; returns (cut off, a protocol violation sent)."""
    cut_off = violated = False
    for data, ends_stream, label in plan.frames:
        if state.close_code is not None or state.ended:
            break
        violated = violated or label.startswith(PROTOCOL_VIOLATIONS)
        try:
            writer.write(data)
            await writer.drain()
        except (ConnectionError, RuntimeError):
            break
        if ends_stream:
            cut_off = True
            with contextlib.suppress(OSError, RuntimeError):
                writer.write_eof()
            break
        await asyncio.sleep(0)
    return cut_off, violated


def _judge(state: _WsState, cut_off: bool, violated: bool) -> Outcome:
    outcome = Outcome("1xx", close_code=state.close_code, replies=state.replies)
    fives = [e for e in state.error_replies if e[1] >= 500]
    if state.close_code in (1006, 1011):
        outcome.finding = f"ws close {state.close_code}"
    elif fives:
        outcome.finding = f"ws ErrorReply {fives[0][1]}"
        outcome.detail = f"{fives[0][0]}: {fives[0][2]}"
    elif state.close_code is None and not cut_off and not violated and not state.error_replies:
        outcome.finding = f"ws {state.ended} without a close frame"
    if state.error_replies and not outcome.detail:
        outcome.detail = "; ".join(f"{k} {s}: {m[:80]}" for k, s, m in state.error_replies)
    return outcome


async def execute(plan: Plan) -> Outcome:
    try:
        async with asyncio.timeout(TIMEOUT_S):
            if plan.frames:
                return await _websocket(plan)
            return await _http(plan)
    except TimeoutError:
        return Outcome("timeout", "timeout", f"no answer within {TIMEOUT_S:g} s")
    except ConnectionError as e:
        return Outcome("reset", "reset", f"{type(e).__name__}: {e}")


def finding_of(plan: Plan, outcome: Outcome) -> Finding:
    if plan.frames:
        body = " | ".join(what for _, _, what in plan.frames)
    else:
        body = "" if plan.body is None else describe(plan.body)
    headers = {k.decode("latin-1"): v[:200].decode("latin-1") for k, v in plan.headers}
    path = plan.target.decode("latin-1")
    return Finding(plan.index, plan.route.name, plan.method.decode("latin-1"), path[:500], headers, body[:2000],
                   outcome.finding or outcome.status, outcome.detail)
