"""A bound on the results a node holds for its head (and for clients that take large results
straight from it: those sent and not yet receipted count too, burla.protocol.direct_results).

Workers hand their results to the node as fast as they compute them; the node sends them up as
fast as its link to the head takes them. When the link is the slower (a tunnel, a head busy
passing 10 MB results on to a client), the difference piled up in the node: 350-750 MB of 10 MB
results at its peak while 1 GB went through. Past `limit` bytes held (results waiting to be
sent, and those being sent), the node stops reading its workers' sockets until the sender has
sent some: a worker then waits in its write, which is the backpressure reaching the calls.

Only the bytes read count towards a check (one per CHECK_EVERY bytes, and each read while it
was full), so a node running no-op calls never pays for it. A waiting reader looks again every
RECHECK_S even without being told, so that results dropped by other means (a job cancelled or
released) cannot leave it waiting for a wake-up that never comes. While it is full the node's
governor adds no workers: its calls wait on the head, and more workers would make more results
to hold (each worker's socket still holds up to WorkerLink's 8 MB).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

RESULT_WINDOW_BYTES = 64 * 1024 * 1024
CHECK_EVERY = 1024 * 1024
RECHECK_S = 0.5


class ResultWindow:
    """`held()` says how many result bytes the node holds now. Before each frame a reader takes
    from a worker it calls `room` with the bytes it read since, and awaits what that returns
    while the node holds too many; `sent` says some went out."""

    def __init__(self, held: Callable[[], int], limit: int = RESULT_WINDOW_BYTES) -> None:
        self._held = held
        self.limit = limit
        self._unchecked = 0
        self._full = False  # at the last look: readers that come now wait without reading first
        self._room = asyncio.Event()
        self.waits = 0  # times a reader waited

    def full(self) -> bool:
        return self._full

    def room(self, read: int) -> Awaitable[None] | None:
        self._unchecked += read
        if self._unchecked < CHECK_EVERY and not self._full:
            return None
        self._unchecked = 0
        self._full = self._held() > self.limit
        if not self._full:
            return None
        self.waits += 1
        return self._wait()

    async def _wait(self) -> None:
        while self._held() > self.limit:
            self._room.clear()
            with contextlib.suppress(TimeoutError):  # not wait_for: 3.11's may swallow a cancel
                async with asyncio.timeout(RECHECK_S):
                    await self._room.wait()
        self._full = False

    def sent(self) -> None:
        self._room.set()
