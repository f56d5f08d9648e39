"""Limits on connections that have not proven who they are, for the head's and nodes' servers.

aiohttp waits forever for a request's head and accepts any number of connections. Here every
connection must deliver a complete request head within `header_timeout_s` (and again between
requests on a kept-alive connection), and one address may hold at most
`max_unauthenticated` connections that have not yet sent the token; more are closed on
arrival. A connection that has authenticated once is no longer counted against its address.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from burla.web.json_io import READ_TIMEOUT

log = logging.getLogger("burla.connections")
HEADER_TIMEOUT_S = 30.0
MAX_UNAUTHENTICATED_PER_ADDRESS = 128
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class RateLimit:
    """One line per `interval_s` at most; the next one allowed says how many were left out."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self._last = -interval_s
        self._suppressed = 0

    def take(self) -> int | None:
        """None: leave this line out; else how many lines were left out since the last one."""
        now = time.monotonic()
        if now - self._last < self.interval_s:
            self._suppressed += 1
            return None
        suppressed, self._last, self._suppressed = self._suppressed, now, 0
        return suppressed


class RateLimitedLog:
    def __init__(self, logger: logging.Logger, interval_s: float = 10.0) -> None:
        self.logger = logger
        self.limit = RateLimit(interval_s)

    def warning(self, message: str, *args: Any) -> None:
        suppressed = self.limit.take()
        if suppressed is not None:
            self.logger.warning(message + (f" (and {suppressed} similar since)" if suppressed else ""), *args)


class OneLineMalformedRequests(logging.Filter):
    """aiohttp logs every malformed request as an ERROR with a traceback, which lets anyone who
    can connect flood the log without a token. This makes each one WARNING line, rate-limited."""

    def __init__(self, interval_s: float = 10.0) -> None:
        super().__init__()
        self.limit = RateLimit(interval_s)

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError):
            return True  # a real fault in a handler keeps its traceback
        summary = " ".join(f"{type(error).__name__}: {error}".split())[:300]
        record.msg, record.args = "%s: %s", (record.getMessage(), summary)
        record.exc_info, record.exc_text = None, None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        suppressed = self.limit.take()
        if suppressed:
            record.msg, record.args = "%s (and %d similar since)", (record.getMessage(), suppressed)
        return suppressed is not None


def quiet_malformed_requests() -> None:
    """Install the one-line filter on aiohttp's server log (once per process)."""
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, OneLineMalformedRequests) for f in server_log.filters):
        server_log.addFilter(OneLineMalformedRequests())


class _GuardedConnection(asyncio.Protocol):
    """Forwards to aiohttp's protocol, closing the connection if no request head comes in time."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.address = ""
        self.authenticated = False
        self.counted = False
        self._deadline: asyncio.TimerHandle | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if isinstance(peer, tuple) and peer else "unix"
        if self.guard.waiting[self.address] >= self.guard.max_unauthenticated:
            self.guard.log.warning("closed a connection from %s: %d connections from there have not sent the "
                                   "token yet", self.address, self.guard.max_unauthenticated)
            transport.abort()
            return
        self.guard.waiting[self.address] += 1
        self.counted = True
        self.guard.connections[transport] = self
        self.arm()
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.counted:
            return  # refused on arrival; aiohttp never saw it
        self.disarm()
        self.uncount()
        if self.transport is not None:
            self.guard.connections.pop(self.transport, None)
        self.inner.connection_lost(exc)

    # deadlines

    def arm(self) -> None:
        self.disarm()
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(self.guard.header_timeout_s, self._expire)

    def disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def uncount(self) -> None:
        if self.counted and not self.authenticated:
            self.guard.waiting[self.address] -= 1
            if self.guard.waiting[self.address] <= 0:
                del self.guard.waiting[self.address]
        self.authenticated = True  # counted no more either way

    def _expire(self) -> None:
        self._deadline = None
        if self.transport is not None and not self.transport.is_closing():
            self.guard.log.warning("closed a connection from %s: no complete request within %.0f s", self.address,
                                   self.guard.header_timeout_s)
            self.transport.close()


class ConnectionGuard:
    """Owns the deadlines and per-address counts of one server's connections."""

    def __init__(self, header_timeout_s: float = HEADER_TIMEOUT_S,
                 max_unauthenticated: int = MAX_UNAUTHENTICATED_PER_ADDRESS) -> None:
        self.header_timeout_s = header_timeout_s
        self.max_unauthenticated = max_unauthenticated
        self.waiting: collections.Counter[str] = collections.Counter()
        self.connections: dict[asyncio.BaseTransport, _GuardedConnection] = {}
        self.log = RateLimitedLog(log)
        quiet_malformed_requests()

    def wrap(self, factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: _GuardedConnection(self, factory())

    def authenticated(self, request: web.Request) -> None:
        """The request proved the token (or a session): its connection is no longer a stranger."""
        connection = self.connections.get(request.transport) if request.transport is not None else None
        if connection is not None:
            connection.uncount()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The request head arrived: no deadline while it is handled (WebSockets and event
        streams run inside), and a fresh one for the next request on the connection."""
        connection = self.connections.get(request.transport) if request.transport is not None else None
        if connection is not None:
            connection.disarm()
        request[READ_TIMEOUT] = self.header_timeout_s  # bodies get as long as heads
        try:
            return await handler(request)
        finally:
            if connection is not None and connection.transport is not None and not connection.transport.is_closing():
                connection.arm()


class GuardedSite(web.BaseSite):
    """A listening socket (given, or bound to host and port) whose connections the guard watches."""

    def __init__(self, runner: web.BaseRunner, guard: ConnectionGuard, *, sock: socket.socket | None = None,
                 host: str | None = None, port: int = 0, ssl_context: Any = None) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._guard = guard
        self._sock = sock
        self._host = host
        self._port = port

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self._port}" if self._sock is None else f"{scheme}://{self._sock.getsockname()}"

    @property
    def port(self) -> int:
        assert self._server is not None
        sockets: list[socket.socket] = list(getattr(self._server, "sockets", ()))  # an asyncio.Server's
        return int(sockets[0].getsockname()[1])

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        factory = self._guard.wrap(server)
        loop = asyncio.get_running_loop()
        if self._sock is not None:
            self._server = await loop.create_server(factory, sock=self._sock, ssl=self._ssl_context)
        else:
            self._server = await loop.create_server(factory, self._host, self._port, ssl=self._ssl_context,
                                                    reuse_address=True)
