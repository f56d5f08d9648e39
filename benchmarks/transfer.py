"""Large payloads between machines: 100 x 10 MB inputs, and 100 x 10 MB results, through the
chain a cloud cluster uses (client -> head -> node -> worker, over WebSockets), beside the
physical anchor for that chain on this machine.

The burla cluster's node has an input-file directory of its own (BURLA_INPUT_FILES_DIR), so it
does not share the client's: inputs take the inline path they take between machines, not files
in /dev/shm. The anchor is a plain relay: the same bytes through the same chain of four processes
(client -> relay -> relay -> worker, and back) over TCP on 127.0.0.1 with 4 MB buffers and
nothing else done to them. Both run in one process, alternating ROUNDS times (default 3); each
figure is the median. Beside the MB/s, the CPU seconds per GB each of burla's processes spent
(client, head, node, worker), and each of the anchor's in the same place of its chain: where the
time goes.

A third anchor, `results_kept`, is the results chain whose client receives each payload into
memory of its own and keeps it to the end, as a client returning results to its caller must.

Large inputs go straight from the client to the node that runs them (client -> node -> worker:
the head relays only their placeholders, burla.protocol.direct_inputs); `inputs_through_head` is
the same job with that turned off (BURLA_DIRECT_INPUTS=0), so every byte crosses the head. Beside
the four-process anchor, a three-process one (client -> relay -> worker) is the chain the
straight path crosses. Large results come straight from the node to the client likewise
(burla.protocol.direct_results); `results_through_head` is that job with BURLA_DIRECT_RESULTS=0.

The chain through the SSH tunnel of the cloud path, beside the same anchor with its middle hop
over an asyncssh forward, is transfer_tunnel.py.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from _common import environment
from two_nodes import Run

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.cluster_runner import LocalCluster  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "3"))
COUNT = int(os.environ.get("COUNT", "100"))  # payloads each way
SIZE = 10 * 2**20
TOTAL_MB = COUNT * SIZE / 2**20
CHUNK = 4 * 2**20

# One process of the anchor chain: `relay PORT NEXT_PORT` forwards both ways; `worker PORT` takes
# COUNT payloads and answers each with a byte (inputs), or sends COUNT payloads (results).
HOP = textwrap.dedent(f"""
    import os, socket, sys, threading
    CHUNK, SIZE, COUNT = {CHUNK}, {SIZE}, {COUNT}

    def listen(port):
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen(1)
        print(server.getsockname()[1], flush=True)
        connection, _ = server.accept()
        return connection

    def tune(sock):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, CHUNK)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CHUNK)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def pump(source, target):
        buffer = bytearray(CHUNK)
        view = memoryview(buffer)
        while True:
            n = source.recv_into(buffer)
            if not n:
                target.shutdown(socket.SHUT_WR)
                return
            target.sendall(view[:n])

    role = sys.argv[1]
    upstream = tune(listen(0))
    if role == "relay":
        downstream = tune(socket.create_connection(("127.0.0.1", int(sys.argv[2]))))
        back = threading.Thread(target=pump, args=(downstream, upstream))
        back.start()
        pump(upstream, downstream)
        back.join()
        times = os.times()
        print(times.user + times.system, flush=True)  # the CPU seconds it spent, once the chain closed
    else:
        mode = upstream.recv(1)
        buffer = bytearray(CHUNK)
        if mode == b"i":
            for _ in range(COUNT):
                left = SIZE
                while left:
                    left -= upstream.recv_into(buffer, min(CHUNK, left))
                upstream.sendall(b"k")
        else:
            payload = bytes(SIZE)
            for _ in range(COUNT):
                upstream.sendall(payload)
        upstream.close()
        times = os.times()
        print(times.user + times.system, flush=True)
""")


def start_hop(*arguments: str) -> tuple[subprocess.Popen, int]:
    """One process of the anchor chain (HOP), and the port it listens on."""
    process = subprocess.Popen([sys.executable, "-c", HOP, *arguments], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    return process, int(process.stdout.readline())


def anchor_chain_mb_s(port: int, direction: str, keep: bool = False) -> tuple[float, float]:
    """The client's end of an anchor chain whose first hop listens on `port`: MB/s of COUNT payloads
    sent to its worker (inputs) or received from it (results), and the CPU seconds it spent. With
    `keep`, it receives each result into memory of its own, kept until the end, as a client whose
    caller gets the results must (the least it can do: the kernel's copy lands there)."""
    from burla.protocol.values.buffers import unfilled

    cpu_before = time.process_time()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, CHUNK)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CHUNK)
    start = time.perf_counter()
    buffer = bytearray(CHUNK)
    if direction == "inputs":
        sock.sendall(b"i")
        payload = bytes(SIZE)
        for _ in range(COUNT):
            sock.sendall(payload)
            sock.recv(1)
    else:
        sock.sendall(b"r")
        kept = []
        for _ in range(COUNT):
            target = memoryview(unfilled(SIZE)) if keep else memoryview(buffer)  # fresh memory, not zeroed
            left = SIZE
            while left:
                received = sock.recv_into(target[SIZE - left:] if keep else target, min(CHUNK, left))
                if not received:
                    raise ConnectionError("the chain closed early")
                left -= received
            if keep:
                kept.append(target)
        kept.clear()
    elapsed = time.perf_counter() - start
    sock.close()
    return TOTAL_MB / elapsed, time.process_time() - cpu_before


def cpu_seconds_of(process: subprocess.Popen) -> float:
    """The CPU seconds an anchor hop spent, which it prints once its chain closed."""
    assert process.stdout is not None
    return float(process.stdout.readline())


def anchor_mb_s(direction: str, relays: int = 2, keep: bool = False) -> tuple[float, dict[str, float]]:
    """MB/s of COUNT payloads through client -> relay -> relay -> worker (inputs), or back (results),
    or with one relay (client -> relay -> worker), and the CPU seconds of each process, named by the
    place it takes in burla's chain."""
    worker, port = start_hop("worker")
    hops = [worker]
    for _ in range(relays):
        relay, port = start_hop("relay", str(port))
        hops.append(relay)
    try:
        mb_s, client_cpu = anchor_chain_mb_s(port, direction, keep)
        places = ["head", "nodes"][2 - relays:]  # one relay stands where the node does (the straight path)
        cpu = {"client": client_cpu, **{place: cpu_seconds_of(hop) for place, hop in zip(places, reversed(hops))},
               "workers": cpu_seconds_of(worker)}
        return mb_s, cpu
    finally:
        for process in hops:
            process.kill()
            process.wait()


def payload_size(data: bytes) -> int:
    return len(data)


def payload_of(index: int) -> bytes:
    return bytes([index % 256]) * SIZE


def workloads() -> dict[str, Callable[[], object]]:
    """The jobs: COUNT inputs of SIZE bytes in (straight to the node, and through the head), and
    COUNT results of SIZE bytes out."""
    from burla import remote_parallel_map

    inputs = [bytes([i]) * SIZE for i in range(COUNT)]
    indices = list(range(COUNT))

    def through_head() -> object:
        with environment(BURLA_DIRECT_INPUTS="0"):
            return remote_parallel_map(payload_size, inputs, spinner=False)

    def results_through_head() -> object:
        with environment(BURLA_DIRECT_RESULTS="0"):
            return remote_parallel_map(payload_of, indices, spinner=False)

    return {
        "inputs": lambda: remote_parallel_map(payload_size, inputs, spinner=False),
        "inputs_through_head": through_head,
        "results": lambda: remote_parallel_map(payload_of, indices, spinner=False),
        "results_through_head": results_through_head,
    }


# each job's anchor
DIRECTION = {"inputs": "inputs", "inputs_through_head": "inputs", "results": "results",
             "results_through_head": "results"}


def main() -> None:
    from burla import remote_parallel_map

    jobs = workloads()
    burla_mb_s: dict[str, list[float]] = {name: [] for name in jobs}
    anchors = ("inputs", "results", "inputs_one_relay", "results_one_relay", "results_kept")
    anchor: dict[str, list[float]] = {name: [] for name in anchors}
    anchor_cpu: dict[str, dict[str, float]] = {name: {} for name in anchors}  # seconds per role, summed
    with tempfile.TemporaryDirectory(prefix="burla-bench-") as directory:
        node_files = Path(directory) / "node-input-files"
        node_files.mkdir()
        # The cluster's processes get an input-file directory of their own: inputs travel inline.
        with environment(BURLA_INPUT_FILES_DIR=str(node_files)):
            cluster = LocalCluster(Path(directory) / "cluster", nodes=1, workers=2).__enter__()
        try:
            run = Run(cluster)
            with environment(**cluster.env()):
                remote_parallel_map(payload_size, [bytes(SIZE)] * 4, spinner=False)  # workers up, code warm
            for _ in range(ROUNDS):
                for name, workload in jobs.items():
                    burla_mb_s[name].append(TOTAL_MB / run.timed(name, workload))
                for name in anchors:
                    direction = "results" if name.startswith("results") else "inputs"
                    mb_s, cpu = anchor_mb_s(direction, relays=1 if name.endswith("relay") else 2,
                                            keep=name.endswith("kept"))
                    anchor[name].append(mb_s)
                    for role, seconds in cpu.items():
                        anchor_cpu[name][role] = anchor_cpu[name].get(role, 0.0) + seconds
        finally:
            cluster.stop()
    gb = TOTAL_MB / 1024
    print(json.dumps({
        "benchmark": "transfer",
        "cores": os.cpu_count(),
        "rounds": ROUNDS,
        "payloads": f"{COUNT} x {SIZE // 2**20} MB",
        "burla_inline_mb_s": {name: round(statistics.median(v), 1) for name, v in burla_mb_s.items()},
        "plain_relay_mb_s": {name: round(statistics.median(v), 1) for name, v in anchor.items()},
        "burla_over_relay": {name: round(statistics.median(burla_mb_s[name])
                                         / statistics.median(anchor[DIRECTION[name]]), 3) for name in jobs},
        "straight_inputs_over_one_relay": round(statistics.median(burla_mb_s["inputs"])
                                                / statistics.median(anchor["inputs_one_relay"]), 3),
        "straight_results_over_one_relay": round(statistics.median(burla_mb_s["results"])
                                                 / statistics.median(anchor["results_one_relay"]), 3),
        "results_over_relay_that_keeps_them": round(statistics.median(burla_mb_s["results"])
                                                    / statistics.median(anchor["results_kept"]), 3),
        "burla_cpu_s_per_gb": {name: {role: round(ms / 1e3 / gb, 3) for role, ms in run.cpu_ms(name).items()}
                               for name in jobs},
        "plain_relay_cpu_s_per_gb": {name: {role: round(seconds / ROUNDS / gb, 3) for role, seconds in cpu.items()}
                                     for name, cpu in anchor_cpu.items()},
        "target_burla_over_relay": 0.8,
    }))


if __name__ == "__main__":
    sys.exit(main())
