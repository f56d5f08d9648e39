"""The client's check that a head on this machine holds its token, before it sends it.

A port of 127.0.0.1 may be anyone's: a head that died may have left its port to another user's
head or any server. Before a client sends a plain-http head on this machine its token (the
cluster token, or a call's job token), the head proves it could make that token
(burla.web.head_proof); whatever else answers there gets nothing secret, and the client says
what holds the port. An https head is proved by its pinned certificate instead, and one across
the network by TLS.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

from burla.errors import HeadNotVerified
from burla.web import head_proof

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def needs_proof(url: str) -> bool:
    parsed = urllib.parse.urlsplit(url)
    return parsed.scheme == "http" and parsed.hostname in LOOPBACK_HOSTS


def challenge_path(token: str, nonce: str) -> str:
    return f"/health?{head_proof.challenge_query(token, nonce)}"


def check_answer(url: str, token: str, nonce: str, status: int, body: bytes) -> None:
    """Raise HeadNotVerified unless this answer to the challenge proves the head holds `token`."""
    try:
        answer = json.loads(body).get("proof")
    except (ValueError, AttributeError):
        answer = None
    if status == 200 and head_proof.proves(token, nonce, answer):
        return
    parsed = urllib.parse.urlsplit(url)
    raise HeadNotVerified(
        f"{url} answered, but not as a head holding this client's cluster token (it could not prove it); "
        f"nothing secret was sent there. {port_holder(parsed.hostname or '127.0.0.1', parsed.port)} If it is a "
        "burla head of yours with another token, set BURLA_CLUSTER_TOKEN to that token; else stop what holds the "
        "port, or run `burla head stop` and try again (a new head picks a free port)."
    )


async def prove_if_local(session: Any, url: str, token: str) -> None:
    """For a plain-http head on this machine, the challenge, over the client's own aiohttp
    session: its connection stays open for the job's socket (keep-alive), so proving costs a
    round trip, not a connection. Raises HeadNotVerified if the head can't prove the token."""
    if not needs_proof(url):
        return
    nonce = head_proof.new_nonce()
    async with session.get(f"{url}{challenge_path(token, nonce)}") as response:
        body = await response.content.read(4096)
        status = response.status
    check_answer(url, token, nonce, status, body)


def port_holder(host: str, port: int | None) -> str:
    """What listens on host:port, as far as this machine tells this user (pid, user, command)."""
    import psutil

    try:
        listeners = [c for c in psutil.net_connections(kind="tcp")
                     if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port]
    except (psutil.Error, OSError):
        listeners = []
    for listener in listeners:
        if listener.pid is None:
            continue
        try:
            process = psutil.Process(listener.pid)
            return (f"The port is held by pid {listener.pid} (user {process.username()}: "
                    f"{' '.join(process.cmdline())[:120]}).")
        except psutil.Error:
            return f"The port is held by pid {listener.pid}."
    return f"Port {port} on {host} is held by a process this user can't see (another user's)."
