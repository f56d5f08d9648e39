"""A node's workers come from its fork server, a fresh interpreter: they run calls, see the GPU
they were given, each holds only its own socket, and the node learns how each ended; without the
server, the node still learns that they ended."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

# Run in a fresh process: the test owns the server's process and its exit.
SCRIPT = r"""
import asyncio, os, pickle, signal, struct
from burla.protocol import wire
from burla.protocol import worker_wire
from burla.node.workers.fork_server import NO_GPU, NO_GPUS, UNKNOWN_EXIT, ForkServer, start_fork_server
from burla.protocol.values.packed_results import pack_indices
from tests.support.helpers import result_value
from burla.protocol.values.packed_inputs import PackedInputs
from burla.protocol.values.serialization import dumps_function

def visible(x):
    return (os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ["MARK"], os.getppid(), x)

process, control = start_fork_server({**os.environ, "MARK": "served"})
server_pid = process.pid
server = ForkServer(process, control)
server.request(0, 1)  # before any event loop runs, as a node asks for its first workers

async def frame(reader):
    (size,) = worker_wire.FRAME_HEADER.unpack(await reader.readexactly(worker_wire.FRAME_HEADER.size))
    return wire.decode(await reader.readexactly(size), worker_wire.WORKER_TO_NODE)

async def call(process, sock, shm):
    reader, writer = await asyncio.open_connection(sock=sock)
    ready = await frame(reader)
    assert isinstance(ready, worker_wire.WorkerReady) and ready.pid == process.pid
    assert struct.unpack_from("q", shm, 0)[0] == -1
    run = worker_wire.RunCalls.of("job", PackedInputs.of([[3, pickle.dumps(5)]]))
    for msg in (worker_wire.LoadFunction("job", dumps_function(visible), b""), run):
        data = msg.encode()
        writer.write(worker_wire.FRAME_HEADER.pack(len(data)) + data)
    report = await frame(reader)
    return writer, [result_value(ok, payload) for _, ok, payload in report.part().items()]

def name(pid):
    with open(f"/proc/{pid}/comm") as comm:
        return comm.read().strip()

async def main():
    started = await asyncio.gather(server.start(0, 1), server.start(1, NO_GPU), server.start(2, NO_GPUS),
                                   server.start(4, NO_GPUS))
    *started, (broken, broken_sock, _) = started
    results = []
    writers = []
    import socket
    from burla.node.workers.fork_server import WORKER_SOCKET_BUFFER
    with open("/proc/sys/net/core/wmem_max") as limit:
        widest = 2 * min(WORKER_SOCKET_BUFFER, int(limit.read()))  # Linux doubles what it grants
    for worker, sock, shm in started:
        # Large inputs go to a worker in as few writes as the system allows.
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == widest
        writer, result = await call(worker, sock, shm)
        writers.append(writer)
        results.extend(result)
    assert name(server_pid) == "burla-forksrv"  # it has served requests: it named itself before
    assert {name(worker.pid) for worker, _, _ in started} == {name(os.getpid())}  # workers keep the node's name
    assert results == [("1", "served", server_pid, 5), ("", "served", server_pid, 5),
                       (os.environ.get("CUDA_VISIBLE_DEVICES"), "served", server_pid, 5)], results
    (first, _, _), (second, _, _), (third, _, _) = started
    # A frame a worker can't read (its sizes promise 5 bytes, 1 came): it says why and exits non-zero.
    data = worker_wire.RunCalls("job", pack_indices([0]), pack_indices([5]), b"x").encode()
    broken_sock.sendall(worker_wire.FRAME_HEADER.pack(len(data)) + data)
    assert await asyncio.wait_for(broken.wait(), 30) == 1
    writers[0].close()  # EOF: the worker exits cleanly
    assert await asyncio.wait_for(first.wait(), 30) == 0
    second.kill()
    assert await asyncio.wait_for(second.wait(), 30) == -signal.SIGKILL
    os.kill(server_pid, signal.SIGKILL)  # the server dies: its last worker is still watched
    os.waitpid(server_pid, 0)
    await asyncio.sleep(0.2)
    try:
        await server.start(3, NO_GPUS)
        raise AssertionError("a dead server started a worker")
    except ConnectionError:
        pass
    assert not server.alive
    third.kill()
    assert await asyncio.wait_for(third.wait(), 30) == UNKNOWN_EXIT

asyncio.run(main())
print("ok")
"""


def test_the_fork_server_starts_workers_and_reports_how_they_ended():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert "failed:" in done.stderr and "RunCalls.data is not as long as its sizes add up to" in done.stderr
