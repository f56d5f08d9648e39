"""Calls that mostly wait share CPUs: 20 and 200 calls of time.sleep(1), and a CPU-bound job
beside them, with default arguments on a warm local cluster.

Targets (nodes run more calls than CPUs while CPU and memory have headroom): 20 x sleep(1)
within 3 s and 200 x sleep(1) within 20 s on 2 CPUs, and the CPU-bound job no slower with the
default func_cpu="dynamic" than with func_cpu=1 (one call per CPU; ratio <= 1.05), both
measured here, alternating, beside ProcessPoolExecutor of as many workers as CPUs. Prints one
JSON line.

    python3 benchmarks/waiting_calls.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

from _common import cores, spin, wait_1s, warm_local_cluster

SPIN_CALLS = 40
SPIN_S = 0.05  # CPU time per CPU-bound call
SPIN_REPEATS = 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="only the 20-call run and the CPU-bound ratio")
    args = parser.parse_args()
    from burla import remote_parallel_map

    report: dict = {"benchmark": "waiting_calls", "cores": cores()}
    with warm_local_cluster():
        for calls in (20,) if args.quick else (20, 200):
            start = time.perf_counter()
            remote_parallel_map(wait_1s, list(range(calls)), spinner=False)
            report[f"sleep_1s_x{calls}_s"] = round(time.perf_counter() - start, 2)
        dynamic, one_per_cpu = [], []
        for _ in range(SPIN_REPEATS):  # alternating, so that the machine's drift hits both alike
            for times, func_cpu in ((dynamic, "dynamic"), (one_per_cpu, 1)):
                start = time.perf_counter()
                remote_parallel_map(spin, [SPIN_S] * SPIN_CALLS, func_cpu=func_cpu, spinner=False)
                times.append(time.perf_counter() - start)
        burla_spin, burla_one_per_cpu = statistics.median(dynamic), statistics.median(one_per_cpu)
    with ProcessPoolExecutor(max_workers=cores()) as pool:
        list(pool.map(spin, [0.001] * cores()))
        start = time.perf_counter()
        list(pool.map(spin, [SPIN_S] * SPIN_CALLS, chunksize=1))
        pool_spin = time.perf_counter() - start
    report.update({
        "cpu_bound_s": round(burla_spin, 3), "cpu_bound_one_per_cpu_s": round(burla_one_per_cpu, 3),
        "cpu_bound_process_pool_s": round(pool_spin, 3),
        "cpu_bound_ratio": round(burla_spin / burla_one_per_cpu, 3),
        "cpu_bound_ratio_to_process_pool": round(burla_spin / pool_spin, 3),
        "targets": {"sleep_1s_x20_s": 3.0, "sleep_1s_x200_s": 20.0, "cpu_bound_ratio": 1.05},
    })
    print(json.dumps(report))


if __name__ == "__main__":
    main()
