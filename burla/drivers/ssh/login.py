"""Logging in to a cloud's VMs over SSH, and what the head uploads to them.

The key is the cluster's own (ed25519, created once, 0600), which the cloud authorises on the
VMs it boots. Host keys: trust on first use, per node. The first connection to a new VM records
its host key (in `ssh/known-hosts-<cluster>.json`, 0600, and in the node's history); every later
connection to that VM must present the same key. A VM is new only once, minutes after the head
booted it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from burla.config import TOKEN_FILE, write_private_file
from burla.drivers.ssh.bootstrap import (
    CONFIG_DIR,
    HEAD_CERT_FILE,
    HOME_DIR,
    INSTALLED_MARKER,
    SCRIPT_FILE,
    WHEELHOUSE_DIR,
    PackageSource,
    remote,
    this_python,
)
from burla.drivers.ssh.wheels import needed_files, wheelhouse_files
from burla.errors import BootstrapFailed
from burla.process.build import BUILD_DIR, wheel_name

CONNECT_TIMEOUT_S = 15.0
# AES-GCM first: with the AES instructions every cloud VM and laptop has, it carries a tunnel's
# bytes 1.6x as fast as asyncssh's default ChaCha20 (benchmarks/transfer_tunnel.py's anchor: 450
# against 280 MB/s). The others stay allowed for a server that offers neither AES-GCM.
TUNNEL_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com",
                  "aes128-ctr", "aes256-ctr")
RETRY_EVERY_S = 3.0
FIRST_RETRY_S = 0.5  # the first retries come sooner (0.5, 1, 2 s)
KEEPALIVE_S = 10.0
KEEPALIVE_MISSES = 3


def ssh_library() -> ModuleType:
    """asyncssh, imported without the deprecation warning cryptography (from 51) gives whenever
    asyncssh names its DSA key classes at import: burla's own keys are ed25519, so the warning would
    only be noise on every head's first SSH login. burla's first import of asyncssh is always this one
    (a channel server's needs it only on a connection made here)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"asyncssh\.")
        import asyncssh
    return asyncssh


def cluster_key(config_dir: Path, cluster_id: str) -> tuple[Path, str]:
    """The cluster's ed25519 key (created once, 0600) and its public half in OpenSSH form."""
    asyncssh = ssh_library()

    path = config_dir / "ssh" / f"burla-{cluster_id}"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = asyncssh.generate_private_key("ssh-ed25519", comment=f"burla-{cluster_id}")
        write_private_file(path, key.export_private_key().decode())
    public = asyncssh.read_private_key(path).export_public_key().decode().strip()
    return path, public


class HostKeys:
    """Each VM's host key, recorded on first use and required after (a JSON file, 0600)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._keys: dict[str, str] = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            self._keys = {}

    def get(self, node_id: str) -> str | None:
        return self._keys.get(node_id)

    def record(self, node_id: str, key: str) -> None:
        self._keys[node_id] = key
        write_private_file(self.path, json.dumps(self._keys, indent=1))

    def forget(self, node_id: str) -> None:
        if self._keys.pop(node_id, None) is not None:
            write_private_file(self.path, json.dumps(self._keys, indent=1))


def explain(error: BaseException, address: str, user: str) -> str:
    """What a failed SSH attempt means for the user, and what to check."""
    asyncssh = ssh_library()

    if isinstance(error, asyncssh.PermissionDenied):
        return (f"the VM at {address} refused the cluster's SSH key for user {user!r}; check that the image "
                "accepts keys through the cloud's key mechanism (or set the SSH user for this cloud)")
    if isinstance(error, asyncssh.HostKeyNotVerifiable):
        return f"the VM at {address} presented a different SSH host key than when it was first reached"
    if isinstance(error, (OSError, TimeoutError, asyncssh.DisconnectError)):
        return (f"nothing answered SSH on port 22 of {address} ({type(error).__name__}: {error}); check that "
                "the firewall or security group lets this machine reach port 22 and that the VM is running")
    return f"{type(error).__name__}: {error}"


@dataclass(frozen=True)
class SshLogin:
    """How this machine logs in to a cloud's VMs."""

    user: str
    key_path: Path
    address_map: Path | None = None  # JSON {address: "host:port"}: dial only these (stand-in VMs)

    def endpoint(self, address: str) -> tuple[str, int]:
        """Where to dial the VM's SSH: its port 22, or with an address map only what the map says,
        so nothing is ever dialled outside it."""
        if self.address_map is None:
            return address, 22
        try:
            target = json.loads(self.address_map.read_text()).get(address)
        except (OSError, ValueError):
            target = None
        if not target:
            raise ConnectionRefusedError(f"{address} is not in the SSH address map {self.address_map}")
        host, port = target.rsplit(":", 1)
        return host, int(port)

    async def connect(self, address: str, pinned_host_key: str | None) -> Any:
        """One connection; with a pinned host key, only a server presenting it is accepted."""
        asyncssh = ssh_library()

        host, port = self.endpoint(address)
        known_hosts: tuple[list[Any], list[Any], list[Any]] | None = (
            ([asyncssh.import_public_key(pinned_host_key)], [], []) if pinned_host_key else None)
        return await asyncio.wait_for(asyncssh.connect(
            host, port, username=self.user, client_keys=[self.key_path], known_hosts=known_hosts,
            connect_timeout=CONNECT_TIMEOUT_S, keepalive_interval=KEEPALIVE_S, keepalive_count_max=KEEPALIVE_MISSES,
            agent_path=None, config=None, encryption_algs=list(TUNNEL_CIPHERS),
        ), CONNECT_TIMEOUT_S * 2)

    async def connect_until(self, address: str, deadline: float, pinned_host_key: str | None,
                            note: Callable[[str], None]) -> Any:
        """Connect, retrying until the deadline; BootstrapFailed says what kept failing."""
        asyncssh = ssh_library()

        attempts = 0
        noted = ""
        while True:
            attempts += 1
            try:
                connection = await self.connect(address, pinned_host_key)
                note(f"connected to {address} as {self.user} (attempt {attempts})")
                return connection
            except Exception as e:  # noqa: BLE001 - every failure is retried until the deadline
                last = explain(e, address, self.user)
                if isinstance(e, asyncssh.HostKeyNotVerifiable):
                    raise BootstrapFailed(last) from None
                if last != noted or attempts % 10 == 0:  # each new reason, and a heartbeat
                    note(f"attempt {attempts}: {last}")
                    noted = last
            if time.monotonic() > deadline:
                raise BootstrapFailed(f"after {attempts} attempts, {last}")
            # sshd often answers a moment after the address appears: try again soon, then every 3 s
            await asyncio.sleep(min(RETRY_EVERY_S, FIRST_RETRY_S * 2 ** (attempts - 1)))


def host_key_of(connection: Any) -> str:
    return connection.get_server_host_key().export_public_key().decode().strip()


async def write_private(sftp: Any, path: str, text: str) -> None:
    """A file only its owner reads (0600) on the VM."""
    asyncssh = ssh_library()

    async with sftp.open(path, "w", attrs=asyncssh.SFTPAttrs(permissions=0o600)) as handle:
        await handle.write(text)
    await sftp.chmod(path, 0o600)


def secret_files(token: str | None, head_cert: str | None) -> dict[str, str]:
    """The 0600 files a VM gets: its token (none for an image builder), the head's certificate."""
    files = {remote(CONFIG_DIR, TOKEN_FILE): token + "\n"} if token is not None else {}
    if head_cert:
        files[remote(HEAD_CERT_FILE)] = head_cert
    return files


async def upload_setup(connection: Any, wheel: Path, packages: PackageSource, script: str, tag: str,
                       private: dict[str, str], python_version: str | None = None, extra: str | None = None,
                       whole_wheelhouse: bool = False) -> None:
    """~/.burla (0700) with the `private` files (0600: a token, a head's certificate and key), the
    build and the bootstrap. The build and the wheelhouse go only when that build is not installed
    there yet (`tag`, see bootstrap.installed_tag); of the wheelhouse, only the wheels installing
    the build with `extra` needs (uv and pip too if the VM's Python is not `python_version`), or
    all of it (`whole_wheelhouse`: a deployed head hands it on to its nodes)."""
    asyncssh = ssh_library()

    attrs = asyncssh.SFTPAttrs(permissions=0o700)
    async with connection.start_sftp_client() as sftp:
        for directory in (HOME_DIR, remote(BUILD_DIR), remote(CONFIG_DIR)):
            await sftp.makedirs(directory, attrs=attrs, exist_ok=True)
            await sftp.chmod(directory, 0o700)
        for path, text in private.items():
            await write_private(sftp, path, text)
        installed = ""
        with contextlib.suppress(asyncssh.SFTPError):
            async with sftp.open(remote(INSTALLED_MARKER)) as marker:
                installed = (await marker.read()).strip()
        if installed != tag:
            await sftp.put(str(wheel), remote(BUILD_DIR, wheel_name()))
            if packages.wheelhouse:
                wheelhouse = Path(packages.wheelhouse)
                if whole_wheelhouse:
                    files = wheelhouse_files(wheelhouse)
                else:
                    tools = await _python_of(connection) != (python_version or this_python())
                    files = needed_files(wheelhouse, wheel, extra, tools)
                await sftp.makedirs(remote(WHEELHOUSE_DIR), attrs=attrs, exist_ok=True)
                await sftp.put([str(f) for f in files], remote(WHEELHOUSE_DIR))
        await write_private(sftp, remote(SCRIPT_FILE), script)


async def _python_of(connection: Any) -> str | None:
    """The major.minor of the VM's python3 (what the bootstrap makes its venv with), None if none."""
    probe = await connection.run("python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'",
                                 timeout=CONNECT_TIMEOUT_S)
    output = (probe.stdout or "").strip()
    return output if probe.exit_status == 0 and output else None


def completed_output(result: Any) -> str:
    return ((result.stdout or "") + (result.stderr or "")).strip()
