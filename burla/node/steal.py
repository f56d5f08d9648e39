"""Work stealing between nodes (DESIGN.md §3).

When the head has nothing left to push for a job, it hints an idle node at a peer that still
holds queued inputs, with a transfer grant the head signed for that donor, thief, job and
transfer (burla.protocol.grants). The thief asks that donor for half its surplus, presenting the grant
(the same transfer always gets the same inputs, so retries are safe), tells the head the inputs
moved, then acknowledges the transfer with the same grant. A transfer the donor never sees
acknowledged goes back into its own queue: at worst an input runs twice, and the head keeps
only its first result. Nodes of an https head serve https, and thieves pin the donor's
certificate digest that the head passed along.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp

from burla.errors import GrantRefused, ProtocolError
from burla.node.dispatcher import Dispatcher
from burla.process.loop_supervisor import end_tasks
from burla.protocol import grants, wire
from burla.protocol.values.packed_inputs import PackedInputs

log = logging.getLogger("burla.node")

REQUEST_ATTEMPTS = 3
REQUEST_TIMEOUT_S = 10.0


def take_surplus(dispatcher: Dispatcher, job_id: str, max_items: int) -> list:
    """Give away half of a job's queued inputs (from the tail, the last to run here), as
    [(input_index, pickled_args), ...]."""
    job = dispatcher.jobs.get(job_id)
    if job is None or job.cancelled or not job.queue:
        return []
    count = min(max_items, max(1, len(job.queue) // 2))
    return job.queue.take_last(count).items()


def queue_back(dispatcher: Dispatcher, job_id: str, items: list, first: bool) -> bool:
    """Queue inputs of a transfer here: `first`, those a thief never acknowledged (they run here
    after all); else those stolen from a donor. False if the job is no longer here."""
    job = dispatcher.jobs.get(job_id)
    if job is None or job.cancelled:
        return False
    if first:
        job.queue.prepend(PackedInputs.of(items))
    else:
        job.queue.append(PackedInputs.of(items))
    dispatcher.pump()
    return True


@dataclass
class Transfer:
    job_id: str
    items: list
    given_at: float
    grant: bytes
    expires_at: float
    acked: bool = False


class Donor:
    """The giving side: opens a transfer only with a grant the head signed with this node's key,
    and remembers it until it is acknowledged or expires."""

    def __init__(self, node_id: str, dispatcher: Dispatcher, ack_timeout_s: float) -> None:
        self._node_id = node_id
        self._dispatcher = dispatcher
        self._ack_timeout_s = ack_timeout_s
        self.key = b""  # from the head at registration
        self.transfers: dict[str, Transfer] = {}
        self._spent: dict[str, float] = {}  # closed transfer ids -> until when their grant could be replayed

    def give(self, request: wire.StealRequest, now: float) -> wire.StealGrant:
        """`now` is monotonic (for the ack deadline); grants expire on the head's wall clock."""
        problem = grants.refusal(self.key, request.grant, request.job_id, self._node_id, request.thief_id,
                                 request.transfer_id, request.expires_at, time.time())
        if problem is None and request.transfer_id in self._spent:
            problem = "this transfer was already closed"
        if problem is not None:
            raise GrantRefused(problem)
        transfer = self.transfers.get(request.transfer_id)
        if transfer is None:
            items = take_surplus(self._dispatcher, request.job_id, max(1, request.max_items))
            transfer = Transfer(request.job_id, items, now, request.grant, request.expires_at)
            self.transfers[request.transfer_id] = transfer
            if items:
                log.info("gave %d inputs of job %s to %s (transfer %s)", len(items), request.job_id,
                         request.thief_id, request.transfer_id)
        elif transfer.job_id != request.job_id:
            raise ProtocolError(f"transfer {request.transfer_id} belongs to job {transfer.job_id}")
        items = transfer.items if not transfer.acked else []
        receipt = grants.receipt(self.key, request.job_id, self._node_id, request.thief_id, request.transfer_id,
                                 [index for index, _ in items])
        return wire.StealGrant(request.job_id, request.transfer_id, items, receipt)

    def ack(self, ack: wire.StealAck) -> bool:
        transfer = self.transfers.get(ack.transfer_id)
        if transfer is None or transfer.job_id != ack.job_id:
            return False
        if not hmac.compare_digest(transfer.grant, ack.grant):
            raise GrantRefused("the acknowledgement does not carry the transfer's grant")
        transfer.acked = True
        transfer.items = []
        return True

    def expire(self, now: float) -> None:
        """Unacknowledged transfers return to this node's queue; acknowledged ones are forgotten."""
        wall = time.time()
        for transfer_id, until in list(self._spent.items()):
            if wall > until:
                del self._spent[transfer_id]
        for transfer_id, transfer in list(self.transfers.items()):
            if now - transfer.given_at < self._ack_timeout_s:
                continue
            del self.transfers[transfer_id]
            self._spent[transfer_id] = transfer.expires_at + grants.CLOCK_SKEW_S
            if not transfer.acked and transfer.items:
                returned = queue_back(self._dispatcher, transfer.job_id, transfer.items, first=True)
                log.warning("transfer %s was never acknowledged; %s %d inputs", transfer_id,
                            "took back" if returned else "dropped (job gone)", len(transfer.items))


class Thief:
    """The taking side: one steal at a time per job, started by the head's hints."""

    def __init__(self, node_id: str, dispatcher: Dispatcher, report: Callable[[wire.Stolen], Awaitable[None]]) -> None:
        self._node_id = node_id
        self._dispatcher = dispatcher
        self._report = report
        self._active: dict[str, asyncio.Task] = {}
        self._session: aiohttp.ClientSession | None = None
        self.stolen = 0

    def on_hint(self, hint: wire.StealHint) -> None:
        if hint.job_id in self._active or hint.job_id not in self._dispatcher.jobs:
            return
        task = asyncio.create_task(self._steal(hint), name=f"steal-{hint.job_id}")
        self._active[hint.job_id] = task
        task.add_done_callback(lambda _: self._active.pop(hint.job_id, None))

    async def _steal(self, hint: wire.StealHint) -> None:
        job = self._dispatcher.jobs.get(hint.job_id)
        if job is None:
            return
        window = job.window(self._dispatcher.capacity())
        request = wire.StealRequest(hint.job_id, hint.transfer_id, self._node_id, window, hint.expires_at, hint.grant)
        pin = aiohttp.Fingerprint(hint.donor_cert_sha256) if hint.donor_cert_sha256 else None
        grant = await self._post(f"{hint.donor_url}/v1/jobs/{hint.job_id}/steal", request, pin)
        if not isinstance(grant, wire.StealGrant) or not grant.items:
            return
        if not queue_back(self._dispatcher, hint.job_id, grant.items, first=False):
            return  # the job ended here meanwhile: no ack, so the donor keeps them
        await self._report(wire.Stolen(hint.job_id, hint.donor_id, [i for i, _ in grant.items], hint.transfer_id,
                                       hint.expires_at, hint.grant, grant.receipt))
        self.stolen += len(grant.items)
        log.info("stole %d inputs of job %s from %s", len(grant.items), hint.job_id, hint.donor_id)
        await self._post(f"{hint.donor_url}/v1/jobs/{hint.job_id}/steal/ack",
                         wire.StealAck(hint.job_id, hint.transfer_id, hint.grant), pin)

    async def _post(self, url: str, msg: wire.Message, pin: aiohttp.Fingerprint | None) -> wire.Message | None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S))
        for attempt in range(REQUEST_ATTEMPTS):
            try:
                # No bearer token goes to a peer: the grant is the only credential a transfer needs.
                async with self._session.post(url, data=msg.encode(), ssl=pin if pin is not None else True) as response:
                    body = await response.read()
                    if response.status == 204:
                        return None
                    if response.status == 200:
                        return wire.decode(body, wire.NODE_TO_NODE)
                    log.warning("steal request to %s answered %d: %s", url, response.status, body[:200])
                    return None
            except (TimeoutError, aiohttp.ClientError, OSError, ProtocolError) as e:
                log.info("steal request to %s failed (%s); attempt %d", url, e, attempt + 1)
                await asyncio.sleep(0.1 * (attempt + 1))
        return None

    async def close(self) -> None:
        await end_tasks(log, *self._active.values())
        if self._session is not None:
            await self._session.close()
