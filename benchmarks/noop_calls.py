"""10,000 no-op calls: microseconds per call, burla (warm local cluster) beside ProcessPoolExecutor."""

from __future__ import annotations

import json
import sys
from concurrent.futures import ProcessPoolExecutor

from _common import cores, median_time, noop, warm_local_cluster

CALLS = 10_000
REPEATS = 3


def main() -> None:
    from burla import remote_parallel_map

    inputs = list(range(CALLS))
    with warm_local_cluster():
        burla_s = median_time(lambda: remote_parallel_map(noop, inputs, spinner=False), REPEATS)
    with ProcessPoolExecutor(max_workers=cores()) as pool:
        list(pool.map(noop, range(100)))  # start the workers before timing
        pool_s = median_time(lambda: list(pool.map(noop, inputs, chunksize=1)), REPEATS)
    print(json.dumps({
        "benchmark": "noop_calls",
        "calls": CALLS,
        "cores": cores(),
        "burla_us_per_call": round(burla_s / CALLS * 1e6, 1),
        "process_pool_chunksize1_us_per_call": round(pool_s / CALLS * 1e6, 1),
        "speedup_vs_process_pool": round(pool_s / burla_s, 2),
        "target_us_per_call": 50,
    }))


if __name__ == "__main__":
    sys.exit(main())
