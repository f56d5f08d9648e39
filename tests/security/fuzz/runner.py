"""A fuzzing run: what the cluster holds (nodes, jobs) read first, then the generated plans sent
a few at a time, their outcomes gathered into a `Summary`."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import random
import time
import urllib.parse
from typing import Any

from tests.security.fuzz.generator import plans
from tests.security.fuzz.model import Context, Summary
from tests.security.fuzz.transport import execute, finding_of

CONCURRENCY = 8


def _address(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or parts.hostname != "127.0.0.1" or parts.port is None:
        raise ValueError(f"the fuzzer only talks to http://127.0.0.1:PORT, not {url!r}")
    return parts.hostname, parts.port


async def _get_json(address: tuple[str, int], path: str, token: str) -> dict:
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {address[0]}:{address[1]}\r\nAuthorization: Bearer {token}\r\n"
                     "Connection: close\r\n\r\n".encode())
        response = await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    head, _, body = response.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"GET {path} answered {head[:100]!r}")
    return json.loads(body)


async def fuzz(head: Any, node_url: str, rng: random.Random, requests: int, concurrency: int = CONCURRENCY) -> Summary:
    """Send `requests` generated requests to `head` (has .url and .token) and the node at `node_url`."""
    head_address, node_address = _address(head.url), _address(node_url)
    cluster = await _get_json(head_address, "/v1/cluster", head.token)
    jobs = await _get_json(head_address, "/v1/jobs?limit=1000", head.token)
    existing = [j["job_id"] for j in jobs["jobs"]]
    ctx = Context(head.token.encode(), head_address, node_address, sorted(n["node_id"] for n in cluster["nodes"]),
                  list(existing), list(existing))
    summary = Summary()
    generated = plans(rng, ctx, requests)
    start = time.monotonic()

    async def worker() -> None:
        for plan in generated:
            outcome = await execute(plan)
            summary.requests += 1
            summary.counts.setdefault(plan.route.name, collections.Counter())[outcome.status] += 1
            if outcome.close_code is not None:
                summary.ws_close_codes[outcome.close_code] += 1
            if outcome.replies:
                summary.ws_replies.update(outcome.replies)
            if outcome.finding is not None:
                summary.findings.append(finding_of(plan, outcome))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    summary.seconds = time.monotonic() - start
    summary.findings.sort(key=lambda f: f.index)
    return summary


def run(head: Any, node_url: str, rng: random.Random, requests: int, concurrency: int = CONCURRENCY) -> Summary:
    """`fuzz` from synchronous code."""
    return asyncio.run(fuzz(head, node_url, rng, requests, concurrency))
