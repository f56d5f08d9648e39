"""The head's side of large inputs sent straight to their node (burla.protocol.direct_inputs).

Placeholders go through the head as any input. Once it has pushed some to a node, it tells the
job's client where they went (`UploadDirect`), with a grant signed with that node's key for that
node and job; the client sends their bytes there. The head offers a node's address only
where the client can reach that very node: one the node's own connection to the head came from
(not a tunnel's end, nor a NAT's), and then a node serving https (the client pins its
certificate, so no other machine at that address can take the bytes), or one on this machine's
loopback when the client is on it too. Otherwise, and wherever the client's sending fails, the
bytes come through the head (`DirectFallback`), which passes on those still in flight on that
node (`DirectFill`).
"""

from __future__ import annotations

import ipaddress
import time
from typing import Protocol

from yarl import URL

from burla.head.links import ClientLink, NodeLink
from burla.head.scheduling.records import JobRecord, NodeRecord
from burla.head.scheduling.scheduler import Scheduler
from burla.protocol import grants, wire
from burla.protocol.direct_inputs import placeholders_in
from burla.protocol.direct_wire import UPLOAD_GRANT_TTL_S
from burla.protocol.values.packed_inputs import PackedInputs, gather, pack_uints


class Links(Protocol):
    """What the head's side of direct uploads uses of the cluster (head/cluster.py's `Cluster`)."""

    scheduler: Scheduler
    node_links: dict[str, NodeLink]
    client_links: dict[str, ClientLink]


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def reachable_url(node: NodeRecord, client_local: bool) -> str:
    """The node's address if the job's client may send it inputs there ("" if not). A node whose
    connection came from another address than the one it gives (a laptop head's VMs reach it
    through SSH tunnels from private addresses nothing here routes to) gets them through the head."""
    try:
        host = URL(node.url).host if node.url else None
    except ValueError:  # an address no client could use (a node's --advertise-url is its own word)
        return ""
    if not host or not _same_host(host, node.peer_host):
        return ""
    if node.cert_sha256:
        return node.url
    return node.url if client_local and is_loopback(host) else ""


def _same_host(advertised: str, peer: str) -> bool:
    if is_loopback(advertised) and is_loopback(peer):
        return True
    try:
        return ipaddress.ip_address(advertised.strip("[]")) == ipaddress.ip_address(peer)
    except ValueError:
        return advertised == peer


class DirectUploads:
    def __init__(self, cluster: Links) -> None:
        self._cluster = cluster

    def pushed(self, node_id: str, job: JobRecord, part: PackedInputs) -> None:
        """A push to a node: tell the client where its placeholders went."""
        found = placeholders_in(part)
        if found:
            self._tell_client(job, node_id, found)

    def client_back(self, job: JobRecord) -> None:
        """A client back on its job: where every placeholder in flight went, once more (those whose
        bytes came already are sent again and dropped by their node: a connection that was cut may
        have lost what the head had told it)."""
        if not job.spec.direct_inputs:
            return
        for node_id, assignment in job.assignments.items():
            found = placeholders_in(gather(assignment.inflight.items()))
            if found:
                self._tell_client(job, node_id, found)

    def fallback(self, job: JobRecord, msg: wire.DirectFallback) -> None:
        """Inputs the client could not send to their node: passed on if still in flight there."""
        assignment = job.assignments.get(msg.node_id)
        link = self._cluster.node_links.get(msg.node_id)
        if assignment is None or link is None:
            return  # the node is gone: its placeholders were pushed again (and the client told again)
        inflight = assignment.inflight
        items = [(index, data) for index, data in msg.part().items() if index in inflight]
        if items:
            link.send(wire.DirectFill.of(job.job_id, PackedInputs.of(items)))

    def offer_results(self, job: JobRecord, node_id: str) -> None:
        """A node's results are large: its client may take them there itself, once per node and job
        (burla.protocol.direct_results), where it can reach that node."""
        if node_id in job.results_offered:
            return
        found = self._address(job, node_id)
        if found is None:
            return  # the client is away: offered when the next such results come
        link, node, url = found
        job.results_offered.add(node_id)
        if url:
            expires_at, grant = self._grant(node, job, node_id)
            link.send(wire.DirectOffer(job.job_id, node_id, url, node.cert_sha256, expires_at, grant))

    def _address(self, job: JobRecord, node_id: str) -> tuple[ClientLink, NodeRecord, str] | None:
        """The job's client, the node, and the node's address for that client ("": it can't reach it)."""
        link = self._cluster.client_links.get(job.job_id)
        node = self._cluster.scheduler.nodes.get(node_id)
        if link is None or node is None:
            return None
        return link, node, reachable_url(node, link.client_local)

    @staticmethod
    def _grant(node: NodeRecord, job: JobRecord, node_id: str) -> tuple[float, bytes]:
        expires_at = time.time() + UPLOAD_GRANT_TTL_S
        return expires_at, grants.sign_upload(node.grant_key, job.job_id, node_id, expires_at)

    def _tell_client(self, job: JobRecord, node_id: str, found: list[tuple[int, int]]) -> None:
        address = self._address(job, node_id)
        if address is None:
            return
        link, node, url = address
        expires_at, grant = self._grant(node, job, node_id) if url else (time.time() + UPLOAD_GRANT_TTL_S, b"")
        indices, sizes = zip(*found)
        link.send(wire.UploadDirect(job.job_id, pack_uints(indices), pack_uints(sizes), b"", node_id, url,
                                    node.cert_sha256 if url else b"", expires_at, grant))
