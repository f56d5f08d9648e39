"""A node's first workers are forked from it: they run calls, each sees only its own socket,
and the node learns how each one ended."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

# Run in a fresh process: forking is only safe from a single thread, and pytest runs several.
SCRIPT = r"""
import asyncio, os, pickle, signal, struct
from burla.protocol import wire
from burla.protocol import worker_wire
from burla.protocol.packed_results import pack_indices
from burla.protocol.packed_results import pack_indices
from burla.node.worker_fork import can_fork, fork_workers
from burla.protocol.packed_inputs import PackedInputs
from burla.protocol.serialization import dumps_function

def triple(x):
    return (os.environ["MARK"], x * 3)

assert can_fork()
first, second, third = fork_workers(3, {**os.environ, "MARK": "forked"})

def send(worker, msg):
    data = msg.encode()
    worker.node_end.sendall(worker_wire.FRAME_HEADER.pack(len(data)) + data)

def receive(worker):
    def exactly(n):
        data = b""
        while len(data) < n:
            chunk = worker.node_end.recv(n - len(data))
            assert chunk, "the worker closed its socket"
            data += chunk
        return data
    (size,) = worker_wire.FRAME_HEADER.unpack(exactly(worker_wire.FRAME_HEADER.size))
    return wire.decode(exactly(size), worker_wire.WORKER_TO_NODE)

for worker in (first, second, third):
    ready = receive(worker)
    assert isinstance(ready, worker_wire.WorkerReady) and ready.pid == worker.process.pid != os.getpid()
    assert struct.unpack_from("q", worker.shm, 0)[0] == -1

send(second, worker_wire.LoadFunction("job", dumps_function(triple), b""))
send(second, worker_wire.RunCalls.of("job", PackedInputs.of([[7, pickle.dumps(14)]])))
report = receive(second)
results = report.part().items()
assert [(index, ok, pickle.loads(payload)) for index, ok, payload in results] == [(7, True, ("forked", 42))]

# A frame the worker can't read (its sizes promise 5 bytes, 1 came): it says why and exits non-zero.
send(third, worker_wire.RunCalls("job", pack_indices([0]), pack_indices([5]), b"x"))

async def main():
    assert await asyncio.wait_for(third.process.wait(), 30) == 1
    first.node_end.close()  # EOF: the first exits although the second (forked after it) still runs
    assert await asyncio.wait_for(first.process.wait(), 30) == 0
    second.process.kill()
    assert await asyncio.wait_for(second.process.wait(), 30) == -signal.SIGKILL
    second.process.kill()  # reaped: nothing to signal, and no error

asyncio.run(main())
print("ok")
"""


def test_forked_workers_run_calls_and_are_watched():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert "failed:" in done.stderr and "RunCalls.data is not as long as its sizes add up to" in done.stderr
