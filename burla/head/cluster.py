"""The head's event handlers: they feed the scheduler and carry out what it decides.

The WebSocket handlers (head/routes/sockets.py) call these synchronously as frames arrive; the only I/O here is
queuing frames on links, so a handler never waits on a slow peer.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict

from burla.errors import BurlaError, HeadUnreachable, JobNotFound, ProtocolError, Unauthorized
from burla.head import messages
from burla.head.client_watch import ClientWatch
from burla.head.direct_uploads import DirectUploads
from burla.head.history.queries import HEAD_STOPPED
from burla.head.history.recorder import NoRecord, Recorder
from burla.head.history.store import History
from burla.head.idle_collector import IdleCollector
from burla.head.links import ClientLink, NodeLink, WriteTurns
from burla.head.machines.interface import Machines, NoMachines
from burla.head.node_reports import NodeReports
from burla.head.node_watch import NodeWatch
from burla.head.restart_recovery import REJOIN_GRACE_S, RestartRecovery
from burla.head.routes.view_builders import job_view
from burla.head.scheduling.held_inputs import mark_client_held, take_up_held
from burla.head.scheduling.records import CANCELED, COMPLETED, FAILED, RUNNING, JobRecord, NodeRecord
from burla.head.scheduling.retries import with_attempts
from burla.head.scheduling.scheduler import Scheduler
from burla.process.build import build_hash
from burla.protocol import wire
from burla.protocol.states import EndKind, JobStatus
from burla.protocol.values.packed_inputs import PackedInputs
from burla.protocol.views import JobView
from burla.web import scoped_tokens

log = logging.getLogger("burla.head")

FINISHED_JOBS_KEPT = 1000
SHUTDOWN_NOTICE_S = 1.0


class Cluster:
    def __init__(self, version: str, history: History | None = None, token: str | None = None) -> None:
        self.version = version
        # What the head derives scoped credentials from (burla.web.scoped_tokens): job tokens for
        # calls, job secrets for clients. A head without one (tests of the cluster alone) makes one up.
        self.token = token or secrets.token_urlsafe(32)
        self.build = build_hash()  # nodes must run exactly this build
        self.history = history  # what a head keeps (None with --no-history): for queries
        self.record: Recorder = history if history is not None else NoRecord()  # where it records what happens
        self.scheduler = Scheduler()
        self.idle_collector = IdleCollector(lambda: bool(self.scheduler.running))
        self.node_links: dict[str, NodeLink] = {}
        self.node_writes = WriteTurns()  # shared by the node links: frames written per loop turn
        self.client_links: dict[str, ClientLink] = {}
        self.job_times: dict[str, tuple[float, float | None]] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        self.booting_since: dict[str, float] = {}  # node id -> when its driver started it
        self.rejoining: dict[str, float] = {}  # node id -> when its connection dropped (it may come back)
        # node id -> why: its driver saw its process end while its connection still looked open
        # (on a busy machine the exit can be seen first); when that connection drops, it is lost.
        self.exited: dict[str, str] = {}
        self.watch = NodeWatch(self)  # liveness, idleness and steal hints
        self.reports = NodeReports(self)  # what registered nodes send, checked against what they hold
        self.clients = ClientWatch(self)  # progress to clients and history, and clients that left
        self.machines: Machines = NoMachines()  # the fleet, once it is made (use_machines)
        self.recovery = RestartRecovery(self)  # jobs kept in history, taken up after a restart
        self.direct = DirectUploads(self)  # large inputs a client sends straight to their nodes
        self.stopping = False  # set by shut_down: connections that close now are not node losses

    # --- pushing inputs ------------------------------------------------------------------

    def pump(self) -> None:
        self.send_pushes(self.scheduler.plan())

    def send_pushes(self, pushes: list[tuple[str, str, PackedInputs]]) -> None:
        jobs = self.scheduler.jobs
        for node_id, job_id, part in pushes:
            link = self.node_links.get(node_id)
            if link is not None:
                link.send(wire.InputBatch.of(job_id, part))
                job = jobs.get(job_id)
                if job is not None and job.spec.direct_inputs:
                    self.direct.pushed(node_id, job, part)
        for node_id, job_id, inputs in self.scheduler.take_withdrawn():  # after the inputs they go with
            link = self.node_links.get(node_id)
            if link is not None:
                link.send(wire.CreditWithdrawn(job_id, inputs))
        for job in self.scheduler.take_all_pushed():
            if len(job.assignments) < 2:
                continue  # its one node's bound (the job's size) is exact already: no frame for it
            frame = wire.InputsPushed(job.job_id).encode()
            for node_id in job.assignments:
                link = self.node_links.get(node_id)
                if link is not None:
                    link.send_frame(frame)

    # --- nodes ---------------------------------------------------------------------------

    def node_registered(self, msg: wire.RegisterNode, link: NodeLink, grant_key: bytes,
                        peer_host: str = "") -> NodeRecord:
        old = self.node_links.get(msg.node_id)
        if old is not None:
            # Back before its old connection's end was noticed: that session ends now. Its inputs go
            # back to the queue without being pushed anywhere (what the node still holds is taken
            # up again below), and its jobs wait for it as for a rejoining node meanwhile.
            old.close()
            self.booting_ids.add(msg.node_id)
            self.node_lost(msg.node_id, pump=False, replace=False)
        node = NodeRecord.from_register(msg, grant_key, peer_host)
        self.node_links[msg.node_id] = link
        self.exited.pop(msg.node_id, None)
        self.watch.heard(msg.node_id)
        self.booting_ids.discard(msg.node_id)
        self.booting_since.pop(msg.node_id, None)
        for job, _ in self.scheduler.add_node(node, {job_id for job_id, _ in msg.held}):
            self._send_assignment(link, job, node.node_id)
        self._adopt_held(msg, link)
        log.info("node %s registered (%d slots, %s)", node.node_id, node.slots, node.url)
        self.idle_collector.changed()
        self.pump()  # its first window is granted with AssignJob: fill it now, it may never ask
        self.record.node_event(node.node_id, "registered", f"{node.slots} slots at {node.url}")
        self._end_unrunnable()  # the job's last candidate finished booting and can't run it
        return node

    def _end_unrunnable(self) -> None:
        """No job waits for a node that will never come (Scheduler.unrunnable says which)."""
        for job, kind, why in self.scheduler.unrunnable():
            self.end_job(job, FAILED, kind, why)

    def _adopt_held(self, msg: wire.RegisterNode, link: NodeLink) -> None:
        """What a node kept running while it had no head: inputs of jobs this head runs stay on it
        (their results follow); jobs this head does not run (ended, or unknown) stop there."""
        for job_id in take_up_held(self.scheduler.jobs, msg.node_id, msg.held):
            link.send(wire.CancelJob(job_id, "the head does not run this job (any more)"))
            link.send(wire.ReleaseJob(job_id))
        if msg.held:
            log.info("node %s came back holding inputs of %d job(s)", msg.node_id, len(msg.held))
        self.recovery.node_back(msg.node_id)

    def node_lost(self, node_id: str, pump: bool = True, replace: bool = True) -> None:
        self.node_links.pop(node_id, None)
        self.exited.pop(node_id, None)
        self.idle_collector.changed()
        if self.stopping:
            return
        self.watch.forget(node_id)
        for job, given_up in self.scheduler.remove_node(node_id):
            if given_up:
                self.accept_results(None, job, [[i, False, messages.node_loss_error(i, job)] for i in given_up])
            if replace:  # its share goes to nodes the job left out (it wants no more slots than inputs)
                for joined_id, _ in self.scheduler.top_up(job):
                    link = self.node_links.get(joined_id)
                    if link is not None:
                        self._send_assignment(link, job, joined_id)
            if job.status == RUNNING and not job.assignments and self.scheduler.booting == 0:
                self.end_job(job, FAILED, EndKind.NODE_DISCONNECTED, messages.nodes_lost_reason(job, node_id))
        log.info("node %s left", node_id)
        self.record.node_event(node_id, "left")
        self._end_unrunnable()
        if pump:
            self.pump()

    @property
    def booting_ids(self) -> set[str]:
        """Nodes a driver is starting (the scheduler's set: jobs may wait for them)."""
        return self.scheduler.booting_ids

    def use_machines(self, machines: Machines) -> None:
        self.machines = machines

    def expect_nodes(self, node_ids: list[str], host_id: str = "") -> None:
        """A driver is starting these nodes; jobs may wait for them instead of failing. `host_id`:
        theirs when known ahead (nodes on the head's own machine)."""
        self.booting_ids.update(node_ids)
        now = time.monotonic()
        for node_id in node_ids:
            self.booting_since.setdefault(node_id, now)
            if host_id:
                self.scheduler.booting_hosts[node_id] = host_id

    def node_dropped(self, node_id: str) -> None:
        """The node's connection closed without a goodbye. Its inputs go elsewhere now, but it may be
        back in a moment (a network blip, a re-established SSH tunnel): jobs wait for it as for a
        booting node, up to the node deadline (see NodeWatch.reap_loop). A stopping head loses no node: its
        jobs stay as they are for the head that starts next."""
        if self.stopping:
            self.node_lost(node_id)
            return
        exited = self.exited.pop(node_id, None)
        self.rejoining[node_id] = time.monotonic()
        self.booting_ids.add(node_id)
        self.node_lost(node_id)
        if exited is not None:  # its process is gone: it will not be back
            self.node_boot_failed(node_id, exited, what="lost")

    def node_boot_failed(self, node_id: str, why: str, what: str | None = None) -> None:
        """A node a job may wait for (booting, or gone and expected back) won't come: stop waiting.
        `what` happened: by default "lost" for a node that ran (its process died), else "failed to boot"."""
        was_running = self.rejoining.pop(node_id, None) is not None
        if node_id not in self.booting_ids:
            if node_id in self.node_links:
                self.exited[node_id] = why  # seen before its connection's end: node_dropped finishes this
            return
        what = what or ("lost" if was_running else "failed to boot")
        log.warning("node %s %s: %s", node_id, what, why)
        self.record.node_event(node_id, what, why)
        self.booting_ids.discard(node_id)
        self.booting_since.pop(node_id, None)
        if self.scheduler.booting == 0 and not self.scheduler.nodes:
            for job in list(self.scheduler.jobs.values()):
                if job.status == RUNNING and not job.assignments and was_running:
                    reason = messages.nodes_lost_reason(job, f"{node_id}, {why}")
                    self.end_job(job, FAILED, EndKind.NODE_DISCONNECTED, reason)
                elif job.status == RUNNING and not job.assignments:
                    self.end_job(job, FAILED, EndKind.NO_NODES,
                                 f"No node is left for this job: {node_id} {what}: {why}")
        self._end_unrunnable()

    def check_waiting(self, now: float, deadline_s: float) -> None:
        """What waits for nodes: jobs taken up after a restart, and dropped nodes that may rejoin."""
        self.recovery.end_jobs_without_nodes(now)
        self.recovery.release(now)
        for node_id, dropped in list(self.rejoining.items()):
            if node_id not in self.booting_ids:
                self.rejoining.pop(node_id, None)  # it came back (or its driver gave up on it)
            elif now - dropped > max(deadline_s, REJOIN_GRACE_S):
                self.node_boot_failed(node_id, f"its connection dropped and it did not come back within "
                                               f"{max(deadline_s, REJOIN_GRACE_S):g} s", what="lost")
                self.machines.remove_machine(node_id, "its connection dropped and it did not come back")

    def on_node_message(self, node_id: str, msg: wire.Message) -> None:
        self.reports.on_message(node_id, msg)

    def output(self, msg: wire.OutputBatch) -> None:
        """Output for a job's client and history: a node's (checked by NodeReports), or the head's own word."""
        job = self.scheduler.jobs.get(msg.job_id)
        if job is None or job.status != RUNNING:
            return
        link = self.client_links.get(msg.job_id)
        if link is not None:
            link.deliver(msg.items, [])
        self.record.output(job.job_id, msg.items)

    def accept_results(self, node_id: str | None, job: JobRecord, items: list) -> list:
        """Take a node's results (or the head's own word, `node_id` None); returns those that were
        new, which go to the client and history."""
        if job.status != RUNNING:
            return []
        queued = len(job.pending)
        fresh = with_attempts(job, self.scheduler.record_results(node_id, job, items))
        if len(job.pending) > queued:  # failed tries queued again (retries)
            self.pump()
        if not fresh:
            return []
        if job.n_failed:
            self.record.failures(job.job_id, fresh)
        if job.spec.detach:  # kept until get_results collects them
            self.record.keep_results(job.job_id, fresh)
        link = self.client_links.get(job.job_id)
        if link is not None:
            link.deliver([], fresh)
        if job.spec.detach and job.n_done >= job.n_inputs:  # results wait for get_results
            self.end_job(job, COMPLETED, EndKind.NONE, "")
            return fresh
        if job.spec.raise_errors:
            failed = next((item for item in fresh if not item[1]), None)
            if failed is not None:
                self.end_job(job, FAILED, EndKind.CALL_FAILED, f"input {failed[0]} raised an exception")
        return fresh

    # --- clients -------------------------------------------------------------------------

    def open_job(self, spec: wire.OpenJob) -> tuple[JobRecord, ClientLink]:
        """Admit the job, assign it, and queue (and push) the inputs its opening carries; those
        were checked with the opening (sockets._validate_open)."""
        if self.stopping:  # its nodes' connections are going: nothing would run it
            raise HeadUnreachable("the head is stopping (a restart or shutdown); run the job again once it is back")
        first_inputs = spec.first_inputs
        if first_inputs:  # inputs, not part of the job's spec (which history keeps for a restart)
            spec = spec.replace(first_inputs=[])
        self.machines.prepare_job(spec)  # grow, or restart local nodes removed for idleness
        job = self.scheduler.admit(spec)
        link = ClientLink(spec.job_id)
        self.client_links[spec.job_id] = link
        self.job_times[spec.job_id] = (time.time(), None)
        self.assign(job)
        if first_inputs:  # pushed before the bookkeeping below: the node can start at once
            try:
                self.add_inputs(job, PackedInputs.of(first_inputs))
            except BurlaError as e:
                self.cancel(job.job_id, f"its first inputs were refused: {e}")
                self.client_left(job, link)  # no client will attach to it
                raise
        log.info("job %s admitted: %d inputs on %d node(s)", spec.job_id, spec.n_inputs, len(job.assignments))
        self.clients.record_job(job)
        self.record.job_opened(spec.job_id, job.spec.encode())  # a restarted head takes it up again (as admitted)
        return job, link

    def assign(self, job: JobRecord) -> None:
        """Tell every node the scheduler gave a share of `job` to run it."""
        # (parallelism, slots) -> the encoded AssignJob (its function may be large)
        frames: dict[tuple[int, int], bytes] = {}
        for node_id, assignment in job.assignments.items():
            link = self.node_links.get(node_id)
            if link is not None:
                key = (assignment.parallelism, assignment.slots)
                frame = frames.get(key)
                if frame is None:
                    frame = frames[key] = messages.assign_message(job.spec, assignment, self.token).encode()
                link.send_frame(frame)

    def _send_assignment(self, link: NodeLink, job: JobRecord, node_id: str) -> None:
        """A running job's share for a node that joins it."""
        link.send(messages.assign_message(job.spec, job.assignments[node_id], self.token))
        if job.all_pushed:  # its credit brings no more inputs than the others' does
            link.send(wire.InputsPushed(job.job_id))

    def resume_job(self, msg: wire.ResumeJob, nested_in_token: bool = False) -> tuple[JobRecord, ClientLink,
                                                                                       wire.JobResumed]:
        """A client comes back (after a network cut, or to collect a detached job's results): the
        one that opened the job (which heard its secret), a holder of the cluster token, or the
        calls of a job this one is nested in (`nested_in_token`: their token's tree holds it)."""
        if not nested_in_token and not scoped_tokens.secret_matches(self.token, msg.job_id, msg.secret):
            raise Unauthorized(f"resuming job {msg.job_id!r} takes its secret (JobAccepted.job_secret), which the "
                               "client that opened it holds and the cluster token derives")
        job = self.scheduler.jobs.get(msg.job_id)
        link = self.client_links.get(msg.job_id)
        if job is None or link is None:
            raise JobNotFound(
                f"this head has no results waiting for job {msg.job_id!r}: it never ran here, its "
                "results were already collected, or it was not detached and its client is gone (only a "
                "detached job's results wait for `burla jobs results`; with --no-history, not past a restart)."
            )
        link.patience_s = None  # back: a later disconnect gets the usual client deadline
        # Batches are numbered after what the client acknowledged: a restarted head counts from 0
        # again (on one that did not restart, its numbers are past the client's already).
        link.continue_after(msg.acked_seq)
        if job.restored and job.status == RUNNING:  # this head restarted: the client says what it has
            if not msg.held:
                raise ProtocolError("a job taken up after a restart needs ResumeJob.held")
            link.acked, client_states = mark_client_held(job, msg.held)
            # A returning node may have sent results the client already holds: they would count
            # twice towards the acknowledgements that end the job.
            link.forget_results(client_states)
            log.info("job %s resumed by its client, which holds %d of %d results", job.job_id, link.acked,
                     job.n_inputs)
            if link.acked >= job.n_inputs:
                self.end_job(job, COMPLETED, EndKind.NONE, "")
        else:
            # As any acknowledgement: one that covers every result ends the job (the client's last
            # may have been lost with the connection it went on, and it waits to hear the end).
            self.ack(job, msg.acked_seq)
        if job.spec.detach and job.received >= job.n_inputs:  # a detaching client cut before it heard
            self._confirm_inputs_kept(job)
        if job.status != RUNNING:  # it ended while the client was away: say so after the results
            link.send(wire.JobEnded(job.job_id, job.status, job.end_kind, job.reason))
        return job, link, messages.resumed_message(job)

    def add_inputs(self, job: JobRecord, part: PackedInputs) -> None:
        if job.status != RUNNING:
            return
        self.scheduler.add_packed(job, part)
        if job.spec.detach:  # its client won't be there to send them again
            self.record.keep_inputs(job.job_id, part.items())
            if job.received >= job.n_inputs:
                self._confirm_inputs_kept(job)
        self.pump()

    def _confirm_inputs_kept(self, job: JobRecord) -> None:
        """Tell a detaching client its inputs are safe once history holds them: it may leave then."""
        job_id, count = job.job_id, job.received

        def confirm() -> None:
            link = self.client_links.get(job_id)
            if link is not None:
                link.send(wire.InputsKept(job_id, count))

        self.record.after_flush(confirm)

    def ack(self, job: JobRecord, seq: int) -> None:
        link = self.client_links.get(job.job_id)
        if link is None:
            return
        link.ack(seq)
        if link.acked >= job.n_inputs or (job.status != RUNNING and not link.unacked_results()):
            if job.status == RUNNING:
                # The client holds every result and stopped listening with its last ack.
                self.end_job(job, COMPLETED, EndKind.NONE, "", tell_client=False)
            self.client_links.pop(job.job_id, None)  # everything is delivered
            if job.spec.detach:
                self.record.job_closed(job.job_id)  # collected: nothing left to keep

    def cancel(self, job_id: str, reason: str) -> bool:
        job = self.scheduler.jobs.get(job_id)
        if job is None or job.status != RUNNING:
            return False
        self.end_job(job, CANCELED, EndKind.JOB_CANCELED, reason or "canceled")
        return True

    def client_left(self, job: JobRecord, link: ClientLink) -> None:
        """The client's connection ended; the job waits `client_deadline_s` for it to resume."""
        if link.attached:
            return  # a newer connection already took over
        if self.client_links.get(job.job_id) is link and job.status != RUNNING and not job.spec.detach:
            if job.status != COMPLETED or link.unacked_results() == 0:
                self.client_links.pop(job.job_id, None)

    def end_job(self, job: JobRecord, status: JobStatus, kind: EndKind, reason: str, tell_client: bool = True) -> None:
        was_running = job.status == RUNNING
        released = self.scheduler.finish(job, status, reason)
        if not was_running:
            return
        self.idle_collector.changed()
        job.end_kind = kind
        started, _ = self.job_times.get(job.job_id, (time.time(), None))
        self.job_times[job.job_id] = (started, time.time())
        for node_id in released:
            link = self.node_links.get(node_id)
            if link is None:
                continue
            if status != COMPLETED:
                link.send(wire.CancelJob(job.job_id, reason))
            link.send(wire.ReleaseJob(job.job_id))
        client = self.client_links.get(job.job_id) if tell_client else None
        if client is not None:
            if status != COMPLETED:  # a completed job's client has counted every result itself
                self.clients.send_progress(job, client, force=True)
            client.send(wire.JobEnded(job.job_id, status, kind, reason))
        self._cancel_children(job)
        log.info("job %s %s%s", job.job_id, status, f": {reason}" if reason else "")
        self.clients.record_job(job)
        if not job.spec.detach or job.n_done == 0:  # a detached job's results (if any) wait to be collected
            self.record.job_closed(job.job_id)
        self._finished[job.job_id] = None
        while len(self._finished) > FINISHED_JOBS_KEPT:
            old, _ = self._finished.popitem(last=False)
            self.scheduler.forget(old)
            self.record.job_closed(old)
            self.job_times.pop(old, None)
            self.client_links.pop(old, None)
        self.watch.job_ended(job.job_id)
        self.pump()

    async def shut_down(self) -> None:
        """The head is stopping. With history, running jobs stay in it and a restarted head takes
        them up (their clients reconnect, detached jobs' inputs and results are kept there);
        without, they end clearly. Clients get a moment to receive what is already here."""
        self.stopping = True  # from here on, closing connections end no job and lose no node
        for node_id in self.node_links:  # they keep running what they hold, for the next head
            self.record.node_event(node_id, HEAD_STOPPED)
        for job in list(self.scheduler.jobs.values()):
            if job.status != RUNNING:
                continue
            if self.history is None:
                self.end_job(job, FAILED, EndKind.JOB_FAILED, messages.HEAD_STOPPED_WITHOUT_HISTORY)
        deadline = time.monotonic() + SHUTDOWN_NOTICE_S
        while any(link.pending_frames() for link in self.client_links.values() if link.attached):
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.02)

    def _cancel_children(self, parent: JobRecord) -> None:
        """A parent that ends early takes its running nested jobs with it."""
        if parent.status == COMPLETED:
            return
        for job in list(self.scheduler.running.values()):
            if job.spec.parent_job_id == parent.job_id:
                self.end_job(job, CANCELED, EndKind.JOB_CANCELED,
                             f"its parent job {parent.job_id} ended {parent.status}")

    # --- views for HTTP ------------------------------------------------------------------

    def waiting_for_nodes(self, job: JobRecord) -> int:
        """How many booting nodes a job that has no node yet waits for (0 for any other job)."""
        return len(self.booting_ids) if job.status == RUNNING and not job.assignments else 0

    def job_view(self, job: JobRecord) -> JobView:
        return job_view(job, self.scheduler.nodes, self.job_times.get(job.job_id, (None, None)), len(self.booting_ids))
