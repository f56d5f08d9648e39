"""A real head with N simulated nodes: what the head costs per node and per call.

The nodes speak the real node protocol over real WebSockets (RegisterNode, AssignJob, credit,
InputBatch, NodeResults, a NodeState push every second) from a few processes, so the simulator
is not the bottleneck; their "workers" answer every input at once (or after --call-ms per call,
`--slots` at a time), so the head (and the client feeding it) is all that is measured. They ask
for credit with the real node's records and rule (`burla.node.dispatcher.NodeJob`): a window of
about 0.1 s of calls, asked for in chunks of at least a quarter window. One job of
--calls no-op inputs is spread over all nodes.

    python3 benchmarks/head_scale.py --nodes 1000 --slots 32 --calls 200000 --json

Prints one JSON line: nodes, calls, calls_per_s, head_cpu_us_per_call (the head's CPU during the
job, minus what it spends idle with the same nodes), loop_lag_p99_ms (the head's event loop during
the job), idle figures, and false_deaths (live nodes the head dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import json
import math
import os
import random
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from _common import noop, private_config

from burla.node.dispatcher import NodeJob

STATE_INTERVAL_S = 1.0  # as burla.node.service pushes
# What a real worker's loop takes per no-op call (benchmarks/worker_loop.py): with --call-ms 0 the
# simulated node reports this, and sizes its credit window from it as a real node does.
INSTANT_CALL_S = 3e-6
REGISTER_TIMEOUT_S = 300.0
OTHER_MACHINES_NICENESS = 10


# --- one simulator process: many nodes in one event loop ---------------------------------


class Counts:
    def __init__(self) -> None:
        self.registered = 0
        self.false_deaths = 0  # sessions the head ended while the node was alive and talking
        self.connect_failures = 0
        self.results = 0


async def simulated_node(session, head: str, token: str, node_id: str, slots: int, call_s: float, counts: Counts,
                         stopping: asyncio.Event) -> None:
    import aiohttp

    from burla._version import __version__
    from burla.process.build import build_hash
    from burla.protocol import limits, wire

    python = ".".join(map(str, sys.version_info[:3]))
    register = wire.RegisterNode(node_id, "http://127.0.0.1:9", slots, slots, 64.0, None, 0, None, "local", python,
                                 __version__, build_hash(), b"", []).encode()
    first_session = True
    while not stopping.is_set():
        try:
            async with session.ws_connect(f"{head}/v1/nodes/ws", headers={"Authorization": f"Bearer {token}"},
                                          max_msg_size=limits.MAX_FRAME_BYTES, heartbeat=None) as ws:
                await ws.send_bytes(register)
                reply = wire.decode((await ws.receive()).data, wire.HEAD_TO_NODE)
                if not isinstance(reply, wire.NodeRegistered):
                    raise SystemExit(f"{node_id}: the head answered registration with {reply}")
                if first_session:
                    counts.registered += 1
                    first_session = False
                if await _SimulatedSession(ws, slots, call_s, counts).serve(node_id):
                    return  # the head told it to shut down
            if not stopping.is_set():
                counts.false_deaths += 1
        except (TimeoutError, aiohttp.ClientError, OSError):
            if stopping.is_set():
                return
            counts.connect_failures += 1
            await asyncio.sleep(0.5)


class _SimulatedSession:
    """One connection of a simulated node: the real node's per-job records, workers that answer
    after `call_s` (or at once), and the state pushes."""

    def __init__(self, ws, slots: int, call_s: float, counts: Counts) -> None:
        self.ws = ws
        self.slots = slots
        self.call_s = call_s
        self.counts = counts
        self.jobs: dict[str, NodeJob] = {}  # they size its credit
        self.answering: set[asyncio.Task] = set()
        self.free_at = [0.0] * slots  # a heap: when each simulated worker is next free

    async def serve(self, node_id: str) -> bool:
        """Until the connection ends; True if the head told this node to shut down."""
        import aiohttp

        from burla.protocol import wire

        pusher = asyncio.create_task(_push_state(self.ws, node_id, self.slots, self.jobs))
        try:
            async for frame in self.ws:
                if frame.type != aiohttp.WSMsgType.BINARY:
                    break
                if not await self.on_message(wire.decode(frame.data, wire.HEAD_TO_NODE)):
                    return True
        finally:
            for task in (pusher, *self.answering):
                task.cancel()
            for task in (pusher, *self.answering):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        return False

    async def on_message(self, msg) -> bool:
        """Act on one frame from the head; False when it says to shut down."""
        from burla.protocol import wire

        if isinstance(msg, wire.InputBatch):
            await self.on_inputs(msg)
        elif isinstance(msg, wire.AssignJob):
            # Its workers never grow past its slots (a real node's governor would not, for calls
            # that keep a CPU busy).
            parallelism = max(1, min(msg.parallelism, self.slots))
            job = self.jobs[msg.job_id] = NodeJob(msg.job_id, b"", parallelism, None, None, b"")
            job.credit_unused = msg.credit  # granted with the assignment
            await _ask_credit(self.ws, job)
        elif isinstance(msg, wire.CreditWithdrawn):
            job = self.jobs.get(msg.job_id)
            if job is not None:
                job.credit_unused = max(0, job.credit_unused - msg.inputs)
                await _ask_credit(self.ws, job)
        elif isinstance(msg, (wire.CancelJob, wire.ReleaseJob)):
            self.jobs.pop(msg.job_id, None)
        elif isinstance(msg, wire.ShutdownNode):
            return False
        return True

    async def on_inputs(self, msg) -> None:
        job = self.jobs.get(msg.job_id)
        if job is None:
            return
        job.took_inputs(msg.part())
        job.inflight += msg.part().count
        if self.call_s:  # its workers take call_s per call, `slots` at a time
            task = asyncio.create_task(_answer_later(self.ws, msg, job, self.free_at, self.call_s, self.counts))
            self.answering.add(task)
            task.add_done_callback(self.answering.discard)
        else:
            await _answer(self.ws, msg, job, INSTANT_CALL_S, self.counts)


async def _ask_credit(ws, job: NodeJob) -> None:
    from burla.protocol import wire

    due = job.credit_due(job.parallelism)
    if due:
        await ws.send_bytes(wire.Credit(job.job_id, due).encode())


async def _answer(ws, msg, job: NodeJob, seconds_per_call: float, counts: Counts) -> None:
    from burla.protocol import wire
    from burla.protocol.values import inline_values, packed_results
    from burla.protocol.values.inline_values import INPUT_MARK, VALUE

    # A no-op returns its input: as a pickle, or as the value itself for one that travelled inline.
    results = [[index, VALUE, inline_values.unpack_input(data)] if data[:1] == bytes((INPUT_MARK,))
               else [index, True, data] for index, data in msg.part().items()]
    job.calls_done(len(results), seconds_per_call)
    counts.results += len(results)
    # The credit the freed slots allow rides along, by the real node's rule.
    frame = wire.NodeResults.of(msg.job_id, packed_results.PackedResults.of(results), job.credit_due(job.parallelism))
    await ws.send_bytes(frame.encode())


async def _answer_later(ws, msg, job: NodeJob, free_at: list[float], call_s: float, counts: Counts) -> None:
    """Run the batch's calls on the node's workers in arrival order (`free_at`: when each worker
    is next free), then answer for all of them."""
    now = time.monotonic()
    done_at = now
    for _ in range(msg.part().count):
        start = max(now, heapq.heappop(free_at))
        heapq.heappush(free_at, start + call_s)
        done_at = max(done_at, start + call_s)
    await asyncio.sleep(done_at - now)
    with contextlib.suppress(ConnectionError, RuntimeError):
        await _answer(ws, msg, job, call_s, counts)


async def _push_state(ws, node_id: str, slots: int, jobs: dict[str, NodeJob]) -> None:
    from burla.protocol import wire

    await asyncio.sleep(random.random() * STATE_INTERVAL_S)  # nodes don't push in lockstep
    while True:
        rows = [[job_id, job.parallelism, 0, job.done] for job_id, job in jobs.items()]
        status = "RUNNING" if rows else "READY"
        await ws.send_bytes(wire.NodeState(node_id, status, slots, rows, 5.0, 20.0, 0.0, 0.0).encode())
        await asyncio.sleep(STATE_INTERVAL_S)


async def simulate(head: str, token: str, prefix: str, count: int, slots: int, call_s: float) -> None:
    import aiohttp

    counts = Counts()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    connector = aiohttp.TCPConnector(limit=0)  # one connection per node, however many
    async with aiohttp.ClientSession(connector=connector) as session:
        nodes = [asyncio.create_task(simulated_node(session, head, token, f"{prefix}-{i:05d}", slots, call_s,
                                                    counts, stopping)) for i in range(count)]
        while counts.registered < count and not stopping.is_set():
            await asyncio.sleep(0.05)
        print("ready", flush=True)
        await stopping.wait()
        for task in nodes:
            task.cancel()
        await asyncio.gather(*nodes, return_exceptions=True)
    print(json.dumps({"false_deaths": counts.false_deaths, "connect_failures": counts.connect_failures,
                      "results": counts.results}), flush=True)


# --- the coordinator ---------------------------------------------------------------------


def _get(url: str, token: str) -> dict:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def _start_head(config_dir: Path, token: str, log_path: Path) -> tuple[subprocess.Popen, str]:
    read_fd, write_fd = os.pipe()
    env = dict(os.environ, BURLA_CONFIG_DIR=str(config_dir), BURLA_CLUSTER_TOKEN=token)
    head = subprocess.Popen([sys.executable, "-m", "burla", "head", "serve", "--port", "0", "--local-nodes", "0",
                             "--driver", "local", "--ready-fd", str(write_fd)],
                            env=env, pass_fds=(write_fd,), stdout=subprocess.DEVNULL,
                            stderr=open(log_path, "ab"))
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as ready:
        url = ready.readline().decode().strip()
    if not url:
        raise SystemExit(f"the head did not start: {log_path.read_text()[-2000:]}")
    return head, url


def _profile(pid: int, output: str) -> subprocess.Popen:
    """Collapsed stacks of the head (py-spy, where installed) until _stop_profile."""
    profiler = subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--format", "raw", "--rate", "250",
                                 "--output", output], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached
    return profiler


def _stop_profile(profiler: subprocess.Popen | None) -> None:
    if profiler is not None:
        profiler.send_signal(signal.SIGINT)
        profiler.wait(60)


def _start_simulators(simulators: list[subprocess.Popen], url: str, token: str, nodes: int, slots: int,
                      call_ms: float, processes: int) -> None:
    """Start the simulator processes (into `simulators`, so the caller stops them however this
    ends) and wait until every simulated node has registered."""
    per = math.ceil(nodes / processes)
    for p in range(processes):
        count = min(per, nodes - p * per)
        if count <= 0:
            break
        simulators.append(subprocess.Popen(
            [sys.executable, __file__, "--simulate", "--head", url, "--prefix",
             f"sim{p}", "--count", str(count), "--slots", str(slots), "--call-ms", str(call_ms)],
            env=dict(os.environ, BURLA_CLUSTER_TOKEN=token), stdout=subprocess.PIPE, text=True))
    for simulator in simulators:
        if simulator.stdout.readline().strip() != "ready":
            raise SystemExit("a simulator failed to register its nodes")
    deadline = time.monotonic() + REGISTER_TIMEOUT_S
    while len(_get(f"{url}/v1/cluster", token)["nodes"]) < nodes:
        if time.monotonic() > deadline:
            raise SystemExit("not every simulated node registered")
        time.sleep(0.2)


def run(nodes: int, slots: int, calls: int, call_ms: float, processes: int, idle_s: float, profile: str | None,
        head_log: str | None, yield_to_head: bool) -> dict:
    from burla import Client

    token = secrets.token_urlsafe(24)
    with private_config() as config_dir:
        head, url = _start_head(config_dir, token, Path(head_log) if head_log else config_dir / "head.log")
        if yield_to_head:
            # The client and the nodes stand in for other machines: on this one they yield the CPU
            # to the head, so that its figures are not its waits for their time slices. (The
            # simulators inherit this niceness.)
            os.nice(OTHER_MACHINES_NICENESS)
        simulators: list[subprocess.Popen] = []
        try:
            _start_simulators(simulators, url, token, nodes, slots, call_ms, processes)
            time.sleep(STATE_INTERVAL_S * 2)  # registrations settle
            before_idle = _get(f"{url}/v1/head", token)
            profiler = _profile(before_idle["pid"], f"{profile}.idle") if profile else None
            time.sleep(idle_s)
            _stop_profile(profiler)
            after_idle = _get(f"{url}/v1/head?window_s={max(1, int(idle_s))}", token)
            idle_cpu_per_s = (after_idle["cpu_s"] - before_idle["cpu_s"]) / idle_s

            client = Client(url, token)
            client.remote_parallel_map(noop, list(range(min(calls, 1000))), spinner=False)  # warm the client's path
            before = _get(f"{url}/v1/head", token)
            profiler = _profile(before["pid"], profile) if profile else None
            start = time.perf_counter()
            results = client.remote_parallel_map(noop, list(range(calls)), spinner=False)
            wall = time.perf_counter() - start
            _stop_profile(profiler)
            after = _get(f"{url}/v1/head", token)
            # The head's lag window is asked for in whole seconds, back from when it is asked: waiting
            # until that many seconds after the job's start makes the window start with the job (not
            # in the warm-up before it).
            window_s = max(1, math.ceil(time.perf_counter() - start))
            time.sleep(max(0.0, start + window_s - time.perf_counter()))
            after["loop_lag_ms"] = _get(f"{url}/v1/head?window_s={window_s}", token)["loop_lag_ms"]
            assert results == list(range(calls)), "results came back wrong"
            job_cpu = after["cpu_s"] - before["cpu_s"]
            deaths = 0
            for simulator in simulators:
                simulator.send_signal(signal.SIGTERM)
            for simulator in simulators:
                out, _ = simulator.communicate(timeout=120)
                deaths += json.loads(out.strip().splitlines()[-1])["false_deaths"]
            return {
                "benchmark": "head_scale",
                "nodes": nodes,
                "slots_per_node": slots,
                "calls": calls,
                "call_ms": call_ms,
                "simulator_processes": len(simulators),
                "others_yield_to_head": yield_to_head,
                "wall_s": round(wall, 3),
                "calls_per_s": round(calls / wall),
                "head_cpu_us_per_call": round(max(0.0, job_cpu - idle_cpu_per_s * wall) / calls * 1e6, 2),
                "head_cpu_us_per_call_raw": round(job_cpu / calls * 1e6, 2),
                "loop_lag_p99_ms": after["loop_lag_ms"]["p99"],
                "loop_lag_max_ms": after["loop_lag_ms"]["max"],
                "idle_head_cpu_percent": round(idle_cpu_per_s * 100, 1),
                "idle_loop_lag_p99_ms": after_idle["loop_lag_ms"]["p99"],
                "head_rss_mb": after["rss_mb"],
                "false_deaths": deaths,
            }
        finally:
            for simulator in simulators:
                if simulator.poll() is None:
                    simulator.kill()
            head.send_signal(signal.SIGTERM)
            try:
                head.wait(60)
            except subprocess.TimeoutExpired:
                head.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--slots", type=int, default=32, help="worker slots per simulated node")
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--call-ms", type=float, default=0.0,
                        help="how long each simulated call takes (default 0: workers answer at once)")
    parser.add_argument("--processes", type=int, default=0, help="simulator processes (default: 1 per 250 nodes)")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds the idle cost is measured over")
    parser.add_argument("--profile-head", metavar="FILE", help="write py-spy's collapsed stacks of the head "
                        "during the job to FILE (and while idle to FILE.idle)")
    parser.add_argument("--head-log", metavar="FILE", help="keep the head's log in FILE")
    parser.add_argument("--same-priority", action="store_true",
                        help="run the client and the simulated nodes at the head's priority (by default they run at "
                        f"niceness {OTHER_MACHINES_NICENESS}, standing in for other machines)")
    parser.add_argument("--json", action="store_true", help="print one JSON line (the only output format)")
    parser.add_argument("--simulate", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--head", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.simulate:
        token = os.environ["BURLA_CLUSTER_TOKEN"]  # not an argument: `ps` shows those to every user
        asyncio.run(simulate(args.head, token, args.prefix, args.count, args.slots, args.call_ms / 1000))
        return
    if args.nodes < 1 or args.calls < 1 or args.call_ms < 0:
        parser.error("--nodes and --calls must be at least 1, --call-ms at least 0")
    processes = args.processes or max(1, math.ceil(args.nodes / 250))
    print(json.dumps(run(args.nodes, args.slots, args.calls, args.call_ms, processes, args.idle, args.profile_head,
                         args.head_log, not args.same_priority)))


if __name__ == "__main__":
    main()
