"""The head's memory (RSS) idle, after a 1,000,000-input job and after a 100 x 10 MB job.

A finished job should leave nothing behind: the target is within +50 MB of idle after each.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time

import psutil
from _common import noop, warm_local_cluster


def size_of(payload: bytes) -> int:
    return len(payload)


def head_rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def settled_rss_mb(pid: int, seconds: float = 3.0) -> float:
    """RSS once the head has flushed history and freed what the job held (the lowest of a few reads)."""
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        samples.append(head_rss_mb(pid))
        time.sleep(0.25)
    return min(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--inputs", type=int, default=1_000_000)
    parser.add_argument("--big-inputs", type=int, default=100)
    parser.add_argument("--big-mb", type=int, default=10)
    args = parser.parse_args()
    from burla import remote_parallel_map
    from burla.config import HeadRecord, config_dir

    with warm_local_cluster():
        record = HeadRecord.read(config_dir())
        assert record is not None
        gc.collect()
        idle = settled_rss_mb(record.pid)
        started = time.perf_counter()
        results = remote_parallel_map(noop, range(args.inputs), spinner=False)
        assert len(results) == args.inputs
        small_s = time.perf_counter() - started
        del results
        after_small = settled_rss_mb(record.pid)
        payloads = [bytes([i % 256]) * (args.big_mb * 2**20) for i in range(args.big_inputs)]
        sizes = remote_parallel_map(size_of, payloads, spinner=False)
        assert sizes == [len(p) for p in payloads]
        del payloads
        after_big = settled_rss_mb(record.pid)
    print(json.dumps({
        "benchmark": "head_memory",
        "idle_mb": round(idle, 1),
        "after_small_inputs_mb": round(after_small, 1),
        "small_inputs": args.inputs,
        "small_job_s": round(small_s, 2),
        "after_big_inputs_mb": round(after_big, 1),
        "big_inputs": f"{args.big_inputs} x {args.big_mb} MB",
        "growth_small_mb": round(after_small - idle, 1),
        "growth_big_mb": round(after_big - idle, 1),
        "target_growth_mb": 50,
    }))


if __name__ == "__main__":
    sys.exit(main())
