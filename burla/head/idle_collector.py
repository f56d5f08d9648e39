"""The cyclic GC's long pauses, moved to when no job runs.

Objects that live long (a node's connection is some 125 of them: its tasks, buffers, futures)
are walked by the GC's middle and old generations until a full collection has moved them out of
reach of the frequent ones. When 1,000 nodes register and a job starts right after, those walks
came during the job: pauses of 60-80 ms of the head's only event loop. After the cluster changed
(nodes came or went, jobs ended) and no job has run for a moment, this collects everything once,
so the next job starts with its generations holding only what it makes.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable

from burla.process.memory import give_back_memory

log = logging.getLogger("burla.head")

QUIET_BEFORE_S = 2.0  # no job running for this long before collecting
CHECK_EVERY_S = 0.5


class IdleCollector:
    def __init__(self, jobs_running: Callable[[], bool]) -> None:
        self._jobs_running = jobs_running
        self._changes = 0  # cluster changes since the last collection
        self._quiet_since: float | None = None

    def changed(self) -> None:
        """A node registered or left, or a job ended: objects worth collecting may have piled up."""
        self._changes += 1

    def collect_if_due(self, now: float) -> bool:
        """One check: collect if something changed and no job has run for QUIET_BEFORE_S."""
        if self._jobs_running():
            self._quiet_since = None
            return False
        if self._quiet_since is None:
            self._quiet_since = now
        if not self._changes or now - self._quiet_since < QUIET_BEFORE_S:
            return False
        self._changes = 0
        started = time.perf_counter()
        found = gc.collect()
        give_back_memory()  # the heap's free pages: large inputs and results passed through meanwhile
        log.debug("collected %d objects while idle in %.1f ms", found, (time.perf_counter() - started) * 1000)
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_EVERY_S)
            self.collect_if_due(time.monotonic())
