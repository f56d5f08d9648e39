"""A skewed job on two nodes: the last inputs are 50x slower than the rest.

A node sizes its queue from the calls it has seen (fast ones), so one node can take every slow
input at the end while the other runs dry. Stealing lets the idle node take half of the busy
node's queue, so the wall time stays close to the ideal (total work / total workers). Printed
beside ProcessPoolExecutor with the same number of workers (one shared queue: the balanced
reference).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.cluster_runner import LocalCluster  # noqa: E402

SLOW_S = 0.5
FAST_S = 0.01
N_SLOW = 8
N_FAST = 200
WORKERS_PER_NODE = 1


def work(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def main() -> None:
    from burla import remote_parallel_map

    inputs = [FAST_S] * N_FAST + [SLOW_S] * N_SLOW
    workers = 2 * WORKERS_PER_NODE
    ideal = sum(inputs) / workers
    with tempfile.TemporaryDirectory(prefix="burla-bench-") as directory:
        with LocalCluster(Path(directory), nodes=2, workers=WORKERS_PER_NODE) as cluster:
            os.environ.update(cluster.env())
            # A call per CPU, as in ProcessPoolExecutor: by default calls that wait (these sleep)
            # share CPUs, and would finish far under the ideal of a call per worker.
            remote_parallel_map(work, [0.0] * 10, func_cpu=1, spinner=False)  # warm
            start = time.perf_counter()
            remote_parallel_map(work, inputs, func_cpu=1, spinner=False)
            burla_s = time.perf_counter() - start
            stolen = cluster.get("/v1/cluster")["jobs"][0]["stolen"]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        list(pool.map(work, [0.0] * workers))
        start = time.perf_counter()
        list(pool.map(work, inputs, chunksize=1))
        pool_s = time.perf_counter() - start
    print(json.dumps({
        "benchmark": "skewed_steal",
        "inputs": len(inputs),
        "ideal_s": round(ideal, 3),
        "burla_s": round(burla_s, 3),
        "burla_over_ideal_pct": round((burla_s / ideal - 1) * 100, 1),
        "inputs_stolen": stolen,
        "process_pool_s": round(pool_s, 3),
    }))


if __name__ == "__main__":
    main()
