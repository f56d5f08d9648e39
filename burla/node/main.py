"""A node process from the start: its workers boot first, then the web stack is imported.

Importing aiohttp and the node's modules takes ~0.2 s and a worker takes as long to start; a
cold embedded cluster waits for both, so they overlap: the workers are forked (worker_fork)
before the event loop starts and `burla.node.service` is imported.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from burla.config import ENV_HEAD_URL, ENV_NODE_ID, ENV_TOKEN, NodeSettings
from burla.node.gpus import Gpus
from burla.node.worker_fork import can_fork, fork_workers
from burla.node.worker_pool import WorkerPool
from burla.process_memory import release_large_blocks


def run_node(settings: NodeSettings) -> int:
    """Serve until stopped; returns the process exit code (0, or why the head was lost)."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s node %(levelname)s %(message)s")
    release_large_blocks()  # inputs and results pass through the node too
    exit_code = 0

    env = dict(os.environ)
    env[ENV_HEAD_URL] = settings.head_url
    env[ENV_TOKEN] = settings.token
    env[ENV_NODE_ID] = settings.node_id
    lifeline = () if settings.lifeline_fd is None else (settings.lifeline_fd,)
    gpus = Gpus(settings.gpu, settings.gpu_count)
    forked = fork_workers(settings.workers, env, close_in_child=lifeline, gpus=gpus) if can_fork() else []

    async def main() -> None:
        nonlocal exit_code
        pool = WorkerPool(settings.workers, env, forked, gpus)
        await pool.start()
        from burla.node.service import NodeService  # while the workers boot

        service = NodeService(settings, pool)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, service.stop, f"stopped by {sig.name}")
        try:
            await service.run()
        finally:
            exit_code = service.exit_code

    asyncio.run(main())
    return exit_code
