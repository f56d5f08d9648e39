"""Installing what a job's client has and this node's Python lacks, before the job runs.

Uses `uv pip install` when uv is on PATH, else pip, into the node's own environment (shared by
its workers). A package set already satisfied is remembered, so the next job with the same
packages checks nothing and installs nothing. pip's and uv's own settings apply, e.g.
PIP_FIND_LINKS and PIP_NO_INDEX for an offline wheel directory. Wheels only (`--only-binary
:all:`: building a source distribution runs its code) unless the node allows source builds;
packages the client installed from a direct URL come from that URL, checked against its digest.
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
import tempfile
from collections.abc import Callable

from burla.protocol.replication.environment import canonical, environment_changed, installed_distributions

log = logging.getLogger("burla.node")


class Environment:
    """The node's Python environment, read once at start-up (off the event loop) and after installs."""

    def __init__(self, source_builds: bool = False) -> None:
        self._source_builds = source_builds
        self._satisfied: set[str] = set()
        self._last_satisfied: dict[str, str] = {}  # jobs of one client send the same map each time
        self._lock = asyncio.Lock()  # one installation at a time in this environment
        self.unavailable: dict[str, str] = {}  # requirement -> why it could not be installed here

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
        wanted = [requirement(name, wanted) for name, wanted in sorted(packages.items())
                  if have.get(canonical(name)) != wanted_version(wanted)
                  and requirement(name, wanted) not in self.unavailable]
        if not wanted:
            self._satisfied.add(self._digest(packages))
            self._last_satisfied = packages
        return wanted

    async def install(self, packages: dict[str, str], on_line: Callable[[str], None]) -> dict[str, str]:
        """Install what is missing. A requirement the installer can't get does not stop the
        others (they are tried one by one after a failed batch); returns those it could not
        install, with why, and remembers them so later jobs don't try again. Raises only if
        the installer itself can't run."""
        async with self._lock:
            requirements = self.missing(packages)
            if not requirements:
                return {}
            failed: dict[str, str] = {}
            if not self._source_builds:  # pip builds a URL's sdist despite --only-binary
                for requirement in [r for r in requirements if _source_by_url(r)]:
                    failed[requirement] = ("it is a source distribution by URL, and this node installs wheels only "
                                           "(start it with --allow-source-builds to build it)")
                    requirements.remove(requirement)
            if not requirements:
                self._give_up(failed, on_line)
                self._satisfied.add(self._digest(packages))
                return failed
            on_line(f"[burla] installing {len(requirements)} package(s) on this node: "
                    f"{', '.join(map(shown, requirements))}\n")
            ok, output = await self._run_installer(requirements, on_line, self._source_builds)
            if not ok:
                for requirement in requirements if len(requirements) > 1 else []:
                    one_ok, one_output = await self._run_installer([requirement], lambda _: None, self._source_builds)
                    if not one_ok:
                        failed[requirement] = one_output
                if len(requirements) == 1:
                    failed[requirements[0]] = output
            importlib.invalidate_caches()
            environment_changed()  # read the environment again next time
            self._give_up(failed, on_line)
            self._satisfied.add(self._digest(packages))  # as satisfied as this node can make it
            installed = [r for r in requirements if r not in failed]
            if installed:
                log.info("installed %s", ", ".join(installed))
            return failed

    def _give_up(self, failed: dict[str, str], on_line: Callable[[str], None]) -> None:
        """Say once why each of these can't be installed here, and don't try them again."""
        for requirement, why in failed.items():
            reason = _last_line(why)
            self.unavailable[requirement] = reason
            on_line(f"[burla] this node could not install {shown(requirement)} ({reason}); calls that import it "
                    "fail. Make it installable on the nodes (a wheel on an index they reach, or PIP_FIND_LINKS; "
                    "a source distribution only on nodes started with --allow-source-builds) or install it "
                    "there by hand.\n")

    @classmethod
    async def _run_installer(cls, requirements: list[str], on_line: Callable[[str], None], source_builds: bool
                             ) -> tuple[bool, str]:
        """Install these: plain ones as arguments, hash-pinned ones from a requirements file in a
        run of their own (hash checking covers every requirement of a run; their dependencies
        are entries of the job's packages too, installed by the other run)."""
        hashed = [r for r in requirements if _hashed(r)]
        plain = [r for r in requirements if not _hashed(r)]
        ok, output = True, ""
        if plain:
            ok, output = await cls._install(plain, on_line, source_builds)
        if hashed:
            with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="burla-pins-") as pins:
                pins.write("\n".join(hashed) + "\n")
                pins.flush()
                pinned_ok, pinned_output = await cls._install(["-r", pins.name, "--no-deps", "--require-hashes"],
                                                              on_line, source_builds)
            ok, output = ok and pinned_ok, output + pinned_output
        return ok, output

    @staticmethod
    async def _install(arguments: list[str], on_line: Callable[[str], None], source_builds: bool
                       ) -> tuple[bool, str]:
        uv = shutil.which("uv")
        command = ([uv, "pip", "install", "--python", sys.executable] if uv else
                   [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input"])
        if not source_builds:
            command += ["--only-binary", ":all:"]
        process = await asyncio.create_subprocess_exec(
            *command, *arguments, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
        )
        lines: list[str] = []
        assert process.stdout is not None
        async for raw in process.stdout:
            line = raw.decode(errors="replace")
            lines.append(line)
            on_line(line)
        return await process.wait() == 0, "".join(lines)


def requirement(name: str, wanted: str) -> str:
    """What the installer is asked for: name==version from the index; for a package the client
    installed from a direct URL, `name @ URL#sha256=DIGEST` (fetched from there and checked); for
    one an extra index of the client's offers, `name==version --hash=sha256:D ...` (a requirements
    file line: whatever the node's index serves must have one of those digests)."""
    version, _, url = wanted.partition(" @ ")
    if url:
        return f"{name} @ {url}"
    version, _, hashes = version.partition("#sha256=")
    return f"{name}=={version}" + "".join(f" --hash=sha256:{digest}" for digest in hashes.split(",") if digest)


def wanted_version(wanted: str) -> str:
    """The version a packages entry names, whatever else it says."""
    return wanted.split(" @ ", 1)[0].split("#", 1)[0]


def _hashed(requirement: str) -> bool:
    return " --hash=" in requirement


def shown(requirement: str) -> str:
    """A requirement as messages name it (a hash-pinned one without its digests)."""
    base, _, hashes = requirement.partition(" --hash=")
    return f"{base} (pinned to the digests of the client's extra index)" if hashes else requirement


def _source_by_url(requirement: str) -> bool:
    """A `name @ URL` requirement whose URL is not a wheel's (an sdist: building it runs its code)."""
    _, _, url = requirement.partition(" @ ")
    return bool(url) and not url.split("#", 1)[0].split("?", 1)[0].endswith(".whl")


def _last_line(output: str) -> str:
    """The installer's last words: usually why it failed."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "the installer failed without saying why"
