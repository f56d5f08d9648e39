"""A node's tunnel carried by OpenSSH's own client, `ssh -R`, in a process of its own.

Every byte between a laptop head and its cloud nodes crosses the tunnel, and SSH's per-packet
work (a 32 KB packet at a time, since OpenSSH's sshd reads a forwarded socket that much at a
time) is most of what the tunnel costs. asyncssh does it in Python on the head's event loop;
OpenSSH's client does it in C, in a process of its own, on another core: the head then reads its
tunnelled nodes' connections from its own port as it reads any other (`benchmarks/transfer_tunnel.py`
measures both). The head still sets the VM up over asyncssh (SFTP, commands), and uses it for the
tunnel when this machine has no `ssh` program.

The client is started with nothing taken from the user's SSH configuration: the cluster's key
only, the VM's host key pinned (under the node's name, in a known-hosts file of the node's own),
keepalives as the head's own connections use, and the ciphers the head prefers. It runs a
command on the VM that reports the tunnel ready and then reads its standard input: when the head
dies, that input ends, the command exits and the client with it, so no tunnel outlives its head.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from burla.config import write_private_file
from burla.drivers.ssh.login import CONNECT_TIMEOUT_S, KEEPALIVE_MISSES, KEEPALIVE_S, TUNNEL_CIPHERS, SshLogin
from burla.errors import BootstrapFailed
from burla.process.loop_supervisor import end_tasks

log = logging.getLogger("burla.ssh")

READY = "burla-tunnel-ready"
# Runs on the VM for the tunnel's life: SSH's channel order puts the forward's answer before this
# command's output, so READY means the forward was granted (a refusal ends the client first).
REMOTE_COMMAND = f"echo {READY}; exec cat > /dev/null"
ALLOCATED = re.compile(r"Allocated port (\d+) for remote forward")
FORWARD_REFUSED = "remote port forwarding failed"
STDERR_LINES = 20  # what the client last said, kept for the VM's transcript
STOP_GRACE_S = 5.0


class ForwardRefused(BootstrapFailed):
    """The VM's sshd refused the tunnel's remote port forward (RFC 4254 §7.1): it could not bind
    the port, or does not allow forwarding."""


def find_ssh_program() -> str | None:
    """OpenSSH's client on this machine, if any."""
    return shutil.which("ssh")


def _host_key_algorithms(host_key: str) -> str:
    """The algorithms that verify the pinned key: the server must present that key."""
    key_type = host_key.split()[0]
    if key_type == "ssh-rsa":  # an RSA key is signed with SHA-2 by current servers
        return "rsa-sha2-512,rsa-sha2-256,ssh-rsa"
    return key_type


class OpenSshTunnel:
    """One VM's tunnel: `ssh -R 127.0.0.1:PORT:HOST:PORT` to the VM, owned by its `VmSession`."""

    def __init__(self, program: str, login: SshLogin, address: str, node_id: str, host_key: str,
                 known_hosts: Path, target: tuple[str, int], note: Callable[[str], None]) -> None:
        self._program = program
        self._login = login
        self._address = address
        self._node_id = node_id
        self._host_key = host_key
        self._known_hosts = known_hosts
        self._target = target
        self._note = note
        self._process: asyncio.subprocess.Process | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._allocated: asyncio.Future[int] | None = None
        self._reader: asyncio.Task[None] | None = None

    def command(self, remote_port: int) -> list[str]:
        host, port = self._login.endpoint(self._address)
        target_host, target_port = self._target
        options = {
            "BatchMode": "yes", "IdentitiesOnly": "yes", "IdentityAgent": "none", "PasswordAuthentication": "no",
            "KbdInteractiveAuthentication": "no",
            "StrictHostKeyChecking": "yes", "HostKeyAlias": self._node_id, "CheckHostIP": "no",
            "UpdateHostKeys": "no", "UserKnownHostsFile": str(self._known_hosts),
            "GlobalKnownHostsFile": str(self._known_hosts), "HostKeyAlgorithms": _host_key_algorithms(self._host_key),
            "ConnectTimeout": f"{CONNECT_TIMEOUT_S:g}", "ServerAliveInterval": f"{KEEPALIVE_S:g}",
            "ServerAliveCountMax": str(KEEPALIVE_MISSES), "ExitOnForwardFailure": "yes",
            "Ciphers": ",".join(TUNNEL_CIPHERS), "ControlMaster": "no", "ControlPath": "none", "LogLevel": "INFO",
        }
        command = [self._program, "-T", "-F", "none", "-i", str(self._login.key_path), "-l", self._login.user,
                   "-p", str(port)]
        for name, value in options.items():
            command += ["-o", f"{name}={value}"]
        return [*command, "-R", f"127.0.0.1:{remote_port}:{target_host}:{target_port}", host, REMOTE_COMMAND]

    async def open(self, remote_port: int) -> int:
        """Start the client and wait until the VM's sshd granted the forward; the port it listens
        on (`remote_port`, or the one it chose for 0). ForwardRefused if it was refused, else
        BootstrapFailed saying what the client said."""
        # The node's name is the only host name the client knows, with the key the head pinned.
        write_private_file(self._known_hosts, f"{self._node_id} {' '.join(self._host_key.split()[:2])}\n")
        self._allocated = asyncio.get_running_loop().create_future()
        # Its own session: a Ctrl-C in the head's terminal does not reach it; the head ends it.
        self._process = await asyncio.create_subprocess_exec(
            *self.command(remote_port), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True)
        self._reader = asyncio.create_task(self._read_stderr(), name=f"ssh-tunnel-stderr-{self._node_id}")
        try:
            ready = await asyncio.wait_for(self._ready(), CONNECT_TIMEOUT_S * 2)
        except TimeoutError:
            ready = False
        if not ready:
            await self.close()
            said = self.said()
            if FORWARD_REFUSED in said:
                raise ForwardRefused(said)
            raise BootstrapFailed(f"the tunnel's ssh did not start: {said or 'it said nothing'}")
        if remote_port:
            return remote_port
        try:  # the client said which port before the command's output: it is in its pipe
            return await asyncio.wait_for(asyncio.shield(self._allocated), CONNECT_TIMEOUT_S)
        except TimeoutError:
            await self.close()
            raise BootstrapFailed(f"the tunnel's ssh did not say which port the VM gave it: {self.said()}") from None

    async def _ready(self) -> bool:
        assert self._process is not None and self._process.stdout is not None
        while line := await self._process.stdout.readline():
            if line.decode(errors="replace").strip() == READY:
                return True
        await self._process.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)  # all it said, up to its exit
        return False

    async def _read_stderr(self) -> None:
        assert self._process is not None and self._process.stderr is not None
        while raw := await self._process.stderr.readline():
            line = raw.decode(errors="replace").strip()
            if not line:
                continue
            self._stderr.append(line)
            self._note(f"tunnel's ssh: {line}")  # its warnings and why it ended, in the VM's transcript
            allocated = ALLOCATED.search(line)
            if allocated and self._allocated is not None and not self._allocated.done():
                self._allocated.set_result(int(allocated.group(1)))

    def said(self) -> str:
        """What the client last said on its standard error."""
        return " / ".join(self._stderr)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def wait_closed(self) -> str:
        """Wait until the client exits (the connection dropped, its keepalives went unanswered, or
        someone ended it); why, in its own words."""
        assert self._process is not None
        code = await self._process.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        return f"exit {code}" + (f": {self.said()}" if self._stderr else "")

    async def close(self) -> None:
        """End the client: its input closed (the VM's command ends, then the client), then a
        SIGTERM, then a SIGKILL."""
        process = self._process
        if process is not None and process.returncode is None:
            if process.stdin is not None:
                process.stdin.close()
            for stop in (process.terminate, process.kill):
                try:
                    await asyncio.wait_for(process.wait(), STOP_GRACE_S)
                    break
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        stop()
            await process.wait()
        await end_tasks(log, self._reader)
        self._reader = None
        if self._allocated is not None and not self._allocated.done():
            self._allocated.cancel()
