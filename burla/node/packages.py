"""Installing what a job's client has and this node's Python lacks, before the job runs.

Uses `uv pip install` when uv is on PATH, else pip, into the node's own environment (shared by
its workers). A package set already satisfied is remembered, so the next job with the same
packages checks nothing and installs nothing. pip's and uv's own settings apply, e.g.
PIP_FIND_LINKS and PIP_NO_INDEX for an offline wheel directory.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.metadata
import json
import logging
import shutil
import sys
from collections.abc import Callable

from burla.environment import canonical, installed_distributions

log = logging.getLogger("burla.node")


class InstallFailed(Exception):
    def __init__(self, requirements: list[str], output: str) -> None:
        self.requirements = requirements
        self.output = output
        tail = "\n".join(output.strip().splitlines()[-15:])
        super().__init__(
            f"This node could not install {', '.join(requirements)} to match the client's environment:\n{tail}\n"
            "Make the packages installable on the node (an index or PIP_FIND_LINKS), or run the client in an "
            "environment the nodes can reproduce."
        )

    def __reduce__(self):
        return (type(self), (self.requirements, self.output))


class Environment:
    """The node's Python environment, read once at start-up (off the event loop) and after installs."""

    def __init__(self) -> None:
        self._satisfied: set[str] = set()
        self._last_satisfied: dict[str, str] = {}  # jobs of one client send the same map each time
        self._lock = asyncio.Lock()  # one installation at a time in this environment

    @staticmethod
    def _digest(packages: dict[str, str]) -> str:
        return hashlib.sha256(json.dumps(sorted(packages.items())).encode()).hexdigest()

    def missing(self, packages: dict[str, str]) -> list[str]:
        """Requirements (name==version) this environment lacks; [] when already satisfied."""
        if not packages or packages == self._last_satisfied:
            return []
        if self._digest(packages) in self._satisfied:
            self._last_satisfied = packages
            return []
        have = dict(installed_distributions())
        wanted = [f"{name}=={version}" for name, version in sorted(packages.items())
                  if have.get(canonical(name)) != version]
        if not wanted:
            self._satisfied.add(self._digest(packages))
            self._last_satisfied = packages
        return wanted

    async def install(self, packages: dict[str, str], on_line: Callable[[str], None]) -> None:
        async with self._lock:
            requirements = self.missing(packages)
            if not requirements:
                return
            uv = shutil.which("uv")
            command = ([uv, "pip", "install", "--python", sys.executable] if uv else
                       [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input"])
            on_line(f"[burla] installing {len(requirements)} package(s) on this node: {', '.join(requirements)}\n")
            process = await asyncio.create_subprocess_exec(
                *command, *requirements, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
            )
            lines: list[str] = []
            assert process.stdout is not None
            async for raw in process.stdout:
                line = raw.decode(errors="replace")
                lines.append(line)
                on_line(line)
            if await process.wait() != 0:
                raise InstallFailed(requirements, "".join(lines))
            importlib.invalidate_caches()
            installed_distributions.cache_clear()  # read the environment again next time
            self._satisfied.add(self._digest(packages))
            log.info("installed %s", ", ".join(requirements))
