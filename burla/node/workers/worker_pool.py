"""The node's worker processes: spawn, talk to, watch and replace them.

Each worker gets one end of a private socketpair (never a listening port) and a shared page
in which it publishes the input index it is running. The pool reads every worker's frames on
the event loop and hands them to the owner through two callbacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import mmap
import os
import signal
import socket
import sys
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from burla.config import MAX_CALLS_PER_SLOT
from burla.errors import BurlaError, CallTimeout, OutOfMemory, ProtocolError
from burla.node.gpus import ENV_VISIBLE, Gpus
from burla.node.workers.fork_server import NO_GPU, NO_GPUS, ForkServer, ServedProcess, worker_socketpair
from burla.node.workers.worker_link import WorkerLink
from burla.process.loop_supervisor import end_tasks
from burla.protocol import limits, wire, worker_wire
from burla.protocol.framing import Payload
from burla.protocol.values.packed_inputs import UINT_BYTES, PackedInputs, unpack_uints

Process = asyncio.subprocess.Process | ServedProcess

log = logging.getLogger("burla.node")
_INDEX = worker_wire.PAGE_SLOT  # the shared page's layout: worker_wire
CLOSE_WAIT_S = 5.0


@dataclass
class Batch:
    """A worker's batch: its inputs from position `reported` on are still without a result."""

    job_id: str
    part: PackedInputs
    dispatched_at: float
    reported: int = 0

    @property
    def left(self) -> int:
        return self.part.count - self.reported

    def took_results(self, indices: bytes) -> int:
        """These inputs' results are in (packed indices, as in a WorkerReport); returns how many.

        A worker reports its batch's results in the batch's order, so they are the next ones here:
        one comparison of bytes checks it. Were they not, the batch is cut down to the inputs still
        without a result, one by one."""
        size = UINT_BYTES
        at = self.reported * size
        if self.part.indices[at:at + len(indices)] == indices:
            self.reported += len(indices) // size
            return len(indices) // size
        reported = set(unpack_uints(indices))
        left = [item for item in self.remaining_items() if item[0] not in reported]
        taken = self.left - len(left)
        self.part, self.reported = PackedInputs.of(left), 0
        return taken

    def remaining_items(self) -> list[tuple[int, Payload]]:
        return self.part.items()[self.reported:]

    def remaining_indices(self) -> list[int]:
        return self.part.index_list()[self.reported:]

    def next_index(self) -> int:
        """The input the worker runs next (or runs now); -1 if none is left."""
        at = self.reported * UINT_BYTES
        return unpack_uints(self.part.indices[at:at + UINT_BYTES])[0] if self.left else -1


@dataclass(frozen=True)
class MemoryKill:
    used_gb: float
    limit_gb: float
    per_call: bool  # over the job's func_ram (True) or the node's memory (False)
    retry: bool  # run the input again (with fewer workers) instead of failing it


@dataclass(frozen=True)
class TimeoutKill:
    timeout_s: float  # the node stopped it: its call ran past the job's timeout (call_timeouts.py)


def kill_error(index: int, kill: MemoryKill | TimeoutKill) -> BurlaError | None:
    """Why the call of a worker the node stopped failed; None: it runs again (with fewer workers)."""
    if isinstance(kill, TimeoutKill):
        return CallTimeout(index, kill.timeout_s)
    if kill.retry:
        return None
    return OutOfMemory(index, kill.used_gb, kill.limit_gb, kill.per_call)


@dataclass(eq=False)
class WorkerHandle:
    number: int
    process: Process
    writer: asyncio.WriteTransport
    reader: WorkerLink
    shm: mmap.mmap
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    loaded_jobs: set[str] = field(default_factory=set)
    batches: deque[Batch] = field(default_factory=deque)
    last_progress_at: float = 0.0
    alive: bool = True
    waiting: bool = False  # its call waits on a nested job: its slot is lent to another worker
    retired: bool = False  # an extra worker told to exit now that the slot came back
    killed_for: MemoryKill | TimeoutKill | None = None  # set when the node stopped it (memory, timeout)
    reader_task: asyncio.Task | None = None
    gpu: int | None = None  # the GPU it sees (CUDA_VISIBLE_DEVICES), None: none
    # Whose calls it runs: None while fresh (it never ran a call), then its first job's tenant
    # (NodeJob.tenant) for good. It never runs another tenant's call.
    tenant: bytes | None = None
    idle_since: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, *msgs: wire.Message) -> None:
        """Frame and write these messages in one write (one syscall, one wake-up of the worker),
        but for a bulk frame's payloads, which are written as they are."""
        for part in worker_wire.framed(msgs):
            self.writer.write(part)

    def current_index(self) -> int:
        return _INDEX.unpack_from(self.shm, 0)[0]

    def reporting(self) -> bool:
        """Whether it is sending results between two calls (worker_wire.REPORTING_AT)."""
        return _INDEX.unpack_from(self.shm, worker_wire.REPORTING_AT)[0] != 0

    def batch_job(self) -> str | None:
        return self.batches[0].job_id if self.batches else None

    def signal_cancel(self) -> None:
        try:
            os.kill(self.pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        try:
            self.process.kill()
        except ProcessLookupError:
            pass


ReportHandler = Callable[[WorkerHandle, worker_wire.WorkerReport], None]
ExitHandler = Callable[[WorkerHandle, int | None], None]
ReadyHandler = Callable[[WorkerHandle], None]


def _unbound(*_: object) -> None:
    raise RuntimeError("the worker pool's handlers are not bound yet")


KEEP_WARM_S = 30.0  # a tenant's idle workers wait this long for its next job once it has none here


class Tenants(Protocol):
    """What the pool asks of the node's jobs about its workers' tenants (node/tenancy.py's Tenancy)."""

    def tenant_live(self, tenant: bytes) -> bool:
        """Whether a job of this tenant is on the node."""

    def yields(self, worker: WorkerHandle) -> bool:
        """Whether this idle worker should give its slot to a fresh one, for another tenant."""

    fresh_coming: Callable[[], int]


class _NoJobs:
    fresh_coming: Callable[[], int] = staticmethod(lambda: 0)

    def tenant_live(self, tenant: bytes) -> bool:
        return True

    def yields(self, worker: WorkerHandle) -> bool:
        return False


class WorkerPool:
    """The node's worker processes. Started before the node's web stack is even imported (a cold
    node boots its workers meanwhile); their frames are read once the node binds its handlers."""

    def __init__(self, size: int, env: dict[str, str], gpus: Gpus = Gpus(None, 0),
                 fork_server: ForkServer | None = None) -> None:
        self.size = size  # workers computing at once; guards lower it under pressure, the governor raises it
        self.full_size = size  # one per slot: what an idle node comes back to
        self.max_size = size * MAX_CALLS_PER_SLOT
        self._env = env
        self._gpus = gpus
        self._free_gpus = set(range(gpus.count))  # GPUs no live worker sees
        self._on_report: ReportHandler = _unbound
        self._on_exit: ExitHandler = _unbound
        self._on_ready: ReadyHandler = _unbound
        self._room: Callable[[int], Awaitable[None] | None] = lambda read: None
        self.workers: list[WorkerHandle] = []
        self._closing = False
        self._spawns: set[asyncio.Task] = set()
        self._numbers = itertools.count(size)
        self._processes: set[Process] = set()  # every worker process started
        self._fork_server = fork_server  # starts workers in milliseconds, while it runs
        self._first_gpus: dict[int, int | None] = {}  # the GPUs of the workers asked for early
        self._bound = False
        self._tenants: Tenants = _NoJobs()

    def bind_tenants(self, tenants: Tenants) -> None:
        """Ask `tenants` whose workers to keep, and tell it what fresh workers are coming."""
        self._tenants = tenants
        tenants.fresh_coming = self.fresh_coming

    def fresh_coming(self) -> int:
        """Fresh workers being started (each can take any tenant's calls once it joins)."""
        return len(self._spawns)

    def bind(self, on_report: ReportHandler, on_exit: ExitHandler, on_ready: ReadyHandler,
             room: Callable[[int], Awaitable[None] | None] = lambda read: None) -> None:
        """Hand the workers' frames and exits to the node from now on (what they sent before
        waits in their sockets: a forked worker is ready before the node is). Before each frame
        it reads from a worker, a reader asks `room` (told the bytes it read since), and awaits
        what that returns (the node's ResultWindow holding back its workers)."""
        self._on_report, self._on_exit, self._on_ready = on_report, on_exit, on_ready
        self._room = room
        self._bound = True
        for handle in self.workers:
            self._start_reading(handle)

    def request_first_workers(self) -> None:
        """Ask the fork server for the first workers now, before the event loop runs: they boot
        while the node imports its web stack. `start` then takes them."""
        if self._fork_server is None:
            return
        for number in range(self.size):
            gpu = self._first_gpus[number] = self._take_gpu()
            self._fork_server.request(number, self._gpu_code(gpu))

    async def start(self) -> None:
        """Start the workers; they report ready by themselves once the node is bound."""
        gpus = [self._first_gpus.pop(n) if n in self._first_gpus else self._take_gpu() for n in range(self.size)]
        self.workers = list(await asyncio.gather(*(self._spawn(n, gpu) for n, gpu in enumerate(gpus))))

    def _gpu_code(self, gpu: int | None) -> int:
        return NO_GPUS if not self._gpus.count else NO_GPU if gpu is None else gpu

    def alive_count(self) -> int:
        return sum(1 for w in self.workers if w.alive and w.ready.is_set())

    def _take_gpu(self, wanted: int | None = None) -> int | None:
        """A GPU for a new worker (the lowest free one, or `wanted` if free); None if none is."""
        if not self._free_gpus:
            return None
        gpu = wanted if wanted in self._free_gpus else min(self._free_gpus)
        self._free_gpus.discard(gpu)
        return gpu

    def _give_back(self, gpu: int | None) -> None:
        if gpu is not None:
            self._free_gpus.add(gpu)

    async def _spawn(self, number: int, gpu: int | None) -> WorkerHandle:
        """Start worker `number` seeing `gpu` (taken from the free ones by the caller; given back
        if the worker can't start)."""
        try:
            return await self._start_process(number, gpu)
        except BaseException:
            self._give_back(gpu)
            raise

    async def _start_process(self, number: int, gpu: int | None) -> WorkerHandle:
        process: Process
        if self._fork_server is not None and self._fork_server.alive:
            try:
                process, node_end, shm = await self._fork_server.start(number, self._gpu_code(gpu))
            except ConnectionError:
                pass  # the server is gone: start it as a new interpreter
            else:
                handle = await self._handle(number, process, node_end, shm)
                handle.gpu = gpu
                return handle
        env = self._env
        if self._gpus.count:  # each worker sees its own GPU, or none
            env = {**env, ENV_VISIBLE: "" if gpu is None else str(gpu)}
        node_end, worker_end = worker_socketpair()
        with tempfile.TemporaryFile() as page:
            page.truncate(mmap.PAGESIZE)
            shm = mmap.mmap(page.fileno(), mmap.PAGESIZE)
            _INDEX.pack_into(shm, 0, -1)
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "burla.node.workers.worker",
                str(worker_end.fileno()),
                str(page.fileno()),
                pass_fds=(worker_end.fileno(), page.fileno()),
                stdin=asyncio.subprocess.DEVNULL,
                env=env,
            )
        worker_end.close()
        handle = await self._handle(number, process, node_end, shm)
        handle.gpu = gpu
        return handle

    async def _handle(self, number: int, process: Process, node_end: socket.socket, shm: mmap.mmap) -> WorkerHandle:
        self._processes.add(process)
        transport, link = await asyncio.get_running_loop().connect_accepted_socket(
            lambda: WorkerLink(limits.MAX_FRAME_BYTES), sock=node_end)
        handle = WorkerHandle(number, process, transport, link, shm)
        if self._bound:
            self._start_reading(handle)
        return handle

    def _start_reading(self, handle: WorkerHandle) -> None:
        if handle.reader_task is None:
            handle.reader_task = asyncio.create_task(self._read(handle), name=f"worker-{handle.number}-reader")

    def _on_message(self, handle: WorkerHandle, msg: wire.Message) -> None:
        if isinstance(msg, worker_wire.WorkerReport):
            self._on_report(handle, msg)
            if msg.batch_done:
                self.rebalance()
        elif isinstance(msg, worker_wire.WorkerWaiting):
            handle.waiting = msg.waiting
            self.rebalance()
            self._on_ready(handle)
        elif isinstance(msg, worker_wire.WorkerReady):
            handle.last_progress_at = time.monotonic()
            handle.ready.set()
            self._on_ready(handle)

    async def _read(self, handle: WorkerHandle) -> None:
        try:
            read = 0
            while True:
                room = self._room(read)
                if room is not None:
                    await room
                if (frame := await handle.reader.read()) is None:
                    break
                self._on_message(handle, wire.decode(frame, worker_wire.WORKER_TO_NODE))
                read = len(frame)
        except ConnectionError:
            pass
        except ProtocolError as e:  # a worker that speaks garbage is broken: replace it
            log.error("worker %d sent a bad frame (%s); replacing it", handle.number, e)
            handle.kill()
        except Exception:  # a bug handling its report: say so, and replace it (its calls run again)
            log.exception("handling worker %d's report failed; replacing it", handle.number)
            handle.kill()
        handle.alive = False
        # Its GPU goes to its replacement now: a pool that counts this worker gone (it no longer
        # computes) but its GPU taken would start the replacement without one.
        self._give_back(handle.gpu)
        handle.gpu = None
        handle.writer.close()
        exit_code = await handle.process.wait()
        if self._closing:
            return
        self._processes.discard(handle.process)  # ended: nothing to stop at close (workers come and go)
        if handle in self.workers:
            self.workers.remove(handle)
        if not handle.retired:
            self._on_exit(handle, exit_code)
        handle.shm.close()
        self.rebalance()

    def shrink(self) -> int:
        """Run one worker fewer (never below one); returns the new size."""
        self.size = max(1, self.size - 1)
        return self.size

    def resize(self, size: int) -> None:
        """Compute with `size` workers (between one and max_size): start the missing ones now;
        extra ones retire as they become idle."""
        size = max(1, min(self.max_size, size))
        if size != self.size:
            self.size = size
            self.rebalance()

    def computing(self) -> list[WorkerHandle]:
        """The workers that count towards `size`: alive, not lending their slot, not retiring."""
        return [w for w in self.workers if w.alive and not w.waiting and not w.retired]

    def starting(self) -> int:
        """Workers being started that have not joined yet (spawning, or not ready)."""
        return len(self._spawns) + sum(1 for w in self.workers if w.alive and not w.ready.is_set())

    def restore(self) -> None:
        """Back to full parallelism (the node is idle again)."""
        if self.size != self.full_size:
            self.size = self.full_size
            self.rebalance()

    def rebalance(self) -> None:
        """Keep `size` workers computing, and a fresh one beyond those a tenant took (so that a
        new job never waits for a process, at most one past `size`): add one per waiting worker,
        retire extras once idle, and idle workers that give way to another tenant's job or whose
        tenant has had no job here for KEEP_WARM_S."""
        if self._closing:
            return
        now = time.monotonic()
        for worker in self.computing():
            if self._idle(worker) and worker.tenant is not None and (
                    self._tenants.yields(worker) or self._cold(worker, now)):
                self._retire(worker)
        # Workers without a GPU go first, so that GPU calls keep every GPU they can.
        computing = sorted(self.computing(), key=lambda w: w.gpu is not None)
        claimed = sum(1 for w in computing if w.tenant is not None)
        wanted = min(self.size + 1, max(self.size, claimed + 1))
        missing = wanted - len(computing) - len(self._spawns)
        for _ in range(max(0, missing)):
            self._add_worker()
        surplus = -missing
        # Tenants' idle workers go first, then fresh ones; of each, those without a GPU first (GPU
        # calls keep every GPU they can), the longest idle first.
        for worker in sorted(computing, key=lambda w: (w.tenant is None, w.gpu is not None, w.idle_since)):
            if surplus <= 0:
                break
            if self._idle(worker):
                self._retire(worker)
                surplus -= 1
        # A GPU no worker sees while a worker sees none (a GPU worker retired while the others
        # were busy): an idle worker without one makes way for one that gets it.
        for worker in computing:
            if not self._free_gpus:
                break
            if worker.gpu is None and self._idle(worker) and not worker.retired:
                self._retire(worker)
                self._add_worker()

    @staticmethod
    def _idle(worker: WorkerHandle) -> bool:
        return not worker.batches and worker.ready.is_set()

    def _cold(self, worker: WorkerHandle, now: float) -> bool:
        return (worker.tenant is not None and now - worker.idle_since > KEEP_WARM_S
                and not self._tenants.tenant_live(worker.tenant))

    @staticmethod
    def _retire(worker: WorkerHandle) -> None:
        worker.retired = True
        worker.writer.close()  # at EOF the worker exits

    def _add_worker(self) -> None:
        task = asyncio.create_task(self._join(next(self._numbers), self._take_gpu()))
        self._spawns.add(task)
        task.add_done_callback(self._spawns.discard)

    async def _join(self, number: int, gpu: int | None) -> None:
        handle = await self._spawn(number, gpu)
        # It stops counting as a spawn as it joins, in one step: a rebalance between the two
        # (the task's done callback runs a loop turn later) would count it twice.
        self._spawns.discard(asyncio.current_task())
        self.workers.append(handle)

    def begin_close(self) -> None:
        """No more replacements: the node is stopping."""
        self._closing = True

    async def close(self) -> None:
        self._closing = True
        await end_tasks(log, *self._spawns)
        for handle in self.workers:
            handle.writer.close()
        await self._stop_processes()
        await end_tasks(log, *(handle.reader_task for handle in self.workers))
        if self._fork_server is not None:
            self._fork_server.close()

    async def _stop_processes(self) -> None:
        for process in self._processes:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
        for process in self._processes:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), CLOSE_WAIT_S)
