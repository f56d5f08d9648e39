"""Warm single-call latency: one job of one input on a running head, beside a warm process pool.

Also prints the CPU time each process spends per job (client, head, node, workers): on a small
machine the processes share the cores, so a warm call is as fast as their CPU allows.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import psutil
from _common import median_time, noop, warm_local_cluster

from burla.node.workers.fork_server import PROCESS_NAME as FORK_SERVER_NAME

REPEATS = 50
CPU_JOBS = 300


def _processes() -> dict[str, list[psutil.Process]]:
    from burla.config import HeadRecord

    record = HeadRecord.read(Path(os.environ["BURLA_CONFIG_DIR"]))
    assert record is not None
    head = psutil.Process(record.pid)
    nodes = head.children()  # its local nodes (forked from it, or `burla node join`)
    workers = [w for node in nodes for w in node.children(recursive=True) if w.name() != FORK_SERVER_NAME]
    return {"client": [psutil.Process()], "head": [head], "node": nodes, "workers": workers}


def _cpu_s(processes: list[psutil.Process]) -> float:
    return sum(sum(p.cpu_times()[:2]) for p in processes)


def main() -> None:
    from burla import remote_parallel_map

    with warm_local_cluster():
        burla_s = median_time(lambda: remote_parallel_map(noop, [1], spinner=False), REPEATS)
        processes = _processes()
        before = {name: _cpu_s(group) for name, group in processes.items()}
        start = time.perf_counter()
        for _ in range(CPU_JOBS):
            remote_parallel_map(noop, [1], spinner=False)
        elapsed = time.perf_counter() - start
        cpu_ms = {name: round((_cpu_s(group) - before[name]) / CPU_JOBS * 1e3, 2) for name, group in processes.items()}
    with ProcessPoolExecutor(max_workers=1) as pool:
        pool.submit(noop, 0).result()
        pool_s = median_time(lambda: pool.submit(noop, 1).result(), REPEATS)
    print(json.dumps({
        "benchmark": "warm_latency",
        "repeats": REPEATS,
        "burla_ms": round(burla_s * 1e3, 2),
        "burla_mean_ms_over_cpu_run": round(elapsed / CPU_JOBS * 1e3, 2),
        "cpu_ms_per_job": cpu_ms,
        "process_pool_ms": round(pool_s * 1e3, 3),
        "target_ms": 3,
    }))


if __name__ == "__main__":
    main()
