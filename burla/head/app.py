"""The head as one aiohttp application: its parts wired together, its routes, and the
background loops that start and stop with it.

Every route but `/health` and `/login` needs `Authorization: Bearer <cluster token>` (compared
in constant time) or a dashboard session cookie; errors are JSON `{"error": kind, "message":
what to fix}` with a 4xx status.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

from burla.config import HeadSettings
from burla.drivers.base import Driver
from burla.drivers.local import LocalDriver
from burla.head.budget import ConnectionCounts, HeadLimits
from burla.head.cluster import Cluster
from burla.head.history.recorder import Recorder
from burla.head.history.store import History
from burla.head.keys import (
    CHANNELS,
    CLIENT_CONNECTIONS,
    CLUSTER,
    FLEET,
    GUARD,
    LIMITS,
    LOOP_MONITOR,
    OPEN_SOCKETS,
    SHUT_DOWN,
    STOP,
    SUPERVISOR,
)
from burla.head.loop_monitor import LoopMonitor
from burla.head.machines.cluster_settings import ClusterSettings
from burla.head.machines.fleet import Fleet
from burla.head.routes.access import job_view, scope_check
from burla.head.routes.api import add_api_routes
from burla.head.routes.dashboard import add_dashboard_routes, login_needed
from burla.head.routes.sockets import close_open_sockets, job_socket, node_socket
from burla.process.loop_supervisor import LoopSupervisor, run_every_step
from burla.protocol.values import input_files
from burla.web import head_proof
from burla.web.auth import Sessions, token_middleware
from burla.web.channel_server import ChannelServer
from burla.web.connection_guard import ConnectionGuard
from burla.web.json_io import error_response, json_errors, json_response, require_text_urls

log = logging.getLogger("burla.head")

MAX_HTTP_BODY = 1024 * 1024


def create_head_app(settings: HeadSettings, driver: LocalDriver, url: str,
                    booted: Sequence[str] = ()) -> web.Application:
    """The whole head. `driver` runs its local nodes (`booted`: those already started for it);
    a configured cloud gets a driver of its own. Background loops start with the app; stopping
    it runs every cleanup step, each even if one before it failed."""
    history = None
    if settings.history_path is not None:
        history = History(settings.history_path, settings.history_retention_days)
    cluster = Cluster(settings.version, history, settings.token)
    cluster.expect_nodes(list(booted), input_files.host_id())  # local nodes share this machine's input files
    from burla.head.history.usage import MACHINE_STARTED, machine_detail

    for node_id in booted:
        cluster.record.node_event(node_id, MACHINE_STARTED, machine_detail("local", "", "", False))
    driver.on_boot_failed = cluster.node_boot_failed
    head_cert = settings.tls_cert.read_text() if settings.tls_cert is not None else None
    fleet_driver: Driver = driver
    channels = ChannelServer()
    if settings.cloud is not None:
        # A plain-http head whose tunnels run on asyncssh in its own process serves them on their SSH
        # channels, once its site serves.
        fleet_driver = _cloud_driver(settings, url, head_cert, cluster.record,
                                     channels if settings.tls_cert is None else None)
    defaults = ClusterSettings(
        quantity=settings.local_nodes, workers_per_node=settings.local_node_workers,
        inactivity_timeout_s=settings.inactivity_timeout_s,
    )
    fleet = Fleet(cluster, fleet_driver, history, url, settings.token, defaults, settings.config_dir, head_cert)
    if fleet_driver is not driver:  # a cloud VM that can't be set up is deleted at once
        fleet_driver.on_boot_failed = fleet.setup_failed
    cluster.use_machines(fleet)
    app = build_app(cluster, fleet, settings.token, url, ConnectionGuard(settings.header_timeout_s),
                    HeadLimits(settings.max_open_jobs, settings.max_client_connections,
                               settings.max_tree_jobs, settings.max_tree_mb))
    lifecycle = _Lifecycle(settings, app, history, driver, fleet_driver)
    app.on_startup.append(lifecycle.start)
    app[CHANNELS] = channels
    app[SHUT_DOWN] = lifecycle.stop
    app.on_shutdown.insert(0, lambda _app: lifecycle.stop())  # before the sockets close: nodes and clients hear
    app.on_cleanup.append(lifecycle.close_history)
    return app


def build_app(cluster: Cluster, fleet: Fleet, token: str, head_url: str, guard: ConnectionGuard,
              limits: HeadLimits | None = None) -> web.Application:
    """The routes and middleware over a cluster and its fleet (no background loops of its own)."""
    sessions = Sessions(token)
    app = web.Application(
        client_max_size=MAX_HTTP_BODY,
        middlewares=[guard.middleware, json_errors(MAX_HTTP_BODY), require_text_urls,
                     token_middleware(token, sessions, login_page=login_needed, on_authenticated=guard.authenticated,
                                      job_view=job_view, scope_check=scope_check)],
    )
    app[CLUSTER] = cluster
    app[FLEET] = fleet
    app[GUARD] = guard
    app[LIMITS] = limits or HeadLimits()
    app[CLIENT_CONNECTIONS] = ConnectionCounts()
    app[LOOP_MONITOR] = LoopMonitor()
    app[SUPERVISOR] = LoopSupervisor(log)
    app[STOP] = asyncio.Event()
    app[OPEN_SOCKETS] = set()
    app.on_shutdown.append(close_open_sockets)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/jobs/ws", job_socket)
    app.router.add_get("/v1/nodes/ws", node_socket)
    app.router.add_post("/v1/shutdown", shutdown)
    add_api_routes(app)
    add_dashboard_routes(app, sessions, head_url)
    return app


async def health(request: web.Request) -> web.Response:
    """Open to all; with `?nonce=` it also proves this head holds the cluster token (head_proof)."""
    cluster = request.app[CLUSTER]
    nonce = request.query.get("nonce")
    if nonce is None:
        return json_response({"ok": True, "version": cluster.version})
    if not 0 < len(nonce) <= head_proof.MAX_NONCE_HEX:
        return error_response(400, "InvalidArgument", f"nonce must be 1 to {head_proof.MAX_NONCE_HEX} characters")
    answer = head_proof.head_answer(cluster.token, nonce, request.query.get("scope"))
    if answer is None:
        return error_response(400, "InvalidArgument", "scope must name a scoped token: its kind and subject")
    return json_response({"ok": True, "version": cluster.version, "proof": answer})


async def shutdown(request: web.Request) -> web.Response:
    request.app[STOP].set()
    return json_response({"ok": True})


class _Lifecycle:
    """What the head starts once it serves, and tears down, in order, when it stops."""

    def __init__(self, settings: HeadSettings, app: web.Application, history: History | None, driver: LocalDriver,
                 fleet_driver: Driver) -> None:
        self._settings = settings
        self._cluster = app[CLUSTER]
        self._fleet = app[FLEET]
        self._monitor = app[LOOP_MONITOR]
        self._supervisor = app[SUPERVISOR]
        self._history = history
        self._driver = driver
        self._fleet_driver = fleet_driver
        self._startup: asyncio.Task[None] | None = None
        self._stopping: asyncio.Task[None] | None = None

    def loops(self) -> dict[str, Callable[[], Awaitable[None]]]:
        """Every background loop of the head, by the name `/v1/cluster` shows."""
        s, cluster, fleet = self._settings, self._cluster, self._fleet
        return {
            "progress": cluster.clients.progress_loop,
            "loop-monitor": self._monitor.run,
            "idle-collector": cluster.idle_collector.run,
            "reaper": lambda: cluster.watch.reap_loop(s.node_deadline_s),
            "steal-hints": cluster.watch.steal_loop,
            "inactivity": lambda: cluster.watch.inactivity_loop(fleet.idle_timeout, fleet.delete_node),
            "boot-watch": lambda: fleet.boot_watch_loop(s.boot_deadline_s),
            "client-reaper": lambda: cluster.clients.client_reap_loop(s.client_deadline_s),
        }

    async def start(self, app: web.Application) -> None:
        self._driver.start_watching()
        # History opens meanwhile: the head serves at once (what is recorded before waits in memory).
        self._startup = asyncio.create_task(self._open_history(), name="history-open")
        for name, run in self.loops().items():
            self._supervisor.start(name, run)

    async def _open_history(self) -> None:
        history, cluster, fleet = self._history, self._cluster, self._fleet
        try:
            if history is not None:
                await history.open()
                await fleet.load_saved_settings()  # before jobs are taken up: they may boot machines
                kept = await history.kept_jobs()
                if kept:
                    await fleet.catalog.ready()  # what they grow from
                cluster.recovery.restore_jobs(kept, await history.nodes_connected_at_stop())
        except Exception:  # noqa: BLE001 - the head serves on without the jobs it kept
            log.exception("history could not be opened; jobs kept in it are not taken up")
        finally:
            cluster.recovery.done.set()  # clients resuming jobs waited for this
        try:
            await fleet.sweep_leftovers()
        except Exception:  # noqa: BLE001 - each later boot watch removes what it finds
            log.exception("could not look for machines an earlier head left")

    async def stop(self) -> None:
        """Every step, once (the server runs it while its site still serves; on_shutdown again)."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop_every_step())
        await asyncio.shield(self._stopping)

    async def _stop_every_step(self) -> None:
        steps: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("background loops", self._supervisor.close),
            ("history opening", self._stop_startup),
            ("jobs and nodes", self._cluster.shut_down),
        ]
        if not self._settings.keep_nodes:
            steps.append(("delete machines", self._fleet.delete_machines))
        steps += [("fleet", self._fleet.close), ("local driver", self._driver.close)]
        if self._fleet_driver is not self._driver:
            steps.append(("cloud driver", self._fleet_driver.close))
        await run_every_step(log, steps)

    async def _stop_startup(self) -> None:
        if self._startup is not None:
            self._startup.cancel()
            await asyncio.gather(self._startup, return_exceptions=True)

    async def close_history(self, app: web.Application) -> None:
        if self._history is not None:
            await run_every_step(log, [("history", self._history.close)])


def _cloud_driver(settings: HeadSettings, url: str, head_cert: str | None, record: Recorder,
                  channels: ChannelServer | None) -> Driver:
    """The configured cloud's driver, its VMs set up over SSH by this head."""
    from burla.drivers.registry import cloud_driver
    from burla.drivers.ssh.bootstrap import PackageSource
    from burla.drivers.ssh.driver import SshBootstrapDriver, SshSettings

    assert settings.cloud is not None
    ssh = SshSettings(
        config_dir=settings.config_dir, cluster_id=settings.cloud.cluster_id, head_url=url, token=settings.token,
        head_cert=head_cert, tunnel=settings.node_link == "tunnel",
        packages=PackageSource(settings.node_index_url,
                               str(settings.node_wheelhouse) if settings.node_wheelhouse else None),
        orphan_timeout_s=settings.orphan_timeout_s, boot_deadline_s=settings.boot_deadline_s,
        address_map=settings.ssh_address_map, tunnel_program=settings.tunnel_program,
    )
    in_process = ssh.tunnel and ssh.tunnel_program is None
    wrapped = SshBootstrapDriver(cloud_driver(settings.cloud), ssh, channels if in_process else None)
    wrapped.on_event = record.node_event
    return wrapped
