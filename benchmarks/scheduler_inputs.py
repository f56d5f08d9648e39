"""The head's scheduler work per input, on its pure state: no sockets, no event loop.

A job of --inputs small inputs arrives in client runs of --run inputs; after each run, one node
asks for as many, is pushed them, and answers every one (all succeeded, as the common case's
results come). Prints one JSON line: ns per input to queue a run, to push it, and to record its
results, medians of --repeats jobs.

    python3 benchmarks/scheduler_inputs.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from burla.head.scheduling.records import JobRecord, NodeRecord  # noqa: E402
from burla.head.scheduling.scheduler import Scheduler  # noqa: E402
from burla.protocol import wire  # noqa: E402
from burla.protocol.values.inline_values import pack_input  # noqa: E402
from burla.protocol.values.packed_inputs import PackedInputs  # noqa: E402


def _job(scheduler: Scheduler, job_id: str, n: int) -> JobRecord:
    spec = wire.OpenJob(job_id, "noop", b"fn", n, None, None, None, None, False, None, False, True, None, None,
                        None, 0, None, "0", "3.11", b"", {})
    return scheduler.admit(spec)


def one_job(runs: list[PackedInputs], n: int, index: int) -> tuple[float, float, float]:
    scheduler = Scheduler()
    scheduler.add_node(NodeRecord("n1", "http://n1", 2, 2, 8.0, None, 0, None, "local", "3.11", "0"))
    job = _job(scheduler, f"j{index}", n)
    queue_s = push_s = results_s = 0.0
    for run in runs:
        began = time.perf_counter()
        scheduler.add_packed(job, run)
        queued = time.perf_counter()
        scheduler.grant("n1", job.job_id, run.count)
        pushes = scheduler.plan_for("n1", job.job_id)
        pushed = time.perf_counter()
        for _, _, frame in pushes:
            if not scheduler.record_successes("n1", job, frame.indices):
                raise RuntimeError("a push's results were not taken as the common case")
        queue_s += queued - began
        push_s += pushed - queued
        results_s += time.perf_counter() - pushed
    if job.n_done != n:
        raise RuntimeError(f"{job.n_done} of {n} inputs done")
    return queue_s, push_s, results_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=10_000)
    parser.add_argument("--run", type=int, default=1_000, help="inputs per client upload run")
    parser.add_argument("--repeats", type=int, default=50)
    arguments = parser.parse_args()
    n, size = arguments.inputs, arguments.run
    runs = [PackedInputs.of([[i, pack_input(i)] for i in range(start, min(n, start + size))])
            for start in range(0, n, size)]
    timings = [one_job(runs, n, index) for index in range(arguments.repeats)]
    queue, push, results = (statistics.median(t[part] for t in timings) / n * 1e9 for part in range(3))
    print(json.dumps({"benchmark": "scheduler_inputs", "inputs": n, "run": size, "queue_ns_per_input": round(queue),
                      "push_ns_per_input": round(push), "results_ns_per_input": round(results),
                      "total_ns_per_input": round(queue + push + results)}))


if __name__ == "__main__":
    main()
