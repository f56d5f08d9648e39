"""How a head reaches its cloud VMs: over SSH, with a per-cluster key the cloud authorises.

When a VM's address appears the head connects (retrying until the boot deadline), uploads its
exact build, the token and its certificate over SFTP (0600 files in ~/.burla), runs the
bootstrap, and starts `burla node join` under its supervisor. When the VMs can't reach the
head's URL (a laptop behind NAT, a loopback head) the node reaches it through a remote port
forward to the VM, held open and re-established when it drops: carried by OpenSSH's client in a
process of its own where this machine has one (`burla.drivers.ssh.tunnel`), else on the asyncssh
connection that set the VM up.

Logging in, host keys and the upload are in `burla.drivers.ssh.login`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from burla.drivers.bake import BakeSettings, ImageBaker
from burla.drivers.base import BakedImage, BootRequest, CloudCheck, Driver, NodeHandle, QuotaRoom, VmAddress
from burla.drivers.catalog import MachineType
from burla.drivers.ssh.bootstrap import (
    ALREADY_INSTALLED,
    HEAD_CERT_FILE,
    HEAD_URL_FILE,
    SCRIPT_FILE,
    PackageSource,
    install_script,
    installed_tag,
    remote,
    supervise_command,
)
from burla.drivers.ssh.host_keys import fingerprint, verified_connection
from burla.drivers.ssh.login import (
    RETRY_EVERY_S,
    HostKeys,
    SshLogin,
    cluster_key,
    completed_output,
    explain,
    host_key_of,
    secret_files,
    ssh_library,
    upload_setup,
    write_private,
)
from burla.drivers.ssh.tunnel import ForwardRefused, OpenSshTunnel
from burla.errors import BootstrapFailed, CloudRefused
from burla.process.build import build_hash, build_wheel
from burla.process.loop_supervisor import end_tasks
from burla.protocol.states import BootStage
from burla.web.channel_server import ChannelServer
from burla.web.scoped_tokens import node_token

log = logging.getLogger("burla.ssh")

ADDRESS_POLL_S = 2.0
DEAD_MAN_DEADLINES = 2  # a VM's power-off timer, in boot deadlines
TRANSCRIPT_LIMIT = 20_000
FORWARD_TRIES = 4  # asks for the tunnel's remote forward, the last three 1, 2 and 4 s after a refusal

NodeEvent = Callable[[str, str, str], None]  # (node_id, kind, detail)


@dataclass(frozen=True)
class SshSettings:
    config_dir: Path  # holds the cluster's key, its known host keys and the build cache
    cluster_id: str
    head_url: str
    token: str
    head_cert: str | None = None  # PEM of the head's own certificate (https heads)
    tunnel: bool = True  # nodes reach the head through a remote port forward (else at head_url)
    packages: PackageSource = PackageSource()
    orphan_timeout_s: float = 600.0
    boot_deadline_s: float = 900.0
    address_map: Path | None = None  # JSON {address: "host:port"}: where to dial a VM's port 22 instead
    tunnel_program: str | None = None  # OpenSSH's client, carrying each tunnel (None: asyncssh, in this process)


def _head_endpoint(head_url: str) -> tuple[str, str, int]:
    """(scheme, host, port) the tunnel forwards to: the head's own listening address."""
    parts = urllib.parse.urlsplit(head_url)
    host = parts.hostname or "127.0.0.1"
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    return parts.scheme, host, parts.port or (443 if parts.scheme == "https" else 80)


class VmSession:
    """One VM: bootstrap it once, then hold the SSH connection its node's tunnel runs through."""

    def __init__(self, owner: SshBootstrapDriver, request: BootRequest, node_id: str) -> None:
        self.owner = owner
        self.request = request
        self.node_id = node_id
        self.problem: str | None = None  # why it could not be set up, once that is known
        self.stage = "waiting for the VM's address"  # how far setting it up got, in words
        self.phase = BootStage.REQUESTED  # and as a stage
        self.transcript: list[str] = []
        self.remote_port = 0  # the tunnel's port on the VM (kept across reconnections)
        self._connection: Any = None  # asyncssh's: setting the VM up, and the tunnel without OpenSSH's client
        self._tunnel: OpenSshTunnel | None = None
        self._address: VmAddress | None = None
        # Logged in as the user of the VM's own image (images of different publishers differ).
        self.login = dataclasses.replace(owner.login, user=owner.inner.login_user(node_id))

    def note(self, text: str) -> None:
        self.transcript.append(f"[{time.strftime('%H:%M:%S')}] {text}")
        total = sum(len(line) for line in self.transcript)
        while total > TRANSCRIPT_LIMIT and len(self.transcript) > 1:
            total -= len(self.transcript.pop(0))

    async def run(self) -> None:
        settings = self.owner.settings
        deadline = time.monotonic() + settings.boot_deadline_s
        try:
            await self._bootstrap(deadline)
        except BootstrapFailed as e:
            self.problem = f"failed at stage {self.phase}: {e}"
            self.note(f"gave up: {e}")
            self.owner.event(self.node_id, "bootstrap failed", "\n".join(self.transcript))
            if self.owner.on_boot_failed is not None:
                self.owner.on_boot_failed(self.node_id, self.problem)
            return
        finally:
            if not settings.tunnel or settings.tunnel_program is not None:
                await self._close_connection()  # the tunnel, if any, has a connection of its own
        if settings.tunnel:
            await self._hold()

    # --- reaching the VM ---------------------------------------------------------------------

    async def _wait_for_address(self, deadline: float) -> VmAddress:
        while True:
            try:
                address = await self.owner.inner.address(self.node_id)
            except Exception as e:  # noqa: BLE001 - a cloud API hiccup; ask again
                address = None
                self.note(f"address lookup failed: {type(e).__name__}: {e}")
            if address is not None and (address.public or address.private):
                self.phase = BootStage.RUNNING
                return address
            if time.monotonic() > deadline:
                raise BootstrapFailed("the VM never got a network address before the boot deadline")
            await asyncio.sleep(ADDRESS_POLL_S)

    def _dial_address(self, address: VmAddress) -> str:
        # A head inside the cloud network (no tunnel) uses private addresses; a laptop the public one.
        if self.owner.settings.tunnel:
            return address.public or address.private or ""
        return address.private or address.public or ""

    async def _connect_until(self, address: str, deadline: float) -> Any:
        pinned = self.owner.host_keys.get(self.node_id)
        if pinned is not None:
            return await self.login.connect_until(address, deadline, pinned, self.note)
        # First contact: kept only if the server's key is one the cloud reports (burla.drivers.ssh.host_keys).
        connection = await verified_connection(
            lambda: self.login.connect_until(address, deadline, None, self.note),
            lambda: self.owner.inner.reported_host_keys(self.node_id), deadline, f"VM {self.node_id}", address,
            self.note)
        self._record_host_key(connection)
        return connection

    def _record_host_key(self, connection: Any) -> None:
        if self.owner.host_keys.get(self.node_id) is None:
            key = host_key_of(connection)
            self.owner.host_keys.record(self.node_id, key)
            self.owner.event(self.node_id, "ssh host key", f"verified against the cloud's report: {fingerprint(key)}")

    # --- setting it up -----------------------------------------------------------------------

    async def _bootstrap(self, deadline: float) -> None:
        self._address = await self._wait_for_address(deadline)
        address = self._dial_address(self._address)
        self.note(f"address: public {self._address.public}, private {self._address.private}")
        self.stage, self.phase = f"connecting to {address} over SSH", BootStage.SSH
        self._connection = await self._connect_until(address, deadline)
        self.stage, self.phase = "uploading the build and running the bootstrap", BootStage.INSTALLING
        await self._upload()
        script = await self._connection.run(f"bash {remote(SCRIPT_FILE)}",
                                            timeout=max(30.0, deadline - time.monotonic()))
        self._record_output("bootstrap", script)
        if script.exit_status != 0:
            tail = "\n".join(completed_output(script).splitlines()[-15:])
            raise BootstrapFailed(f"the bootstrap exited with {script.exit_status}: {tail}")
        if self.owner.settings.tunnel:
            await self._forward(deadline)
        await self._start_node()
        self.stage = "the node was started over SSH but has not registered (see node.log in ~/.burla on the VM)"
        self.phase = BootStage.STARTING
        self.owner.baker.after_setup(self.request, installed=ALREADY_INSTALLED not in completed_output(script))

    async def _upload(self) -> None:
        settings = self.owner.settings
        script = install_script(self.request.python_version, settings.packages, image=self.request.image)
        # The node's own token: the cluster token never reaches a node VM, where a job's code runs.
        secrets = secret_files(node_token(settings.token, self.node_id), settings.head_cert)
        await upload_setup(self._connection, self.owner.wheel, settings.packages, script,
                           installed_tag(self.request.python_version), secrets, self.request.python_version)
        self.note(f"uploaded the build {build_hash()}, the node's token and the bootstrap")

    async def _forward(self, deadline: float | None = None) -> None:
        """The tunnel: a port on the VM's loopback forwarded to the head, written to the file the
        node reads its head URL from."""
        scheme, host, port = _head_endpoint(self.owner.settings.head_url)
        self.remote_port = await self._open_tunnel(host, port, deadline)
        async with self._connection.start_sftp_client() as sftp:
            await write_private(sftp, remote(HEAD_URL_FILE), f"{scheme}://127.0.0.1:{self.remote_port}\n")
        if self._tunnel is not None:
            carrier = f"at {host}:{port}, by OpenSSH's client (pid {self._tunnel.pid})"
        elif self.owner.channels is not None:
            carrier = "on the SSH channel itself"
        else:
            carrier = f"at {host}:{port}"
        self.note(f"tunnel: 127.0.0.1:{self.remote_port} on the VM reaches the head {carrier}")

    async def _open_tunnel(self, host: str, port: int, deadline: float | None) -> int:
        """The remote forward, and the port it listens on. A reconnect asks for the same port; if
        the VM's sshd still holds it (it has not noticed the old connection died), another one. A
        request the sshd refuses (RFC 4254 §7.1: it could not bind, or is busy) is asked again 1, 2
        and 4 s later; refused each time, setting the VM up fails saying so, where it had crashed
        and left the VM waiting out the boot deadline."""
        for attempt in range(FORWARD_TRIES):
            try:
                return await self._ask_forward(host, port)
            except ForwardRefused as e:
                if self.remote_port:
                    self.note(f"port {self.remote_port} is still taken on the VM ({e}); taking another")
                    self.remote_port = 0
                    continue
                pause = 2.0 ** attempt
                if attempt == FORWARD_TRIES - 1 or (deadline is not None and time.monotonic() + pause > deadline):
                    raise BootstrapFailed(
                        f"the VM's sshd refused the tunnel's remote port forward (asked {attempt + 1} times: {e}); "
                        "its sshd_config must allow it (AllowTcpForwarding, yes by default)") from None
                refused = f"the VM's sshd refused the tunnel's remote port forward ({e}); asking again in {pause:g} s"
                self.note(refused)
                self.owner.event(self.node_id, "ssh", refused)
                await asyncio.sleep(pause)
        raise BootstrapFailed(f"the VM's sshd refused the tunnel's remote port forward (asked {FORWARD_TRIES} times)")

    async def _ask_forward(self, host: str, port: int) -> int:
        """Ask the VM's sshd once for the forward at `self.remote_port` (0: any); ForwardRefused
        if it says no."""
        program = self.owner.settings.tunnel_program
        if program is not None:
            await self._close_tunnel()
            host_key = self.owner.host_keys.get(self.node_id)
            assert self._address is not None and host_key is not None  # pinned at the first connection
            tunnel = OpenSshTunnel(program, self.login, self._dial_address(self._address), self.node_id, host_key,
                                   self.owner.tunnel_known_hosts(self.node_id), (host, port), self.note)
            remote_port = await tunnel.open(self.remote_port)
            self._tunnel = tunnel
            return remote_port
        ChannelListenError = ssh_library().ChannelListenError

        channels = self.owner.channels
        try:
            if channels is not None:
                listener = await self._connection.create_server(
                    channels.session_factory(f"{self.node_id} over SSH"), "127.0.0.1", self.remote_port)
            else:
                listener = await self._connection.forward_remote_port("127.0.0.1", self.remote_port, host, port)
        except ChannelListenError as e:
            raise ForwardRefused(str(e)) from None
        return int(listener.get_port())

    def _join_args(self) -> list[str]:
        settings = self.owner.settings
        request = self.request
        if settings.tunnel:
            scheme = _head_endpoint(settings.head_url)[0]
            head_url = f"{scheme}://127.0.0.1:{self.remote_port}"
        else:
            head_url = settings.head_url
        private = self._address.private if self._address else None
        # Peers reach a node at its private address: it listens there only, not on its public one.
        args = ["--head", head_url, "--node-id", self.node_id, "--host", private or "0.0.0.0",
                "--orphan-timeout", f"{settings.orphan_timeout_s:g}"]
        if private:
            args += ["--advertise-host", private]
        if request.workers is not None:
            args += ["--workers", str(request.workers)]
        # GPUs are not passed: the node offers what nvidia-smi lists, which the head checks
        # against the machine type (an image without the NVIDIA driver lists none).
        if request.image is not None:
            args += ["--image", request.image]
        if request.region is not None:
            args += ["--region", request.region]
        if settings.head_cert:
            args += ["--head-cert", f"$B/{HEAD_CERT_FILE}"]
        if settings.tunnel:
            args += ["--head-url-file", f"$B/{HEAD_URL_FILE}"]
        return args

    async def _start_node(self) -> None:
        settings = self.owner.settings
        command = supervise_command(self._join_args(), settings.orphan_timeout_s, self.request.image,
                                    gpu=self.request.gpu is not None)
        started = await self._connection.run(command, timeout=60)
        self._record_output("start", started)
        if started.exit_status != 0:
            raise BootstrapFailed(f"the node's supervisor did not start (exit {started.exit_status}): "
                                  f"{(started.stderr or '').strip()[-500:]}")

    def _record_output(self, step: str, result: Any) -> None:
        output = completed_output(result)
        self.note(f"{step}: exit {result.exit_status}" + (f"\n{output[-4000:]}" if output else ""))

    # --- holding the tunnel --------------------------------------------------------------------

    async def _hold(self) -> None:
        """Keep the node's tunnel up; reconnect when it drops."""
        assert self._address is not None
        address = self._dial_address(self._address)
        while True:
            why = await self._tunnel_closed()
            self.note(f"the SSH connection dropped ({why}); reconnecting")
            self.owner.event(self.node_id, "ssh", f"the connection dropped ({why}); reconnecting")
            while True:
                try:
                    self._connection = await self.login.connect(address, self.owner.host_keys.get(self.node_id))
                    self._record_host_key(self._connection)
                    await self._forward()
                    await self._start_node()  # starts the supervisor again only if it is gone
                    break
                except Exception as e:  # noqa: BLE001 - keep trying: the head reaps a node silent too long
                    await self._close_tunnel()
                    await self._close_connection()
                    self.note(f"reconnect failed: {explain(e, address, self.login.user)}")
                    await asyncio.sleep(RETRY_EVERY_S)
            if self._tunnel is not None:
                await self._close_connection()
            self.owner.event(self.node_id, "ssh", f"reconnected; tunnel on port {self.remote_port}")

    async def _tunnel_closed(self) -> str:
        """Wait until the tunnel's connection ends; why, as far as it is known."""
        if self._tunnel is not None:
            return f"OpenSSH's client ended, {await self._tunnel.wait_closed()}"
        await self._connection.wait_closed()
        return "asyncssh's connection closed"

    async def _close_tunnel(self) -> None:
        tunnel, self._tunnel = self._tunnel, None
        if tunnel is not None:
            await tunnel.close()

    async def _close_connection(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()
            with contextlib.suppress(Exception):
                await connection.wait_closed()

    async def close(self) -> None:
        await self._close_tunnel()
        await self._close_connection()


class SshBootstrapDriver(Driver):
    """A cloud driver whose VMs the head sets up over SSH (see the module docstring)."""

    def __init__(self, inner: Any, settings: SshSettings, channels: ChannelServer | None = None) -> None:
        self.inner = inner
        # Where a plain-http head serves its tunnels' connections, on the SSH channels themselves;
        # without it (a TLS head), a tunnel forwards each connection to the head's port.
        self.channels = channels
        self.name = inner.name
        self.settings = settings
        logging.getLogger("asyncssh").setLevel(logging.WARNING)  # one line per packet exchange otherwise
        key_path, self.public_key = cluster_key(settings.config_dir, settings.cluster_id)
        self.login = SshLogin(inner.ssh_user, key_path, settings.address_map)
        self.host_keys = HostKeys(settings.config_dir / "ssh" / f"known-hosts-{settings.cluster_id}.json")
        self.wheel = build_wheel(settings.config_dir / "builds")
        self.baker = ImageBaker(inner, BakeSettings(self.login, self.wheel, settings.packages, self.public_key,
                                                    settings.boot_deadline_s, settings.tunnel), self.event)
        self.on_event: NodeEvent | None = None
        self.on_boot_failed: Callable[[str, str], None] | None = None  # (node_id, why): delete it now
        self._sessions: dict[str, VmSession] = {}
        self._tasks: dict[str, asyncio.Task] = {}

    def tunnel_known_hosts(self, node_id: str) -> Path:
        """The VM's pinned host key, as OpenSSH's client reads it (see burla.drivers.ssh.tunnel)."""
        return self.settings.config_dir / "ssh" / f"tunnel-hosts-{self.settings.cluster_id}" / node_id

    def event(self, node_id: str, kind: str, detail: str) -> None:
        if self.on_event is not None:
            self.on_event(node_id, kind, detail)

    async def boot(self, request: BootRequest) -> list[str]:
        # A VM this head can't set up (it died, SSH never answered) powers itself off well after the
        # deadline at which a living head would have deleted it.
        request = dataclasses.replace(request, ssh_public_key=self.public_key,
                                      power_off_after_s=DEAD_MAN_DEADLINES * self.settings.boot_deadline_s)
        node_ids = request.ids("burla-node")
        request = dataclasses.replace(request, node_ids=tuple(node_ids))
        try:
            booted = await self.inner.boot(request)
        except CloudRefused as e:
            self._set_up(request, e.booted)  # the machines that did start still become nodes
            raise
        self._set_up(request, booted)
        return booted

    def _set_up(self, request: BootRequest, node_ids: list[str]) -> None:
        for node_id in node_ids:
            session = VmSession(self, request, node_id)
            self._sessions[node_id] = session
            task = asyncio.create_task(session.run(), name=f"ssh-{node_id}")
            self._tasks[node_id] = task
            task.add_done_callback(functools.partial(self._session_ended, node_id))

    def _session_ended(self, node_id: str, task: asyncio.Task) -> None:
        if self._tasks.get(node_id) is task:
            self._tasks.pop(node_id, None)
        error = None if task.cancelled() else task.exception()
        if error is not None:
            log.error("SSH session of %s crashed", node_id, exc_info=error)
            session = self._sessions.get(node_id)
            if session is not None and session.problem is None:
                session.problem = f"setting the VM up crashed: {type(error).__name__}: {error}"

    def boot_stage(self, node_id: str) -> BootStage:
        session = self._sessions.get(node_id)
        return session.phase if session is not None else BootStage.REQUESTED

    def boot_problem(self, node_id: str) -> str | None:
        session = self._sessions.get(node_id)
        if session is None:
            return None
        if session.problem:
            return session.problem
        last = f"; last: {session.transcript[-1][:500]}" if session.transcript else ""
        return f"{session.stage}{last}"

    async def list_nodes(self) -> list[NodeHandle]:
        return await self.inner.list_nodes()

    async def quota_room(self, machine_type: str, spot: bool) -> QuotaRoom | None:
        return await self.inner.quota_room(machine_type, spot)

    @property
    def region(self) -> str:
        return self.inner.region

    async def machine_types(self) -> list[MachineType]:
        return await self.inner.machine_types()

    async def check(self, machine_type: str | None = None) -> list[CloudCheck]:
        return await self.inner.check(machine_type)

    async def baked_images(self) -> list[BakedImage]:
        return await self.inner.baked_images()

    async def delete_baked_image(self, image_id: str) -> bool:
        return await self.inner.delete_baked_image(image_id)

    async def _end_session(self, node_id: str, forget: bool = True) -> None:
        session = self._sessions.pop(node_id, None)
        task = self._tasks.pop(node_id, None)
        await end_tasks(log, task)
        if session is not None:
            await session.close()
        if forget:  # the VM is gone; a new one may come back at this name
            self.host_keys.forget(node_id)
            self.tunnel_known_hosts(node_id).unlink(missing_ok=True)

    async def delete(self, node_id: str) -> bool:
        await self._end_session(node_id)
        return await self.inner.delete(node_id)

    async def boot_log(self, node_id: str) -> str:
        console = ""
        with contextlib.suppress(Exception):
            console = await self.inner.boot_log(node_id)
        session = self._sessions.get(node_id)
        transcript = "\n".join(session.transcript) if session is not None else ""
        parts = [f"--- console ---\n{console}" if console else "", f"--- ssh ---\n{transcript}" if transcript else ""]
        return "\n".join(p for p in parts if p)

    async def close(self) -> None:
        """End every session (VMs kept with --keep-nodes keep their recorded host keys)."""
        await self.baker.close()  # a builder in flight is deleted first
        for node_id in list(self._sessions):
            await self._end_session(node_id, forget=False)
        await self.inner.close()
