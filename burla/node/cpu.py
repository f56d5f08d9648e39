"""func_cpu="dynamic": give calls more CPU by running fewer at once where they wait for a core.

Every second the node reads, for each busy worker, the scheduler's own accounting of its
threads (/proc/PID/task/*/schedstat: time on a CPU, time waiting for one). When a call keeps
two or more threads busy (it is multithreaded) and the workers' threads wait on the run queue
at least half as long as they run, for two samples in a row, the node runs one worker fewer.
A single-threaded call never triggers it, so a busy machine alone does not lower parallelism.
Parallelism comes back once the node is idle. Linux only; elsewhere this guard does nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from burla.node.dispatcher import Dispatcher
from burla.node.workers.worker_pool import WorkerPool

log = logging.getLogger("burla.node")

SAMPLE_S = 0.5
ACTIVE_THREAD = 0.3  # a thread running or runnable this share of the time is doing the call's work
WAIT_RATIO = 0.5  # run-queue wait per unit of CPU time that counts as waiting for a core
SAMPLES_IN_A_ROW = 2


def _thread_stats(pid: int) -> dict[str, tuple[int, int]] | None:
    """Per thread of a process: (nanoseconds on a CPU, nanoseconds waiting for one)."""
    stats = {}
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    run, wait, _ = f.read().split()
            except (OSError, ValueError):
                continue
            stats[tid] = (int(run), int(wait))
    except OSError:
        return None
    return stats


class CpuGuard:
    def __init__(self, pool: WorkerPool, dispatcher: Dispatcher) -> None:
        self._pool = pool
        self._dispatcher = dispatcher
        self._last: dict[int, dict[str, tuple[int, int]]] = {}
        self._last_at = time.monotonic()
        self._strikes = 0
        self.enabled = os.path.exists("/proc/self/task")

    def check(self) -> None:
        now = time.monotonic()
        elapsed_ns = max(1, int((now - self._last_at) * 1e9))
        self._last_at = now
        busy = []
        for worker in self._pool.workers:
            job = self._dispatcher.jobs.get(worker.batch_job() or "")
            if not worker.alive or job is None or job.func_cpu is not None or worker.waiting:
                continue
            busy.append(worker.pid)
        current = {pid: stats for pid in busy if (stats := _thread_stats(pid)) is not None}
        multithreaded = False
        total_cpu = total_wait = 0
        for pid, threads in current.items():
            if pid not in self._last:
                continue  # a worker seen for the first time: its totals span its whole life
            before = self._last[pid]
            active = 0
            for tid, (on_cpu, waiting) in threads.items():
                start = before.get(tid, (0, 0))  # a thread started since the last sample
                cpu, wait = on_cpu - start[0], waiting - start[1]
                total_cpu += cpu
                total_wait += wait
                if cpu + wait > ACTIVE_THREAD * elapsed_ns:
                    active += 1
            multithreaded = multithreaded or active >= 2
        self._last = current
        if multithreaded and total_cpu and total_wait / total_cpu > WAIT_RATIO:
            self._strikes += 1
        else:
            self._strikes = 0
        if self._strikes >= SAMPLES_IN_A_ROW and self._pool.size > 1:
            self._strikes = 0
            size = self._pool.shrink()
            log.warning("calls wait for a core (%.0f%% of their CPU time); running %d at a time", 100 * total_wait /
                        total_cpu, size)

    async def run(self) -> None:
        if not self.enabled:
            return
        while True:
            await asyncio.sleep(SAMPLE_S)
            self.check()
