"""func_cpu="dynamic": calls that wait share CPUs.

A node starts with one worker per CPU. When every worker is busy, calls of a job that may run
more at once are queued here, and the machine's CPUs are mostly idle (calls waiting on sleep,
the network or a disk), the node starts more workers: as many as should bring the CPUs to
about GROW_TO busy, up to MAX_CALLS_PER_SLOT per slot and never past what the jobs may run
(their parallelism from the head: max_parallelism, func_ram) or what memory allows. When the
CPUs stay saturated it runs fewer again (extra workers retire once idle), and once the node is
idle it goes back to one worker per CPU. Jobs with an explicit func_cpu or a GPU never count:
they run exactly their share.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from burla.node.dispatcher import Dispatcher
from burla.node.memory import MemoryGuard
from burla.node.workers.worker_pool import WorkerPool

log = logging.getLogger("burla.node")

SAMPLE_S = 0.2
GROW_BELOW = 0.6  # CPUs busy below this share: calls wait on something else, more may run
GROW_TO = 0.8  # how busy added workers should make the CPUs, by the share each call used
SHRINK_ABOVE = 0.95  # CPUs this busy ...
SHRINK_AFTER = 2  # ... for this many samples in a row: run fewer extra workers
MEMORY_HEADROOM = 0.8  # workers may grow to this share of the node's memory budget
WAITING_CALL = 0.5  # a busy worker using less of a CPU than this runs a call that mostly waits


@dataclass(frozen=True)
class Sample:
    """One look at the node: what its workers did since the last one."""

    size: int  # workers the pool computes with now
    busy: int  # of them, how many ran a call through the whole sample
    cpu_per_busy_worker: float  # CPUs a busy worker used, on average (1.0: one whole CPU)
    machine_cpu: float  # share of the machine's CPUs busy, everything on it included
    cpus: int
    could_run_more: int  # queued calls that more workers would start (Dispatcher.could_run_more)
    memory_room: int  # more workers memory allows, at what a worker uses now
    # The node holds all the results it may (ResultWindow): its calls wait on the head, not on
    # something more workers would overlap, and more workers would only make more to hold.
    results_full: bool = False


def grown_size(sample: Sample, max_size: int) -> int:
    """The size to grow to, or `sample.size` if the node should not run more calls."""
    if sample.could_run_more <= 0 or sample.busy < sample.size or sample.size >= max_size or sample.results_full:
        return sample.size
    if sample.cpu_per_busy_worker >= WAITING_CALL or sample.machine_cpu >= GROW_BELOW:
        return sample.size
    # Each added worker should use about what a busy one uses now: add as many as bring the
    # machine to GROW_TO, within what is queued, the cap and memory.
    per_worker = max(sample.cpu_per_busy_worker, 0.01) / sample.cpus
    more = math.floor((GROW_TO - sample.machine_cpu) / per_worker)
    more = min(more, sample.could_run_more, max_size - sample.size, sample.memory_room)
    return sample.size + max(0, more)


def held_back(sample: Sample) -> str:
    """Why the node runs fewer calls than its jobs could use right now ("" if it does not): calls
    wait (they use little CPU) and more are queued, but the machine is too busy to add workers,
    whether by these calls or by other processes on it."""
    waiting_calls = sample.busy >= sample.size and sample.cpu_per_busy_worker < WAITING_CALL
    if sample.could_run_more <= 0 or not waiting_calls or sample.machine_cpu < GROW_BELOW:
        return ""
    ours = min(sample.machine_cpu, sample.busy * sample.cpu_per_busy_worker / sample.cpus)
    return (f"machine {100 * sample.machine_cpu:.0f}% busy ({100 * (sample.machine_cpu - ours):.0f}% by other "
            "processes): no extra calls started until it calms down")


def shrunk_size(size: int, full_size: int, machine_cpu: float) -> int:
    """With the CPUs saturated, the size that would bring them back to GROW_TO (never below
    one worker per slot: the guards lower that themselves)."""
    if size <= full_size:
        return size
    return max(full_size, min(size - 1, math.floor(size * GROW_TO / max(machine_cpu, 0.01))))


class Governor:
    """Raise the pool's size while calls wait on something other than a CPU, lower it when the
    CPUs saturate. Owned by the node service, which runs `run()` in its task group."""

    def __init__(self, pool: WorkerPool, dispatcher: Dispatcher, memory: MemoryGuard, cpus: int,
                 on_grow: Callable[[], None], on_change: Callable[[], None] = lambda: None,
                 results_full: Callable[[], bool] = lambda: False) -> None:
        self._pool = pool
        self._results_full = results_full
        self._dispatcher = dispatcher
        self._memory = memory
        self._cpus = max(1, cpus)
        self._on_grow = on_grow
        self._on_change = on_change  # what it holds back changed: the node pushes its state
        self._processes: dict[int, psutil.Process] = {}
        self._last_cpu: dict[int, float] = {}  # worker pid -> its CPU seconds at the last sample
        self._last_busy: set[int] = set()  # pids busy at the last sample
        self._last_machine = psutil.cpu_times()
        self._saturated = 0
        self.held_back = ""  # why it runs fewer calls than its jobs could use (NodeState.held_back)

    def _machine_cpu(self) -> float:
        now = psutil.cpu_times()
        before, self._last_machine = self._last_machine, now
        total = sum(now) - sum(before)
        idle = (now.idle - before.idle) + (getattr(now, "iowait", 0.0) - getattr(before, "iowait", 0.0))
        return 0.0 if total <= 0 else max(0.0, min(1.0, 1.0 - idle / total))

    def _worker_cpu(self, pid: int) -> float | None:
        process = self._processes.get(pid)
        try:
            if process is None:
                process = self._processes[pid] = psutil.Process(pid)
            times = process.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None
        return times.user + times.system

    def sample(self, elapsed: float) -> Sample:
        computing = self._pool.computing()
        busy_now = {w.pid for w in computing if w.batches}
        used: list[float] = []
        seen: dict[int, float] = {}
        for worker in computing:
            cpu = self._worker_cpu(worker.pid)
            if cpu is None:
                continue
            seen[worker.pid] = cpu
            # Busy through the whole sample: busy at both looks (a worker that was idle part of
            # it would look like one whose calls wait).
            if worker.pid in busy_now and worker.pid in self._last_busy and worker.pid in self._last_cpu:
                used.append((cpu - self._last_cpu[worker.pid]) / max(elapsed, 1e-3))
        self._last_cpu, self._last_busy = seen, busy_now
        for pid in [p for p in self._processes if p not in seen]:
            del self._processes[pid]
        memory_room = self._memory.room_for_workers(MEMORY_HEADROOM)
        return Sample(
            size=self._pool.size, busy=len(used), cpu_per_busy_worker=sum(used) / len(used) if used else 1.0,
            machine_cpu=self._machine_cpu(), cpus=self._cpus, could_run_more=self._dispatcher.could_run_more(),
            memory_room=memory_room, results_full=self._results_full(),
        )

    def check(self, elapsed: float) -> None:
        pool = self._pool
        sample = self.sample(elapsed)
        if pool.starting() or pool.size < pool.full_size:
            return  # workers still starting (their start costs CPU), or a guard lowered the size
        reason = held_back(sample) if sample.size < pool.max_size else ""
        if reason != self.held_back:
            self.held_back = reason
            self._on_change()
        self._saturated = self._saturated + 1 if sample.machine_cpu >= SHRINK_ABOVE else 0
        if self._saturated >= SHRINK_AFTER:
            self._saturated = 0
            size = shrunk_size(pool.size, pool.full_size, sample.machine_cpu)
            if size < pool.size:
                log.info("CPUs saturated (%.0f%%): running %d calls at a time", 100 * sample.machine_cpu, size)
                pool.resize(size)
            return
        size = grown_size(sample, pool.max_size)
        if size > pool.size:
            log.info("calls leave the CPUs idle (%.0f%% of a CPU each, machine %.0f%% busy): running %d at a time",
                     100 * sample.cpu_per_busy_worker, 100 * sample.machine_cpu, size)
            pool.resize(size)
            self._on_grow()

    async def run(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(SAMPLE_S)
            now = time.monotonic()
            self.check(now - last)
            last = now
