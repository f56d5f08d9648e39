"""A loopback HTTP proxy in front of a node that can refuse chosen requests (a lost message)."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from tests.support.loopback_server import LoopbackServer


class DroppingProxy(LoopbackServer):
    """Forwards every request to `target`, except those whose path ends with `drop_suffix`."""

    def __init__(self, target: str, drop_suffix: str) -> None:
        self.target = target.rstrip("/")
        self.drop_suffix = drop_suffix
        self.dropped = 0
        self.forwarded = 0
        self._session: aiohttp.ClientSession | None = None
        super().__init__()

    async def serving(self) -> None:
        self._session = aiohttp.ClientSession()

    async def stopping(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def forward(self, request: web.Request) -> web.StreamResponse:
        if request.path.endswith(self.drop_suffix):
            self.dropped += 1
            return web.Response(status=503, text="dropped by the test proxy")
        self.forwarded += 1
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        assert self._session is not None
        async with self._session.request(request.method, self.target + request.path_qs, headers=headers,
                                         data=await request.read()) as upstream:
            return web.Response(status=upstream.status, body=await upstream.read(),
                                content_type=upstream.content_type)

    def build_app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.forward)
        return app
