"""1,000 calls of time.sleep(0.01): wall time against the ideal (calls x 10 ms / cores).

burla runs them a call per CPU (func_cpu=1, like for like with ProcessPoolExecutor) and with its
default, where calls that wait share CPUs (so it beats that ideal). A sleep of 10 ms takes
longer than 10 ms (how much longer depends on the machine), so each call also returns how long
it really took: `*_in_call_s` is that time per core, the best any scheduler could do with these
calls, and `*_efficiency` is it over the wall time (what the time between calls costs)."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

from _common import cores, median_time, sleep_10ms, timed_sleep_10ms, warm_local_cluster

CALLS = 1_000
REPEATS = 3


def measured(run: Callable[[], list[float]]) -> tuple[float, float, float]:
    """Medians over REPEATS runs: the wall time, the calls' own time per core, and the ratio of
    the second to the first (taken run by run)."""
    walls, in_call, efficiency = [], [], []
    for _ in range(REPEATS):
        start = time.perf_counter()
        durations = run()
        walls.append(time.perf_counter() - start)
        in_call.append(sum(durations) / cores())
        efficiency.append(in_call[-1] / walls[-1])
    return statistics.median(walls), statistics.median(in_call), statistics.median(efficiency)


def main() -> None:
    from burla import remote_parallel_map

    ideal = CALLS * 0.01 / cores()
    inputs = list(range(CALLS))
    with warm_local_cluster():
        burla_s, burla_in_call, burla_efficiency = measured(
            lambda: remote_parallel_map(timed_sleep_10ms, inputs, func_cpu=1, spinner=False))
        default_s = median_time(lambda: remote_parallel_map(sleep_10ms, inputs, spinner=False), REPEATS)
    with ProcessPoolExecutor(max_workers=cores()) as pool:
        list(pool.map(sleep_10ms, range(cores())))
        pool_s, pool_in_call, pool_efficiency = measured(lambda: list(pool.map(timed_sleep_10ms, inputs, chunksize=1)))
    print(json.dumps({
        "benchmark": "sleep_calls",
        "calls": CALLS,
        "cores": cores(),
        "ideal_s": round(ideal, 3),
        "burla_s": round(burla_s, 3),
        "burla_over_ideal_pct": round((burla_s / ideal - 1) * 100, 1),
        "burla_in_call_s": round(burla_in_call, 3),
        "burla_efficiency": round(burla_efficiency, 4),
        "burla_default_s": round(default_s, 3),
        "process_pool_s": round(pool_s, 3),
        "process_pool_over_ideal_pct": round((pool_s / ideal - 1) * 100, 1),
        "process_pool_in_call_s": round(pool_in_call, 3),
        "process_pool_efficiency": round(pool_efficiency, 4),
        "target_over_ideal_pct": 5,
    }))


if __name__ == "__main__":
    main()
