"""The seeded sequence of plans: one route after another, picked by weight, and for each the
request (or WebSocket session) that goes to it. The same seed and cluster give the same plans."""

from __future__ import annotations

import random
from collections.abc import Iterator

from tests.security.fuzz.http_requests import (
    METHODS,
    SAFE_METHODS,
    auth,
    auth_header,
    extra_headers,
    json_body,
    query,
    quote,
    request_path,
    right_token_is_unsafe,
    segment,
    steal_body,
)
from tests.security.fuzz.model import ROUTES, Context, Plan, Route
from tests.security.fuzz.websocket import ws_frames, ws_handshake_headers


def plans(rng: random.Random, ctx: Context, count: int) -> Iterator[Plan]:
    routes = [route for route in ROUTES for _ in range(route.weight)]
    for index in range(count):
        route = rng.choice(routes)
        yield _plan(rng, ctx, route, index)


def _plan(rng: random.Random, ctx: Context, route: Route, index: int) -> Plan:
    address = ctx.head if route.base == "head" else ctx.node
    mode, authorization = auth(rng, ctx, route)
    method = route.method if rng.random() < 0.75 else rng.choice(METHODS)
    right_cancel = mode == "right" and route.template.endswith("/cancel")
    target = request_path(rng, ctx, route, right_cancel) + query(rng, ctx, route)
    host = f"{address[0]}:{address[1]}".encode()
    headers = [(b"Host", host)]
    body: bytes | None = None
    frames: list[tuple[bytes, bool, str]] = []
    ws = route.kind == "ws" and rng.random() < 0.85
    if ws:
        method = b"GET" if rng.random() < 0.97 else rng.choice(METHODS)
        headers += ws_handshake_headers(rng)
        frames = ws_frames(rng, ctx, route, mode == "right")
    elif route.body in ("steal", "ack"):
        job_id = rng.choice(ctx.live_ids[-20:]) if ctx.live_ids and rng.random() < 0.7 else f"fuzz-{index}"
        target = b"/v1/jobs/" + quote(job_id) + (b"/steal/ack" if route.body == "ack" else b"/steal")
        target += query(rng, ctx, route)
        if rng.random() < 0.2:
            target = b"/v1/jobs/" + segment(rng, ctx, "job_id") + target[len(b"/v1/jobs/" + quote(job_id)):]
        body = steal_body(rng, job_id, route.body == "ack")
    elif route.body == "json" or (method not in SAFE_METHODS and rng.random() < 0.5):
        body = json_body(rng, ctx, route)
    elif rng.random() < 0.05:
        body = rng.choice([b"", b"{}", rng.randbytes(100)])
    if body is not None and route.body in ("steal", "ack"):
        headers.append((b"Content-Type", b"application/msgpack"))
    elif body is not None and rng.random() < 0.7:
        headers.append((b"Content-Type", b"application/json"))
    headers += extra_headers(rng)
    if mode == "right" and right_token_is_unsafe(method, target, body):
        mode = rng.choice(["wrong", "none", "non-utf8"])
        authorization = auth_header(rng, ctx, mode)
    if authorization is not None:
        headers.append((b"Authorization", authorization))
    plan = Plan(index, route, address, method, target, headers, body, frames=frames, drop=rng.random() < 0.1,
                linger=rng.choice([0.0, 0.0, 0.0, 0.2, 0.5, 1.0]))
    if body is not None and rng.random() < 0.1:
        plan.chunked = True
    if rng.random() < 0.02 and not ws:
        plan.headers.append(rng.choice([(b"Content-Length", b"zz"), (b"Content-Length", b"-1"),
                                        (b"Transfer-Encoding", b"gzip, chunked"), (b"Content-Length", b"5")]))
    return plan
