"""A server's connections over SSH channels: a tunnelled node's connection is served by the head's
own protocol where the channel's bytes arrive, with no socket in between.

A laptop head reaches its cloud VMs over SSH, and each VM's node reaches the head through a
remote port forward on that connection. asyncssh's own forward connects each forwarded channel to
the head's listening port, so the head's process wrote every tunnelled byte to its own loopback
socket and read it back (two copies through the kernel, and Python for each read on both sides).
Here the channel is an asyncio transport of its own (`ChannelTransport`), and the head's server
protocol (the connection guard in front of aiohttp's) runs on it directly.

Only plain-http servers are served so: a TLS head keeps asyncssh's forward to its port, where
asyncio's TLS runs on a real socket.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("burla.channels")

ProtocolFactory = Callable[[], asyncio.Protocol]


class ChannelTransport(asyncio.Transport):
    """An asyncio transport over one SSH channel (asyncssh's `SSHTCPChannel`, bytes mode).

    Writes go to the channel, which copies them into its own send buffer; its flow control
    (`pause_writing` / `resume_writing` past its write-buffer limits) reaches the protocol
    through `ChannelSession`. Reads arrive as the channel delivers them."""

    def __init__(self, channel: Any, protocol: asyncio.BaseProtocol, peername: tuple[str, int]) -> None:
        super().__init__(extra={"peername": peername, "sockname": None, "socket": None, "sslcontext": None})
        self._channel = channel
        self._protocol = protocol
        self._closing = False
        self._reading = True

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def is_closing(self) -> bool:
        return self._closing

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return  # as asyncio's own transports: a write after close goes nowhere
        try:
            self._channel.write(data)
        except OSError:  # the peer closed the channel for sending: the session hears connection_lost
            self._closing = True

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:  # asyncssh would join them: one more copy of each
            self.write(data)

    def write_eof(self) -> None:
        if not self._closing:
            self._channel.write_eof()

    def can_write_eof(self) -> bool:
        return True

    def get_write_buffer_size(self) -> int:
        return int(self._channel.get_write_buffer_size())

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._channel.set_write_buffer_limits(high, low)

    def pause_reading(self) -> None:
        if self._reading and not self._closing:
            self._reading = False
            self._channel.pause_reading()

    def resume_reading(self) -> None:
        if not self._reading and not self._closing:
            self._reading = True
            self._channel.resume_reading()

    def is_reading(self) -> bool:
        return self._reading and not self._closing

    def close(self) -> None:
        """Close once what was written is sent (the channel flushes its buffer first)."""
        if not self._closing:
            self._closing = True
            self._channel.close()

    def abort(self) -> None:
        if not self._closing:
            self._closing = True
            self._channel.abort()


def feed(transport: asyncio.BaseTransport, data: bytes) -> None:
    """Hand `data` to the transport's protocol, into its own buffers if it reads that way
    (asyncio's BufferedProtocol, as a large WebSocket frame's filler does). The protocol is asked
    for again after each buffer: a filler gives the connection back once its frame is whole, and
    what follows the frame goes to the protocol after it."""
    view = memoryview(data)
    while view and not transport.is_closing():
        protocol = transport.get_protocol()
        if not isinstance(protocol, asyncio.BufferedProtocol):
            protocol.data_received(data if len(view) == len(data) else bytes(view))  # type: ignore[attr-defined]
            return
        buffer = memoryview(protocol.get_buffer(len(view)))
        size = min(len(buffer), len(view))
        if not size:
            raise RuntimeError("a protocol offered an empty buffer for a channel's data")
        buffer[:size] = view[:size]
        view = view[size:]
        protocol.buffer_updated(size)


class ChannelSession:
    """asyncssh's session for one forwarded channel: its callbacks drive a `ChannelTransport` and
    the server protocol made for it (the transport's protocol may change between reads, as a
    large frame's filler stands in for a while)."""

    def __init__(self, factory: ProtocolFactory, peername: tuple[str, int]) -> None:
        self._factory = factory
        self._peername = peername
        self._transport: ChannelTransport | None = None

    def connection_made(self, channel: Any) -> None:
        protocol = self._factory()
        self._transport = ChannelTransport(channel, protocol, self._peername)
        protocol.connection_made(self._transport)

    def session_started(self) -> None:
        pass

    def data_received(self, data: bytes, datatype: Any = None) -> None:
        if self._transport is not None:
            feed(self._transport, data)

    def eof_received(self) -> bool:
        """True keeps the channel open for the protocol's last writes (half-closed), as a socket's
        protocol may ask; else it closes."""
        if self._transport is None:
            return False
        keep_open = bool(self._transport.get_protocol().eof_received())  # type: ignore[attr-defined]
        return keep_open

    def connection_lost(self, exc: Exception | None) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            transport._closing = True
            transport.get_protocol().connection_lost(exc)

    def pause_writing(self) -> None:
        if self._transport is not None:
            self._transport.get_protocol().pause_writing()

    def resume_writing(self) -> None:
        if self._transport is not None:
            self._transport.get_protocol().resume_writing()


class ChannelServer:
    """Where tunnelled connections are served: the head's server protocol once its site serves
    plain http (`serve`), nothing before that or after `close` (a channel opened then is refused,
    and the node connects again)."""

    def __init__(self) -> None:
        self._factory: ProtocolFactory | None = None

    def serve(self, factory: ProtocolFactory) -> None:
        self._factory = factory

    def close(self) -> None:
        self._factory = None

    def session_factory(self, peer: str) -> Callable[[str, int], ChannelSession]:
        """asyncssh's session factory for one VM's remote listener; `peer` names the VM in the
        connections' peer address (what the connection guard counts connections by)."""

        def session(orig_host: str, orig_port: int) -> ChannelSession:
            factory = self._factory
            if factory is None:
                from asyncssh import OPEN_CONNECT_FAILED, ChannelOpenError

                raise ChannelOpenError(OPEN_CONNECT_FAILED, "the head is not serving")
            return ChannelSession(factory, (peer, orig_port))

        return session
