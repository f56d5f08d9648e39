"""Stand-ins for cloud VMs: each an SSH server on 127.0.0.1 (asyncssh's) whose commands run in a
home directory of its own with a clean environment, so the head's real bootstrap runs through it:
SFTP uploads, the install from the uploaded wheel, the supervised node, the remote port forward.

`MotoVmFarm` watches a moto EC2 server: each instance that starts running gets a stand-in that
authorises the public key of the instance's EC2 key pair (as cloud-init would), and the address
map the head dials through (`BURLA_SSH_ADDRESS_MAP`) points the instance's addresses at it. A
terminated instance's stand-in is stopped with everything it runs; a stand-in whose machine is
shut down from inside (`shutdown -h now`, as the node supervisor does) terminates its instance
when the instance was started with InstanceInitiatedShutdownBehavior=terminate, as EC2 does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import asyncssh

SHIMS = {
    # Cloud images let the login user run root commands through passwordless sudo.
    "sudo": '#!/bin/sh\n[ "$1" = "-n" ] && shift\nexec "$@"\n',
    # Powering off: recorded; the farm turns it into what the cloud does on shutdown.
    "shutdown": '#!/bin/sh\necho "$@" >> "$HOME/../powered-off"\n',
}


class LoopThread:
    """An event loop in a daemon thread, for servers the (synchronous) tests keep running."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="vm-standins", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine, timeout: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class StandinVm:
    def __init__(self, root: Path, authorized_key: str, name: str) -> None:
        self.root = root
        self.name = name
        self.home = root / "home"
        self.shims = root / "shims"
        self.home.mkdir(parents=True, exist_ok=True)
        self.shims.mkdir(parents=True, exist_ok=True)
        for shim, text in SHIMS.items():
            (self.shims / shim).write_text(text)
            (self.shims / shim).chmod(0o755)
        self.authorized_key = authorized_key
        self.host_key = asyncssh.generate_private_key("ssh-ed25519")
        self.connections: set[asyncssh.SSHServerConnection] = set()
        self.logins: list[str] = []  # user names that logged in
        self.commands: list[str] = []
        self.port = 0
        self._server: asyncssh.SSHAcceptor | None = None

    @property
    def powered_off(self) -> bool:
        return (self.root / "powered-off").exists()

    async def start(self) -> int:
        vm = self

        class Server(asyncssh.SSHServer):
            def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
                self._conn = conn
                vm.connections.add(conn)

            def connection_lost(self, exc: Exception | None) -> None:
                vm.connections.discard(self._conn)

            def begin_auth(self, username: str) -> bool:
                vm.logins.append(username)
                return True

            def server_requested(self, listen_host: str, listen_port: int) -> bool:
                return listen_host in ("127.0.0.1", "localhost")  # remote forwards on the VM's loopback

        self._server = await asyncssh.create_server(
            Server, "127.0.0.1", 0, server_host_keys=[self.host_key],
            authorized_client_keys=asyncssh.import_authorized_keys(self.authorized_key + "\n"),
            process_factory=self._run, sftp_factory=lambda channel: asyncssh.SFTPServer(channel, chroot=self.home),
            encoding=None, allow_scp=False,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def environment(self) -> dict[str, str]:
        path = os.pathsep.join([str(self.shims), str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin",
                                "/bin", "/usr/sbin", "/sbin"])
        # No package index: what the VM installs must come from what its head uploads.
        return {"HOME": str(self.home), "PATH": path, "LANG": "C.UTF-8", "PIP_NO_INDEX": "1",
                "USER": self.logins[-1] if self.logins else "root"}

    async def _run(self, process: asyncssh.SSHServerProcess) -> None:
        command = process.command or "true"
        self.commands.append(command)
        child = await asyncio.create_subprocess_exec(
            "/bin/bash", "-c", command, cwd=self.home, env=self.environment(), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await child.communicate()
        process.stdout.write(out)
        process.stderr.write(err)
        process.exit(child.returncode or 0)

    def drop_connections(self) -> int:
        """Cut every SSH connection (as a network failure would); returns how many there were."""
        connections = list(self.connections)
        for connection in connections:
            connection.abort()
        return len(connections)

    def kill_processes(self) -> None:
        """Everything the VM runs dies with it (the supervisor's session and its children)."""
        pid_file = self.home / ".burla" / "supervisor.pid"
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
            os.killpg(int(pid_file.read_text().strip()), signal.SIGKILL)

    async def stop(self) -> None:
        self.drop_connections()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        self.kill_processes()


class MotoVmFarm:
    """Stand-in VMs for the instances of a moto EC2 server (see the module docstring)."""

    def __init__(self, ec2: Any, root: Path, authorize: bool = True, answer: bool = True) -> None:
        self.ec2 = ec2
        self.root = root
        self.map_path = root / "ssh-address-map.json"
        self.authorize = authorize  # False: the VM refuses the cluster's key
        self.answer = answer  # False: nothing listens on the VM's port 22
        self.vms: dict[str, StandinVm] = {}  # instance id -> stand-in
        self.node_ids: dict[str, str] = {}  # instance id -> burla node id
        self.terminated_by_shutdown: list[str] = []
        self._gone: set[str] = set()
        self._loop = LoopThread()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        root.mkdir(parents=True, exist_ok=True)
        self.map_path.write_text("{}")
        self._thread = threading.Thread(target=self._watch, name="moto-vm-farm", daemon=True)
        self._thread.start()

    def vm(self, node_id: str, timeout: float = 60.0) -> StandinVm:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                for instance_id, found in self.node_ids.items():
                    if found == node_id and instance_id in self.vms:
                        return self.vms[instance_id]
            time.sleep(0.1)
        raise TimeoutError(f"no stand-in VM for node {node_id}")

    def only_vm(self, timeout: float = 60.0) -> StandinVm:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self.vms:
                    return next(iter(self.vms.values()))
            time.sleep(0.1)
        raise TimeoutError("no stand-in VM started")

    def _watch(self) -> None:
        while not self._stop.wait(0.3):
            try:
                self._poll()
            except Exception as e:  # noqa: BLE001 - moto restarting between tests; keep watching
                print(f"vm farm: {type(e).__name__}: {e}", file=sys.stderr)

    def _instances(self) -> list[dict]:
        reservations = self.ec2.describe_instances(Filters=[{"Name": "tag-key", "Values": ["burla-node-id"]}])
        return [i for r in reservations["Reservations"] for i in r["Instances"]]

    def _poll(self) -> None:
        for instance in self._instances():
            instance_id, state = instance["InstanceId"], instance["State"]["Name"]
            vm = self.vms.get(instance_id)
            if state == "running" and vm is None and instance_id not in self._gone:
                self._start(instance)
            elif vm is not None and state in ("shutting-down", "terminated", "stopping", "stopped"):
                self._retire(instance_id)
            elif vm is not None and vm.powered_off:
                behaviour = self.ec2.describe_instance_attribute(
                    InstanceId=instance_id, Attribute="instanceInitiatedShutdownBehavior")
                if behaviour["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate":
                    self.ec2.terminate_instances(InstanceIds=[instance_id])
                    self.terminated_by_shutdown.append(instance_id)
                else:
                    self.ec2.stop_instances(InstanceIds=[instance_id])
                self._retire(instance_id)

    def _start(self, instance: dict) -> None:
        instance_id = instance["InstanceId"]
        tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
        key = ""
        if instance.get("KeyName"):
            pairs = self.ec2.describe_key_pairs(KeyNames=[instance["KeyName"]], IncludePublicKey=True)["KeyPairs"]
            key = pairs[0]["PublicKey"]
        if not self.authorize or not key:
            key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
        vm = StandinVm(self.root / instance_id, key, instance_id)
        port = self._loop.run(vm.start())
        if not self.answer:
            self._loop.run(vm.stop())
            port = _closed_port()
        with self._lock:
            self.vms[instance_id] = vm
            self.node_ids[instance_id] = tags.get("burla-node-id", "")
            mapping = json.loads(self.map_path.read_text())
            for address in (instance.get("PublicIpAddress"), instance.get("PrivateIpAddress")):
                if address:
                    mapping[address] = f"127.0.0.1:{port}"
            partial = self.map_path.with_suffix(".tmp")
            partial.write_text(json.dumps(mapping))
            partial.replace(self.map_path)

    def _retire(self, instance_id: str) -> None:
        with self._lock:
            vm = self.vms.pop(instance_id, None)
            self._gone.add(instance_id)
        if vm is not None:
            self._loop.run(vm.stop())

    def drop_connections(self) -> int:
        with self._lock:
            vms = list(self.vms.values())
        return sum(self._loop.run(_call(vm.drop_connections)) for vm in vms)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for instance_id in list(self.vms):
            self._retire(instance_id)
        self._loop.close()


async def _call(function):
    return function()


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed again when this returns: nothing answers there
