"""The bearer-token check every head and node endpoint shares (all but the health check)."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPEN_PATHS = frozenset({"/health"})


def error_response(status: int, kind: str, message: str) -> web.Response:
    return web.json_response({"error": kind, "message": message}, status=status)


def token_middleware(token: str):
    """Reject any request without `Authorization: Bearer <token>` (compared in constant time)."""
    expected = token.encode()

    @web.middleware
    async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        given = request.headers.get("Authorization", "")
        if not given.startswith("Bearer ") or not hmac.compare_digest(given[7:].strip().encode(), expected):
            return error_response(
                401, "Unauthorized",
                "Missing or wrong cluster token. Send 'Authorization: Bearer <token>'; the token is in "
                "the burla config directory (file cluster_token) or BURLA_CLUSTER_TOKEN.",
            )
        return await handler(request)

    return require_token
