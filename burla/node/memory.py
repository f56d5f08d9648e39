"""Memory per call, enforced by the node.

With `func_ram=N` a call whose worker grows past N GB is stopped and fails with OutOfMemory
(never retried: it would only fail again). With `func_ram="dynamic"` the node watches the sum
of its workers' memory against its budget: when calls together go over, the largest one is
stopped, the node runs one worker fewer, and that input runs again; only a call that is over
the budget alone fails. Parallelism comes back once the node is idle (for this guard and the CPU one alike).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psutil

from burla.node.dispatcher import Dispatcher
from burla.node.workers.worker_pool import MemoryKill, WorkerHandle, WorkerPool

log = logging.getLogger("burla.node")

CHECK_INTERVAL_S = 0.1
GB = 2**30


class MemoryGuard:
    def __init__(self, pool: WorkerPool, dispatcher: Dispatcher, budget_gb: float,
                 on_change: Callable[[], None]) -> None:
        self._pool = pool
        self._dispatcher = dispatcher
        self._budget_bytes = budget_gb * GB
        self._budget_gb = budget_gb
        self._on_change = on_change
        self._processes: dict[int, psutil.Process] = {}
        self._workers_bytes = 0  # what the workers used together at the last check
        self._workers_counted = 0

    def _rss(self, worker: WorkerHandle) -> int:
        process = self._processes.get(worker.pid)
        if process is None:
            process = self._processes[worker.pid] = psutil.Process(worker.pid)
        return process.memory_info().rss

    def check(self) -> None:
        workers = [w for w in self._pool.workers if w.alive and w.killed_for is None]
        live = {w.pid for w in workers}
        for pid in [p for p in self._processes if p not in live]:
            del self._processes[pid]
        usage: list[tuple[int, WorkerHandle]] = []
        for worker in workers:
            try:
                usage.append((self._rss(worker), worker))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        for rss, worker in usage:
            job = self._dispatcher.jobs.get(worker.batch_job() or "")
            if job is not None and job.func_ram is not None and rss > job.func_ram * GB:
                log.warning("worker %d uses %.2f GB, over func_ram=%g GB; stopping it", worker.number, rss / GB,
                            job.func_ram)
                self._kill(worker, MemoryKill(rss / GB, job.func_ram, per_call=True, retry=False))
                return
        total = sum(rss for rss, _ in usage)
        self._workers_bytes, self._workers_counted = total, len(usage)
        busy = [(rss, w) for rss, w in usage if w.batches]
        if total <= self._budget_bytes or not busy:
            return
        rss, worker = max(busy, key=lambda u: u[0])
        alone = self._pool.size <= 1  # it can't run fewer (an idle fresh worker beyond it runs nothing)
        if not alone:
            self._pool.shrink()
        log.warning("workers use %.2f GB, over this node's %.2f GB; stopping worker %d (%.2f GB)%s",
                    total / GB, self._budget_gb, worker.number, rss / GB,
                    "" if alone else f" and running {self._pool.size} at a time")
        self._kill(worker, MemoryKill(rss / GB, self._budget_gb, per_call=False, retry=not alone))

    def room_for_workers(self, headroom: float) -> int:
        """How many more workers fit, each using what one uses now, while the workers stay within
        `headroom` of this node's budget and take at most half of what the machine has free."""
        if not self._workers_counted:
            return 0  # nothing measured yet: no basis to add any
        per_worker = max(1, self._workers_bytes // self._workers_counted)
        room = min(headroom * self._budget_bytes - self._workers_bytes, 0.5 * psutil.virtual_memory().available)
        return max(0, int(room // per_worker))

    def _kill(self, worker: WorkerHandle, reason: MemoryKill) -> None:
        worker.killed_for = reason
        worker.kill()
        self._on_change()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_INTERVAL_S)
            if not self._dispatcher.jobs:
                self._pool.restore()  # idle: whatever guards lowered comes back
            self.check()
