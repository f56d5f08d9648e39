"""Two local nodes of one worker each beside one node of two workers, on the same machine.

Target: two nodes are never slower than one with the same workers (ratio two/one <= 1, give or
take the run-to-run noise). Both clusters stay up and the workloads alternate between them, so
that both see the same machine; each ratio is the median of the per-round ratios.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import environment, noop, sleep_10ms

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.cluster_runner import LocalCluster  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "5"))


def size_of(data: bytes) -> int:
    return len(data)


def workloads() -> dict[str, Callable[[], object]]:
    from burla import remote_parallel_map

    noops = list(range(10_000))
    sleeps = list(range(200))
    blobs = [bytes([i]) * (10 * 2**20) for i in range(20)]
    return {
        "noop_10000": lambda: remote_parallel_map(noop, noops, spinner=False),
        "sleep_10ms_200": lambda: remote_parallel_map(sleep_10ms, sleeps, spinner=False),
        "bytes_10mb_20": lambda: remote_parallel_map(size_of, blobs, spinner=False),
        "single_call": lambda: [remote_parallel_map(noop, [1], spinner=False) for _ in range(20)],
    }


def timed(cluster: LocalCluster, run: Callable[[], object]) -> float:
    with environment(**cluster.env()):
        start = time.perf_counter()
        run()
        return time.perf_counter() - start


def main() -> None:
    runs = workloads()
    with tempfile.TemporaryDirectory(prefix="burla-bench-") as directory:
        with LocalCluster(Path(directory) / "one", nodes=1, workers=2) as one, \
                LocalCluster(Path(directory) / "two", nodes=2, workers=1) as two:
            for cluster in (one, two):  # workers up, function code warm
                for run in runs.values():
                    timed(cluster, run)
            ratios: dict[str, list[float]] = {name: [] for name in runs}
            seconds: dict[str, dict[str, list[float]]] = {name: {"one": [], "two": []} for name in runs}
            for _ in range(ROUNDS):
                for name, run in runs.items():
                    one_s, two_s = timed(one, run), timed(two, run)
                    seconds[name]["one"].append(one_s)
                    seconds[name]["two"].append(two_s)
                    ratios[name].append(two_s / one_s)
    print(json.dumps({
        "benchmark": "two_nodes",
        "cores": os.cpu_count(),
        "rounds": ROUNDS,
        "one_node_s": {name: round(statistics.median(s["one"]), 4) for name, s in seconds.items()},
        "two_nodes_s": {name: round(statistics.median(s["two"]), 4) for name, s in seconds.items()},
        "two_over_one": {name: round(statistics.median(r), 3) for name, r in ratios.items()},
        "target_two_over_one": 1.0,
    }))


if __name__ == "__main__":
    sys.exit(main())
