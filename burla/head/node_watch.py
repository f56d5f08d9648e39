"""Watching the registered nodes: which went silent (declared dead), which sat idle past their
timeout (removed), and which idle ones to point at a peer still holding queued inputs (steal
hints). It owns when each node was last heard, since when it has been idle and when its state
was last kept in history; what to do with a lost node is the cluster's."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from burla.head.history.recorder import Recorder
from burla.head.links import NodeLink
from burla.head.machines.interface import Machines
from burla.head.scheduling.scheduler import Scheduler
from burla.head.scheduling.steals import steal_plan
from burla.protocol import grants, wire


class WatchedNodes(Protocol):
    """What the node watch uses of the cluster (head/cluster.py's `Cluster`)."""

    node_links: dict[str, NodeLink]
    scheduler: Scheduler
    record: Recorder
    machines: Machines

    def node_lost(self, node_id: str, pump: bool = True, replace: bool = True) -> None: ...

    def check_waiting(self, now: float, deadline_s: float) -> None: ...

log = logging.getLogger("burla.head")

INACTIVITY_CHECK_S = 0.5
STEAL_CHECK_S = 0.25
STEAL_HINT_COOLDOWN_S = 1.0  # about one state push: let the last steal show before hinting again
NODE_SAMPLES_PER_S = 100  # node states kept in history per second, across all nodes


class NodeWatch:
    def __init__(self, cluster: WatchedNodes) -> None:
        self._cluster = cluster
        self.last_heard: dict[str, float] = {}  # node id -> monotonic time of its last frame
        self.idle_since: dict[str, float] = {}  # node id -> since when it has had no running job
        self._hinted: dict[tuple[str, str], float] = {}  # (thief, job) -> when it was last hinted
        self._sampled_at: dict[str, float] = {}  # node id -> when its state was last kept in history

    def heard(self, node_id: str) -> None:
        self.last_heard[node_id] = time.monotonic()

    def forget(self, node_id: str) -> None:
        self.idle_since.pop(node_id, None)
        self.last_heard.pop(node_id, None)
        self._sampled_at.pop(node_id, None)

    def sample_period_s(self) -> float:
        """How often each node's state is kept in history (bounded to NODE_SAMPLES_PER_S in all)."""
        return max(1.0, len(self._cluster.node_links) / NODE_SAMPLES_PER_S)

    def sample_due(self, node_id: str) -> bool:
        """Whether to keep this node's state in history now: every second with up to
        NODE_SAMPLES_PER_S nodes, less often with more, so history's writes stay bounded."""
        now = time.monotonic()
        every = self.sample_period_s() * 0.9  # a push arriving early still counts
        if now - self._sampled_at.get(node_id, 0.0) < every:
            return False
        self._sampled_at[node_id] = now
        return True

    def stolen(self, thief_id: str, job_id: str) -> None:
        """The thief took what it was hinted at: it may be hinted again at once."""
        self._hinted.pop((thief_id, job_id), None)

    def job_ended(self, job_id: str) -> None:
        for key in [k for k in self._hinted if k[1] == job_id]:
            del self._hinted[key]

    def note_idleness(self, node_id: str) -> None:
        busy = any(node_id in job.assignments for job in self._cluster.scheduler.running.values())
        if busy:
            self.idle_since.pop(node_id, None)
        else:
            self.idle_since.setdefault(node_id, time.monotonic())

    async def reap_loop(self, deadline_s: float) -> None:
        """Drop nodes that stopped talking (frozen, cut off): their inputs go to live nodes."""
        cluster = self._cluster
        while True:
            await asyncio.sleep(min(1.0, deadline_s / 4))
            now = time.monotonic()
            for node_id, heard in list(self.last_heard.items()):
                if now - heard > deadline_s:
                    link = cluster.node_links.get(node_id)
                    log.warning("node %s silent for %.1f s; declaring it dead", node_id, now - heard)
                    cluster.record.node_event(node_id, "declared dead", f"silent for {now - heard:.1f} s")
                    cluster.node_lost(node_id)
                    if link is not None:
                        link.close()
                    cluster.machines.remove_machine(node_id, f"silent for {now - heard:.1f} s")
            cluster.check_waiting(now, deadline_s)

    async def inactivity_loop(
        self, timeout_of: Callable[[str], float | None], delete: Callable[[str], Awaitable[bool]]
    ) -> None:
        """Remove nodes idle past their timeout: through their driver, else by asking them to stop."""
        cluster = self._cluster
        while True:
            await asyncio.sleep(INACTIVITY_CHECK_S)
            now = time.monotonic()
            for node_id, since in list(self.idle_since.items()):
                if node_id not in cluster.node_links:
                    self.idle_since.pop(node_id, None)
                    continue
                self.note_idleness(node_id)
                timeout_s = timeout_of(node_id)
                if not timeout_s or node_id not in self.idle_since or now - since < timeout_s:
                    continue
                log.info("node %s idle for %.0f s; removing it", node_id, now - since)
                cluster.record.node_event(node_id, "removed", f"idle for {now - since:.0f} s")
                link = cluster.node_links.get(node_id)
                cluster.node_lost(node_id)
                self.idle_since.pop(node_id, None)
                if not await delete(node_id) and link is not None:
                    link.send(wire.ShutdownNode(f"idle for more than {timeout_s:g} s"))

    async def steal_loop(self) -> None:
        """Point idle nodes at peers that still hold queued inputs (they steal half)."""
        while True:
            await asyncio.sleep(STEAL_CHECK_S)
            self.hint_thieves(time.monotonic())

    def hint_thieves(self, now: float) -> None:
        cluster = self._cluster
        for thief_id, job_id, donor_id in steal_plan(cluster.scheduler.running, cluster.scheduler.nodes):
            if now - self._hinted.get((thief_id, job_id), 0.0) < STEAL_HINT_COOLDOWN_S:
                continue
            thief = cluster.node_links.get(thief_id)
            donor = cluster.scheduler.nodes.get(donor_id)
            if thief is None or donor is None:
                continue
            self._hinted[(thief_id, job_id)] = now
            transfer_id = grants.new_transfer_id(thief_id)
            expires_at = time.time() + grants.GRANT_TTL_S
            grant = grants.sign(donor.grant_key, job_id, donor_id, thief_id, transfer_id, expires_at)
            thief.send(wire.StealHint(job_id=job_id, donor_id=donor_id, donor_url=donor.url,
                                      donor_cert_sha256=donor.cert_sha256, transfer_id=transfer_id,
                                      expires_at=expires_at, grant=grant))
