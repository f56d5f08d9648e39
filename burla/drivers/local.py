"""The local driver: node processes on this machine (the embedded cluster, tests, tox envs)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys

from burla.config import ENV_TOKEN
from burla.drivers.base import BootFailed, BootRequest, Driver, NodeHandle

EXIT_POLL_S = 0.2
STOP_GRACE_S = 3.0


class LocalDriver(Driver):
    name = "local"
    on_this_machine = True

    def __init__(self, on_boot_failed: BootFailed | None = None, env: dict[str, str] | None = None) -> None:
        self.on_boot_failed = on_boot_failed
        self._env = dict(os.environ if env is None else env)
        self._processes: dict[str, subprocess.Popen] = {}
        self._lifelines: dict[str, int] = {}
        self._watcher: asyncio.Task | None = None

    def boot_now(self, request: BootRequest) -> list[str]:
        """Start node processes synchronously (usable before an event loop exists)."""
        node_ids = []
        for node_id in request.ids("local"):
            read_end, write_end = os.pipe()  # the node exits when this head does
            command = [sys.executable, "-m", "burla", "node", "join", "--head", request.head_url,
                       "--node-id", node_id, "--lifeline-fd", str(read_end)]
            if request.workers is not None:
                command += ["--workers", str(request.workers)]
            env = dict(self._env)
            env[ENV_TOKEN] = request.token
            process = subprocess.Popen(
                command, env=env, pass_fds=(read_end,), stdin=subprocess.DEVNULL, start_new_session=True
            )
            os.close(read_end)
            self._processes[node_id] = process
            self._lifelines[node_id] = write_end
            node_ids.append(node_id)
        return node_ids

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
            NodeHandle(node_id, self.name, "RUNNING", f"pid {process.pid}")
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

    async def _stop(self, process: subprocess.Popen) -> None:
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
