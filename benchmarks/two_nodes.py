"""Two local nodes of one worker each beside one node of two workers, on the same machine.

Target: two nodes are never slower than one with the same workers (ratio two/one <= 1, give or
take the run-to-run noise). Both clusters stay up and each workload runs on one, then on the
other, the order swapping every round, so that both see the same machine; each ratio is the
median of the per-round ratios. Beside the median times, the mean CPU each cluster's
processes spent per run (client, head, nodes, workers): where a second node's cost goes.
ROUNDS (default 8) should be even, so that each cluster goes first as often.
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from _common import environment, noop, sleep_10ms

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.cluster_runner import LocalCluster  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "8"))
ROLES = ("client", "head", "nodes", "workers")


def size_of(data: bytes) -> int:
    return len(data)


def workloads() -> dict[str, Callable[[], object]]:
    from burla import remote_parallel_map

    noops = list(range(10_000))
    sleeps = list(range(200))
    blobs = [bytes([i]) * (10 * 2**20) for i in range(20)]
    return {
        "noop_10000_x3": lambda: [remote_parallel_map(noop, noops, spinner=False) for _ in range(3)],
        "sleep_10ms_200": lambda: remote_parallel_map(sleep_10ms, sleeps, spinner=False),
        "bytes_10mb_20": lambda: remote_parallel_map(size_of, blobs, spinner=False),
        "single_call_x20": lambda: [remote_parallel_map(noop, [1], spinner=False) for _ in range(20)],
    }


def processes(cluster: LocalCluster) -> dict[str, list[psutil.Process]]:
    """The cluster's own processes by role (a node's workers are its children; its fork server,
    if any, counts with them: it forks replacements, and is idle otherwise)."""
    assert cluster.head is not None
    nodes = [psutil.Process(node.pid) for node in cluster.nodes.values()]
    workers = [child for node in nodes for child in node.children(recursive=True)]
    return {"head": [psutil.Process(cluster.head.pid)], "nodes": nodes, "workers": workers}


def cpu_by_pid(group: list[psutil.Process]) -> dict[int, float]:
    seconds = {}
    for process in group:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:  # a worker that retired meanwhile
            continue
        seconds[process.pid] = times.user + times.system
    return seconds


class Run:
    """One cluster's runs of each workload: wall seconds, and CPU seconds per role."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.seconds: dict[str, list[float]] = collections.defaultdict(list)
        self.cpu: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def timed(self, name: str, run: Callable[[], object]) -> float:
        before = {role: cpu_by_pid(members) for role, members in processes(self.cluster).items()}
        client = psutil.Process()
        with environment(**self.cluster.env()):
            client_before = sum(client.cpu_times()[:2])  # read last and first: listing costs the client CPU
            start = time.perf_counter()
            run()
            elapsed = time.perf_counter() - start
            self.cpu[name]["client"] += sum(client.cpu_times()[:2]) - client_before
        self.seconds[name].append(elapsed)
        # Listed again: workers a node started during the run (calls that wait share CPUs) count
        # whole; those that retired during it are missed.
        for role, members in processes(self.cluster).items():
            was = before[role]
            self.cpu[name][role] += sum(seconds - was.get(pid, 0.0) for pid, seconds in cpu_by_pid(members).items())
        return elapsed

    def cpu_ms(self, name: str) -> dict[str, float]:
        runs = len(self.seconds[name])
        return {role: round(self.cpu[name][role] / runs * 1e3, 2) for role in ROLES}


def main() -> None:
    runs = workloads()
    with tempfile.TemporaryDirectory(prefix="burla-bench-") as directory:
        with LocalCluster(Path(directory) / "one", nodes=1, workers=2) as one_cluster, \
                LocalCluster(Path(directory) / "two", nodes=2, workers=1) as two_cluster:
            for cluster in (one_cluster, two_cluster):  # workers up, function code warm
                with environment(**cluster.env()):
                    for run in runs.values():
                        run()
            one, two = Run(one_cluster), Run(two_cluster)
            ratios: dict[str, list[float]] = collections.defaultdict(list)
            for round_number in range(ROUNDS):
                for name, run in runs.items():
                    if round_number % 2:
                        two_s, one_s = two.timed(name, run), one.timed(name, run)
                    else:
                        one_s, two_s = one.timed(name, run), two.timed(name, run)
                    ratios[name].append(two_s / one_s)
    print(json.dumps({
        "benchmark": "two_nodes",
        "cores": os.cpu_count(),
        "rounds": ROUNDS,
        "one_node_s": {name: round(statistics.median(s), 4) for name, s in one.seconds.items()},
        "two_nodes_s": {name: round(statistics.median(s), 4) for name, s in two.seconds.items()},
        "two_over_one": {name: round(statistics.median(r), 3) for name, r in ratios.items()},
        "one_node_cpu_ms": {name: one.cpu_ms(name) for name in runs},
        "two_nodes_cpu_ms": {name: two.cpu_ms(name) for name in runs},
        "target_two_over_one": 1.0,
    }))


if __name__ == "__main__":
    sys.exit(main())
