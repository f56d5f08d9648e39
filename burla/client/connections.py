"""Job connections kept open between jobs, per head.

Opening a job's WebSocket (TCP, the HTTP upgrade, the head's checks) cost a warm single-call
job about a millisecond of CPU on each side. A connection whose job has every result
acknowledged goes back here, and the process's next job to that head opens over it: a
connection carries one job at a time, and an opening sent on it tells the head the client is
done listening to the one before (as a close would). While a connection is idle a watcher
reads it, so pings are answered, late frames of the ended job are dropped and a connection
the head closed leaves the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

IDLE_KEEP_S = 30.0  # an idle connection is closed after this
MAX_IDLE = 4  # idle connections kept per head (one per job that ran at the same time)


class JobConnections:
    """Idle job WebSockets to one head (its URL, token and certificate); used on the client loop."""

    def __init__(self) -> None:
        self._idle: list[tuple[Any, asyncio.Task]] = []  # (ws, its watcher), the most recent last
        self._closed = False  # the process is winding down: nothing more is kept

    async def take(self) -> Any | None:
        """An idle connection to open the next job on, or None: open a new one."""
        while self._idle:
            ws, watcher = self._idle.pop()
            watcher.cancel()
            await asyncio.wait({watcher})  # its receive() must be over before the job's starts
            if watcher.cancelled() and not ws.closed:
                return ws
        return None

    def give_back(self, ws: Any) -> bool:
        """Keep `ws` for the next job; False if it can't be kept (the caller closes it)."""
        if self._closed or ws.closed or len(self._idle) >= MAX_IDLE:
            return False
        watcher = asyncio.create_task(self._watch(ws), name="burla-idle-job-connection")
        self._idle.append((ws, watcher))
        return True

    async def _watch(self, ws: Any) -> None:
        import aiohttp

        ended = (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED,
                 aiohttp.WSMsgType.ERROR)
        try:
            while True:
                frame = await ws.receive(timeout=IDLE_KEEP_S)
                if frame.type in ended:
                    break
                # Anything else is a late frame of the job that ended here (its progress, say).
        except (TimeoutError, aiohttp.ClientError, OSError):
            pass
        self._idle = [(kept, task) for kept, task in self._idle if kept is not ws]
        with contextlib.suppress(Exception):
            await ws.close()

    async def close(self) -> None:
        """Close every idle connection (at exit: the head sees a clean close, not a reset)."""
        self._closed = True
        idle, self._idle = self._idle, []
        for _, watcher in idle:
            watcher.cancel()
        if idle:
            await asyncio.wait([watcher for _, watcher in idle])
        for ws, _ in idle:
            with contextlib.suppress(Exception):
                await ws.close()
