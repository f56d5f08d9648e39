"""1,000,000 no-op inputs on a warm local cluster: microseconds per call, the client's peak memory
beside the size of its pickled inputs, and the head's memory once the job is over.

Targets: <= 6 us per call; the client's peak growth, net of the results it returns (the caller's
list and the unpickled values: what any tool must hold), <= 2x the pickled inputs; the head back
within +50 MB of idle.
"""

from __future__ import annotations

import argparse
import gc
import json
import pickle
import sys
import threading
import time

import psutil
from _common import noop, warm_local_cluster


class PeakRss:
    """The highest RSS of this process while it runs, sampled every few milliseconds."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def settled_rss_mb(pid: int, seconds: float = 3.0) -> float:
    """The lowest of a few reads: RSS once the head has flushed history and freed the job."""
    process = psutil.Process(pid)
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        samples.append(process.memory_info().rss / 2**20)
        time.sleep(0.25)
    return min(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--inputs", type=int, default=1_000_000)
    args = parser.parse_args()
    from burla import remote_parallel_map
    from burla.config import HeadRecord, config_dir

    inputs = list(range(args.inputs))
    pickled_mb = sum(len(pickle.dumps(x, pickle.HIGHEST_PROTOCOL)) for x in inputs) / 2**20
    with warm_local_cluster():
        record = HeadRecord.read(config_dir())
        assert record is not None
        head_idle = settled_rss_mb(record.pid)
        gc.collect()
        before = psutil.Process().memory_info().rss
        with PeakRss() as peak:
            started = time.perf_counter()
            results = remote_parallel_map(noop, inputs, spinner=False)
            elapsed = time.perf_counter() - started
        assert results == inputs
        results_mb = (sys.getsizeof(results) + sum(sys.getsizeof(value) for value in results)) / 2**20
        del results
        head_after = settled_rss_mb(record.pid)
    growth_mb = (peak.peak - before) / 2**20
    overhead_mb = growth_mb - results_mb
    print(json.dumps({
        "benchmark": "many_inputs",
        "inputs": args.inputs,
        "us_per_call": round(elapsed / args.inputs * 1e6, 2),
        "pickled_inputs_mb": round(pickled_mb, 1),
        "client_peak_growth_mb": round(growth_mb, 1),
        "results_mb": round(results_mb, 1),
        "client_overhead_mb": round(overhead_mb, 1),
        "client_overhead_vs_pickled": round(overhead_mb / pickled_mb, 2),
        "head_idle_mb": round(head_idle, 1),
        "head_after_mb": round(head_after, 1),
        "head_growth_mb": round(head_after - head_idle, 1),
        "targets": {"us_per_call": 6, "client_overhead_vs_pickled": 2, "head_growth_mb": 50},
    }))


if __name__ == "__main__":
    sys.exit(main())
