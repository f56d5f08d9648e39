"""Every key of the head's aiohttp application, in one place: what a handler may find there."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

from burla.head.budget import ConnectionCounts, HeadLimits
from burla.head.cluster import Cluster
from burla.head.loop_monitor import LoopMonitor
from burla.head.machines.fleet import Fleet
from burla.process.loop_supervisor import LoopSupervisor
from burla.web.auth import Sessions
from burla.web.channel_server import ChannelServer
from burla.web.connection_guard import ConnectionGuard

CLUSTER = web.AppKey("cluster", Cluster)
FLEET = web.AppKey("fleet", Fleet)
LOOP_MONITOR = web.AppKey("loop_monitor", LoopMonitor)
SUPERVISOR = web.AppKey("supervisor", LoopSupervisor)  # the head's background loops
GUARD = web.AppKey("guard", ConnectionGuard)
# Where cloud nodes' tunnels are served on their SSH channels: the server's guarded protocol while
# a plain-http site serves (`head/server.py`).
CHANNELS = web.AppKey("channels", ChannelServer)
STOP = web.AppKey("stop", asyncio.Event)  # set to stop the head
# Stop the head's loops, jobs, nodes and drivers (once; run again it does nothing), while the
# site still serves. The app's on_shutdown runs it too, for a runner cleaned up directly.
SHUT_DOWN: web.AppKey[Callable[[], Awaitable[None]]] = web.AppKey("shut_down")
# Every node and job WebSocket being served.
OPEN_SOCKETS: web.AppKey[set[web.WebSocketResponse]] = web.AppKey("open_sockets", set)
SESSIONS = web.AppKey("sessions", Sessions)  # the dashboard's signed-in browsers
HEAD_URL = web.AppKey("head_url", str)  # the head's own address, as clients reach it
LIMITS = web.AppKey("limits", HeadLimits)  # what the head holds at most
CLIENT_CONNECTIONS = web.AppKey("client_connections", ConnectionCounts)  # open job connections per credential
