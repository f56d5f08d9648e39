"""JSON in and out of the head's and nodes' HTTP endpoints, strictly.

Bodies must be UTF-8 JSON objects of bounded depth whose strings are valid Unicode and whose
numbers are finite; answers never contain NaN (which JSON has no spelling for). URLs whose
path or query is not valid UTF-8 are refused before any handler sees them.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_JSON_DEPTH = 32
# Request key: how long its body may take (set by the connection guard). A typed key where aiohttp
# has them (3.13 and later warn about string keys).
READ_TIMEOUT: Any = (web.RequestKey("burla_read_timeout_s", float) if hasattr(web, "RequestKey")
                     else "burla_read_timeout_s")

dumps = functools.partial(json.dumps, allow_nan=False)


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=dumps)


def error_response(status: int, kind: str, message: str) -> web.Response:
    return json_response({"error": kind, "message": message}, status=status)


class BadJson(ValueError):
    """A request body that isn't a JSON object burla can take; the message says why."""


def is_text(value: str) -> bool:
    """Valid Unicode: no lone surrogate halves (which JSON's \\ud800 escapes and undecodable URL
    bytes produce, and which neither UTF-8, SQLite nor msgpack can store)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check(value: Any, depth: int) -> None:
    if depth > MAX_JSON_DEPTH:
        raise BadJson(f"the body nests deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, str):
        if not is_text(value):
            raise BadJson("the body's strings must be valid Unicode (a lone surrogate \\ud800-\\udfff was sent)")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check(key, depth + 1)
            _check(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check(item, depth + 1)


def _refuse_constant(name: str) -> Any:
    raise BadJson(f"the body's numbers must be finite ({name} was sent)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses as infinity without passing parse_constant
        raise BadJson(f"the body's numbers must be finite ({text[:50]} overflows)")
    return value


def parse_object(raw: bytes) -> dict:
    """A JSON object from a request body (empty: {}), or BadJson saying what is wrong."""
    if not raw.strip():
        return {}
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadJson("the body must be UTF-8") from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except BadJson:
        raise
    except RecursionError:
        raise BadJson(f"the body nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as e:
        raise BadJson(f"the body must be JSON ({e})") from None
    if not isinstance(value, dict):
        raise BadJson("the body must be a JSON object")
    _check(value, 0)
    return value


async def read_body(request: web.Request) -> bytes:
    """The request's body, or HTTPRequestTimeout if it trickles in slower than a request head may."""
    timeout_s = request.get(READ_TIMEOUT, 30.0)
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError:
        raise web.HTTPRequestTimeout(text=f"the body did not arrive within {timeout_s:g} s") from None


async def read_object(request: web.Request) -> dict:
    """The request's body as a JSON object; raises HTTPBadRequest saying what is wrong."""
    raw = await read_body(request)
    try:
        return parse_object(raw)
    except BadJson as e:
        raise web.HTTPBadRequest(text=str(e)) from None


def json_errors(max_body: int):
    """Answer every HTTP error a handler or aiohttp raises as JSON {"error", "message"}."""

    @web.middleware
    async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:
            return error_response(413, "RequestTooLarge", f"the body is over the {max_body} byte limit")
        except web.HTTPException as e:
            if e.status >= 400:
                return error_response(e.status, e.reason.replace(" ", ""), e.text or e.reason)
            raise

    return errors_as_json


@web.middleware
async def require_text_urls(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse URLs whose path or query decodes to invalid Unicode, before any handler or
    database sees an id or search string it can't store."""
    if not is_text(request.path) or not all(is_text(k) and is_text(v) for k, v in request.query.items()):
        return error_response(400, "BadRequest", "the URL's path and query must be valid UTF-8")
    return await handler(request)
