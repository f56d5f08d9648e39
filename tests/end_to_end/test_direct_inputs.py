"""Large inputs sent straight to their node (DESIGN.md §3): a placeholder goes through the head, the
bytes to the node the head pushed it to, under a grant only that node accepts; through the head
where the client can't reach that node, and again after a node is lost or a connection is cut.

The clusters here run on 127.0.0.1 with an input-file directory that is not the client's, so
large inputs can't go by file: the inline path between machines."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import socket
import ssl
import time
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from burla.client.loop import client_loop
from burla.config import ENV_INPUT_FILES_DIR
from burla.errors import ProtocolError
from burla.head.direct_uploads import reachable_url
from burla.head.scheduling.records import NodeRecord
from burla.node.direct_route import direct_socket
from burla.node.dispatcher import Dispatcher
from burla.node.result_pipes import ResultPipes
from burla.protocol import direct_inputs, grants, wire
from burla.protocol.direct_inputs import EXPIRES_HEADER, GRANT_HEADER
from burla.protocol.values.inline_values import pack_input
from burla.protocol.values.packed_inputs import PackedInputs, pack_uints, unpack_uints
from burla.protocol.values.packed_results import unpack_indices
from burla.protocol.values.serialization import dumps, dumps_function
from burla.web.scoped_tokens import node_token
from tests.cluster_runner import LocalCluster
from tests.conftest import own_head, start_head, wait_for_nodes
from tests.security.test_security_and_bad_input import open_job
from tests.support import functions
from tests.support.helpers import result_value
from tests.support.proxy import CuttableProxy

LARGE = 2 * 2**20  # over direct_inputs.DIRECT_MIN_BYTES


def _inputs(large: int, small: int) -> list[bytes]:
    """Large inputs (each its own bytes) among small ones."""
    mixed: list[bytes] = [bytes([i % 251]) * (LARGE + i) for i in range(large)]
    for i in range(small):
        mixed.insert((i * 3) % (len(mixed) + 1), f"small-{i}".encode())
    return mixed


def _expected(inputs: list[bytes]) -> list[tuple[int, str]]:
    return [(len(data), hashlib.sha256(data).hexdigest()) for data in inputs]


def _get(url: str, token: str) -> dict:
    """A GET as this test reads state: an https head's or node's own certificate is not checked here
    (the client under test pins them)."""
    context = ssl._create_unverified_context() if url.startswith("https") else None
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        return json.load(response)


def _ready_nodes(head_url: str, token: str, count: int) -> list[dict]:
    deadline = time.monotonic() + 60
    while True:
        nodes = [n for n in _get(head_url + "/v1/cluster", token)["nodes"] if n["workers_alive"] >= 1]
        if len(nodes) >= count or time.monotonic() > deadline:
            return nodes
        time.sleep(0.05)


def _direct_counts(node: dict, cluster_token: str, own_token: bool = True) -> dict:
    """What a node says it was sent straight and through the head. A head's local nodes hold a token
    of their own (`own_token`); nodes that joined by hand, the cluster's."""
    token = node_token(cluster_token, node["node_id"]) if own_token else cluster_token
    return _get(node["url"] + "/v1/state", token)["direct_inputs"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def apart(tmp_path, monkeypatch):
    """Call with True before starting a cluster (its processes get an input-file directory of their
    own), then with False for the client's (this process's) directory."""

    def choose(cluster: bool) -> None:
        name = "cluster-files" if cluster else "client-files"
        (tmp_path / name).mkdir(exist_ok=True)
        monkeypatch.setenv(ENV_INPUT_FILES_DIR, str(tmp_path / name))

    return choose


# --- whole clusters ------------------------------------------------------------------------


@pytest.mark.parametrize("settings, options, straight", [
    ({}, {}, 6),
    # A detached job's inputs must outlive the client on the head: no placeholder stands for one.
    # (In a process that stays, its results are collected as any other job's.)
    ({}, {"detach": True}, 0),
    # `burla config set direct_inputs false` (or BURLA_DIRECT_INPUTS=0): no placeholder at all.
    ({"direct_inputs": False}, {}, 0),
], ids=["straight", "detached", "turned-off"])
def test_where_a_jobs_large_inputs_go(tmp_path, apart, settings, options, straight):
    apart(True)
    with own_head(tmp_path) as head:
        apart(False)
        inputs = _inputs(6, 10)
        results = head.client(**settings).remote_parallel_map(functions.digest_after, inputs, spinner=False,
                                                               **options)
        assert [tuple(r) for r in results] == _expected(inputs)
        node = wait_for_nodes(head, 1)[0]
        assert _direct_counts(node, head.token) == {"straight": straight, "through_head": 0}


def test_a_node_the_client_cant_reach_gets_its_inputs_through_the_head(tmp_path, apart):
    apart(True)
    port = _free_port()
    with LocalCluster(tmp_path / "cluster", nodes=0, workers=2) as cluster:
        # It tells the head an address nothing listens on: the client's connections there fail.
        advertised = f"http://127.0.0.1:{_free_port()}"
        cluster.add_node("node-0", "--port", str(port), "--advertise-url", advertised)
        cluster.wait_for_nodes(1)
        apart(False)
        inputs = _inputs(4, 3)
        results = cluster.client().remote_parallel_map(functions.digest_after, inputs, spinner=False)
        assert [tuple(r) for r in results] == _expected(inputs)
        node = {"node_id": "node-0", "url": f"http://127.0.0.1:{port}"}  # where it really listens
        assert _direct_counts(node, cluster.token, own_token=False) == {"straight": 0, "through_head": 4}
        # This process's next jobs don't wait out a connection to it again.
        assert advertised in client_loop().unreachable_nodes


def test_inputs_of_a_node_lost_mid_job_go_to_another_node(tmp_path, apart):
    apart(True)
    with LocalCluster(tmp_path / "cluster", nodes=2, workers=2) as cluster:
        apart(False)
        # A node and its workers killed, with what they held.
        _run_through(cluster.client(), _inputs(16, 0), 0.4, lambda: cluster.signal_node("node-1", signal.SIGKILL))
        survivor = next(n for n in cluster.get("/v1/cluster")["nodes"] if n["node_id"] == "node-0")
        assert _direct_counts(survivor, cluster.token, own_token=False)["straight"] >= 8


def test_a_client_cut_off_mid_job_is_told_again_where_its_inputs_go(tmp_path, apart):
    apart(True)
    with own_head(tmp_path) as head:
        apart(False)
        parsed = urllib.parse.urlsplit(head.url)
        proxy = CuttableProxy(parsed.hostname, parsed.port)

        def outage() -> None:  # of about a second
            proxy.cut()
            time.sleep(1.0)
            proxy.restore()

        try:
            _run_through(head.client(head_url=proxy.url), _inputs(10, 0), 0.2, outage)
        finally:
            proxy.close()
        assert proxy.connections >= 2


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_head_restarted_mid_job_has_its_placeholders_filled_again(tmp_path, apart, how):
    """The nodes drop placeholders whose bytes never came when they register again; the restarted
    head pushes them anew and tells the resumed client where: every input runs, and right."""
    apart(True)
    with LocalCluster(tmp_path / "cluster", nodes=2, workers=1) as cluster:
        apart(False)
        _run_through(cluster.client(), _inputs(12, 2), 0.3, lambda: (cluster.stop_head(how), cluster.start_head()))


def _run_through(client: Any, inputs: list[bytes], hold_s: float, disturb: Callable[[], object]) -> None:
    """Run a job whose calls take `hold_s` each, `disturb` it once its first result is in, and check
    every result came, once and right."""
    stream = client.remote_parallel_map(functions.digest_after, [(data, hold_s) for data in inputs],
                                        generator=True, spinner=False)
    results = [next(stream)]
    disturb()
    results.extend(stream)
    assert sorted(tuple(r) for r in results) == sorted(_expected(inputs))


def test_a_resuming_client_is_told_again_where_its_placeholders_went(tmp_path):
    """A client whose connection ended before it sent a placeholder's bytes hears where it went
    again when it resumes, and may send them through the head then. Spoken on the wire, as a client
    whose connection dropped right after the head's UploadDirect reached it."""
    big, small = b"q" * LARGE, b"small"
    job = open_job(n_inputs=2, function_bytes=dumps_function(functions.digest_after), direct_inputs=True)

    async def scenario(head) -> list:
        async with aiohttp.ClientSession(headers=head.headers()) as session:
            async with session.ws_connect(head.url + "/v1/jobs/ws") as ws:
                await ws.send_bytes(job.encode())
                accepted = wire.decode((await ws.receive(timeout=60)).data)
                assert isinstance(accepted, wire.JobAccepted) and accepted.direct_inputs
                inputs = [[0, direct_inputs.placeholder(len(dumps(big)))], [1, dumps(small)]]
                await ws.send_bytes(wire.InputBatch.of(job.job_id, PackedInputs.of(inputs)).encode())
                told = await _next(ws, wire.UploadDirect)
                assert unpack_uints(told.indices) == (0,) and told.url.startswith("http://127.0.0.1:")
            # Gone before sending the bytes: the node awaits them still.
            async with session.ws_connect(head.url + "/v1/jobs/ws", max_msg_size=0) as ws:
                resume = wire.ResumeJob(job.job_id, 0, zlib.compress(bytes(2)), accepted.job_secret)
                await ws.send_bytes(resume.encode())
                results: list = []
                told_again = None
                while len(results) < 2:  # results, and where input 0 went, in whatever order they come
                    msg = await _next(ws, (wire.UploadDirect, wire.ResultBatch))
                    if isinstance(msg, wire.ResultBatch):
                        results.extend(msg.items)
                        await ws.send_bytes(wire.ResultAck(job.job_id, msg.seq).encode())
                    elif told_again is None:
                        told_again = msg
                        assert (unpack_uints(msg.indices), msg.node_id) == ((0,), told.node_id)
                        part = PackedInputs.of([[0, dumps(big)]])
                        await ws.send_bytes(wire.DirectFallback(job.job_id, part.indices, part.sizes, part.data,
                                                                msg.node_id).encode())
                assert told_again is not None
                return results

    with own_head(tmp_path) as head:
        results = asyncio.run(scenario(head))
        values = {index: tuple(result_value(ok, payload)) for index, ok, payload in results}
        assert values == {0: tuple(functions.digest_after(big)), 1: tuple(functions.digest_after(small))}
        node = wait_for_nodes(head, 1)[0]
        assert _direct_counts(node, head.token) == {"straight": 0, "through_head": 1}


async def _next(ws: aiohttp.ClientWebSocketResponse, kind: type | tuple[type, ...]) -> Any:
    """The next message of this kind (or kinds) from the head (others skipped), within a minute."""
    async with asyncio.timeout(60):  # progress keeps coming: a deadline for the whole wait
        while True:
            frame = await ws.receive()
            assert frame.type == aiohttp.WSMsgType.BINARY, frame
            msg = wire.decode(frame.data, wire.HEAD_TO_CLIENT)
            if isinstance(msg, wire.ErrorReply):
                raise AssertionError(f"the head refused: {msg.message}")
            if isinstance(msg, kind):
                return msg


def test_an_https_node_takes_inputs_from_a_client_that_pins_its_certificate(tmp_path, apart):
    apart(True)
    head = start_head(tmp_path / "config", extra=["--tls-self-signed"])
    try:
        [node] = _ready_nodes(head.url, head.token, 1)
        assert node["url"].startswith("https://")
        apart(False)
        inputs = _inputs(3, 1)
        client = head.client(head_cert=str(head.config_dir / "head-cert.pem"))
        results = client.remote_parallel_map(functions.digest_after, inputs, spinner=False)
        assert [tuple(r) for r in results] == _expected(inputs)
        assert _direct_counts(node, head.token) == {"straight": 3, "through_head": 0}
    finally:
        head.stop()


def test_a_node_opens_a_connection_for_inputs_only_with_its_heads_grant(cluster):
    """The route needs no token, only the head's grant for this node and job, checked before the
    WebSocket opens (no frame is read without it); every other route still wants the token."""
    node = wait_for_nodes(cluster, 1)[0]
    expires = time.time() + 60

    async def status(headers: dict[str, str]) -> tuple[int, str]:
        async with aiohttp.ClientSession() as session:
            try:
                async with session.ws_connect(f"{node['url']}/v1/jobs/j-1/direct", headers=headers):
                    return 101, ""
            except aiohttp.WSServerHandshakeError as e:
                return e.status, str(e.message)

    forged = {GRANT_HEADER: (b"g" * 32).hex(), EXPIRES_HEADER: repr(expires)}
    assert asyncio.run(status(forged))[0] == 403
    assert asyncio.run(status({}))[0] == 400
    assert asyncio.run(status({GRANT_HEADER: "not hex", EXPIRES_HEADER: "soon"}))[0] == 400
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{node['url']}/v1/state", timeout=10)
    assert refused.value.code == 401
    refused.value.close()


class _Receiver:
    """A node as the route sees it, with a grant key the test holds (the head's, in a cluster)."""

    def __init__(self) -> None:
        self.key = grants.new_key()
        self.arrived: list[tuple[str, list[int], bool]] = []
        self.not_awaited: set[int] = set()
        self.dispatcher = Dispatcher(lambda: [], lambda: None)
        self.result_pipes = ResultPipes(self.dispatcher, lambda: None)
        self.spent_grants = grants.SpentGrants()

    def upload_key(self) -> tuple[str, bytes]:
        return "n1", self.key

    def headers(self, job_id: str = "j-1", expires: float | None = None) -> dict[str, str]:
        """A fresh grant for one connection to this node for `job_id`, as the head would send it."""
        expires = time.time() + 60 if expires is None else expires
        return {GRANT_HEADER: grants.sign_upload(self.key, job_id, "n1", expires).hex(), EXPIRES_HEADER: repr(expires)}

    def inputs_arrived(self, job_id: str, part: PackedInputs, straight: bool) -> list[int]:
        self.arrived.append((job_id, part.index_list(), straight))
        return [index for index in part.index_list() if index not in self.not_awaited]

    def runs(self, job_id: str) -> bool:
        return True


async def _serve_route(receiver: _Receiver) -> tuple[aiohttp.web.AppRunner, int]:
    """The node's direct route, in this process, on an ephemeral port of 127.0.0.1."""

    async def route(request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        return await direct_socket(request, receiver)

    return await _serve_handler(route)


async def _serve_handler(route: Any) -> tuple[aiohttp.web.AppRunner, int]:
    """`route` as a node's direct route, in this process, on an ephemeral port of 127.0.0.1."""
    app = aiohttp.web.Application()
    app.router.add_get("/v1/jobs/{job_id}/direct", route)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


def test_the_direct_route_takes_frames_of_its_job_and_refuses_the_rest_by_name():
    receiver = _Receiver()

    async def scenario() -> list:
        runner, port = await _serve_route(receiver)
        seen = []
        try:
            async with aiohttp.ClientSession() as session:
                url = f"http://127.0.0.1:{port}/v1/jobs/j-1/direct"
                for frame in (wire.DirectInputs.of("j-1", PackedInputs.of([[4, b"abc"]])).encode(),
                              wire.DirectInputs.of("j-2", PackedInputs.of([[5, b"d"]])).encode(), b"\x93junk"):
                    async with session.ws_connect(url, headers=receiver.headers()) as ws:
                        await ws.send_bytes(frame)
                        seen.append(wire.decode((await ws.receive(timeout=30)).data, wire.NODE_TO_CLIENT))
                # A grant for another job opens nothing.
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    await session.ws_connect(url.replace("j-1", "j-2"), headers=receiver.headers())
                seen.append(refused.value.status)
        finally:
            await runner.cleanup()
        return seen

    received, other_job, junk, refused = asyncio.run(scenario())
    assert isinstance(received, wire.DirectReceived) and received.indices == pack_uints([4])
    assert isinstance(other_job, wire.ErrorReply) and "does not match the URL" in other_job.message
    assert isinstance(junk, wire.ErrorReply) and junk.kind == "ProtocolError" and junk.status == 400
    assert refused == 403
    assert receiver.arrived == [("j-1", [4], True)]


def test_an_upload_grant_opens_one_connection_and_is_refused_by_name_after():
    """A grant seen on its way (a log, a proxy, a call that read the client's memory) can't open a
    second connection to the node while the first is open, nor after it closed."""
    receiver = _Receiver()

    async def scenario() -> list:
        runner, port = await _serve_route(receiver)
        url = f"http://127.0.0.1:{port}/v1/jobs/j-1/direct"
        headers, seen = receiver.headers(), []
        try:
            async with aiohttp.ClientSession() as session:
                async with session.ws_connect(url, headers=headers) as first:
                    for _ in range(2):  # while it is open, and once it has closed
                        async with session.get(url, headers=headers) as again:
                            seen.append((again.status, (await again.json())["message"]))
                        await first.close()
        finally:
            await runner.cleanup()
        return seen

    refusals = asyncio.run(scenario())
    assert [status for status, _ in refusals] == [403, 403]
    assert all("opened a connection already" in message for _, message in refusals)


def test_spent_grants_are_kept_only_while_they_could_still_open_a_connection():
    key, spent, now = grants.new_key(), grants.SpentGrants(), time.time()
    first, second = (grants.sign_upload(key, "j", "n1", now + 60) for _ in range(2))
    assert first[:grants.NONCE_BYTES] != second[:grants.NONCE_BYTES]  # each grant is its own
    assert spent.spend(first, now + 60, now) is None and spent.spend(second, now + 60, now) is None
    assert spent.spend(first, now + 60, now + 1) is not None
    late = now + 60 + grants.CLOCK_SKEW_S + 1  # refused as expired from here on: no need to keep it
    assert spent.spend(grants.sign_upload(key, "j", "n1", late + 60), late + 60, late) is None
    assert len(spent._spent) == 1


def test_bytes_that_reach_a_node_before_their_placeholder_go_again_through_the_head():
    """The head's push and its word to the client travel apart, so a client's bytes can come to
    the node first: the node's receipt names only what it took, and the client sends the rest
    through the head, which passes it on behind the push."""
    from types import SimpleNamespace

    from burla.client.direct_sender import DirectSender

    receiver = _Receiver()
    receiver.not_awaited = {5}

    async def scenario() -> list[wire.Message]:
        runner, port = await _serve_route(receiver)
        through_head: list[wire.Message] = []

        async def via_head(msg: wire.Message) -> None:
            through_head.append(msg)

        session = aiohttp.ClientSession()
        shared = SimpleNamespace(session=lambda cert: session, unreachable_nodes={})
        sender = DirectSender("j-1", {4: dumps(b"four"), 5: dumps(b"five"), 6: dumps(b"six")}, dumps, via_head,
                              lambda: shared)  # type: ignore[arg-type,return-value]
        expires = time.time() + 60
        sender.on_upload(wire.UploadDirect("j-1", pack_uints([4, 5, 6]), pack_uints([9, 9, 9]), b"", "n1",
                                           f"http://127.0.0.1:{port}", b"", expires,
                                           grants.sign_upload(receiver.key, "j-1", "n1", expires)))
        try:
            async with asyncio.timeout(60):
                while not through_head:
                    await asyncio.sleep(0.01)
        finally:
            await sender.close()
            await session.close()
            await runner.cleanup()
        assert shared.unreachable_nodes == {}  # the node is reachable: only these went the other way
        return through_head

    [fallback] = asyncio.run(scenario())
    assert isinstance(fallback, wire.DirectFallback) and fallback.node_id == "n1"
    assert fallback.part().items() == [(5, dumps(b"five"))]
    assert [indices for _, indices, _ in receiver.arrived] == [[4], [5], [6]]


# --- the parts -----------------------------------------------------------------------------


def test_placeholders_are_found_among_entries_of_every_size():
    """Only whole entries that are placeholders: not a 5-byte inline value, nor the bytes of a
    placeholder's size spanning two sizes (an entry of 1,280 bytes before an empty one)."""
    entries = [
        (0, pack_input("abc")),  # 5 bytes, 0xC0 first
        (1, direct_inputs.placeholder(3 * 2**20)),
        (2, b"\x80" + b"p" * 1279),  # size 0x500: its bytes and the next size read 05 00 00 00 misaligned
        (3, b""),
        (4, dumps(list(range(50)))),
        (9, direct_inputs.placeholder(2**20)),
        (5, b"\x01abcd"),  # 5 bytes with the mark: a placeholder of size 0x64636261, by construction
    ]
    part = PackedInputs.of(entries)
    assert direct_inputs.placeholders_in(part) == [(1, 3 * 2**20), (9, 2**20), (5, 0x64636261)]
    rest = direct_inputs.without(part, direct_inputs.placeholders_in(part))
    assert rest.items() == [(i, data) for i, data in entries if i not in (1, 9, 5)]
    assert direct_inputs.placeholders_in(PackedInputs.of([(i, d) for i, d in entries if i in (0, 2, 3, 4)])) == []


def test_an_upload_grant_opens_exactly_its_node_and_job_until_it_expires():
    key, now = grants.new_key(), time.time()
    grant = grants.sign_upload(key, "j", "n1", now + 60)
    assert grants.upload_refusal(key, grant, "j", "n1", now + 60, now) is None
    assert "not the head's" in grants.upload_refusal(grants.new_key(), grant, "j", "n1", now + 60, now)
    assert "not the head's" in grants.upload_refusal(key, grant, "j", "n2", now + 60, now)
    assert "not the head's" in grants.upload_refusal(key, grant, "j2", "n1", now + 60, now)
    assert "not the head's" in grants.upload_refusal(key, grant, "j", "n1", now + 61, now)  # its expiry is signed
    forged_nonce = bytes(grants.NONCE_BYTES) + grant[grants.NONCE_BYTES:]
    assert "not the head's" in grants.upload_refusal(key, forged_nonce, "j", "n1", now + 60, now)  # so is its nonce
    assert "not the head's" in grants.upload_refusal(key, grant[:grants.NONCE_BYTES], "j", "n1", now + 60, now)
    assert "expired" in grants.upload_refusal(key, grant, "j", "n1", now + 60, now + 60 + 121)
    assert "no grant key" in grants.upload_refusal(b"", grant, "j", "n1", now + 60, now)
    # A steal grant with the same key is no upload grant.
    steal = grants.sign(key, "j", "n1", "n2", "t", now + 60)
    assert grants.upload_refusal(key, steal, "j", "n1", now + 60, now) is not None


@pytest.mark.parametrize("make, words", [
    (lambda: wire.UploadDirect("j", pack_uints([1]), pack_uints([9]), b"x", "n", "", b"", 1.0, b""), "no data"),
    (lambda: wire.UploadDirect("j", pack_uints([1]), b"", b"", "n", "", b"", 1.0, b""), "4-byte size"),
    (lambda: wire.UploadDirect("j", pack_uints([1]), pack_uints([9]), b"", "n", "u", b"d" * 31, 1.0, b""),
     "SHA-256"),
    (lambda: wire.DirectReceived("j", pack_uints([1]), pack_uints([1]), b""), "indices only"),
    (lambda: wire.DirectInputs("j", pack_uints([1]), pack_uints([2]), b"a"), "as long as"),
    (lambda: wire.DirectFallback("j", pack_uints([1]), pack_uints([2]), b"a", "n"), "as long as"),
])
def test_malformed_direct_messages_are_refused_by_name(make, words):
    with pytest.raises(ProtocolError, match=words):
        wire.decode(make().encode())


def test_a_node_sends_inputs_to_clients_only_where_they_reach_that_very_node():
    def node(url: str, peer: str, https: bool = False) -> NodeRecord:
        return NodeRecord("n", url, 2, 2, 4.0, None, 0, None, "r", "3.11", cert_sha256=b"d" * 32 if https else b"",
                          peer_host=peer)

    https = node("https://10.0.0.5:8443", "10.0.0.5", https=True)
    assert reachable_url(https, client_local=False) == "https://10.0.0.5:8443"  # pinned: no other machine passes
    local = node("http://127.0.0.1:9000", "127.0.0.1")
    assert reachable_url(local, client_local=True) == "http://127.0.0.1:9000"
    assert reachable_url(local, client_local=False) == ""  # that loopback is not the client's
    assert reachable_url(node("http://10.0.0.5:9000", "10.0.0.5"), client_local=True) == ""  # plain http afar
    # A laptop head's VM: its node gives its private address, its connection comes out of a tunnel.
    assert reachable_url(node("https://10.0.0.5:8443", "127.0.0.1", https=True), client_local=True) == ""
    assert reachable_url(node("https://10.0.0.5:8443", "", https=True), client_local=True) == ""
    assert reachable_url(node("https://[::1]:8443", "::1", https=True), client_local=True) == "https://[::1]:8443"
    assert reachable_url(node("", "127.0.0.1"), client_local=True) == ""
    assert reachable_url(node("https://[::1:8443", "::1", https=True), client_local=True) == ""  # unparsable


def _direct_job(d: Dispatcher) -> None:
    d.assign(wire.AssignJob("j", "f", b"fn", 2, None, None, b"", {}, 4, direct_inputs=True))


def test_a_node_keeps_placeholders_aside_until_their_bytes_come_once():
    d = Dispatcher(lambda: [], lambda: None)
    _direct_job(d)
    d.add_inputs("j", PackedInputs.of([[0, b"a"], [1, direct_inputs.placeholder(LARGE)], [2, b"b"],
                                      [3, direct_inputs.placeholder(LARGE)]]))
    job = d.jobs["j"]
    assert job.queue.index_list() == [0, 2] and job.awaited == {1: LARGE, 3: LARGE}
    assert job.mean_input_bytes > LARGE / 3  # the window counts the inputs, not their placeholders
    due = job.credit_due(2)
    job.credit_unused -= due
    assert len(job.queue) + len(job.awaited) + job.credit_unused + due == job.window(2)  # awaited count as held
    # Held for a head that registers again: only what the node has the bytes of.
    assert {job_id: unpack_indices(packed) for job_id, packed in d.held()} == {"j": [0, 2]}
    # Bytes for an awaited input and for one that is not: only the first is queued, and only once.
    assert d.fill("j", PackedInputs.of([[1, b"one"], [7, b"stray"]]), straight=True) == [1]
    assert d.fill("j", PackedInputs.of([[1, b"one again"]]), straight=False) == []
    assert job.queue.index_list() == [0, 2, 1] and job.awaited == {3: LARGE}
    assert d.filled == {True: 1, False: 0}
    # A new head session: placeholders whose bytes never came are pushed (and sent) again.
    d.new_head_session()
    assert job.awaited == {} and d.fill("j", PackedInputs.of([[3, b"late"]]), straight=True) == []


def test_placeholders_of_a_job_whose_packages_failed_to_install_fail_with_it():
    d = Dispatcher(lambda: [], lambda: None)
    _direct_job(d)
    d.add_inputs("j", PackedInputs.of([[0, b"a"], [1, direct_inputs.placeholder(LARGE)]]))
    d.install_failed("j", b"the error")
    job = d.jobs["j"]
    failed = sorted(index for part in job.out_results for index in unpack_indices(part.indices))
    assert failed == [0, 1] and not job.awaited
    assert d.fill("j", PackedInputs.of([[1, b"late"]]), straight=True) == []  # its bytes change nothing


def test_a_node_scans_only_jobs_whose_client_may_send_placeholders():
    d = Dispatcher(lambda: [], lambda: None)
    d.assign(wire.AssignJob("j", "f", b"fn", 2, None, None, b"", {}, 4))
    d.add_inputs("j", PackedInputs.of([[0, b"\x01abcd"]]))  # an entry of another kind: queued as it is
    assert d.jobs["j"].queue.index_list() == [0] and not d.jobs["j"].awaited


def test_the_uploader_keeps_a_placeholders_input_until_its_result_is_in():
    from burla.client.progress import Display
    from burla.client.upload import Uploader

    data = [b"z" * LARGE, b"small"]
    uploader = Uploader("j", data, bytearray(2), Display(total=2, show_progress=False), detaching=False)
    uploader.direct = True
    sent: list[wire.Message] = []

    async def send(msg: wire.Message) -> None:
        sent.append(msg)

    uploader.resume(0, (10, 1 << 30))
    asyncio.run(uploader.upload(send, 0))
    (batch,) = sent
    assert isinstance(batch, wire.InputBatch)
    entries = dict(batch.part().items())
    assert direct_inputs.is_placeholder(entries[0]) and direct_inputs.real_size(entries[0]) >= LARGE
    assert not direct_inputs.is_placeholder(entries[1])
    assert list(uploader.direct_pending) == [0]
    assert uploader.outstanding_bytes > LARGE  # the window weighs the input, not its placeholder
    uploader.results_in([0, 1])
    assert uploader.direct_pending == {} and uploader.outstanding_bytes == 0


def test_a_client_answers_for_an_input_whose_result_is_in_by_encoding_it_again():
    """Its node awaits the bytes all the same (the head may push an input twice): a name skipped
    would leave a placeholder waiting there for good, holding the node's window."""
    from burla.client.direct_sender import DirectSender

    encoded: list[int] = []

    def encode(index: int) -> bytes:
        if index >= 3:
            raise IndexError(index)  # not one of this process's inputs
        encoded.append(index)
        return b"again"

    sender = DirectSender("j", {0: b"kept"}, encode, lambda msg: asyncio.sleep(0), client_loop)
    told = wire.UploadDirect("j", pack_uints([0, 2, 5]), pack_uints([9, 9, 9]), b"", "n", "", b"", 1.0, b"")
    assert sender._still_pending(told) == [(0, b"kept"), (2, b"again")] and encoded == [2]


def test_an_input_file_directory_apart_is_what_these_tests_rely_on(tmp_path, apart):
    """The client's input-file directory differs from the cluster's, so its host id does too."""
    from burla.protocol.values import input_files

    apart(True)
    cluster_host = input_files.host_id()
    apart(False)
    assert input_files.host_id() not in ("", cluster_host)
    assert Path(os.environ[ENV_INPUT_FILES_DIR]).name == "client-files"
