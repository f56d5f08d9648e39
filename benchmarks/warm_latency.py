"""Warm single-call latency: one job of one input on a running head, beside a warm process pool."""

from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor

from _common import median_time, noop, warm_local_cluster

REPEATS = 50


def main() -> None:
    from burla import remote_parallel_map

    with warm_local_cluster():
        burla_s = median_time(lambda: remote_parallel_map(noop, [1], spinner=False), REPEATS)
    with ProcessPoolExecutor(max_workers=1) as pool:
        pool.submit(noop, 0).result()
        pool_s = median_time(lambda: pool.submit(noop, 1).result(), REPEATS)
    print(json.dumps({
        "benchmark": "warm_latency",
        "repeats": REPEATS,
        "burla_ms": round(burla_s * 1e3, 2),
        "process_pool_ms": round(pool_s * 1e3, 3),
        "target_ms": 20,
    }))


if __name__ == "__main__":
    main()
