"""A worker's own cost per call: 100,000 no-op calls through the worker loop, in one process.

The node side of the worker's socket is drained by a thread; what is measured is the worker's
per-call work (unpickle, call, pickle, output capture, the running-index page), which bounds
how many calls per second each core can run.
"""

from __future__ import annotations

import json
import mmap
import os
import pickle
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CALLS = 100_000
BATCH = 1_000


def noop(x):
    return x


def main() -> None:
    from burla.node.workers.worker import Worker
    from burla.protocol.values.packed_inputs import pack_uints

    node_end, worker_end = socket.socketpair()
    threading.Thread(target=lambda: [None for _ in iter(lambda: node_end.recv(1 << 20), b"")], daemon=True).start()
    worker = Worker(worker_end, mmap.mmap(-1, mmap.PAGESIZE))
    worker.capture.install()  # fd 1 and 2 now go to the worker's pipes, as in a real worker
    worker._functions["job"] = noop
    indices, arguments = pack_uints(range(CALLS)), [pickle.dumps(i, 5) for i in range(CALLS)]
    start = time.perf_counter()
    for first in range(0, CALLS, BATCH):
        worker._run_batch("job", indices[4 * first:4 * (first + BATCH)], arguments[first:first + BATCH])
    elapsed = time.perf_counter() - start
    line = json.dumps({"benchmark": "worker_loop", "calls": CALLS, "us_per_call": round(elapsed / CALLS * 1e6, 2)})
    os.write(worker.capture.diagnostics_fd, (line + "\n").encode())  # stdout is captured by now


if __name__ == "__main__":
    main()
