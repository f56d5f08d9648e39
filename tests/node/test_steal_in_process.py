"""Stealing between two nodes' dispatchers in this process: the thief's real HTTP requests go
to the donor's real routes (`burla.node.http`) on 127.0.0.1, with grants the head would sign.

The donor's node service is stood in for by the parts its routes use (settings, donor, thief,
state): everything a transfer does runs as on a node.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
from aiohttp import web

from burla.node.dispatcher import Dispatcher
from burla.node.http import build_node_app
from burla.node.steal import Donor, Thief
from burla.protocol import grants, wire
from burla.protocol.values.packed_inputs import PackedInputs
from burla.web.connection_guard import ConnectionGuard

DONOR, THIEF = "node-donor", "node-thief"


@dataclass
class _Settings:
    node_id: str
    token: str


class _DonorNode:
    """The parts of a NodeService the node's routes use."""

    def __init__(self, dispatcher: Dispatcher, key: bytes) -> None:
        self.settings = _Settings(DONOR, "cluster-token")
        self.donor = Donor(DONOR, dispatcher, ack_timeout_s=30.0)
        self.donor.key = key
        self.thief = Thief(DONOR, dispatcher, self._report)

    async def _report(self, stolen: wire.Stolen) -> None:
        raise AssertionError("the donor steals nothing here")

    def state(self):
        raise AssertionError("not asked here")


def _dispatcher_with(job_id: str, count: int) -> Dispatcher:
    dispatcher = Dispatcher(lambda: [], lambda: None)  # no workers: inputs stay queued
    dispatcher.assign(wire.AssignJob(job_id, "f", b"fn", 4, None, None, b"", {}, 0))
    if count:
        dispatcher.add_inputs(job_id, PackedInputs.of([[i, b"x"] for i in range(count)]))
    return dispatcher


@pytest.fixture
async def donor_node():
    key = grants.new_key()
    node = _DonorNode(_dispatcher_with("j", 100), key)
    runner = web.AppRunner(build_node_app(node, ConnectionGuard()), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield node, key, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _hint(key: bytes, url: str, transfer_id: str | None = None, job_id: str = "j") -> wire.StealHint:
    transfer_id = transfer_id or grants.new_transfer_id(THIEF)
    expires_at = time.time() + grants.GRANT_TTL_S
    grant = grants.sign(key, job_id, DONOR, THIEF, transfer_id, expires_at)
    return wire.StealHint(job_id, DONOR, url, b"", transfer_id, expires_at, grant)


async def _steal(thief: Thief, hint: wire.StealHint) -> None:
    thief.on_hint(hint)
    task = thief._active.get(hint.job_id)
    if task is not None:
        await task


async def test_a_thief_takes_half_the_donors_queue_reports_it_and_acknowledges(donor_node):
    node, key, url = donor_node
    reports: list[wire.Stolen] = []

    async def report(stolen: wire.Stolen) -> None:
        reports.append(stolen)

    mine = _dispatcher_with("j", 0)
    thief = Thief(THIEF, mine, report)
    hint = _hint(key, url)
    try:
        await _steal(thief, hint)
    finally:
        await thief.close()
    taken = mine.jobs["j"].queue.index_list()
    # Its own window's worth (4 workers, call time unknown: 16), at most half the donor's queue,
    # from the donor's tail: the inputs that would have run there last.
    assert taken == list(range(84, 100))
    assert node.donor._dispatcher.jobs["j"].queue.index_list() == list(range(84))
    receipt = grants.receipt(key, "j", DONOR, THIEF, hint.transfer_id, taken)  # the donor names what it gave
    assert reports == [wire.Stolen("j", DONOR, taken, hint.transfer_id, hint.expires_at, hint.grant, receipt)]
    transfer = node.donor.transfers[hint.transfer_id]
    assert transfer.acked and transfer.items == []  # acknowledged: nothing to give back


async def test_a_forged_grant_takes_nothing(donor_node):
    node, _key, url = donor_node
    mine = _dispatcher_with("j", 0)

    async def report(stolen: wire.Stolen) -> None:
        raise AssertionError("nothing was stolen")

    thief = Thief(THIEF, mine, report)
    try:
        await _steal(thief, _hint(grants.new_key(), url))  # signed with another node's key
    finally:
        await thief.close()
    assert not mine.jobs["j"].queue
    assert len(node.donor._dispatcher.jobs["j"].queue) == 100


async def test_a_transfer_asked_again_gets_the_same_inputs_and_an_unacknowledged_one_comes_back(donor_node):
    node, key, _url = donor_node
    hint = _hint(key, "unused")
    request = wire.StealRequest("j", hint.transfer_id, THIEF, 10, hint.expires_at, hint.grant)
    first = node.donor.give(request, now=0.0)
    again = node.donor.give(request, now=1.0)  # a retry after a lost answer
    assert first.items == again.items and len(first.items) == 10
    queue = node.donor._dispatcher.jobs["j"].queue
    assert len(queue) == 90
    node.donor.expire(now=31.0)  # past the ack timeout, never acknowledged
    assert len(queue) == 100 and hint.transfer_id not in node.donor.transfers
    with pytest.raises(Exception, match="already closed"):
        node.donor.give(request, now=32.0)  # the same grant can't open it again
