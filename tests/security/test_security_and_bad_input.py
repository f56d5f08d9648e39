"""Tokens on every endpoint, and garbage on every endpoint: a 4xx with a message, never a crash."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys

import aiohttp
import msgpack
import pytest

from burla._version import __version__
from burla.config import ENV_TOKEN
from burla.process.build import build_hash
from burla.protocol import wire
from burla.protocol.values.packed_inputs import PackedInputs
from burla.web.scoped_tokens import node_token
from tests.conftest import wait_for_nodes
from tests.support import functions


def open_job(**overrides) -> wire.OpenJob:
    values = dict(job_id=f"raw-{os.urandom(4).hex()}", function_name="f", function_bytes=b"x", n_inputs=2,
                  func_cpu=None, func_ram=None, func_gpu=None, image=None, grow=False, max_parallelism=None,
                  detach=False, raise_errors=True, region=None, disk_gb=None, parent_job_id=None,
                  retries=0, timeout=None,
                  client_version=__version__, python_version="{}.{}.0".format(*sys.version_info[:2]),
                  local_code=b"", packages={})
    values.update(overrides)
    return wire.OpenJob(**values)


HEAD_ROUTES = [
    ("GET", "/v1/cluster"),
    ("GET", "/v1/head"),
    ("GET", "/v1/jobs/anything"),
    ("POST", "/v1/jobs/anything/cancel"),
    ("POST", "/v1/shutdown"),
    ("GET", "/v1/jobs/ws"),
    ("GET", "/v1/nodes/ws"),
]


@pytest.mark.parametrize("method, path", HEAD_ROUTES)
@pytest.mark.parametrize("auth", [None, "Bearer wrong", "Basic abc", "Bearer "])
async def test_head_routes_need_the_token(cluster, method, path, auth):
    headers = {"Authorization": auth} if auth else {}
    async with aiohttp.ClientSession() as session:
        async with session.request(method, cluster.url + path, headers=headers) as response:
            assert response.status == 401
            body = await response.json()
            assert body["error"] == "Unauthorized" and "token" in body["message"]


async def test_health_needs_no_token(cluster):
    async with aiohttp.ClientSession() as session:
        async with session.get(cluster.url + "/health") as response:
            assert response.status == 200 and (await response.json())["ok"] is True


async def test_node_endpoints_need_the_nodes_own_token(cluster):
    [node] = wait_for_nodes(cluster, 1)
    node_url = node["url"]
    own = {"Authorization": f"Bearer {node_token(cluster.token, node['node_id'])}"}
    async with aiohttp.ClientSession() as session:
        async with session.get(node_url + "/v1/state") as response:
            assert response.status == 401
        async with session.get(node_url + "/v1/state", headers={"Authorization": "Bearer nope"}) as response:
            assert response.status == 401
        # The node never held the cluster token: a holder derives the node's (node_token).
        async with session.get(node_url + "/v1/state", headers=cluster.headers()) as response:
            assert response.status == 401
        async with session.get(node_url + "/v1/state", headers=own) as response:
            assert response.status == 200 and (await response.json())["node_id"] == node["node_id"]
        async with session.get(node_url + "/health") as response:
            assert response.status == 200


def test_node_with_a_wrong_token_is_refused(cluster):
    done = subprocess.run(
        [sys.executable, "-m", "burla", "node", "join", "--head", cluster.url, "--workers", "1"],
        capture_output=True, text=True, timeout=60, env={**os.environ, ENV_TOKEN: "wrong"},
    )
    assert done.returncode == 3
    assert "401" in done.stderr


def test_token_file_is_private(cluster):
    mode = stat.S_IMODE(os.stat(cluster.config_dir / "cluster_token").st_mode)
    assert mode == 0o600


def test_head_listens_on_loopback_by_default(cluster):
    assert cluster.url.startswith("http://127.0.0.1:")


# --- bad input over HTTP -----------------------------------------------------------------


async def test_unknown_job_is_404(cluster):
    async with aiohttp.ClientSession(headers=cluster.headers()) as session:
        async with session.get(cluster.url + "/v1/jobs/no-such-job") as response:
            assert response.status == 404
            assert "no-such-job" in (await response.json())["message"]
        async with session.post(cluster.url + "/v1/jobs/no-such-job/cancel") as response:
            assert response.status == 404


async def test_cancel_body_is_checked(cluster, client):
    client.remote_parallel_map(functions.double, [1], spinner=False)
    async with aiohttp.ClientSession(headers=cluster.headers()) as session:
        async with session.get(cluster.url + "/v1/cluster") as response:
            job_id = (await response.json())["jobs"][0]["job_id"]
        url = f"{cluster.url}/v1/jobs/{job_id}/cancel"
        async with session.post(url, data=b"{not json") as response:
            assert response.status == 400 and "JSON" in (await response.json())["message"]
        async with session.post(url, json={"reason": 5}) as response:
            assert response.status == 400
        async with session.post(url, json={"reason": "late"}) as response:
            assert response.status == 409 and "already ended" in (await response.json())["message"]
        async with session.post(url, data=io.BytesIO(b"x" * (2 * 1024 * 1024))) as response:
            assert response.status == 413


async def test_unknown_route_is_404(cluster):
    async with aiohttp.ClientSession(headers=cluster.headers()) as session:
        async with session.get(cluster.url + "/v1/nope") as response:
            assert response.status == 404


# --- bad input over the WebSockets -------------------------------------------------------


async def _exchange(cluster, path: str, frames: list) -> list[wire.Message]:
    """Send frames, then collect everything the head answers until it closes."""
    replies = []
    async with aiohttp.ClientSession(headers=cluster.headers()) as session:
        async with session.ws_connect(cluster.url + path) as ws:
            for frame in frames:
                if isinstance(frame, str):
                    await ws.send_str(frame)
                else:
                    await ws.send_bytes(frame)
            async for message in ws:
                if message.type == aiohttp.WSMsgType.BINARY:
                    replies.append(wire.decode(message.data))
                else:
                    break
    return replies


def _error(replies: list[wire.Message]) -> wire.ErrorReply:
    errors = [r for r in replies if isinstance(r, wire.ErrorReply)]
    assert errors, f"expected an ErrorReply, got {replies}"
    return errors[0]


@pytest.mark.parametrize(
    "frames, kind, words",
    [
        (["hello"], "ProtocolError", "binary"),
        ([b"\xc0garbage"], "ProtocolError", "msgpack"),
        ([b"\xc1garbage"], "ProtocolError", "bulk frame is shorter than its header"),  # 0xC1 marks a bulk frame
        ([open_job().encode()[:-3]], "ProtocolError", "msgpack"),
        ([msgpack.packb([1, "only-a-job-id"])], "ProtocolError", f"needs {len(wire.OpenJob.FIELDS)} fields"),
        ([wire.InputBatch.of("j", PackedInputs.of([])).encode()], "ProtocolError", "not accepted on this channel"),
        ([open_job(n_inputs=0).encode()], "ProtocolError", "n_inputs"),
        ([open_job(max_parallelism=0).encode()], "ProtocolError", "max_parallelism"),
        # Fails on the previous code (found by the fuzz test): a node's RAM over it overflowed.
        ([open_job(func_ram=5e-324).encode()], "ProtocolError", "func_ram"),
        ([open_job(func_ram=float("nan")).encode()], "ProtocolError", "func_ram"),
        ([open_job(client_version="0.0.1").encode()], "VersionMismatch", "Run the same burla"),
        ([open_job(func_gpu="H100").encode()], "NoCompatibleNodes", "func_gpu"),
        # Inputs carried in the opening are checked before the job is admitted.
        ([open_job(first_inputs=[[7, b"x"]]).encode()], "ProtocolError", "distinct input indices in 0..1"),
        ([open_job(first_inputs=[[1, b"x"], [1, b"x"]]).encode()], "ProtocolError", "distinct input indices"),
        ([open_job(first_inputs=[[0, b"x"], [1, b"x"], [2, b"x"]]).encode()], "ProtocolError",
         "distinct input indices in 0..1"),  # in order, but more than the job has
        ([open_job(first_inputs=[[0, "not-bytes"]]).encode()], "ProtocolError", "expected bytes"),
        ([open_job(first_inputs=[[0, b"x", b"y"]]).encode()], "ProtocolError", "first_inputs"),
    ],
)
async def test_job_channel_rejects_bad_openings(cluster, frames, kind, words):
    error = _error(await _exchange(cluster, "/v1/jobs/ws", frames))
    assert error.kind == kind and words in error.message
    assert 400 <= error.status < 500


def _packed(items: list) -> list:
    part = PackedInputs.of(items)
    return [part.indices, part.sizes, part.data]


@pytest.mark.parametrize(
    "batch, words",
    [
        (_packed([[7, b"x"]]), "outside 0..1"),
        (_packed([[0, b"x"], [0, b"x"]]), "twice"),
        (_packed([[0, b"x"], [1, b"y"]])[:2] + [b"xyz"], "not as long as its sizes"),
        (_packed([[0, b"x"]])[:1] + [b"", b""], "a 4-byte index and a 4-byte size"),
        ([[[0, b"x"]]], "needs 4 fields"),
        (_packed([[0, b"x"]])[:2] + ["not-bytes"], "InputBatch.data has the wrong type"),
    ],
)
async def test_job_channel_rejects_bad_inputs(cluster, batch, words):
    spec = open_job()
    replies = await _exchange(cluster, "/v1/jobs/ws", [spec.encode(), msgpack.packb([4, spec.job_id, *batch])])
    assert isinstance(replies[0], wire.JobAccepted)
    assert words in _error(replies).message


def _register(slots: int, version: str, build: str, ram_gb: float = 1.0) -> bytes:
    return wire.RegisterNode("n", "u", slots, 1, ram_gb, None, 0, None, "r", "3.11", version, build, b"", []).encode()


@pytest.mark.parametrize(
    "frame, words",
    [
        (b"\x00\x01", "msgpack"),
        (_register(slots=0, version=__version__, build=build_hash()), "slots and cpus from 1"),
        (_register(slots=2**62, version=__version__, build=build_hash()), "slots and cpus from 1"),
        # Fails on the previous code: RAM this large over a job's func_ram overflowed admission.
        (_register(slots=1, version=__version__, build=build_hash(), ram_gb=1e308), "ram_gb above 0"),
        (_register(slots=1, version=__version__, build=build_hash(), ram_gb=0.0), "ram_gb above 0"),
        (_register(slots=1, version="9.9.9", build=build_hash()), "runs burla 9.9.9"),
        (_register(slots=1, version=__version__, build="0.1.0+0000"),
         f"runs burla build 0.1.0+0000 but the head runs build {build_hash()}"),
        (wire.Credit("j", 1).encode(), "not accepted on this channel"),
    ],
)
async def test_node_channel_rejects_bad_frames(cluster, frame, words):
    assert words in _error(await _exchange(cluster, "/v1/nodes/ws", [frame])).message


def test_the_head_still_serves_after_all_that(client):
    assert client.remote_parallel_map(functions.double, range(10), spinner=False) == [x * 2 for x in range(10)]


def test_a_node_listens_on_the_address_it_is_given_when_this_machine_has_it():
    import psutil

    from burla.node.listen import bind_address

    own = next((a.address for addresses in psutil.net_if_addrs().values() for a in addresses
                if a.family.name == "AF_INET" and not a.address.startswith("127.")), None)
    if own is not None:
        assert bind_address(own) == own
    assert bind_address("127.0.0.1") == "127.0.0.1" and bind_address("0.0.0.0") == "0.0.0.0"
    assert bind_address("192.0.2.7") == "0.0.0.0"  # a documentation address no machine here has
    assert bind_address("2001:db8::7") == "::"
    assert bind_address("node-7.internal") == "node-7.internal"  # a name is bound as given
