"""What a registered node tells the head, taken only where it concerns that node's own work.

A node's connection speaks for that node alone (its token names it: burla.web.scoped_tokens),
and the head believes of it only what it gave the node: results of inputs pushed to it, granted
to it by a steal or kept by it across a restart (Scheduler.record_results); output of jobs it
runs; credit within what a node could hold (Scheduler.grant); a steal under a grant the head
signed for it (StolenReports). Anything else is dropped and logged, and the job goes on.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from burla.head.direct_uploads import DirectUploads
from burla.head.history.recorder import Recorder
from burla.head.links import ClientLink, NodeLink
from burla.head.machines.interface import Machines
from burla.head.node_watch import NodeWatch
from burla.head.scheduling.records import RUNNING, JobRecord
from burla.head.scheduling.scheduler import Scheduler
from burla.head.scheduling.steals import StolenReports, record_steal
from burla.protocol import wire
from burla.protocol.direct_inputs import DIRECT_MIN_BYTES
from burla.protocol.values.packed_inputs import PackedInputs
from burla.protocol.values.packed_results import INDEX, TIMING_BYTES, pack_indices, unpack_indices
from burla.web.connection_guard import RateLimitedLog

log = logging.getLogger("burla.head")


class ReportedTo(Protocol):
    """What NodeReports uses of the head's cluster (burla.head.cluster.Cluster)."""

    watch: NodeWatch
    scheduler: Scheduler
    record: Recorder
    machines: Machines
    client_links: dict[str, ClientLink]
    node_links: dict[str, NodeLink]
    direct: DirectUploads

    def send_pushes(self, pushes: list[tuple[str, str, PackedInputs]]) -> None: ...

    def accept_results(self, node_id: str | None, job: JobRecord, items: list) -> list: ...

    def output(self, msg: wire.OutputBatch) -> None: ...

    def node_lost(self, node_id: str, pump: bool = True, replace: bool = True) -> None: ...


MAX_CALL_RECORDS = 100_000  # per job: when each call ran, where, how long, in how many tries (history)
HOLDS_BACK = "holds back calls"  # node events: its governor runs fewer calls than its jobs could use
HOLDS_BACK_NO_MORE = "holds back no more"


def calls_of(msg: wire.NodeResults, fresh: list) -> tuple[bytes, bytes, bytes]:
    """The indices, failed indices and timings of the `fresh` results among those `msg` brought."""
    position = {index: at for at, index in enumerate(unpack_indices(msg.indices))}
    indices = [item[0] for item in fresh]
    timings = b"".join(msg.timings[TIMING_BYTES * position[i]:TIMING_BYTES * (position[i] + 1)] for i in indices)
    return pack_indices(indices), pack_indices([item[0] for item in fresh if not item[1]]), timings


class NodeReports:
    def __init__(self, cluster: ReportedTo) -> None:
        self._cluster = cluster
        self._stolen = StolenReports()
        self._refused = RateLimitedLog(log)

    def on_message(self, node_id: str, msg: wire.Message) -> None:
        cluster = self._cluster
        cluster.watch.heard(node_id)
        if isinstance(msg, wire.NodeResults):
            self._on_results(node_id, msg)
        elif isinstance(msg, wire.OutputBatch):
            self._on_output(node_id, msg)
        elif isinstance(msg, wire.Credit):
            cluster.scheduler.grant(node_id, msg.job_id, msg.inputs)
            cluster.send_pushes(cluster.scheduler.plan_for(node_id, msg.job_id))  # only this node can take more
        elif isinstance(msg, wire.NodeState):
            self._on_state(node_id, msg)
        elif isinstance(msg, wire.Stolen):
            self._on_stolen(node_id, msg)
        elif isinstance(msg, wire.NodeLeaving):
            self._on_leaving(node_id, msg)

    def _on_results(self, node_id: str, msg: wire.NodeResults) -> None:
        cluster = self._cluster
        job = cluster.scheduler.jobs.get(msg.job_id)
        if job is not None and job.status == RUNNING:
            if msg.failed or job.spec.detach or not self._pass_on(node_id, job, msg):
                # Decoded, and checked against the indices and failures they came with, only here.
                fresh = cluster.accept_results(node_id, job, msg.part().items("NodeResults"))
                if fresh:
                    self._record_calls(job, node_id, *calls_of(msg, fresh))
            count = len(msg.indices) // INDEX.size
            if job.spec.direct_results and count and len(msg.packed) >= DIRECT_MIN_BYTES * count:
                cluster.direct.offer_results(job, node_id)  # results this large: the client may take them there
        if msg.credit:
            cluster.scheduler.grant(node_id, msg.job_id, msg.credit)
            cluster.send_pushes(cluster.scheduler.plan_for(node_id, msg.job_id))

    def _pass_on(self, node_id: str, job: JobRecord, msg: wire.NodeResults) -> bool:
        """The common case: results that all succeeded, each the first for its input, of inputs
        the node holds, go to the client as the node packed them. False (nothing changed) when
        they need a closer look."""
        cluster = self._cluster
        if not cluster.scheduler.record_successes(node_id, job, msg.indices, msg.runs):
            return False
        link = cluster.client_links.get(job.job_id)
        if link is not None:
            link.deliver_packed(len(msg.indices) // INDEX.size, msg.packed)
        self._record_calls(job, node_id, msg.indices, b"", msg.timings)
        return True

    def _record_calls(self, job: JobRecord, node_id: str, indices: bytes, failed: bytes, timings: bytes) -> None:
        """Per-call records for history: a job's first MAX_CALL_RECORDS calls."""
        record = self._cluster.record
        room = MAX_CALL_RECORDS - job.calls_recorded
        if not record.keeps or room <= 0:
            return
        count = len(indices) // INDEX.size
        if count > room:
            indices, timings = indices[:INDEX.size * room], timings[:TIMING_BYTES * room]
            count = room
        job.calls_recorded += count
        tries = None
        if job.retried:
            tries = {i: job.retried[i] for i in unpack_indices(indices) if i in job.retried}
        record.calls(job.job_id, node_id, indices, failed, timings, tries)

    def _on_output(self, node_id: str, msg: wire.OutputBatch) -> None:
        job = self._cluster.scheduler.jobs.get(msg.job_id)
        if job is not None and node_id not in job.assignments:
            self._refused.warning("node %s sent output for job %s, which it does not run: dropped", node_id,
                                  msg.job_id)
            return
        self._cluster.output(msg)

    def _on_state(self, node_id: str, msg: wire.NodeState) -> None:
        cluster = self._cluster
        if msg.node_id != node_id:
            self._refused.warning("node %s sent the state of node %s: dropped", node_id, msg.node_id)
            return
        before = cluster.scheduler.nodes.get(node_id)
        if before is not None and before.held_back != msg.held_back:  # kept for `burla jobs metrics`
            cluster.record.node_event(node_id, HOLDS_BACK if msg.held_back else HOLDS_BACK_NO_MORE, msg.held_back)
        cluster.scheduler.update_state(msg)
        cluster.watch.note_idleness(node_id)
        if cluster.watch.sample_due(node_id):
            running = sum(r for _, r, _, _ in msg.jobs)
            cluster.record.node_sample(node_id, msg.cpu_percent, msg.mem_percent, msg.net_sent_bps,
                                       msg.net_recv_bps, msg.workers_alive, running, msg.gpu_percent,
                                       msg.gpu_mem_percent)

    def _on_stolen(self, node_id: str, msg: wire.Stolen) -> None:
        cluster = self._cluster
        job = cluster.scheduler.jobs.get(msg.job_id)
        if job is not None:
            why = self._stolen.refusal(node_id, msg, cluster.scheduler.nodes.get(msg.donor_id), time.time())
            if why is not None:
                self._refused.warning("node %s reported a steal from %s of job %s that is not believed: %s",
                                      node_id, msg.donor_id, msg.job_id, why)
                return
            record_steal(node_id, job, msg.donor_id, msg.indices)
        cluster.watch.stolen(node_id, msg.job_id)

    def _on_leaving(self, node_id: str, msg: wire.NodeLeaving) -> None:
        cluster = self._cluster
        log.info("node %s is leaving: %s", node_id, msg.reason)
        cluster.record.node_event(node_id, "leaving", msg.reason)
        link = cluster.node_links.get(node_id)
        cluster.node_lost(node_id)  # its inputs go to other nodes now, not after the deadline
        if link is not None:
            link.close()
        cluster.machines.remove_machine(node_id, msg.reason)
