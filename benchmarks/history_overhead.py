"""History overhead: 100,000 calls that each print a line, with the head's SQLite history on and
off (`--no-history`), side by side in one run. History writes are batched off the hot path, so
the difference should be a few percent at most."""

from __future__ import annotations

import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.cluster_runner import LocalCluster  # noqa: E402

CALLS = 100_000
REPEATS = 3
ROUNDS = 4


def chatty(x: int) -> int:
    print(f"call {x} says hello")
    return x


def timed_run(head_args: list[str]) -> list[float]:
    from burla import remote_parallel_map

    samples = []
    with tempfile.TemporaryDirectory(prefix="burla-bench-") as directory:
        with LocalCluster(Path(directory), nodes=1, workers=2, head_args=head_args) as cluster:
            os.environ.update(cluster.env())
            with contextlib.redirect_stdout(io.StringIO()):
                remote_parallel_map(chatty, range(1000), spinner=False)  # warm
            for _ in range(REPEATS):
                sink = io.StringIO()
                start = time.perf_counter()
                with contextlib.redirect_stdout(sink):
                    results = remote_parallel_map(chatty, range(CALLS), spinner=False)
                samples.append(time.perf_counter() - start)
                assert len(results) == CALLS and sink.getvalue().count("says hello") == CALLS
    return samples


def main() -> None:
    with_history, without_history = [], []
    for _ in range(ROUNDS):  # interleave, so drift on a shared machine hits both alike
        with_history += timed_run([])
        without_history += timed_run(["--no-history"])
    on, off = statistics.median(with_history), statistics.median(without_history)
    print(json.dumps({
        "benchmark": "history_overhead",
        "calls": CALLS,
        "with_history_s": round(on, 3),
        "without_history_s": round(off, 3),
        "overhead_pct": round((on / off - 1) * 100, 1),
        "spread_pct": round((statistics.pstdev(without_history) / off) * 100, 1),  # run-to-run noise
        "target_overhead_pct": "a few",
    }))


if __name__ == "__main__":
    main()
