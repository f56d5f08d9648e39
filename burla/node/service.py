"""A node: registers with its head over one WebSocket, runs jobs on its workers, pushes state.

The head link carries everything both ways in typed msgpack frames: inputs and signals down,
results, output, credit and state up. State goes up at least every second and on every
transition (idle <-> running). A small HTTP server answers a health check and, with the token,
the node's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import socket
import time

import aiohttp
import psutil
from aiohttp import web

from burla.config import NodeSettings
from burla.errors import ProtocolError
from burla.node.call_timeouts import CallTimeouts
from burla.node.cpu import CpuGuard
from burla.node.dispatcher import HARD_KILL_AFTER_S, Dispatcher
from burla.node.governor import Governor
from burla.node.http import build_node_app
from burla.node.listen import LOOPBACK_HOSTS, bind_address
from burla.node.memory import MemoryGuard
from burla.node.packages import Environment
from burla.node.readings import MachineReadings
from burla.node.result_pipes import ResultPipes
from burla.node.result_window import ResultWindow
from burla.node.steal import Donor, Thief
from burla.node.workers.worker_pool import WorkerPool
from burla.process.build import build_hash
from burla.process.lifeline import wait_for_eof
from burla.process.loop_supervisor import LoopSupervisor
from burla.process.memory import give_back_memory
from burla.protocol import grants, limits, wire
from burla.protocol.replication.environment import installed_distributions
from burla.protocol.states import NodeStatus
from burla.protocol.values import packed_results
from burla.protocol.values.packed_inputs import PackedInputs
from burla.protocol.values.serialization import pack_error
from burla.web import ws_bulk
from burla.web.connection_guard import ConnectionGuard, GuardedSite
from burla.web.tls import node_server_context

log = logging.getLogger("burla.node")

STATE_INTERVAL_S = 1.0
IDLE_TRIMS = 3  # state ticks after a job that give the heap's free pages back
# A change (a job starting or ending, say) is pushed this long after it happens, so that
# back-to-back short jobs make one push, not two each.
STATE_SETTLE_S = 0.05
RECONNECT_DELAY_S = 0.05
MAX_FAILED_SESSION_DELAY_S = 30.0
STOLEN_REPORT_TIMEOUT_S = 10.0
# Without a head (it restarts, or the network is cut) a node keeps running what it holds this long,
# then reports it to the head it reaches again; past it, the head has given the inputs to others.
KEEP_JOBS_WITHOUT_HEAD_S = 120.0
# Registering: a tunnel's port left behind on the VM (its sshd missed the old connection's end) accepts
# and says nothing; after this the node reads its head URL again, where the head put the new port.
HEAD_HANDSHAKE_TIMEOUT_S = 20.0


class NodeService:
    def __init__(self, settings: NodeSettings, pool: WorkerPool) -> None:
        """`pool`: the node's workers, already starting (see burla/node/main.py)."""
        self.settings = settings
        self.pool = pool
        self.loops: LoopSupervisor | None = None  # the node's background loops, once it runs
        self._failed_sessions = 0  # sessions with the head a bug ended, in a row
        self.dispatcher = Dispatcher(lambda: self.pool.workers, lambda: self._outgoing.set(), settings.node_id,
                                     socket.gethostname(), lambda: self.pool.size)
        self._sending_bytes = 0  # of the results the sender took and is sending
        self.results_window = ResultWindow(self._held_result_bytes)
        self.result_pipes = ResultPipes(self.dispatcher, self.results_window.sent)  # large results to clients
        pool.bind(self.dispatcher.on_report, self._on_worker_exit, lambda _: self.dispatcher.pump(),
                  self.results_window.room)
        pool.bind_tenants(self.dispatcher.tenancy)  # whose calls each worker may run (one tenant each)
        self.dispatcher.on_workers_changed = pool.rebalance
        self.cpu = CpuGuard(self.pool, self.dispatcher)
        self.donor = Donor(settings.node_id, self.dispatcher, settings.steal_ack_timeout_s)
        self.spent_grants = grants.SpentGrants()  # upload grants that opened a connection here (one each)
        self.memory = MemoryGuard(
            self.pool, self.dispatcher, settings.memory_budget_gb, lambda: self._state_changed.set()
        )
        self.timeouts = CallTimeouts(lambda: self.pool.workers, self.dispatcher, lambda: self._state_changed.set())
        self.governor = Governor(self.pool, self.dispatcher, self.memory, settings.cpus, self._ask_for_more,
                                 lambda: self._state_changed.set(), self.results_window.full)
        self.thief = Thief(settings.node_id, self.dispatcher, self._report_stolen)
        self._control: list[tuple[wire.Message, asyncio.Future]] = []  # sent before data, awaited
        self.url = ""
        self.cert_sha256 = b""  # of this node's TLS certificate (nodes of an https head serve https)
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._outgoing = asyncio.Event()
        self._state_changed = asyncio.Event()
        self._status = NodeStatus.READY
        self._trims_due = 0  # idle state ticks left that give free memory back
        self._stopping = asyncio.Event()
        self._leaving: str | None = None  # why this node stops on its own (None: the head asked, or silent)
        self._pending_credit: set[str] = set()  # jobs whose credit should be recomputed
        self.exit_code = 0
        self.environment = Environment(settings.source_builds)
        self._installs: set[asyncio.Task] = set()
        self.readings = MachineReadings()
        self._head_lost_at: float | None = None  # monotonic time the last head session ended
        self._head_token = settings.token  # the cluster's or this node's token, then the one the head gives it

    # --- lifecycle -----------------------------------------------------------------------

    async def run(self) -> None:
        host = self.settings.advertise_host or self._reachable_host()
        ssl_context = None
        # Peers' transfers are encrypted whenever they can cross a network (whatever the head's
        # scheme: a laptop's head serves http through its tunnels), and like the head's links.
        if self.settings.head_url.startswith("https://") or self.settings.host not in LOOPBACK_HOSTS:
            ssl_context, self.cert_sha256 = node_server_context(host)
        guard = ConnectionGuard()
        runner = web.AppRunner(build_node_app(self, guard), access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = GuardedSite(runner, guard, host=bind_address(self.settings.host), port=self.settings.port,
                           ssl_context=ssl_context)
        await site.start()
        scheme = "https" if ssl_context is not None else "http"
        self.url = self.settings.advertise_url or f"{scheme}://{host}:{site.port}"
        psutil.cpu_percent(interval=None)  # prime the counter
        # Read the installed distributions now, so the first job's package check is instant.
        reading = asyncio.get_running_loop().run_in_executor(None, installed_distributions)
        try:
            async with asyncio.TaskGroup() as group:  # everything the node runs lives in this group
                if self.settings.lifeline_fd is not None:
                    group.create_task(self._watch_lifeline(self.settings.lifeline_fd))
                group.create_task(self._head_session_loop())
                self.loops = LoopSupervisor(log, spawn=group.create_task)
                self.loops.start("memory-guard", self.memory.run)
                self.loops.start("call-timeouts", self.timeouts.run)
                self.loops.start("cpu-guard", self.cpu.run)
                self.loops.start("governor", self.governor.run)
                if self.settings.gpu_count and shutil.which("nvidia-smi"):
                    self.loops.start("gpu-readings", self.readings.watch_gpus)
                group.create_task(self._stop_when_asked(group))
        except* _Stop:
            pass
        finally:
            reading.cancel()
            for task in list(self._installs):
                task.cancel()
            await self.thief.close()
            await self.pool.close()
            await runner.cleanup()

    def _reachable_host(self) -> str:
        """The address peers use: the bound one, or for a wildcard bind the one the head is reached from."""
        host = self.settings.host
        if host not in ("0.0.0.0", "::", ""):
            return host
        import socket
        import urllib.parse

        head = urllib.parse.urlsplit(self.settings.head_url)
        family = socket.AF_INET6 if ":" in (head.hostname or "") else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((head.hostname or "127.0.0.1", head.port or 80))
            address = probe.getsockname()[0]
        return f"[{address}]" if family == socket.AF_INET6 else address

    def stop(self, reason: str | None = None) -> None:
        """Stop serving; with a reason, the head is told this node is leaving (so it deletes the machine)."""
        if reason is not None and self._leaving is None:
            self._leaving = reason
        self.pool.begin_close()
        self._stopping.set()

    async def _stop_when_asked(self, group: asyncio.TaskGroup) -> None:
        await self._stopping.wait()
        ws = self._ws
        if self._leaving is not None and ws is not None and not ws.closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.send_bytes(wire.NodeLeaving(self._leaving).encode()), 2.0)
        raise _Stop()

    async def _watch_lifeline(self, fd: int) -> None:
        await wait_for_eof(fd)
        log.info("lifeline closed; stopping")
        self.stop("its parent process ended")

    # --- head link -----------------------------------------------------------------------

    async def _head_session_loop(self) -> None:
        deadline = time.monotonic() + self.settings.register_deadline_s
        from burla.web.tls import head_connector

        async with aiohttp.ClientSession(connector=head_connector(self.settings.head_cert)) as session:
            while True:
                try:
                    async with asyncio.timeout(HEAD_HANDSHAKE_TIMEOUT_S):
                        ws = await session.ws_connect(
                            f"{self._head_url()}/v1/nodes/ws",
                            headers={"Authorization": f"Bearer {self._head_token}"},
                            max_msg_size=limits.MAX_FRAME_BYTES, heartbeat=None, autoping=True,
                        )
                    async with ws:
                        await self._serve_head(ws)
                        deadline = time.monotonic() + self.settings.register_deadline_s
                except aiohttp.WSServerHandshakeError as e:
                    if e.status == 401:
                        log.error("the head refused this node's token (401); check BURLA_CLUSTER_TOKEN or --token-file")
                        self.exit_code = 3
                        self.stop()
                        return
                except (aiohttp.ClientError, OSError):
                    pass
                except ProtocolError as e:  # a head speaking another protocol: reconnect, maybe it restarts
                    log.warning("the head sent a frame this node can't read (%s); reconnecting", e)
                self._ws = None
                if self._stopping.is_set():
                    return
                self._keep_jobs_a_while()
                if time.monotonic() > deadline:
                    log.error("head %s unreachable; stopping", self.settings.head_url)
                    self.exit_code = 6
                    self.stop()
                    return
                await asyncio.sleep(self._reconnect_delay())

    def _reconnect_delay(self) -> float:
        """At once after a cut; after sessions a bug ended, 1, 2, 4... up to 30 s (a bug that
        repeats must not make the node re-register many times a second)."""
        if not self._failed_sessions:
            return RECONNECT_DELAY_S
        return min(MAX_FAILED_SESSION_DELAY_S, 2.0 ** (self._failed_sessions - 1))

    def _keep_jobs_a_while(self) -> None:
        """Jobs run on without a head, for one that comes back; dropped after KEEP_JOBS_WITHOUT_HEAD_S."""
        now = time.monotonic()
        if self._head_lost_at is None:
            self._head_lost_at = now
            if self.dispatcher.jobs:
                log.warning("lost the head; keeping %d job(s) running for %g s until it is back",
                            len(self.dispatcher.jobs), KEEP_JOBS_WITHOUT_HEAD_S)
        elif self.dispatcher.jobs and now - self._head_lost_at > KEEP_JOBS_WITHOUT_HEAD_S:
            log.warning("the head has been gone for %g s; dropping its jobs", KEEP_JOBS_WITHOUT_HEAD_S)
            self._drop_all_jobs()

    def _head_url(self) -> str:
        """The head's URL: from --head-url-file when its SSH tunnel may have moved, else --head."""
        path = self.settings.head_url_file
        if path:
            try:
                with open(path, encoding="utf-8") as file:
                    url = file.read().strip().rstrip("/")
                if url.startswith(("http://", "https://")):
                    return url
            except OSError:
                pass
        return self.settings.head_url

    async def _serve_head(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        ws_bulk.install_client(ws, limits.MAX_FRAME_BYTES)  # large frames read with one copy
        s = self.settings
        register = wire.RegisterNode(
            node_id=s.node_id, url=self.url, slots=s.workers, cpus=s.cpus, ram_gb=float(s.ram_gb), gpu=s.gpu,
            gpu_count=s.gpu_count, image=s.image, region=s.region, python_version=s.python_version, version=s.version,
            build=build_hash(), cert_sha256=self.cert_sha256, held=self.dispatcher.held(), host_id=s.host_id,
            session_proof=grants.session_proof(self.donor.key, s.node_id) if self.donor.key else b"",
        )
        await ws.send_bytes(register.encode())
        first = await ws.receive(HEAD_HANDSHAKE_TIMEOUT_S)
        if first.type != aiohttp.WSMsgType.BINARY:
            return
        reply = wire.decode(first.data, wire.HEAD_TO_NODE)
        if isinstance(reply, wire.ErrorReply):
            log.error("head refused registration: %s", reply.message)
            self.exit_code = 2
            self.stop()
            return
        if not isinstance(reply, wire.NodeRegistered):
            raise ProtocolError(f"the head answered registration with {type(reply).__name__}")
        self.donor.key = reply.grant_key
        if reply.node_token:  # this node's own credential: what it reconnects with from now on
            self._head_token = reply.node_token
        self._ws = ws
        self._head_lost_at = None
        self.dispatcher.new_head_session()
        self._pending_credit.update(self.dispatcher.jobs)  # ask the new session for work again
        self._outgoing.set()  # and send what was produced without a head
        log.info("registered with %s as %s", s.head_url, s.node_id)
        try:
            async with asyncio.TaskGroup() as link:  # any of the three failing ends the session
                link.create_task(self._send_loop(ws), name="head-sender")
                link.create_task(self._state_loop(ws), name="state-pusher")
                link.create_task(self._receive_from_head(ws), name="head-receiver")
        except* _SessionOver:
            pass
        except* (aiohttp.ClientError, OSError):
            pass  # the connection dropped: the session loop connects again
        except* Exception as failed:  # a bug in one of them: say so, and start a fresh session
            self._failed_sessions += 1
            log.error("the link to the head failed; reconnecting", exc_info=failed)
        else:
            self._failed_sessions = 0

    async def _receive_from_head(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for frame in ws:
            if frame.type != aiohttp.WSMsgType.BINARY:
                break
            try:
                msg = wire.decode(frame.data, wire.HEAD_TO_NODE)
            except ProtocolError as e:
                log.error("bad frame from head: %s", e)
                continue
            if isinstance(msg, wire.ShutdownNode):
                self.stop()
                break
            self._handle(msg)
        raise _SessionOver()

    def _handle(self, msg: wire.Message) -> None:
        d = self.dispatcher
        if isinstance(msg, wire.InputBatch):
            if d.add_inputs(msg.job_id, msg.part()):
                self._set_status()
        elif isinstance(msg, wire.DirectFill):  # a client's large inputs that came through the head
            self.inputs_arrived(msg.job_id, msg.part(), straight=False)
        elif isinstance(msg, wire.AssignJob):
            job = d.assign(msg)
            if self.environment.missing(msg.packages):
                job.ready = False  # inputs queue up while the node installs what the job needs
                task = asyncio.create_task(self._install(job.job_id, msg.packages), name=f"install-{job.job_id}")
                self._installs.add(task)
                task.add_done_callback(self._installs.discard)
            self._queue_credit(job.job_id)
        elif isinstance(msg, wire.CreditWithdrawn):
            d.withdraw_credit(msg.job_id, msg.inputs)
            self._queue_credit(msg.job_id)  # asks again if its window has room (credit_due)
        elif isinstance(msg, wire.InputsPushed):
            d.inputs_pushed(msg.job_id)
        elif isinstance(msg, wire.CancelJob):
            interrupted = d.cancel(msg.job_id)
            if interrupted:
                loop = asyncio.get_running_loop()
                loop.call_later(HARD_KILL_AFTER_S, d.hard_kill_stragglers, msg.job_id, interrupted)
        elif isinstance(msg, wire.StealHint):
            self.thief.on_hint(msg)
        elif isinstance(msg, wire.ReleaseJob):
            d.release(msg.job_id)
            self._set_status()

    async def _install(self, job_id: str, packages: dict[str, str]) -> None:
        try:
            await self.environment.install(packages, lambda line: self.dispatcher.install_output(job_id, line))
        except Exception as e:  # the installer could not even start
            log.error("installing packages for job %s failed: %s", job_id, e)
            self.dispatcher.install_failed(job_id, pack_error(e, origin=self.dispatcher.origin()))
        else:
            self.dispatcher.install_done(job_id)

    def _drop_all_jobs(self) -> None:
        for job_id in list(self.dispatcher.jobs):
            self.dispatcher.cancel(job_id)
            self.dispatcher.release(job_id)
        self._set_status()

    # --- upward traffic ------------------------------------------------------------------

    def _held_result_bytes(self) -> int:
        """Bytes of the results waiting to be sent, and of those being sent (to the head or clients)."""
        waiting = sum(len(part.packed) for job in self.dispatcher.jobs.values() for part in job.out_results)
        return waiting + self._sending_bytes + self.result_pipes.held_bytes()

    def _queue_credit(self, job_id: str) -> None:
        self._pending_credit.add(job_id)
        self._outgoing.set()

    def _ask_for_more(self) -> None:
        """The pool grew: every job's window did too (NodeJob.window), ask for what it allows."""
        for job_id in self.dispatcher.jobs:
            self._queue_credit(job_id)

    async def _report_stolen(self, msg: wire.Stolen) -> None:
        """Tell the head inputs moved here, and wait until that is on the wire (before the ack)."""
        done = asyncio.get_running_loop().create_future()
        self._control.append((msg, done))
        self._outgoing.set()
        await asyncio.wait_for(done, STOLEN_REPORT_TIMEOUT_S)

    async def _send_loop(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        while True:
            await self._outgoing.wait()
            self._outgoing.clear()
            control, self._control = self._control, []
            for msg, done in control:
                await ws.send_bytes(msg.encode())
                if not done.done():
                    done.set_result(None)
            taken = self.dispatcher.take_outgoing()
            self._sending_bytes = sum(len(part.packed) for _, _, results in taken for part in results)
            while taken:
                try:
                    await self._send_results(ws, *taken[0])
                except BaseException:
                    # The session ended mid-send: what may not have gone out goes on the next one
                    # (the head keeps a result once), instead of running again elsewhere.
                    self._sending_bytes = 0
                    self.dispatcher.give_back(taken)
                    raise
                self._sending_bytes -= sum(len(part.packed) for part in taken.pop(0)[2])
                self.results_window.sent()
            credit_jobs, self._pending_credit = self._pending_credit, set()
            for job_id in credit_jobs:
                job = self.dispatcher.jobs.get(job_id)
                if job is None:
                    continue
                due = job.credit_due(self.pool.size)
                if due:
                    await ws.send_bytes(wire.Credit(job_id, due).encode())
            self._set_status()

    async def _send_results(self, ws: aiohttp.ClientWebSocketResponse, job_id: str, outputs: list,
                            results: list[packed_results.PackedResults]) -> None:
        if outputs:
            await ws.send_bytes(wire.OutputBatch(job_id, outputs).encode())
        # A frame is one step of the head's loop: results go in frames of limits.BATCH_ITEMS, and of
        # limits.RESULT_FRAME_BYTES, which the head can pass on to a client as they are.
        frames = packed_results.packed_frames(results)
        for frame in frames[:-1]:
            await ws_bulk.send_bulk(ws, wire.NodeResults.of(job_id, frame, 0).encode_parts())
        if frames:
            # The credit its freed slots allow rides along (it used to be a frame of its own).
            job = self.dispatcher.jobs.get(job_id)
            due = job.credit_due(self.pool.size) if job is not None else 0
            await ws_bulk.send_bulk(ws, wire.NodeResults.of(job_id, frames[-1], due).encode_parts())

    def upload_key(self) -> tuple[str, bytes]:
        return self.settings.node_id, self.donor.key

    def inputs_arrived(self, job_id: str, part: PackedInputs, straight: bool) -> list[int]:
        taken = self.dispatcher.fill(job_id, part, straight)
        if taken:
            self._set_status()
        return taken

    def runs(self, job_id: str) -> bool:
        return job_id in self.dispatcher.jobs

    def _set_status(self) -> None:
        busy = any(job.queue or job.inflight for job in self.dispatcher.jobs.values())
        status = NodeStatus.RUNNING if busy else NodeStatus.READY
        if status != self._status:
            self._status = status
            self._trims_due = IDLE_TRIMS if busy else self._trims_due
            self._state_changed.set()

    async def _state_loop(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        while True:
            try:  # not wait_for: 3.11's may swallow a cancel that meets a wake-up, and the loop go on
                async with asyncio.timeout(STATE_INTERVAL_S):
                    await self._state_changed.wait()
                await asyncio.sleep(STATE_SETTLE_S)
            except TimeoutError:
                pass
            self._state_changed.clear()
            if self._status == NodeStatus.READY and self._trims_due:
                # Idle: the heap's free pages (inputs and results passed through), for a few ticks
                # (what a job held is let go of over its release, its acks, its workers' last reports).
                self._trims_due -= 1
                give_back_memory()
            self.donor.expire(time.monotonic())
            self.pool.rebalance()  # a tenant with no job here for a while gives its workers back
            await ws.send_bytes(self.state().encode())

    def state(self) -> wire.NodeState:
        d = self.dispatcher
        jobs = [[j.job_id, d.running_calls(j), len(j.queue), j.done] for j in d.jobs.values()]
        cpu_percent, mem_percent, sent_bps, recv_bps = self.readings.machine()
        return wire.NodeState(
            node_id=self.settings.node_id, status=self._status, workers_alive=self.pool.alive_count(), jobs=jobs,
            cpu_percent=cpu_percent, mem_percent=mem_percent, net_sent_bps=sent_bps, net_recv_bps=recv_bps,
            gpu_percent=self.readings.gpu_usage[0], gpu_mem_percent=self.readings.gpu_usage[1],
            held_back=self.governor.held_back,
        )

    # --- worker callbacks ----------------------------------------------------------------

    def _on_worker_exit(self, worker, exit_code: int | None) -> None:
        if exit_code not in (0, None):
            log.warning("worker %s (pid %s) exited with %s; replacing it", worker.number, worker.pid, exit_code)
        self.dispatcher.on_worker_exit(worker, exit_code)
        self._state_changed.set()

class _Stop(Exception):
    pass


class _SessionOver(Exception):
    """The head's connection ended (closed, or it told this node to stop)."""
