"""10,000 no-op calls, burla beside a peer in alternating rounds: microseconds per call per round.

The peer is joblib (loky) or Ray (`ray.util.multiprocessing.Pool`, `--peer ray`). Both stay warm
through the run (burla's embedded local cluster, the peer's workers); each round times several
jobs of each and keeps their median. On a shared machine a single run of either says little:
rounds side by side say which is faster in the same minutes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from _common import noop, warm_local_cluster
from peers import joblib_pool, prepare_worker_environment, ray_pool

CALLS = 10_000


def median_us_per_call(run: Callable[[], list[Any]], expected: list[Any], jobs: int) -> float:
    seconds = []
    for _ in range(jobs):
        start = time.perf_counter()
        results = run()
        seconds.append(time.perf_counter() - start)
        if results != expected:
            raise RuntimeError("a no-op job returned other results than its inputs")
    return round(statistics.median(seconds) / len(expected) * 1e6, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=7, help="jobs per tool per round (their median is kept)")
    parser.add_argument("--peer", choices=("joblib", "ray"), default="joblib")
    args = parser.parse_args()
    prepare_worker_environment()
    from burla import remote_parallel_map

    inputs = list(range(CALLS))
    rounds = []
    peer = args.peer
    with warm_local_cluster(), (joblib_pool if peer == "joblib" else ray_pool)() as pool:
        def burla_job() -> list[Any]:
            return remote_parallel_map(noop, inputs, spinner=False)

        def peer_job() -> list[Any]:
            return pool.map(noop, inputs)

        burla_job(), peer_job()  # warm both
        for _ in range(args.rounds):
            rounds.append({"burla": median_us_per_call(burla_job, inputs, args.jobs),
                           peer: median_us_per_call(peer_job, inputs, args.jobs)})
    print(json.dumps({
        "benchmark": "noop_rounds",
        "calls": CALLS,
        "rounds": rounds,
        f"burla_under_{peer}": sum(r["burla"] < r[peer] for r in rounds),
        f"median_ratio_burla_to_{peer}": round(statistics.median(r["burla"] / r[peer] for r in rounds), 2),
    }))


if __name__ == "__main__":
    main()
