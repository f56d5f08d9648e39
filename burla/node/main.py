"""A node process from the start: its workers boot first, then the web stack is imported.

Importing aiohttp and the node's modules takes ~0.2 s and the workers take as long to start; a
cold embedded cluster waits for both, so they overlap: the node starts its fork server (a new
interpreter that never held a credential) and asks it for the first workers before its event loop
starts and `burla.node.service` is imported.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from burla._version import __version__
from burla.config import ENV_CODE_ROOT, ENV_HEAD_URL, ENV_NODE_ID, ENV_TOKEN, NodeSettings
from burla.node.gpus import Gpus
from burla.node.workers.fork_server import ForkServer, can_serve, start_fork_server
from burla.node.workers.worker_pool import WorkerPool
from burla.process.environ_block import erase_variable
from burla.process.hardening import refuse_inspection
from burla.process.locked_dirs import make_locked, remove_abandoned
from burla.process.memory import freeze_inherited_objects, freeze_startup_objects, keep_large_blocks
from burla.web.aiohttp_import import import_aiohttp


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def node_settings(head_url: str, token: str, *, workers: int | None = None, node_id: str | None = None,
                  region: str = "local", image: str | None = None, host: str = "127.0.0.1", port: int = 0,
                  advertise_url: str | None = None, advertise_host: str | None = None, orphan_timeout: float = 60.0,
                  steal_ack_timeout: float = 5.0, memory_limit_gb: float | None = None, gpu: str | None = None,
                  gpu_count: int = 0, head_cert: str | None = None, head_url_file: str | None = None,
                  lifeline_fd: int | None = None, source_builds: bool = False) -> NodeSettings:
    """A node's settings from `burla node join`'s options (the same defaults), with what this
    machine has filled in: CPUs, memory, GPUs."""
    import secrets

    import psutil

    from burla.node.gpus import detect as detect_gpus
    from burla.protocol.values import input_files

    cpus = cpu_count()
    detected = detect_gpus() if gpu is None or not gpu_count else Gpus(gpu, gpu_count)
    gpu = gpu or detected.model
    gpu_count = (gpu_count or detected.count or 1) if gpu else 0
    total_gb = psutil.virtual_memory().total / 2**30
    budget_gb = memory_limit_gb if memory_limit_gb is not None else 0.9 * total_gb
    return NodeSettings(
        head_url=head_url.rstrip("/"), token=token, workers=workers or cpus,
        node_id=node_id or f"node-{secrets.token_hex(4)}", cpus=cpus,
        ram_gb=min(total_gb, budget_gb), memory_budget_gb=budget_gb, image=image, region=region, gpu=gpu,
        gpu_count=gpu_count,
        lifeline_fd=lifeline_fd, version=__version__, host=host, port=port, head_cert=head_cert,
        advertise_url=advertise_url.rstrip("/") if advertise_url else None, advertise_host=advertise_host,
        register_deadline_s=orphan_timeout, steal_ack_timeout_s=steal_ack_timeout, head_url_file=head_url_file,
        source_builds=source_builds,
        host_id="" if image else input_files.host_id(),  # calls in a container see other files
    )


def run_node(settings: NodeSettings) -> int:
    """Serve until stopped; returns the process exit code (0, or why the head was lost)."""
    # force: a node forked from its head inherits the head's logging setup.
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s node %(levelname)s %(message)s",
                        force=True)
    refuse_inspection()  # it holds the node's token (a forked local node came marked from its head)
    keep_large_blocks()  # inputs and results pass through the node too (given back when it is idle)
    freeze_inherited_objects()  # a local node is forked from its head
    exit_code = 0

    # A job's calls get the job's own token (BURLA_JOB_TOKEN), never the node's: not in their
    # environment, nor in the exec-time block they inherit from this process when forked.
    erase_variable(ENV_TOKEN)
    env = dict(os.environ)
    env[ENV_HEAD_URL] = settings.head_url
    env[ENV_NODE_ID] = settings.node_id
    # Shipped modules are unpacked under a directory of the node's, locked while it lives: a node
    # killed before it could remove its own leaves it to the next node on the machine.
    code_root, code_lock = _claim_code_root()
    env[ENV_CODE_ROOT] = str(code_root)
    # Workers are never forked from this process: they would inherit its memory, and with it the
    # node's token (and a local node's head's cluster token). They come from a fresh interpreter.
    pool = WorkerPool(settings.workers, env, Gpus(settings.gpu, settings.gpu_count),
                      ForkServer(*start_fork_server(env)) if can_serve() else None)
    pool.request_first_workers()

    async def main() -> None:
        nonlocal exit_code
        await pool.start()
        import_aiohttp()  # while the workers boot
        from burla.node.service import NodeService

        service = NodeService(settings, pool)
        freeze_startup_objects(collect=False)  # no collection: this is on a cold cluster's path
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, service.stop, f"stopped by {sig.name}")
        try:
            await service.run()
        finally:
            exit_code = service.exit_code

    try:
        asyncio.run(main())
    finally:
        shutil.rmtree(code_root, ignore_errors=True)
        if code_lock >= 0:
            os.close(code_lock)
    return exit_code


CODE_ROOT_PREFIX = "burla-node-code-"


def _claim_code_root() -> tuple[Path, int]:
    """(the node's directory for shipped modules, the fd of its lock), after removing those of
    nodes that died on this machine. Where it can't be made and locked, the fd is -1 and the
    first worker that needs the directory makes it, as its own."""
    parent = Path(tempfile.gettempdir())
    code_root = parent / f"{CODE_ROOT_PREFIX}{secrets.token_hex(8)}"
    try:
        remove_abandoned(parent, lambda name: name.startswith(CODE_ROOT_PREFIX))
        return code_root, make_locked(code_root)
    except OSError as e:
        logging.getLogger("burla.node").warning("could not lock a directory for shipped modules in %s: %s", parent, e)
        return code_root, -1
