"""A node's first workers, forked from the node itself before its event loop starts.

A worker started as `python -m burla.node.worker` spends about 0.1 s of CPU starting an
interpreter and 0.05 s importing what it runs, and a node starts one per CPU at once: on a
cold start, beside the head and the node booting on the same cores, that is most of the wait.
A node instead imports what a worker runs and forks its first workers while it is still a
single thread with no event loop (forking is safe then). Workers that replace them later are
started the usual way: by then the node runs threads. Where the kernel can't watch a process
through a pidfd (Linux before 5.3, other systems), every worker is started the usual way.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import signal
import socket
import struct
import threading
from dataclasses import dataclass

from burla.node.gpus import ENV_VISIBLE, Gpus, visible_to
from burla.process.forking import flush_before_fork, start_child


class ForkedProcess:
    """A forked worker, watched through a pidfd: the part of asyncio.subprocess.Process the
    worker pool uses (pid, returncode, kill, wait)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._exited: asyncio.Future[int] | None = None

    def kill(self) -> None:
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)

    async def wait(self) -> int:
        if self.returncode is not None:
            return self.returncode
        if self._exited is None:
            self._exited = asyncio.get_running_loop().create_future()
            self._watch(self._exited)
        return await asyncio.shield(self._exited)

    def _watch(self, exited: asyncio.Future[int]) -> None:
        loop = asyncio.get_running_loop()
        pidfd = os.pidfd_open(self.pid)

        def on_exit() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
            if not exited.done():
                exited.set_result(self.returncode)

        loop.add_reader(pidfd, on_exit)


@dataclass
class ForkedWorker:
    process: ForkedProcess
    node_end: socket.socket  # the node's end of the worker's socketpair
    shm: mmap.mmap  # the page where the worker publishes the input index it runs


def can_fork() -> bool:
    """Whether this process may fork its workers now: one thread, and pidfds to watch them."""
    if not hasattr(os, "pidfd_open") or not hasattr(os, "fork") or threading.active_count() != 1:
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


def fork_workers(count: int, env: dict[str, str], close_in_child: tuple[int, ...] = (),
                 gpus: Gpus = Gpus(None, 0)) -> list[ForkedWorker]:
    """Fork `count` workers (call before any thread or event loop exists; see can_fork). With
    GPUs, worker i sees GPU i (or none, past the last one)."""
    from burla.node.worker import serve_worker  # imported once here, shared by every child

    flush_before_fork()
    forked: list[ForkedWorker] = []
    for number in range(count):
        node_end, worker_end = socket.socketpair()
        shm = mmap.mmap(-1, mmap.PAGESIZE)  # anonymous and shared: the child writes, the node reads
        struct.pack_into("q", shm, 0, -1)  # no call running
        pid = os.fork()
        if pid == 0:  # the worker
            try:
                node_end.close()
                for other in forked:  # a worker holding another's end would hide its EOF
                    other.node_end.close()
                start_child(close_in_child, env)
                if gpus.count:
                    os.environ[ENV_VISIBLE] = visible_to(number, gpus)
                serve_worker(worker_end, shm)
            finally:
                os._exit(1)  # serve_worker never returns; this is for an error before it ran
        worker_end.close()
        forked.append(ForkedWorker(ForkedProcess(pid), node_end, shm))
    return forked
