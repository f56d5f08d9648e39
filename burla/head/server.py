"""Run a head: bind, start local nodes, serve until told to stop, then tear everything down.

The listening socket is bound first. Local nodes are forked from the head once it has
imported what both run and before it starts a thread (see drivers/local.py), so a cold
embedded cluster pays for those imports once; where forking isn't possible they are started
as processes of their own before aiohttp is imported, and boot beside the head.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
import sys

from burla.config import DEFAULT_HEAD_PORT, ENV_HEAD_CERT, ENV_TOKEN, HeadRecord, HeadSettings
from burla.drivers.base import BootRequest
from burla.drivers.local import LocalDriver, can_fork_nodes
from burla.process.environ_block import erase_variable
from burla.process.hardening import refuse_inspection
from burla.process.lifeline import wait_for_eof
from burla.process.memory import freeze_startup_objects, keep_large_blocks
from burla.web.aiohttp_import import import_aiohttp

log = logging.getLogger("burla.head")


class PortInUse(Exception):
    pass


def bind(host: str, port: int | None) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    candidates = [DEFAULT_HEAD_PORT, 0] if port is None else [port]
    for candidate in candidates:
        try:
            sock.bind((host, candidate))
            break
        except OSError as e:
            if e.errno != errno.EADDRINUSE or candidate == candidates[-1]:
                sock.close()
                raise PortInUse(f"can't listen on {host}:{candidate}: {e.strerror}") from e
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def url_of(sock: socket.socket, settings: HeadSettings) -> str:
    port = sock.getsockname()[1]
    if settings.public_url:
        return settings.public_url.replace("{port}", str(port)).rstrip("/")
    host = settings.host
    shown = f"[{host}]" if ":" in host else host
    return f"{'https' if settings.tls_cert else 'http'}://{shown}:{port}"


def serve(settings: HeadSettings) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s head %(levelname)s %(message)s")
    refuse_inspection()  # it holds the cluster token: no process of its user reads its memory
    keep_large_blocks()  # inputs and results pass through the head; its idle collector gives memory back
    allow_many_connections()
    # Read into the settings already: out of the environment its local nodes (and their calls) inherit.
    erase_variable(ENV_TOKEN)
    sock = bind(settings.host, settings.port)
    url = url_of(sock, settings)
    # Local nodes pin this head's own certificate when it serves https.
    driver = LocalDriver(env={**os.environ, ENV_HEAD_CERT: str(settings.tls_cert)} if settings.tls_cert else None)
    booted: list[str] = []
    if settings.local_nodes:
        fork_closing = None
        if can_fork_nodes():
            import_serving_stack()  # once, before the fork: the nodes inherit it
            fork_closing = (sock.fileno(),) + tuple(fd for fd in (settings.ready_fd, settings.lifeline_fd)
                                                    if fd is not None)
        booted = driver.boot_now(BootRequest(settings.local_nodes, url, settings.token, settings.local_node_workers),
                                 fork_closing)
    asyncio.run(_serve(settings, sock, url, driver, booted))


def import_serving_stack() -> None:
    """What the head serves with and what its local nodes run: both need them."""
    import_aiohttp()
    import aiohttp.web  # noqa: F401

    import burla.head.app  # noqa: F401
    import burla.head.history.store  # noqa: F401
    import burla.head.machines.fleet  # noqa: F401
    import burla.node.main  # noqa: F401
    import burla.node.service  # noqa: F401
    import burla.node.workers.worker  # noqa: F401


def allow_many_connections(wanted: int = 65536) -> None:
    """One socket per node and per client: raise the soft open-files limit (often 1,024) as far
    as the hard limit allows, so a thousand nodes don't exhaust it."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as e:
            log.warning("could not raise the open-files limit from %d: %s", soft, e)


async def _serve(settings: HeadSettings, sock: socket.socket, url: str, driver: LocalDriver, booted: list[str]) -> None:
    import_aiohttp()
    from aiohttp import web

    from burla.head.app import create_head_app
    from burla.head.keys import CHANNELS, GUARD, SHUT_DOWN, STOP
    from burla.web.connection_guard import GuardedSite

    app = create_head_app(settings, driver, url, booted)
    stop = app[STOP]
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()  # the app's loops start here
    lifeline = None
    try:
        ssl_context = None
        if settings.tls_cert is not None and settings.tls_key is not None:
            from burla.web.tls import server_context

            ssl_context = server_context(settings.tls_cert, settings.tls_key)
        site = GuardedSite(runner, app[GUARD], sock=sock, ssl_context=ssl_context)
        await site.start()
        if ssl_context is None:
            assert runner.server is not None
            app[CHANNELS].serve(app[GUARD].wrap(runner.server))
        freeze_startup_objects()
        if settings.lifeline_fd is not None:
            lifeline = asyncio.create_task(wait_for_eof(settings.lifeline_fd), name="lifeline")
            lifeline.add_done_callback(lambda _: stop.set())
        if settings.advertise:
            HeadRecord(url, os.getpid()).write(settings.config_dir)
        print(f"burla head serving at {url}", flush=True)
        log.info("serving at %s with %d local node(s)", url, settings.local_nodes)
        if settings.ready_fd is not None:
            with contextlib.suppress(OSError):
                os.write(settings.ready_fd, f"{url}\n".encode())
                os.close(settings.ready_fd)
        await stop.wait()
    finally:
        log.info("stopping")
        if settings.advertise:
            HeadRecord.remove_if_owned(settings.config_dir, os.getpid())
        if lifeline is not None:
            lifeline.cancel()
            await asyncio.gather(lifeline, return_exceptions=True)
        # Loops, jobs, nodes and drivers stop while the site still serves (a client resuming hears
        # the head is stopping; /health answers while VMs are deleted); then the site stops, the
        # sockets close and history is written and closed.
        await app[SHUT_DOWN]()
        app[CHANNELS].close()
        await runner.cleanup()
