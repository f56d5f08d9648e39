"""Large results sent straight from their node to the client (DESIGN.md §3): the head offers the
client a node whose results are large, the client opens its connection there, and the node sends
such results on it, reporting each to the head as a placeholder once the client's receipt came;
through the head where the client can't reach the node, where the connection fails, and after a
node or the head is lost."""

from __future__ import annotations

import asyncio
import signal
import time
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from burla.client.loop import client_loop
from burla.errors import ProtocolError
from burla.protocol import direct_inputs, grants, wire, worker_wire
from burla.protocol.direct_inputs import EXPIRES_HEADER, GRANT_HEADER
from burla.protocol.direct_results import arrived_value, restored, split_large, value_of
from burla.protocol.values.packed_inputs import PackedInputs, pack_uints
from burla.protocol.values.packed_results import PackedResults
from burla.protocol.values.serialization import dumps, loads
from burla.web import ws_bulk
from burla.web.scoped_tokens import node_token
from tests.cluster_runner import LocalCluster
from tests.conftest import own_head, start_head, wait_for_nodes
from tests.end_to_end.test_direct_inputs import _free_port, _get, _ready_nodes, _Receiver, _serve_handler, _serve_route
from tests.support import functions
from tests.support.proxy import CuttableProxy

LARGE = 2 * 2**20  # over direct_inputs.DIRECT_MIN_BYTES


def _expected(count: int, size: int = LARGE, fail_on: int = -1) -> list[Any]:
    return [functions.sized_result(i, size) if i != fail_on else None for i in range(count)]


def _counts(node: dict, cluster_token: str, own_token: bool = True) -> dict:
    """How many large results a node sent its client straight, and how many went through the head
    after all (its client's connection failed). A head's local nodes hold a token of their own."""
    token = node_token(cluster_token, node["node_id"]) if own_token else cluster_token
    return _get(node["url"] + "/v1/state", token)["direct_results"]


def _arguments(count: int, hold_s: float, size: int = LARGE) -> list[tuple[int, int, float]]:
    return [(i, size, hold_s) for i in range(count)]


# --- whole clusters ------------------------------------------------------------------------


@pytest.mark.parametrize("settings, options, straight", [
    ({}, {}, True),
    # A detached job's results are kept on the head for whoever collects them: none goes past it.
    ({}, {"detach": True}, False),
    # `burla config set direct_results false` (or BURLA_DIRECT_RESULTS=0).
    ({"direct_results": False}, {}, False),
], ids=["straight", "detached", "turned-off"])
def test_where_a_jobs_large_results_go(tmp_path, settings, options, straight):
    with own_head(tmp_path) as head:
        # Calls long enough that the offer and the connection come while most are still to run.
        results = head.client(**settings).remote_parallel_map(functions.sized_result, _arguments(30, 0.2),
                                                               spinner=False, **options)
        assert results == _expected(30)
        counts = _counts(wait_for_nodes(head, 1)[0], head.token)
        assert counts["through_head"] == 0
        assert (counts["straight"] > 0) is straight, counts


def test_a_node_the_client_cant_reach_sends_its_results_through_the_head(tmp_path):
    port = _free_port()
    with LocalCluster(tmp_path / "cluster", nodes=0, workers=2) as cluster:
        advertised = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
        cluster.add_node("node-0", "--port", str(port), "--advertise-url", advertised)
        cluster.wait_for_nodes(1)
        results = cluster.client().remote_parallel_map(functions.sized_result, _arguments(8, 0.1), spinner=False)
        assert results == _expected(8)
        node = {"node_id": "node-0", "url": f"http://127.0.0.1:{port}"}  # where it really listens
        assert _counts(node, cluster.token, own_token=False) == {"straight": 0, "through_head": 0}
        assert advertised in client_loop().unreachable_nodes


def test_results_come_right_when_the_clients_connection_to_their_node_is_cut(tmp_path):
    """The node sends what the client had not receipted through the head, and the rest of the
    job's results too: every result comes once, and right."""
    port = _free_port()
    proxy = CuttableProxy("127.0.0.1", port)
    try:
        with LocalCluster(tmp_path / "cluster", nodes=0, workers=2) as cluster:
            cluster.add_node("node-0", "--port", str(port), "--advertise-url", proxy.url)
            cluster.wait_for_nodes(1)
            stream = cluster.client().remote_parallel_map(functions.sized_result, _arguments(40, 0.25),
                                                          generator=True, spinner=False)
            results = [next(stream)]
            node = {"node_id": "node-0", "url": f"http://127.0.0.1:{port}"}
            deadline = time.monotonic() + 60
            while _counts(node, cluster.token, own_token=False)["straight"] < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            proxy.cut()
            results.extend(stream)
            assert sorted(results, key=repr) == sorted(_expected(40), key=repr)
            assert _counts(node, cluster.token, own_token=False)["straight"] >= 2
            assert proxy.connections >= 1
    finally:
        proxy.close()


def test_results_of_a_node_killed_mid_job_are_made_again_elsewhere(tmp_path):
    with LocalCluster(tmp_path / "cluster", nodes=2, workers=2) as cluster:
        stream = cluster.client().remote_parallel_map(functions.sized_result, _arguments(24, 0.3),
                                                      generator=True, spinner=False)
        results = [next(stream)]
        cluster.signal_node("node-1", signal.SIGKILL)
        results.extend(stream)
        assert sorted(results, key=repr) == sorted(_expected(24), key=repr)
        survivor = next(n for n in cluster.get("/v1/cluster")["nodes"] if n["node_id"] == "node-0")
        assert _counts(survivor, cluster.token, own_token=False)["straight"] > 0


def test_a_head_restarted_mid_job_gets_the_results_its_nodes_sent_straight(tmp_path):
    """A node reports results it sent straight to a head it registers with again: the job the
    restarted head takes up completes, every result once and right."""
    with LocalCluster(tmp_path / "cluster", nodes=2, workers=1) as cluster:
        stream = cluster.client().remote_parallel_map(functions.sized_result, _arguments(24, 0.3),
                                                      generator=True, spinner=False)
        results = [next(stream)]
        nodes = cluster.get("/v1/cluster")["nodes"]
        before = sum(_counts(n, cluster.token, own_token=False)["straight"] for n in nodes)
        cluster.stop_head(signal.SIGKILL)
        cluster.start_head()
        results.extend(stream)
        assert sorted(results, key=repr) == sorted(_expected(24), key=repr)
        # The nodes went on sending results straight through the restart, and the new head has them.
        assert sum(_counts(n, cluster.token, own_token=False)["straight"] for n in nodes) > before


def test_a_failed_call_among_large_results_still_fails_the_job(tmp_path):
    with own_head(tmp_path) as head:
        arguments = [(i, LARGE, 0.1, 13) for i in range(20)]
        with pytest.raises(ValueError, match="input 13 fails"):
            head.client().remote_parallel_map(functions.sized_result, arguments, spinner=False)


def test_an_https_node_sends_results_to_a_client_that_pins_its_certificate(tmp_path):
    head = start_head(tmp_path / "config", extra=["--tls-self-signed"])
    try:
        [node] = _ready_nodes(head.url, head.token, 1)
        assert node["url"].startswith("https://")
        client = head.client(head_cert=str(head.config_dir / "head-cert.pem"))
        results = client.remote_parallel_map(functions.sized_result, _arguments(16, 0.2), spinner=False)
        assert results == _expected(16)
        counts = _counts(node, head.token)
        assert counts["straight"] > 0 and counts["through_head"] == 0, counts
    finally:
        head.stop()


# --- the node's side, in process -------------------------------------------------------------


def _assigned(receiver: _Receiver, direct_results: bool = True) -> None:
    receiver.dispatcher.assign(wire.AssignJob(
        job_id="j-1", function_name="f", function_bytes=b"", parallelism=1, func_ram=None, func_cpu=1,
        local_code=b"", packages={}, credit=0, n_inputs=10, direct_results=direct_results))


def _report(*payloads: tuple[int, bytes]) -> worker_wire.WorkerReport:
    return _report_of([[index, True, payload] for index, payload in payloads])


def _report_of(results: list) -> worker_wire.WorkerReport:
    """A worker's report of these results, split as a worker of a job with direct results splits it,
    as its node reads it."""
    items, direct = split_large(results)
    report = worker_wire.WorkerReport.of_part("j-1", PackedResults.of(items), [], False, 0.0, direct)
    decoded = wire.decode(b"".join(report.encode_parts()), worker_wire.WORKER_TO_NODE)
    assert isinstance(decoded, worker_wire.WorkerReport)
    return decoded


async def _connect(session: aiohttp.ClientSession, port: int, receiver: _Receiver) -> Any:
    expires = time.time() + 60
    headers = {GRANT_HEADER: grants.sign_upload(receiver.key, "j-1", "n1", expires).hex(),
               EXPIRES_HEADER: repr(expires)}
    return await session.ws_connect(f"http://127.0.0.1:{port}/v1/jobs/j-1/direct", headers=headers,
                                    max_msg_size=0)


async def _until(condition: Any) -> None:
    async with asyncio.timeout(60):
        while not condition():
            await asyncio.sleep(0.01)


def test_a_node_reports_large_results_to_the_head_once_its_client_has_them():
    receiver = _Receiver()
    _assigned(receiver)
    job = receiver.dispatcher.jobs["j-1"]
    big = dumps(b"b" * LARGE)
    worker: Any = SimpleNamespace(batches=[])  # a report from no batch: only the results matter here

    async def scenario() -> tuple[wire.Message, list, list]:
        runner, port = await _serve_route(receiver)
        try:
            async with aiohttp.ClientSession() as session:
                ws = await _connect(session, port, receiver)
                await _until(lambda: job.result_pipe)
                worker.batches = []
                receiver.dispatcher.on_report(worker, _report((1, dumps("small")), (2, big)))
                sent = wire.decode((await ws.receive(timeout=60)).data, wire.NODE_TO_CLIENT)
                before_receipt = list(job.out_results)  # nothing for the head yet
                await ws.send_bytes(wire.DirectResultsReceived("j-1", pack_uints([2])).encode())
                await _until(lambda: job.out_results)
                await ws.close()
        finally:
            await runner.cleanup()
        return sent, before_receipt, job.out_results

    sent, before_receipt, out = asyncio.run(scenario())
    assert isinstance(sent, wire.DirectResults) and sent.part().items() == [(2, big)]
    assert before_receipt == []
    [part] = out
    items = part.items()
    assert [item[0] for item in items] == [1, 2] and loads(items[0][2]) == "small"
    assert direct_inputs.is_placeholder(items[1][2])
    assert receiver.dispatcher.results_sent == {True: 1, False: 0}


@pytest.mark.parametrize("ending", ["closed", "wrong-receipt"])
def test_results_a_client_did_not_receipt_go_through_the_head_whole(ending):
    receiver = _Receiver()
    _assigned(receiver)
    job = receiver.dispatcher.jobs["j-1"]
    big = dumps(b"c" * LARGE)
    worker: Any = SimpleNamespace(batches=[])

    async def scenario() -> wire.Message | None:
        runner, port = await _serve_route(receiver)
        answer = None
        try:
            async with aiohttp.ClientSession() as session:
                ws = await _connect(session, port, receiver)
                await _until(lambda: job.result_pipe)
                worker.batches = []
                receiver.dispatcher.on_report(worker, _report((7, big)))
                await ws.receive(timeout=60)  # the results, never receipted
                if ending == "wrong-receipt":
                    await ws.send_bytes(wire.DirectResultsReceived("j-1", pack_uints([8])).encode())
                    answer = wire.decode((await ws.receive(timeout=60)).data, wire.NODE_TO_CLIENT)
                await ws.close()
                await _until(lambda: job.out_results)
        finally:
            await runner.cleanup()
        return answer

    answer = asyncio.run(scenario())
    if ending == "wrong-receipt":
        assert isinstance(answer, wire.ErrorReply) and "receipt" in answer.message
    [part] = job.out_results
    assert part.items()[0][:2] == [7, True] and part.items()[0][2] == big
    assert not job.result_pipe and receiver.dispatcher.results_sent == {True: 0, False: 1}
    # Later reports of the job go whole to the head at once (its workers no longer split them).
    worker.batches = []
    receiver.dispatcher.on_report(worker, _report((9, big)))
    assert job.out_results[-1].items()[0][2] == big


def test_a_job_whose_results_stay_on_the_head_takes_no_connection_for_them():
    receiver = _Receiver()
    _assigned(receiver, direct_results=False)

    async def scenario() -> list[tuple[bool, bool]]:
        runner, port = await _serve_route(receiver)
        try:
            async with aiohttp.ClientSession() as session:
                ws = await _connect(session, port, receiver)
                await _until(lambda: receiver.result_pipes._pipes.get("j-1"))
                seen = [(p.active, receiver.dispatcher.jobs["j-1"].result_pipe)
                        for p in receiver.result_pipes._pipes["j-1"]]
                await ws.close()
        finally:
            await runner.cleanup()
        return seen

    assert asyncio.run(scenario()) == [(False, False)]  # open for inputs, not for results


def test_a_connection_open_before_its_job_is_assigned_takes_its_results_once_it_is():
    receiver = _Receiver()

    async def scenario() -> tuple[bool, bool]:
        runner, port = await _serve_route(receiver)
        try:
            async with aiohttp.ClientSession() as session:
                ws = await _connect(session, port, receiver)
                await _until(lambda: receiver.result_pipes._pipes.get("j-1"))
                _assigned(receiver)  # the client was quicker than the head's AssignJob
                first = receiver.dispatcher.jobs["j-1"].result_pipe
                receiver.dispatcher.release("j-1")
                _assigned(receiver)  # released and assigned again while the client stays
                again = receiver.dispatcher.jobs["j-1"].result_pipe
                await ws.close()
        finally:
            await runner.cleanup()
        return first, again

    assert asyncio.run(scenario()) == (True, True)


def test_a_client_gone_silent_has_its_unreceipted_results_sent_through_the_head(monkeypatch):
    """A connection that carries nothing more and never closes (a laptop asleep, a NAT that
    forgot it) is given up on once a receipt is overdue."""
    from burla.node import result_pipes

    monkeypatch.setattr(result_pipes, "RECEIPT_TIMEOUT_S", 0.5)
    receiver = _Receiver()
    _assigned(receiver)
    job = receiver.dispatcher.jobs["j-1"]
    big = dumps(b"s" * LARGE)
    worker: Any = SimpleNamespace(batches=[])

    async def scenario() -> None:
        runner, port = await _serve_route(receiver)
        proxy = CuttableProxy("127.0.0.1", port)
        try:
            async with aiohttp.ClientSession() as session:
                expires = time.time() + 60
                headers = {GRANT_HEADER: grants.sign_upload(receiver.key, "j-1", "n1", expires).hex(),
                           EXPIRES_HEADER: repr(expires)}
                ws = await session.ws_connect(f"{proxy.url}/v1/jobs/j-1/direct", headers=headers, max_msg_size=0)
                await _until(lambda: job.result_pipe)
                proxy.stall()
                receiver.dispatcher.on_report(worker, _report((3, big)))
                await _until(lambda: job.out_results)
                ws_bulk.drop(ws)
        finally:
            proxy.close()
            await runner.cleanup()

    asyncio.run(scenario())
    [part] = job.out_results
    assert part.items()[0][2] == big and receiver.dispatcher.results_sent == {True: 0, False: 1}


def test_a_receipt_for_results_never_sent_is_refused_by_name():
    receiver = _Receiver()
    _assigned(receiver)

    async def scenario() -> wire.Message:
        runner, port = await _serve_route(receiver)
        try:
            async with aiohttp.ClientSession() as session:
                ws = await _connect(session, port, receiver)
                await _until(lambda: receiver.dispatcher.jobs["j-1"].result_pipe)
                await ws.send_bytes(wire.DirectResultsReceived("j-1", pack_uints([1])).encode())
                answer = wire.decode((await ws.receive(timeout=60)).data, wire.NODE_TO_CLIENT)
                await ws.close()
        finally:
            await runner.cleanup()
        return answer

    answer = asyncio.run(scenario())
    assert isinstance(answer, wire.ErrorReply) and "not sent" in answer.message


def test_a_nodes_registration_lists_results_waiting_for_their_clients_receipt():
    receiver = _Receiver()
    _assigned(receiver)
    receiver.dispatcher.jobs["j-1"].result_pipe = True
    worker: Any = SimpleNamespace(batches=[])
    receiver.dispatcher.on_report(worker, _report((4, dumps(b"h" * LARGE)), (5, dumps("small"))))
    assert receiver.dispatcher.held() == [["j-1", pack_uints([4, 5])]]


async def _client_pipe(port: int, receiver: _Receiver, taken: Any = lambda index: False) -> tuple[Any, Any]:
    """A DirectSender of job j-1 offered the node on `port` (its session to close after)."""
    from burla.client.direct_sender import DirectSender

    session = aiohttp.ClientSession()
    shared = SimpleNamespace(session=lambda cert: session, unreachable_nodes={})
    sender = DirectSender("j-1", {}, dumps, _nowhere, lambda: shared, taken)  # type: ignore[arg-type,return-value]
    expires = time.time() + 60
    sender.on_upload(wire.DirectOffer("j-1", "n1", f"http://127.0.0.1:{port}", b"", expires,
                                      grants.sign_upload(receiver.key, "j-1", "n1", expires)))
    return sender, session


async def _nowhere(msg: wire.Message) -> None:
    raise AssertionError(f"nothing goes through the head here: {msg}")


def test_a_client_takes_results_while_it_sends_inputs_on_the_same_connection():
    """Large frames both ways at once on one connection, the client's input frames chunked and its
    receipts for results between them: every input is receipted, every result taken once."""
    from burla.client.direct_sender import DirectSender

    receiver = _Receiver()
    _assigned(receiver)
    job = receiver.dispatcher.jobs["j-1"]
    count, size = 12, 8 * 2**20
    inputs = {i: dumps(bytes([i]) * size) for i in range(count)}
    worker: Any = SimpleNamespace(batches=[])

    async def scenario() -> tuple[dict, list]:
        runner, port = await _serve_route(receiver)
        session = aiohttp.ClientSession()
        shared = SimpleNamespace(session=lambda cert: session, unreachable_nodes={})
        sender = DirectSender("j-1", dict(inputs), dumps, _nowhere, lambda: shared)  # type: ignore[arg-type]
        expires = time.time() + 60
        grant = grants.sign_upload(receiver.key, "j-1", "n1", expires)
        try:
            sender.on_upload(wire.UploadDirect("j-1", pack_uints(list(inputs)), pack_uints([size] * count), b"", "n1",
                                               f"http://127.0.0.1:{port}", b"", expires, grant))
            await _until(lambda: job.result_pipe)
            for i in range(count):  # results as large as the inputs, while those go out
                receiver.dispatcher.on_report(worker, _report((100 + i, dumps(bytes([i]) * size))))
            async with asyncio.timeout(120):
                while len(receiver.arrived) < count or len(job.out_results) < count:
                    await asyncio.sleep(0.01)
            arrived = dict(sender.arrived)  # closing the sender lets go of them
        finally:
            await sender.close()
            await session.close()
            await runner.cleanup()
        return arrived, receiver.arrived

    arrived, inputs_seen = asyncio.run(scenario())
    assert sorted(arrived) == [100 + i for i in range(count)]
    assert all(arrived[100 + i] == bytes([i]) * size for i in range(count))
    assert sorted(i for _, indices, _ in inputs_seen for i in indices) == list(range(count))
    assert receiver.dispatcher.results_sent == {True: count, False: 0}


def test_a_client_drops_a_connection_that_sends_it_what_it_did_not_ask_for():
    """Results of another job: the client's reader ends and cuts the connection, so the node sends
    what it had sent there through the head (a connection left open would hold them for good)."""
    receiver = _Receiver()

    async def scenario() -> str:
        closed = asyncio.Event()
        seen: list[str] = []

        async def node(request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
            ws = aiohttp.web.WebSocketResponse()
            await ws.prepare(request)
            await ws.send_bytes(wire.DirectResults.of("j-2", PackedInputs.of([[0, dumps(1)]])).encode())
            frame = await ws.receive(timeout=60)
            seen.append(frame.type.name)
            closed.set()
            return ws

        runner, port = await _serve_handler(node)
        sender, session = await _client_pipe(port, receiver)
        try:
            async with asyncio.timeout(60):
                await closed.wait()
        finally:
            await sender.close()
            await session.close()
            await runner.cleanup()
        return seen[0]

    assert asyncio.run(scenario()) in ("CLOSED", "CLOSE", "ERROR")


# --- the parts -----------------------------------------------------------------------------


def test_a_worker_sends_apart_only_successful_pickles_of_a_megabyte_or_more():
    big, edge, small = b"x" * LARGE, b"e" * direct_inputs.DIRECT_MIN_BYTES, b"s" * 100
    error = b"z" * LARGE  # an error record: always through the head, which lists failures
    results = [[0, True, big], [1, False, error], [2, 2, 5], [3, True, small], [4, True, edge]]
    kept, direct = split_large(results)
    assert direct is not None and direct.index_list() == [0, 4]
    assert [bytes(b"".join(direct.data.parts))] == [big + edge]  # type: ignore[union-attr]
    assert kept[1] is results[1] and kept[2:4] == results[2:4]
    assert direct_inputs.real_size(kept[0][2]) == LARGE and results[0][2] is big  # the worker's list untouched
    assert split_large([[0, True, small]]) == ([[0, True, small]], None)


def test_a_result_pickled_in_parts_goes_apart_as_its_parts():
    """A worker pickles a large buffer for a client that takes it straight in parts (the user's
    bytes as they are): they travel as parts of the report's frame, and arrive as the pickle."""
    import pickle

    from burla.protocol.values.pickle_parts import PickleParts, dumps_in_parts

    value = (b"v" * LARGE, "label")
    pickled = dumps_in_parts(value, pickle.Pickler, 5)
    assert isinstance(pickled, PickleParts) and any(part is value[0] for part in pickled.parts)
    report = _report_of([[0, True, pickled], [1, True, dumps("small")]])
    [(index, data)] = report.direct_part().items()
    assert index == 0 and loads(data) == value


def test_a_report_restored_for_the_head_is_the_report_without_the_split():
    results = [[0, True, b"x" * LARGE], [1, False, b"err"], [2, True, b"y" * LARGE]]
    plain = PackedResults.of(results)
    kept, direct = split_large(results)
    assert direct is not None
    joined = PackedInputs(direct.indices, direct.sizes, b"".join(direct.data.parts))  # type: ignore[union-attr]
    back = restored(PackedResults.of(kept), joined)
    assert (bytes(back.packed), back.indices, back.failed) == (bytes(plain.packed), plain.indices, plain.failed)
    with pytest.raises(ProtocolError, match="do not name"):
        restored(PackedResults.of(kept[:1] + [[2, True, b"y"]]), joined)


def test_a_result_taken_whole_through_the_head_leaves_nothing_of_it_behind():
    from burla.client.results import take_results

    arrived: dict = {0: "came straight, receipt lost", 1: "one"}
    received = bytearray(2)
    taken, _, _ = take_results([[0, True, dumps("whole")], [1, True, direct_inputs.placeholder(9)]], received,
                               None, {}, None, arrived)
    assert list(taken) == [0, 1] and arrived == {}


def test_a_client_fills_placeholders_with_what_came_straight_and_names_what_did_not():
    arrived: dict = {3: arrived_value(dumps(b"bytes of three")), 5: arrived_value(b"\x80\x05junk")}
    assert value_of(3, direct_inputs.placeholder(14), arrived) == b"bytes of three" and 3 not in arrived
    assert value_of(4, dumps(1), arrived) == 1  # a pickle of five bytes is no placeholder
    with pytest.raises(ProtocolError, match="input 4 was sent straight"):
        value_of(4, direct_inputs.placeholder(9), arrived)
    with pytest.raises(Exception) as failed:  # what did not unpickle fails in its place, as through the head
        value_of(5, direct_inputs.placeholder(6), arrived)
    assert not isinstance(failed.value, ProtocolError)


def test_a_direct_offer_must_name_where_and_how():
    with pytest.raises(ProtocolError):
        wire.decode(wire.DirectOffer("j", "n", "", b"", 1.0, b"g").encode(), wire.HEAD_TO_CLIENT)
    with pytest.raises(ProtocolError):
        wire.decode(wire.DirectOffer("j", "n", "http://x", b"short", 1.0, b"g").encode(), wire.HEAD_TO_CLIENT)
    with pytest.raises(ProtocolError):
        wire.decode(wire.DirectResultsReceived("j", b"abc").encode(), wire.CLIENT_TO_NODE)

