"""One event loop per client process, shared by its jobs.

A job used to start a thread, an event loop and an HTTP session of its own: about 0.6 ms of a
warm single-call job. The loop thread starts with the first job and stays (a daemon); sessions
are kept per pinned certificate. A forked child starts its own loop. At exit, what is still
running there (connections closing after their job returned) gets a moment to finish, and
the job connections kept for the next job (`connections.py`) are closed.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Coroutine
from typing import Any

from burla.client.connections import JobConnections

EXIT_GRACE_S = 2.0  # at interpreter exit: how long closing connections may take

_lock = threading.Lock()
_current: ClientLoop | None = None


class ClientLoop:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self._sessions: dict[str | None, Any] = {}  # pinned certificate -> aiohttp.ClientSession
        self._connections: dict[tuple[str, str, str | None], JobConnections] = {}  # per head
        # Node address -> until when (monotonic) this process sends its large inputs through the head:
        # it could not reach it (direct_sender), and a job should not wait out a connection again.
        self.unreachable_nodes: dict[str, float] = {}
        self._thread = threading.Thread(target=self._main, name="burla-client-loop", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @property
    def usable(self) -> bool:
        return self.pid == os.getpid() and self._thread.is_alive() and not self.loop.is_closed()

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def session(self, cert: str | None) -> Any:
        """The HTTP session for heads with this pinned certificate (None: the system's trust);
        call on the loop."""
        session = self._sessions.get(cert)
        if session is None or session.closed:
            import aiohttp

            from burla.web.tls import head_connector

            session = self._sessions[cert] = aiohttp.ClientSession(connector=head_connector(cert))
        return session

    def connections(self, url: str, token: str, cert: str | None) -> JobConnections:
        """The idle job connections to this head (for this token and pinned certificate)."""
        key = (url, token, cert)
        pool = self._connections.get(key)
        if pool is None:
            pool = self._connections[key] = JobConnections()
        return pool

    def prepare(self, cert: str | None) -> None:
        """Import the HTTP client and make the session in the background (a cold client spends
        ~0.2 s on that, which overlaps with finding or starting the head this way)."""
        if cert not in self._sessions:  # a warm client has it: no need to wake the loop
            self.loop.call_soon_threadsafe(self.session, cert)

    async def _wind_down(self) -> None:
        for pool in self._connections.values():  # idle: nothing to wait for
            with contextlib.suppress(Exception):
                await pool.close()
        self._connections.clear()
        current = asyncio.current_task()
        pending = [task for task in asyncio.all_tasks() if task is not current]
        if pending:
            await asyncio.wait(pending, timeout=EXIT_GRACE_S)
        for task in pending:
            task.cancel()
        if pending:  # let what was cancelled run its cleanup (closing connections, removing files)
            await asyncio.wait(pending, timeout=0.5)
        for session in self._sessions.values():
            with contextlib.suppress(Exception):
                await session.close()
        self._sessions.clear()

    def stop(self) -> None:
        """Let what runs on the loop finish (briefly), close the sessions, end the thread."""
        if not self.usable:
            return
        with contextlib.suppress(Exception):
            self.submit(self._wind_down()).result(EXIT_GRACE_S + 1)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(EXIT_GRACE_S)


def client_loop() -> ClientLoop:
    """This process's client loop, started on first use (again in a forked child)."""
    global _current
    with _lock:
        if _current is None or not _current.usable:
            _current = ClientLoop()
        return _current


def _stop_at_exit() -> None:
    if _current is not None:
        _current.stop()


def _forget_in_child() -> None:
    """A forked child has no loop thread (only the forking thread survives a fork)."""
    global _current, _lock
    _current = None
    _lock = threading.Lock()


atexit.register(_stop_at_exit)
os.register_at_fork(after_in_child=_forget_in_child)
