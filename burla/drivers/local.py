"""The local driver: node processes on this machine (the embedded cluster, tests, tox envs).

A head starting its first local nodes before it runs any thread forks them from itself
instead of starting `python -m burla node join`: by then it has imported what a node runs
(the interpreter, the web stack: about 0.3 s of CPU), so a forked node is serving within
milliseconds, and on a cold start nobody waits for a second copy of those imports.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import traceback
from typing import NoReturn

from burla.config import ENV_TOKEN
from burla.drivers.base import BootFailed, BootRequest, Driver, NodeHandle
from burla.process.forking import flush_before_fork, start_child
from burla.protocol.states import MachineState
from burla.web.scoped_tokens import node_token

EXIT_POLL_S = 0.2
STOP_GRACE_S = 3.0


class LocalDriver(Driver):
    name = "local"
    on_this_machine = True

    def __init__(self, on_boot_failed: BootFailed | None = None, env: dict[str, str] | None = None) -> None:
        self.on_boot_failed = on_boot_failed
        self._env = dict(os.environ if env is None else env)
        self._processes: dict[str, subprocess.Popen | ForkedNode] = {}
        self._lifelines: dict[str, int] = {}
        self._watcher: asyncio.Task | None = None

    def boot_now(self, request: BootRequest, fork_closing: tuple[int, ...] | None = None) -> list[str]:
        """Start node processes synchronously (usable before an event loop exists). With
        `fork_closing`, and while this process runs one thread (can_fork_nodes), they are
        forked from this process, closing those descriptors (the head's own) in each."""
        node_ids = []
        for node_id in request.ids("local"):
            read_end, write_end = os.pipe()  # the node exits when this head does
            if fork_closing is not None and can_fork_nodes():
                self._processes[node_id] = self._fork(request, node_id, read_end, fork_closing + (write_end,))
                os.close(read_end)
                self._lifelines[node_id] = write_end
                node_ids.append(node_id)
                continue
            command = [sys.executable, "-m", "burla", "node", "join", "--head", request.head_url,
                       "--node-id", node_id, "--lifeline-fd", str(read_end)]
            if request.workers is not None:
                command += ["--workers", str(request.workers)]
            env = dict(self._env)
            env[ENV_TOKEN] = node_token(request.token, node_id)  # the node's own, not the cluster's
            process = subprocess.Popen(
                command, env=env, pass_fds=(read_end,), stdin=subprocess.DEVNULL, start_new_session=True
            )
            os.close(read_end)
            self._processes[node_id] = process
            self._lifelines[node_id] = write_end
            node_ids.append(node_id)
        return node_ids

    def _fork(self, request: BootRequest, node_id: str, lifeline: int, closing: tuple[int, ...]) -> ForkedNode:
        env = dict(self._env)
        env[ENV_TOKEN] = node_token(request.token, node_id)  # the node's own, not the cluster's
        flush_before_fork()
        pid = os.fork()
        if pid == 0:
            _become_node(request, node_id, lifeline, env, closing + tuple(self._lifelines.values()))
        return ForkedNode(pid)

    async def boot(self, request: BootRequest) -> list[str]:
        node_ids = self.boot_now(request)
        self.start_watching()
        return node_ids

    def start_watching(self) -> None:
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch_exits(), name="local-driver-watch")

    async def _watch_exits(self) -> None:
        while True:
            await asyncio.sleep(EXIT_POLL_S)
            for node_id, process in list(self._processes.items()):
                code = process.poll()
                if code is None:
                    continue
                self._forget(node_id)
                if self.on_boot_failed is not None:
                    self.on_boot_failed(node_id, f"node process exited with code {code}")

    def _forget(self, node_id: str) -> None:
        self._processes.pop(node_id, None)
        fd = self._lifelines.pop(node_id, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    async def list_nodes(self) -> list[NodeHandle]:
        return [
            NodeHandle(node_id, self.name, MachineState.RUNNING, f"pid {process.pid}")
            for node_id, process in self._processes.items()
            if process.poll() is None
        ]

    async def delete(self, node_id: str) -> bool:
        process = self._processes.get(node_id)
        if process is None:
            return False
        await self._stop(process)
        self._forget(node_id)
        return True

    async def _stop(self, process: subprocess.Popen | ForkedNode) -> None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        for _ in range(int(STOP_GRACE_S / 0.05)):
            if process.poll() is not None:
                return
            await asyncio.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        await asyncio.gather(*(self._stop(p) for p in self._processes.values()))
        for node_id in list(self._processes):
            self._forget(node_id)


def can_fork_nodes() -> bool:
    """Forking is safe while this process runs one thread (no event loop, no executor yet);
    only on Linux, where nothing this process imported starts helpers behind its back."""
    return sys.platform == "linux" and hasattr(os, "fork") and threading.active_count() == 1


def _become_node(request: BootRequest, node_id: str, lifeline: int, env: dict[str, str],
                 closing: tuple[int, ...]) -> NoReturn:
    """In the forked child: run the node as `burla node join` would, and never return."""
    code = 1
    try:
        os.setsid()  # its own process group, as a started node has: it is stopped as a group
        start_child(closing, env)
        from burla.config import ENV_HEAD_CERT
        from burla.node.main import node_settings, run_node

        settings = node_settings(request.head_url, node_token(request.token, node_id), workers=request.workers,
                                 node_id=node_id, head_cert=env.get(ENV_HEAD_CERT), lifeline_fd=lifeline)
        code = run_node(settings)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - reported like an uncaught error, then the child ends
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


class ForkedNode:
    """A node forked from this head: the part of subprocess.Popen this driver uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: it is gone, how is unknown
                self.returncode = -1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def wait(self) -> int:
        if self.returncode is None:
            try:
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
            except ChildProcessError:
                self.returncode = -1
        return self.returncode
