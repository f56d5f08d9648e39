"""A real head app and a real node service in the test's own event loop (the node's workers are
processes of their own), talking over WebSockets on 127.0.0.1: for tests that look inside them."""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from burla import Client
from burla._version import __version__
from burla.drivers.local import LocalDriver
from burla.process.loop_supervisor import LoopSupervisor


async def until(predicate: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@dataclass
class InProcessCluster:
    url: str
    token: str
    app: object
    service: object
    history_path: Path | None

    def client(self) -> Client:
        return Client(self.url, self.token)


@asynccontextmanager
async def in_process_cluster(tmp_path: Path, driver=None, node_deadline_s: float = 30.0, history: bool = True
                             ) -> AsyncIterator[InProcessCluster]:
    """A head and one node of one worker in this process (the worker is a process of its own);
    `history=False` is a head run with --no-history."""
    from aiohttp import web

    from burla.config import HeadSettings
    from burla.head.app import create_head_app
    from burla.head.keys import GUARD
    from burla.head.server import bind, url_of
    from burla.node.main import node_settings
    from burla.node.service import NodeService
    from burla.node.workers.worker_pool import WorkerPool
    from burla.web.connection_guard import GuardedSite

    token = secrets.token_urlsafe(16)
    history_path = tmp_path / "history.db" if history else None
    settings = HeadSettings(host="127.0.0.1", port=0, token=token, config_dir=tmp_path, advertise=False,
                            history_path=history_path, node_deadline_s=node_deadline_s, version=__version__)
    sock = bind("127.0.0.1", 0)
    url = url_of(sock, settings)
    app = create_head_app(settings, driver or LocalDriver(), url)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    await GuardedSite(runner, app[GUARD], sock=sock).start()
    node = node_settings(url, token, workers=1, node_id="node-inproc")
    pool = WorkerPool(1, dict(os.environ))  # its worker is started as a process of its own
    await pool.start()
    service = NodeService(node, pool)
    serving = asyncio.create_task(service.run())
    try:
        await until(lambda: "node-inproc" in cluster_of(app).scheduler.nodes, "the node to register")
        yield InProcessCluster(url, token, app, service, history_path)
    finally:
        service.stop()
        await asyncio.wait_for(serving, 60)
        await runner.cleanup()


def cluster_of(app):
    from burla.head.keys import CLUSTER

    return app[CLUSTER]


def supervisor_of(app) -> LoopSupervisor:
    from burla.head.keys import SUPERVISOR

    return app[SUPERVISOR]
