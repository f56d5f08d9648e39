"""A loopback HTTP server for a cloud API that can't run here (GCE, Azure Resource Manager).

Subclasses add routes that answer from recorded response bodies (`tests/support/clouds/fixtures/<cloud>/`) and
keep the state the real API would (instances created, deleted). Every request is logged with its
method, path, query, JSON body and Authorization header, so tests assert the exact requests.
"""

from __future__ import annotations

import json
import string
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.support.loopback_server import LoopbackServer

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


class FakeCloudApi(LoopbackServer):
    fixture_dir: str = ""

    def __init__(self) -> None:
        self.requests: list[LoggedRequest] = []
        self._lock = threading.Lock()
        super().__init__()

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

    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._log])
        self.routes(app)
        return app


def json_response(payload: Any, status: int = 200) -> web.Response:
    return web.json_response(payload, status=status)
