"""Each party holds only the credential it needs: a job's calls a job token, a node its node
token, a job's client the job's secret. Each test is a way in that the cluster token, held by
every call and every node, used to open."""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
import threading
import time

import aiohttp
import cloudpickle
import pytest

from burla._version import __version__
from burla.head.scheduling.records import NodeRecord
from burla.head.scheduling.steals import StolenReports
from burla.process.build import build_hash
from burla.protocol import grants, wire
from burla.protocol.values.packed_results import PackedResults
from burla.web.scoped_tokens import job_secret, job_token, node_token, scope_of
from tests.conftest import start_head, wait_for_nodes
from tests.security.test_security_and_bad_input import open_job
from tests.support import functions
from tests.support.helpers import get_json

PYTHON = "{}.{}.0".format(*sys.version_info[:2])


def _register(node_id: str, python: str = PYTHON) -> wire.RegisterNode:
    return wire.RegisterNode(node_id, "http://127.0.0.1:9", 1, 1, 1.0, None, 0, None, "local", python, __version__,
                             build_hash(), b"", [])


async def _answer(session: aiohttp.ClientSession, url: str, frame: wire.Message) -> wire.Message | int:
    """The head's first answer to `frame` on a new WebSocket (or the handshake's HTTP status)."""
    try:
        async with session.ws_connect(url) as ws:
            await ws.send_bytes(frame.encode())
            reply = await ws.receive(timeout=60)
            assert reply.type == aiohttp.WSMsgType.BINARY, reply
            return wire.decode(reply.data)
    except aiohttp.WSServerHandshakeError as e:
        return e.status


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_jobs_code_finds_no_cluster_token_only_its_jobs_own(cluster, client):
    # Fails on the previous code: every call had BURLA_CLUSTER_TOKEN in its environment.
    [seen] = client.remote_parallel_map(functions.credentials_seen, [0], spinner=False)
    assert cluster.token not in " ".join(seen["environ"].values())
    assert cluster.token.encode() not in seen["block"]
    assert "BURLA_CLUSTER_TOKEN" not in seen["environ"]
    scope = scope_of(cluster.token, seen["environ"]["BURLA_JOB_TOKEN"])
    assert scope is not None and scope.kind == "job" and scope.subject == seen["environ"]["BURLA_PARENT_JOB_ID"]


def test_a_job_token_opens_nested_jobs_and_reads_its_tree_and_nothing_else(cluster, client):
    # Fails on the previous code: with the token a call held, it could read and cancel any job,
    # take over any job's results, change settings, stop the cluster and register as a node.
    assert client.remote_parallel_map(functions.double, [1], spinner=False) == [2]
    other = get_json(cluster, "/v1/jobs?limit=1")["jobs"][0]["job_id"]
    [outcome] = client.remote_parallel_map(functions.what_a_job_token_opens, [other], spinner=False)
    assert outcome == {
        "own job": 200, "other job": 403, "job list": 403, "settings": 403, "change settings": 403,
        "stop the cluster": 403, "cancel other job": 403, "attach to other job": "Unauthorized",
        "open a job outside its tree": "Unauthorized", "open a child of another job": "Unauthorized",
        "register a node": 403,
    }
    # ... while nesting, which is what the token is for, works.
    assert client.remote_parallel_map(functions.nested_sum, [4], spinner=False) == [12]
    assert client.remote_parallel_map(functions.two_stage_pipeline, [["ab", "cde"]], spinner=False) == [[4, 6]]


async def test_resuming_a_job_takes_its_secret_even_with_the_cluster_token(cluster):
    # Fails on the previous code: any token holder took over any job by its id (the newest connection won).
    spec = open_job(n_inputs=3)
    async with aiohttp.ClientSession(headers=cluster.headers()) as session:
        async with session.ws_connect(cluster.url + "/v1/jobs/ws") as owner:
            await owner.send_bytes(spec.encode())
            accepted = wire.decode((await owner.receive(timeout=60)).data)
            assert isinstance(accepted, wire.JobAccepted)
            assert accepted.job_secret and accepted.job_secret == job_secret(cluster.token, spec.job_id)
            for wrong in ("", "x" * len(accepted.job_secret), job_secret(cluster.token, "another-job")):
                answer = await _answer(session, cluster.url + "/v1/jobs/ws", wire.ResumeJob(spec.job_id, 0, b"", wrong))
                assert isinstance(answer, wire.ErrorReply) and answer.kind == "Unauthorized", answer
                assert "secret" in answer.message
            # The owner's connection was not taken over: it still cancels its job.
            await owner.send_bytes(wire.CancelJob(spec.job_id, "done testing").encode())
            while not isinstance(ended := wire.decode((await owner.receive(timeout=60)).data), wire.JobEnded):
                assert isinstance(ended, wire.Progress), ended
            assert ended.status == "CANCELED"


async def test_a_node_token_registers_its_own_node_and_does_nothing_else(cluster):
    token = node_token(cluster.token, "scoped-a")
    async with aiohttp.ClientSession(headers=_bearer(token)) as session:
        answer = await _answer(session, cluster.url + "/v1/nodes/ws", _register("scoped-b"))
        assert isinstance(answer, wire.ErrorReply) and "can't register node scoped-b" in answer.message
        for method, path in (("GET", "/v1/cluster"), ("GET", "/v1/jobs"), ("POST", "/v1/cluster/stop")):
            async with session.request(method, cluster.url + path) as response:
                assert response.status == 403, (method, path)
        assert await _answer(session, cluster.url + "/v1/jobs/ws", open_job()) == 403
        # A node token of another cluster is no token at all.
        async with session.get(cluster.url + "/v1/cluster", headers=_bearer(node_token("other", "scoped-a"))) as r:
            assert r.status == 401


async def test_a_second_registration_under_a_live_nodes_id_is_refused(cluster, client):
    # Fails on the previous code: the newcomer took the id over and the node was disconnected.
    [node] = wait_for_nodes(cluster, 1)
    async with aiohttp.ClientSession(headers=cluster.headers()) as session:
        answer = await _answer(session, cluster.url + "/v1/nodes/ws", _register(node["node_id"]))
    assert isinstance(answer, wire.ErrorReply) and "is connected" in answer.message
    assert [n["node_id"] for n in get_json(cluster, "/v1/cluster")["nodes"]] == [node["node_id"]]
    assert client.remote_parallel_map(functions.double, [5], spinner=False) == [10]


async def test_a_live_nodes_session_is_taken_over_by_no_token_only_by_that_node_proving_it(own_cluster):
    """A call that read a node's token (from its config file) and registered under its id took its
    session and its next job. Its token alone no longer does; the node itself, proving the session
    the head gave it, still reconnects before the head noticed its old connection end."""
    cluster = own_cluster
    [node] = wait_for_nodes(cluster, 1)
    stolen = _bearer(node_token(cluster.token, node["node_id"]))
    async with aiohttp.ClientSession(headers=stolen) as session:
        answer = await _answer(session, cluster.url + "/v1/nodes/ws", _register(node["node_id"]))
        forged = _register(node["node_id"]).replace(session_proof=b"p" * 32)
        forged_answer = await _answer(session, cluster.url + "/v1/nodes/ws", forged)
    for refused in (answer, forged_answer):
        assert isinstance(refused, wire.ErrorReply) and "proving the session" in refused.message
    assert [n["node_id"] for n in get_json(cluster, "/v1/cluster")["nodes"]] == [node["node_id"]]
    assert cluster.client().remote_parallel_map(functions.double, [5], spinner=False) == [10]  # it goes on
    assert "without its session's proof" in cluster.log()
    # The node itself: registered, then again on a second connection with its session's proof.
    own = _bearer(node_token(cluster.token, "proving-node"))
    async with aiohttp.ClientSession(headers=own) as session:
        async with session.ws_connect(cluster.url + "/v1/nodes/ws") as first:
            await first.send_bytes(_register("proving-node", python="2.7.18").encode())
            registered = wire.decode((await first.receive(timeout=60)).data)
            assert isinstance(registered, wire.NodeRegistered)
            proof = grants.session_proof(registered.grant_key, "proving-node")
            again = _register("proving-node", python="2.7.18").replace(session_proof=proof)
            assert isinstance(await _answer(session, cluster.url + "/v1/nodes/ws", again), wire.NodeRegistered)


async def _rogue_writes(cluster, job_id_holder: list, stop: threading.Event) -> None:
    """A registered node that runs nothing writes results and output into the job that runs."""
    async with aiohttp.ClientSession(headers=cluster.headers()) as session:
        async with session.ws_connect(cluster.url + "/v1/nodes/ws") as ws:
            # A Python no job of this client's runs on: the head gives it no share.
            await ws.send_bytes(_register("rogue", python="2.7.18").encode())
            assert isinstance(wire.decode((await ws.receive(timeout=60)).data), wire.NodeRegistered)
            while not job_id_holder:
                await asyncio.sleep(0.05)
            job_id = job_id_holder[0]
            forged = PackedResults.of([[0, True, cloudpickle.dumps("forged")], [1, True, cloudpickle.dumps("forged")]])
            await ws.send_bytes(wire.NodeResults.of(job_id, forged, 0).encode())
            await ws.send_bytes(wire.OutputBatch(job_id, [[0, wire.STDOUT, "forged output\n"]]).encode())
            stolen = wire.Stolen(job_id, "nobody", [0, 1], "t", time.time() + 60, b"g" * 32, b"r" * 32)
            await ws.send_bytes(stolen.encode())
            await ws.send_bytes(wire.Credit(job_id, 10**9).encode())
            while not stop.is_set():
                await asyncio.sleep(0.05)


@pytest.fixture
def own_cluster(tmp_path):
    """A head of its own: a node that registers and leaves stays on a head's mind for a while
    (it may rejoin), which would change what the shared cluster's other tests see."""
    head = start_head(tmp_path / "config")
    try:
        wait_for_nodes(head, 1)  # inside: a head whose node never came is stopped all the same
        yield head
    finally:
        head.stop()


def test_a_calls_memory_holds_neither_the_cluster_nor_the_nodes_token(tmp_path):
    # Fails on the previous code: workers were forked from their node, itself forked from the
    # head, so a call found both tokens in the memory it inherited (say, the head's settings).
    cluster_token = "ct-" + secrets.token_hex(24)
    head = start_head(tmp_path / "config", token=cluster_token)
    try:
        [node] = wait_for_nodes(head, 1)
        tokens = {"cluster": cluster_token, "node": node_token(cluster_token, node["node_id"])}
        prefixes = {kind: token[:len(token) // 2] for kind, token in tokens.items()}
        [found] = head.client().remote_parallel_map(functions.memory_after, [sorted(prefixes.values())],
                                                    spinner=False)
    finally:
        head.stop()
    for kind, token in tokens.items():
        assert not [chunk for chunk in found[prefixes[kind]] if chunk.startswith(token.encode())], \
            f"a call's memory holds the {kind} token"


def test_a_node_cannot_write_into_a_job_it_does_not_run(own_cluster, capsys):
    # Fails on the previous code: the client took the rogue node's results (pickles it unpickles).
    cluster, client = own_cluster, own_cluster.client()
    job_id_holder: list[str] = []
    stop = threading.Event()
    rogue = threading.Thread(target=lambda: asyncio.run(_rogue_writes(cluster, job_id_holder, stop)), daemon=True)
    rogue.start()

    def spot_the_job() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not job_id_holder:
            running = get_json(cluster, "/v1/jobs?status=RUNNING")["jobs"]
            if running:
                job_id_holder.append(running[0]["job_id"])
            time.sleep(0.05)

    spotter = threading.Thread(target=spot_the_job, daemon=True)
    spotter.start()
    try:
        results = client.remote_parallel_map(functions.pause_then_double, [(1, 3.0), (2, 3.0)], spinner=False)
    finally:
        stop.set()
        spotter.join(60)
        rogue.join(60)
    assert job_id_holder, "the job was never seen running"
    assert results == [2, 4]
    assert "forged" not in capsys.readouterr().out


def test_a_steal_report_moves_inputs_only_under_the_heads_grant_once():
    donor = NodeRecord("donor", "http://x", 1, 1, 1.0, None, 0, None, "local", "3.11", "0.1.0",
                       grant_key=os.urandom(32))
    reports = StolenReports()
    expires = time.time() + grants.GRANT_TTL_S
    good = grants.sign(donor.grant_key, "j", "donor", "thief", "t-1", expires)
    now = time.time()

    def stolen(indices: list[int], transfer_id: str = "t-1", grant: bytes = good, donor_id: str = "donor",
               thief_id: str = "thief") -> wire.Stolen:
        receipt = grants.receipt(donor.grant_key, "j", donor_id, thief_id, transfer_id, indices)
        return wire.Stolen("j", donor_id, indices, transfer_id, expires, grant, receipt)

    assert "not the head's" in reports.refusal("thief", stolen([1], grant=b"x" * 32), donor, now)
    # A grant is the thief's own: another node can't show it.
    assert reports.refusal("other", stolen([1], thief_id="other"), donor, now) is not None
    # Fails on the previous code: a granted thief could name any of the donor's inputs. Only
    # those the donor's receipt names move.
    more = wire.Stolen("j", "donor", [1, 2, 3], "t-1", expires, good, stolen([1]).receipt)
    assert "receipt" in reports.refusal("thief", more, donor, now)
    assert reports.refusal("thief", stolen([1]), donor, now) is None
    assert "reported already" in reports.refusal("thief", stolen([2]), donor, now)
    assert "not registered" in reports.refusal("thief", stolen([1], "t-2", donor_id="gone"), None, now)


@pytest.mark.parametrize("spelling", ["", "bjt1..", "bjt1.am9i.", "bjt1.am9i.AAAA", "bnt1.!!.x", "bjt1.am9i.x.y"])
def test_malformed_scoped_tokens_are_no_tokens(spelling):
    assert scope_of("cluster-token", spelling) is None
    valid = job_token("cluster-token", "job")
    assert scope_of("cluster-token", valid) is not None
    assert scope_of("cluster-token", valid + "=") is None  # only the canonical spelling
    assert scope_of("another-token", valid) is None


async def test_a_job_token_collects_its_nested_jobs_but_not_its_own_and_ends_with_its_job(cluster):
    # A call may collect a job nested in its own without that job's secret (its tree is its own),
    # never its own job, whose client is the user's; once its job ended, its token opens nothing.
    parent = open_job(n_inputs=3)  # waits for inputs that never come: it runs until canceled
    async with aiohttp.ClientSession(headers=cluster.headers()) as owner_session:
        async with owner_session.ws_connect(cluster.url + "/v1/jobs/ws") as owner:
            await owner.send_bytes(parent.encode())
            assert isinstance(wire.decode((await owner.receive(timeout=60)).data), wire.JobAccepted)
            calls = _bearer(job_token(cluster.token, parent.job_id))
            async with aiohttp.ClientSession(headers=calls) as session:
                child = open_job(n_inputs=2, parent_job_id=parent.job_id)
                async with session.ws_connect(cluster.url + "/v1/jobs/ws") as opener:
                    await opener.send_bytes(child.encode())
                    assert isinstance(wire.decode((await opener.receive(timeout=60)).data), wire.JobAccepted)
                collected = await _answer(session, cluster.url + "/v1/jobs/ws", wire.ResumeJob(child.job_id, 0, b""))
                assert isinstance(collected, wire.JobResumed), collected
                own = await _answer(session, cluster.url + "/v1/jobs/ws", wire.ResumeJob(parent.job_id, 0, b""))
                assert isinstance(own, wire.ErrorReply) and own.kind == "Unauthorized"
                taken = await _answer(session, cluster.url + "/v1/jobs/ws",
                                      open_job(job_id=child.job_id, parent_job_id=parent.job_id))
                assert isinstance(taken, wire.ErrorReply) and "taken" in taken.message
                await owner.send_bytes(wire.CancelJob(parent.job_id, "done").encode())
                while not isinstance(wire.decode((await owner.receive(timeout=60)).data), wire.JobEnded):
                    pass
                late = await _answer(session, cluster.url + "/v1/jobs/ws",
                                     open_job(parent_job_id=parent.job_id))
                assert isinstance(late, wire.ErrorReply) and "not running" in late.message


async def test_a_job_tree_has_a_budget_of_its_own_and_other_jobs_are_still_admitted(tmp_path):
    """With its job token, a call opened nested jobs with large functions and kept them open until
    the head's memory ran out and the next user's job was refused. A tree now has its own limits,
    on open jobs and on bytes held, each refused with 429 naming the option that raises it."""
    limits = ["--max-tree-jobs", "3", "--max-tree-mb", "25"]
    head = start_head(tmp_path / "config", local_nodes=1, workers=1, extra=limits)
    held = []
    try:
        wait_for_nodes(head, 1)
        async with aiohttp.ClientSession(headers=head.headers()) as owner, \
                aiohttp.ClientSession(headers=_bearer(job_token(head.token, "tree-root"))) as call:

            async def opened(session: aiohttp.ClientSession, spec: wire.OpenJob) -> wire.Message:
                ws = await session.ws_connect(head.url + "/v1/jobs/ws", max_msg_size=0)
                held.append(ws)  # open: the job stays open while its client is connected
                await ws.send_bytes(spec.encode())
                return wire.decode((await ws.receive(timeout=60)).data)

            assert isinstance(await opened(owner, open_job(job_id="tree-root", n_inputs=2)), wire.JobAccepted)
            big = 10 * 2**20
            for _ in range(2):
                nested = open_job(parent_job_id="tree-root", function_bytes=b"f" * big)
                assert isinstance(await opened(call, nested), wire.JobAccepted)
            over_bytes = await opened(call, open_job(parent_job_id="tree-root", function_bytes=b"f" * big))
            assert isinstance(over_bytes, wire.ErrorReply) and over_bytes.kind == "BudgetExceeded"
            assert over_bytes.status == 429 and "--max-tree-mb 25" in over_bytes.message
            assert isinstance(await opened(call, open_job(parent_job_id="tree-root")), wire.JobAccepted)
            over_jobs = await opened(call, open_job(parent_job_id="tree-root"))
            assert isinstance(over_jobs, wire.ErrorReply) and over_jobs.status == 429
            assert "--max-tree-jobs 3" in over_jobs.message and "tree-root" in over_jobs.message
            # Another user's job is not held back by that tree.
            assert isinstance(await opened(owner, open_job()), wire.JobAccepted)
            for ws in held:
                await ws.close()
    finally:
        head.stop()
