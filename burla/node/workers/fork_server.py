"""Workers started in milliseconds: a fork server, started as a fresh interpreter.

A worker started as `python -m burla.node.workers.worker` costs a new interpreter, about 0.15 s of CPU,
and a node starts one per CPU at once, then more (replacing one that died, or the governor
adding some while calls wait). Forking the node itself would be quick, but a worker forked from
it would inherit its memory: the node's token, and for a local node forked from its head, the
cluster token, where a call could read them. So the node starts this server as a new
interpreter (`python -m burla.node.workers.fork_server`) that never held a credential: a small
single-threaded process that imports what a worker runs once, forks a worker whenever the node
asks and hands back the worker's end of the socketpair and its shared page (as file descriptors
over a Unix socket), then reports each worker's exit code. The workers are the server's
children; it reaps them. The node asks for its first workers as soon as the server is started,
so they boot while the node imports its web stack.

Messages on the SOCK_SEQPACKET pair, one per packet:
    node -> server  b"S" number gpu          start worker `number` (gpu: index, -1 none, -2 no GPUs here)
    server -> node  b"P" number pid  + 2 fds  started: the node's end of its socket, its page
    server -> node  b"X" pid exit_code       a worker exited
If the server is gone, the node starts workers the usual way, and watches those the server
started through pidfds (their exit code is then unknown: -1).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import os
import select
import signal
import socket
import struct
import subprocess
import sys

from burla.node.gpus import ENV_VISIBLE
from burla.process.hardening import refuse_inspection

log = logging.getLogger("burla.node")

_START = struct.Struct("qq")  # number, gpu
_STARTED = struct.Struct("qq")  # number, pid
_EXITED = struct.Struct("qq")  # pid, exit code
PROCESS_NAME = "burla-forksrv"  # what ps and top show for the server (15 characters at most)
NO_GPUS = -2  # the node has no GPUs: leave CUDA_VISIBLE_DEVICES alone
NO_GPU = -1  # the node has GPUs, this worker sees none
UNKNOWN_EXIT = -1


def can_serve() -> bool:
    """Whether this system has what the server uses: memfd pages and descriptor passing."""
    return hasattr(os, "memfd_create") and hasattr(socket, "send_fds") and hasattr(socket, "SOCK_SEQPACKET")


def start_fork_server(env: dict[str, str]) -> tuple[subprocess.Popen, socket.socket]:
    """Start the server as a new interpreter with `env` (and no other descriptor of this
    process); returns it and the node's end of its control socket."""
    node_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "burla.node.workers.fork_server", str(server_end.fileno()), _this_process_name()],
            pass_fds=(server_end.fileno(),), stdin=subprocess.DEVNULL, env=env)
    except BaseException:
        node_end.close()
        raise
    finally:
        server_end.close()
    return process, node_end


def main(argv: list[str]) -> None:
    control = socket.socket(fileno=int(argv[0]))
    worker_name = argv[1] if len(argv) > 1 else ""
    # No secret is here, but its workers start from it, marked too: a call can't read another's.
    refuse_inspection()
    _name_this_process(PROCESS_NAME)
    from burla.node.workers.worker import serve_worker  # once here, shared by every worker

    try:
        _serve(control, serve_worker, worker_name)
    finally:
        os._exit(0)  # the node is gone: its workers see their sockets close and exit too


def _this_process_name() -> str:
    try:
        with open("/proc/self/comm") as comm:
            return comm.read().strip()
    except OSError:
        return ""


def _name_this_process(name: str) -> None:
    if name:
        with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
            comm.write(name)


def _serve(control: socket.socket, serve_worker, worker_name: str) -> None:
    """The server's loop: start workers when asked, report their exits; ends with the node."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake select() through the pipe
    while True:
        try:
            ready, _, _ = select.select([control.fileno(), wake_read], [], [])
        except InterruptedError:
            continue
        if wake_read in ready:
            os.read(wake_read, 4096)
            _report_exits(control)
        if control.fileno() in ready:
            request = control.recv(64)
            if not request:
                return  # the node is gone; its workers see their sockets close and exit too
            if request[:1] == b"S":
                number, gpu = _START.unpack(request[1:])
                _start_worker(control, number, gpu, (wake_read, wake_write), serve_worker, worker_name)


def _report_exits(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        with contextlib.suppress(OSError):
            control.send(b"X" + _EXITED.pack(pid, os.waitstatus_to_exitcode(status)))


WORKER_SOCKET_BUFFER = 4 * 1024 * 1024  # asked for; the kernel caps it (net.core.wmem_max)


def worker_socketpair() -> tuple[socket.socket, socket.socket]:
    """A node's private socketpair to a worker, (node's end, worker's end), each end's send buffer
    as large as the system allows up to WORKER_SOCKET_BUFFER. A Unix socket's send buffer bounds
    what one write moves (212 KB by default): with 10 MB inputs, the node's transport copied what
    the socket did not take into its own buffer, and both ends woke once per 212 KB."""
    pair = socket.socketpair()
    for end in pair:
        with contextlib.suppress(OSError):
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, WORKER_SOCKET_BUFFER)
    return pair


def _start_worker(control: socket.socket, number: int, gpu: int, wake: tuple[int, int], serve_worker,
                  name: str) -> None:
    node_end, worker_end = worker_socketpair()
    page = os.memfd_create("burla-worker-page")
    os.ftruncate(page, mmap.PAGESIZE)
    shm = mmap.mmap(page, mmap.PAGESIZE)
    struct.pack_into("q", shm, 0, -1)  # no call running
    pid = os.fork()
    if pid == 0:  # the worker
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (*wake, page):
                os.close(fd)
            control.close()
            node_end.close()
            _name_this_process(name)  # a worker, named like the node's own
            if gpu != NO_GPUS:
                os.environ[ENV_VISIBLE] = "" if gpu == NO_GPU else str(gpu)
            serve_worker(worker_end, shm)
        finally:
            os._exit(1)
    worker_end.close()
    shm.close()
    try:
        socket.send_fds(control, [b"P" + _STARTED.pack(number, pid)], [node_end.fileno(), page])
    finally:
        node_end.close()
        os.close(page)


class ServedProcess:
    """A worker the server started: the part of asyncio.subprocess.Process the pool uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def kill(self) -> None:
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)

    def exited(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            if not self._exited.done():
                self._exited.set_result(code)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)


class ForkServer:
    """The node's side of the server; used on the node's event loop."""

    def __init__(self, process: subprocess.Popen, control: socket.socket) -> None:
        self._process = process
        self._control = control
        self._control.setblocking(False)
        self._starting: dict[int, asyncio.Future[tuple[ServedProcess, socket.socket, mmap.mmap]]] = {}
        self._processes: dict[int, ServedProcess] = {}
        self._early_exits: dict[int, int] = {}  # exits reported before the start they belong to was read
        self._requested: set[int] = set()  # workers asked for before the event loop ran
        self.alive = True
        self._reading = False

    def request(self, number: int, gpu: int) -> None:
        """Ask for worker `number` now (before the event loop runs); `start` then waits for it."""
        if self.alive:
            try:
                self._control.send(b"S" + _START.pack(number, gpu))
            except OSError:
                return  # start() finds the server gone
            self._requested.add(number)

    def _ensure_reading(self) -> None:
        if not self._reading and self.alive:
            asyncio.get_running_loop().add_reader(self._control.fileno(), self._on_readable)
            self._reading = True

    async def start(self, number: int, gpu: int) -> tuple[ServedProcess, socket.socket, mmap.mmap]:
        """Start worker `number`; returns its process, the node's end of its socket and its page.
        Raises ConnectionError if the server is gone (start it the usual way then)."""
        if not self.alive:
            raise ConnectionError("the fork server is gone")
        self._ensure_reading()
        started = asyncio.get_running_loop().create_future()
        self._starting[number] = started
        if number in self._requested:
            self._requested.discard(number)
            return await started
        try:
            self._control.send(b"S" + _START.pack(number, gpu))
        except OSError as e:
            self._starting.pop(number, None)
            self._lost()
            raise ConnectionError(f"the fork server is gone ({e})") from None
        return await started

    def _on_readable(self) -> None:
        while True:
            try:
                message, fds, _, _ = socket.recv_fds(self._control, 64, 2)
            except BlockingIOError:
                return
            except OSError:
                message, fds = b"", []
            if not message:
                for fd in fds:
                    os.close(fd)
                self._lost()
                return
            if message[:1] == b"P" and len(fds) == 2:
                number, pid = _STARTED.unpack(message[1:])
                self._started(number, pid, fds[0], fds[1])
            elif message[:1] == b"X":
                pid, code = _EXITED.unpack(message[1:])
                process = self._processes.pop(pid, None)
                if process is not None:
                    process.exited(code)
                else:
                    self._early_exits[pid] = code
            else:
                for fd in fds:
                    os.close(fd)

    def _started(self, number: int, pid: int, sock_fd: int, page_fd: int) -> None:
        node_end = socket.socket(fileno=sock_fd)
        shm = mmap.mmap(page_fd, mmap.PAGESIZE)
        os.close(page_fd)
        process = ServedProcess(pid)
        if pid in self._early_exits:
            process.exited(self._early_exits.pop(pid))
        else:
            self._processes[pid] = process
        waiter = self._starting.pop(number, None)
        if waiter is None or waiter.done():  # nobody waits any more (the pool is closing)
            node_end.close()
            shm.close()
            process.kill()
            return
        waiter.set_result((process, node_end, shm))

    def _lost(self) -> None:
        """The server died (or the node is closing it): start nothing more through it, and learn
        of its workers' exits from pidfds (with no code)."""
        if not self.alive:
            return
        self.alive = False
        if self._reading:
            asyncio.get_running_loop().remove_reader(self._control.fileno())
            self._reading = False
        self._control.close()
        self._process.poll()  # it died: reap it (at close it exits after this)
        for waiter in self._starting.values():
            if not waiter.done():
                waiter.set_exception(ConnectionError("the fork server is gone"))
        self._starting.clear()
        if self._processes:
            log.warning("the worker fork server exited; watching its %d workers directly", len(self._processes))
        for process in list(self._processes.values()):
            self._watch_directly(process)
        self._processes.clear()

    @staticmethod
    def _watch_directly(process: ServedProcess) -> None:
        loop = asyncio.get_running_loop()
        try:
            pidfd = os.pidfd_open(process.pid)
        except OSError:  # gone already
            process.exited(UNKNOWN_EXIT)
            return

        def on_exit() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            process.exited(UNKNOWN_EXIT)

        loop.add_reader(pidfd, on_exit)

    def close(self) -> None:
        """The node is stopping: the server exits when its control socket closes."""
        self._lost()


if __name__ == "__main__":
    main(sys.argv[1:])
