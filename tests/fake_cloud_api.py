"""A loopback HTTP server for a cloud API that can't run here (GCE, Azure Resource Manager).

Subclasses add routes that answer from recorded response bodies (`tests/fixtures/<cloud>/`) and
keep the state the real API would (instances created, deleted). Every request is logged with its
method, path, query, JSON body and Authorization header, so tests assert the exact requests.
"""

from __future__ import annotations

import asyncio
import json
import string
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

FIXTURES = Path(__file__).parent / "fixtures"
JSON_BODY = web.RequestKey("json_body", object)


@dataclass
class LoggedRequest:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    authorization: str
    form: dict[str, str] = field(default_factory=dict)


class FakeCloudApi:
    fixture_dir: str = ""

    def __init__(self) -> None:
        self.requests: list[LoggedRequest] = []
        self.port = 0
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name=type(self).__name__)
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError("the fake cloud API did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fixture(self, fixture_name: str, **values: Any) -> Any:
        """A recorded response with its placeholders filled in."""
        text = (FIXTURES / self.fixture_dir / f"{fixture_name}.json").read_text()
        quoted = {k: json.dumps(v)[1:-1] if isinstance(v, str) else json.dumps(v) for k, v in values.items()}
        return json.loads(string.Template(text).substitute(quoted))

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def logged(self, method: str | None = None, contains: str = "") -> list[LoggedRequest]:
        with self._lock:
            return [r for r in self.requests if (method is None or r.method == method) and contains in r.path]

    @web.middleware
    async def _log(self, request: web.Request, handler) -> web.StreamResponse:
        raw = await request.read()
        body: Any = None
        form: dict[str, str] = {}
        if request.content_type == "application/x-www-form-urlencoded":
            form = dict(await request.post())
        elif raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode(errors="replace")
        with self._lock:
            self.requests.append(LoggedRequest(request.method, request.path, dict(request.query), body,
                                               request.headers.get("Authorization", ""), form))
        request[JSON_BODY] = body
        return await handler(request)

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        app = web.Application(middlewares=[self._log])
        self.routes(app)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def json_response(payload: Any, status: int = 200) -> web.Response:
    return web.json_response(payload, status=status)
