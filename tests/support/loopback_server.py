"""An aiohttp application served from its own thread on 127.0.0.1 at a free port, for tests that
need a server beside the code under test (a proxy, a cloud API that can't run here)."""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web


class LoopbackServer:
    def __init__(self) -> None:
        self.port = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name=type(self).__name__)
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError(f"{type(self).__name__} did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def build_app(self) -> web.Application:
        raise NotImplementedError

    async def serving(self) -> None:
        """Runs in the server's loop before it serves (e.g. to open client sessions)."""

    async def stopping(self) -> None:
        """Runs in the server's loop after it stops serving."""

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        await self.serving()
        runner = web.AppRunner(self.build_app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()
        await self.stopping()

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
