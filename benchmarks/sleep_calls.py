"""1,000 calls of time.sleep(0.01): wall time against the ideal (calls x 10 ms / cores).

burla runs them a call per CPU (func_cpu=1, like for like with ProcessPoolExecutor) and with its
default, where calls that wait share CPUs (so it beats that ideal)."""

from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor

from _common import cores, median_time, sleep_10ms, warm_local_cluster

CALLS = 1_000
REPEATS = 3


def main() -> None:
    from burla import remote_parallel_map

    ideal = CALLS * 0.01 / cores()
    inputs = list(range(CALLS))
    with warm_local_cluster():
        burla_s = median_time(lambda: remote_parallel_map(sleep_10ms, inputs, func_cpu=1, spinner=False), REPEATS)
        default_s = median_time(lambda: remote_parallel_map(sleep_10ms, inputs, spinner=False), REPEATS)
    with ProcessPoolExecutor(max_workers=cores()) as pool:
        list(pool.map(sleep_10ms, range(cores())))
        pool_s = median_time(lambda: list(pool.map(sleep_10ms, inputs, chunksize=1)), REPEATS)
    print(json.dumps({
        "benchmark": "sleep_calls",
        "calls": CALLS,
        "cores": cores(),
        "ideal_s": round(ideal, 3),
        "burla_s": round(burla_s, 3),
        "burla_over_ideal_pct": round((burla_s / ideal - 1) * 100, 1),
        "burla_default_s": round(default_s, 3),
        "process_pool_s": round(pool_s, 3),
        "process_pool_over_ideal_pct": round((pool_s / ideal - 1) * 100, 1),
        "target_over_ideal_pct": 5,
    }))


if __name__ == "__main__":
    main()
