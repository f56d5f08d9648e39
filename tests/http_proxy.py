"""A loopback HTTP proxy in front of a node that can refuse chosen requests (a lost message)."""

from __future__ import annotations

import asyncio
import threading

import aiohttp
from aiohttp import web


class DroppingProxy:
    """Forwards every request to `target`, except those whose path ends with `drop_suffix`."""

    def __init__(self, target: str, drop_suffix: str) -> None:
        self.target = target.rstrip("/")
        self.drop_suffix = drop_suffix
        self.dropped = 0
        self.forwarded = 0
        self.port = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with aiohttp.ClientSession() as session:

            async def forward(request: web.Request) -> web.StreamResponse:
                if request.path.endswith(self.drop_suffix):
                    self.dropped += 1
                    return web.Response(status=503, text="dropped by the test proxy")
                self.forwarded += 1
                headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
                async with session.request(request.method, self.target + request.path_qs, headers=headers,
                                           data=await request.read()) as upstream:
                    return web.Response(status=upstream.status, body=await upstream.read(),
                                        content_type=upstream.content_type)

            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", forward)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]
            self._ready.set()
            await self._stop.wait()
            await runner.cleanup()

    def close(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
