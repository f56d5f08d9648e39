"""Where a no-op call's CPU goes: microseconds of CPU per call in the client, head, node and
workers over one job of many no-op calls on a warm local cluster, beside its wall time.

On a small machine the processes share the cores, so the sum of their CPU per call bounds how
fast calls can go: this is what to trim to make no-op calls cheaper.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from _common import noop, warm_local_cluster
from warm_latency import _cpu_s, _processes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=0, help="jobs run first and not counted")
    args = parser.parse_args()
    calls, repeats = args.calls, args.repeats
    from burla import remote_parallel_map

    runs = []
    with warm_local_cluster():
        for _ in range(args.warmup):
            remote_parallel_map(noop, list(range(calls)), spinner=False)
        processes = _processes()
        first = {name: _cpu_s(group) for name, group in processes.items()}
        for _ in range(repeats):
            before = {name: _cpu_s(group) for name, group in processes.items()}
            start = time.perf_counter()
            remote_parallel_map(noop, list(range(calls)), spinner=False)
            wall = time.perf_counter() - start
            runs.append({
                "wall_us_per_call": round(wall / calls * 1e6, 2),
                "cpu_us_per_call": {name: round((_cpu_s(group) - before[name]) / calls * 1e6, 2)
                                    for name, group in processes.items()},
            })
        # Over every run together: a short job is under the 10 ms the CPU counters resolve.
        total = {name: round((_cpu_s(group) - first[name]) / (calls * repeats) * 1e6, 2)
                 for name, group in processes.items()}
    print(json.dumps({"benchmark": "cpu_per_call", "calls": calls, "runs": runs,
                      "median_wall_us_per_call": statistics.median(run["wall_us_per_call"] for run in runs),
                      "cpu_us_per_call_over_runs": total, "cpu_sum_us_per_call": round(sum(total.values()), 2)}))


if __name__ == "__main__":
    main()
