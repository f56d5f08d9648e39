"""Calls stopped at their job's timeout (`remote_parallel_map(..., timeout=SECONDS)`).

Arbitrary code can only be stopped by ending its process, so a call past its timeout has its
worker killed; the pool replaces the worker and the dispatcher fails the call with CallTimeout
(the head runs it again if the job's retries allow). A call's start is when this watcher first
sees its index in the worker's page, so a call is stopped at most CHECK_INTERVAL_S late.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from burla.node.workers.worker_pool import TimeoutKill, WorkerHandle

log = logging.getLogger("burla.node")
CHECK_INTERVAL_S = 0.05


class TimedJobs(Protocol):
    """What the watcher reads of the dispatcher: a job's timeout, by id."""

    def timeout_of(self, job_id: str) -> float | None: ...


class CallTimeouts:
    def __init__(self, workers: Callable[[], list[WorkerHandle]], jobs: TimedJobs, on_change: Callable[[], None]
                 ) -> None:
        self._workers = workers
        self._jobs = jobs
        self._on_change = on_change
        self._seen: dict[WorkerHandle, tuple[int, int, float]] = {}  # worker -> (index, its batch's id, since)

    def check(self, now: float) -> None:
        seen: dict[WorkerHandle, tuple[int, int, float]] = {}
        for worker in self._workers():
            if not worker.alive or worker.killed_for is not None or not worker.batches:
                continue
            timeout = self._jobs.timeout_of(worker.batches[0].job_id)
            index = worker.current_index()
            if timeout is None or index < 0 or worker.reporting():  # reporting: its call is over
                continue
            key = (index, id(worker.batches[0]))
            before = self._seen.get(worker)
            since = before[2] if before is not None and before[:2] == key else now
            if now - since <= timeout:
                seen[worker] = (*key, since)
                continue
            log.warning("the call of input %d ran past its timeout of %g s; stopping worker %d", index, timeout,
                        worker.number)
            worker.killed_for = TimeoutKill(timeout)
            worker.kill()
            self._on_change()
        self._seen = seen

    async def run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_INTERVAL_S)
            self.check(time.monotonic())
