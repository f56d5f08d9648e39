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

from burla import input_files
from burla.config import DEFAULT_HEAD_PORT, ENV_HEAD_CERT, HeadRecord, HeadSettings
from burla.drivers.base import BootRequest, Driver
from burla.drivers.local import LocalDriver, can_fork_nodes
from burla.lifeline import wait_for_eof
from burla.process_memory import freeze_startup_objects, release_large_blocks
from burla.web_import import import_aiohttp

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
    release_large_blocks()  # inputs pass through the head: its memory must come back after big ones
    allow_many_connections()
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
    import burla.head.fleet  # noqa: F401
    import burla.head.history  # noqa: F401
    import burla.node.main  # noqa: F401
    import burla.node.service  # noqa: F401
    import burla.node.worker  # noqa: F401


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

    from burla.connection_guard import ConnectionGuard, GuardedSite
    from burla.head.app import build_app
    from burla.head.cluster import Cluster
    from burla.head.fleet import ClusterSettings, Fleet
    from burla.head.history import History
    from burla.head.loop_monitor import LoopMonitor

    history = None
    if settings.history_path is not None:
        history = History(settings.history_path, settings.history_retention_days)
    cluster = Cluster(settings.version, history)
    cluster.expect_nodes(booted, input_files.host_id())  # local nodes share this machine's input files
    if history is not None:
        from burla.head.usage import MACHINE_STARTED, machine_detail

        for node_id in booted:
            history.node_event(node_id, MACHINE_STARTED, machine_detail("local", "", "", False))
    driver.on_boot_failed = cluster.node_boot_failed
    driver.start_watching()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    defaults = ClusterSettings(
        quantity=settings.local_nodes, workers_per_node=settings.local_node_workers,
        inactivity_timeout_s=settings.inactivity_timeout_s,
    )
    head_cert = settings.tls_cert.read_text() if settings.tls_cert is not None else None
    fleet_driver: Driver = driver
    if settings.cloud is not None:
        fleet_driver = _cloud_driver(settings, url, head_cert, history)
    fleet = Fleet(cluster, fleet_driver, history, url, settings.token, defaults, head_cert)
    if fleet_driver is not driver:  # a cloud VM that can't be set up is deleted at once
        fleet_driver.on_boot_failed = fleet.setup_failed
    # Serve first; history opens meanwhile (what is recorded before waits in memory).
    startup = asyncio.create_task(_open_history(history, fleet, cluster), name="history-open")
    cluster.prepare_job = fleet.prepare_job
    cluster.remove_machine = fleet.remove_machine
    guard = ConnectionGuard(settings.header_timeout_s)
    loop_monitor = LoopMonitor()
    runner = web.AppRunner(build_app(cluster, fleet, settings.token, stop, url, guard, loop_monitor), access_log=None,
                           shutdown_timeout=1.0)
    await runner.setup()
    ssl_context = None
    if settings.tls_cert is not None and settings.tls_key is not None:
        from burla.tls import server_context

        ssl_context = server_context(settings.tls_cert, settings.tls_key)
    site = GuardedSite(runner, guard, sock=sock, ssl_context=ssl_context)
    await site.start()
    freeze_startup_objects()
    progress = asyncio.create_task(cluster.progress_loop(), name="progress")
    loop_watch = asyncio.create_task(loop_monitor.run(), name="loop-monitor")
    idle_collector = asyncio.create_task(cluster.idle_collector.run(), name="idle-collector")
    reaper = asyncio.create_task(cluster.reap_loop(settings.node_deadline_s), name="reaper")
    stealer = asyncio.create_task(cluster.steal_loop(), name="steal-hints")
    idle_reaper = asyncio.create_task(
        cluster.inactivity_loop(fleet.idle_timeout, fleet.delete_node), name="inactivity"
    )
    boot_watch = asyncio.create_task(fleet.boot_watch_loop(settings.boot_deadline_s), name="boot-watch")
    client_reaper = asyncio.create_task(cluster.client_reap_loop(settings.client_deadline_s), name="client-reaper")
    lifeline = None
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
    try:
        await stop.wait()
    finally:
        log.info("stopping")
        if settings.advertise:
            HeadRecord.remove_if_owned(settings.config_dir, os.getpid())
        for task in (progress, loop_watch, idle_collector, reaper, stealer, client_reaper, idle_reaper, boot_watch,
                     lifeline, startup):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await cluster.shut_down()
        if not settings.keep_nodes:
            await fleet.delete_machines()
        await fleet.close()
        await driver.close()
        if fleet_driver is not driver:
            await fleet_driver.close()
        await runner.cleanup()
        if history is not None:
            await history.close()



def _cloud_driver(settings: HeadSettings, url: str, head_cert: str | None, history) -> Driver:
    """The configured cloud's driver, its VMs set up over SSH by this head."""
    from burla.drivers.bootstrap import PackageSource
    from burla.drivers.cloud import cloud_driver
    from burla.drivers.ssh import SshBootstrapDriver, SshSettings

    ssh = SshSettings(
        config_dir=settings.config_dir, cluster_id=settings.cloud.cluster_id, head_url=url, token=settings.token,
        head_cert=head_cert, tunnel=settings.node_link == "tunnel",
        packages=PackageSource(settings.node_index_url,
                               str(settings.node_wheelhouse) if settings.node_wheelhouse else None),
        orphan_timeout_s=settings.orphan_timeout_s, boot_deadline_s=settings.boot_deadline_s,
        address_map=settings.ssh_address_map,
    )
    wrapped = SshBootstrapDriver(cloud_driver(settings.cloud), ssh)
    if history is not None:
        wrapped.on_event = history.node_event
    return wrapped


async def _open_history(history, fleet, cluster) -> None:
    try:
        if history is not None:
            await history.open()
            await fleet.load_saved_settings()  # before jobs are taken up: they may boot machines
            cluster.restore_jobs(await history.kept_jobs(), await history.nodes_connected_at_stop())
    finally:
        cluster.restored.set()  # clients resuming jobs waited for this
    await fleet.sweep_leftovers()
