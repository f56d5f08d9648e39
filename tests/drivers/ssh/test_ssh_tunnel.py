"""A node's tunnel carried by OpenSSH's client (`burla.drivers.ssh.tunnel`), against a stand-in
VM's sshd on 127.0.0.1 (`tests.support.clouds.vm_standin`): the real `ssh -R` forwards a port on the VM to a
server standing for the head, refuses what it must (a taken port, another host key) saying why,
and ends when its owner closes it or the connection drops."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import asyncssh
import pytest

from burla.drivers.ssh.login import SshLogin
from burla.drivers.ssh.tunnel import REMOTE_COMMAND, ForwardRefused, OpenSshTunnel, find_ssh_program
from burla.errors import BootstrapFailed
from tests.support.clouds.vm_standin import StandinVm
from tests.support.helpers import require_openssh

pytestmark = pytest.mark.timeout(120)

VM_ADDRESS = "10.0.0.5"  # what the cloud reports; the address map dials the stand-in instead


class Setup:
    def __init__(self, vm: StandinVm, login: SshLogin, head: tuple[str, int], root: Path) -> None:
        self.vm = vm
        self.login = login
        self.head = head
        self.root = root
        self.notes: list[str] = []

    def tunnel(self, host_key: str | None = None) -> OpenSshTunnel:
        pinned = host_key or self.vm.host_key.export_public_key().decode()
        program = find_ssh_program()
        assert program is not None
        return OpenSshTunnel(program, self.login, VM_ADDRESS, "burla-node-1", pinned,
                             self.root / "tunnel-hosts" / "burla-node-1", self.head, self.notes.append)


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


@pytest.fixture
async def setup(tmp_path):
    require_openssh()
    key = asyncssh.generate_private_key("ssh-ed25519")
    key_path = tmp_path / "cluster-key"
    key.write_private_key(str(key_path))
    key_path.chmod(0o600)
    vm = StandinVm(tmp_path / "vm", key.export_public_key().decode().strip(), "vm-1")
    port = await vm.start()
    address_map = tmp_path / "address-map.json"
    address_map.write_text(json.dumps({VM_ADDRESS: f"127.0.0.1:{port}"}))
    head = await asyncio.start_server(_echo, "127.0.0.1", 0)
    yield Setup(vm, SshLogin("ec2-user", key_path, address_map), ("127.0.0.1", head.sockets[0].getsockname()[1]),
                tmp_path)
    head.close()
    await head.wait_closed()
    await vm.stop()


async def _round_trip(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    await writer.drain()
    echoed = await asyncio.wait_for(reader.readexactly(len(payload)), 30)
    writer.close()
    await writer.wait_closed()
    return echoed


async def test_a_port_on_the_vm_reaches_the_head_until_the_tunnel_is_closed(setup):
    tunnel = setup.tunnel()
    port = await tunnel.open(0)  # the VM's sshd chose it, and ssh said which
    assert port > 0 and f"Allocated port {port}" in tunnel.said()
    assert any(f"Allocated port {port}" in note for note in setup.notes)  # the VM's transcript has it too
    payload = bytes(range(256)) * 4096  # 1 MiB each way, across SSH packets
    assert await _round_trip(port, payload) == payload
    assert setup.vm.commands == [REMOTE_COMMAND] and setup.vm.logins == ["ec2-user"]
    # Only the pinned key, under the node's name, in a file of its own.
    assert (setup.root / "tunnel-hosts" / "burla-node-1").read_text().startswith("burla-node-1 ssh-ed25519 ")
    await tunnel.close()
    assert tunnel.pid is not None and "exit" in await tunnel.wait_closed()
    with pytest.raises(OSError):
        await _round_trip(port, b"x")


async def _reopened(setup: Setup, port: int) -> OpenSshTunnel:
    for _ in range(40):
        tunnel = setup.tunnel()
        try:
            assert await tunnel.open(port) == port
            return tunnel
        except ForwardRefused:  # the VM's sshd has not closed the old listener yet
            await asyncio.sleep(0.25)
    raise AssertionError(f"port {port} never came back")


async def test_the_same_port_is_asked_for_again_and_a_taken_one_is_refused_saying_so(setup):
    first = setup.tunnel()
    port = await first.open(0)
    await first.close()
    again = await _reopened(setup, port)  # a reconnect gets its port back once the VM let it go
    assert await _round_trip(port, b"back") == b"back"
    taken = setup.tunnel()  # the port is the first tunnel's: the VM's sshd can't bind it
    with pytest.raises(ForwardRefused, match=f"remote port forwarding failed for listen port {port}"):
        await taken.open(port)
    assert taken.pid is not None and "failed" in await taken.wait_closed()
    assert await _round_trip(port, b"still") == b"still"  # the tunnel holding it is untouched
    await again.close()


async def test_a_vm_presenting_another_host_key_gets_no_tunnel(setup):
    impostor = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()
    tunnel = setup.tunnel(host_key=impostor)
    with pytest.raises(BootstrapFailed, match="Host key verification failed") as failed:
        await tunnel.open(0)
    assert not isinstance(failed.value, ForwardRefused)
    assert setup.vm.commands == []  # it never logged in


async def test_a_dropped_connection_ends_the_tunnel_saying_why(setup):
    tunnel = setup.tunnel()
    await tunnel.open(0)
    assert await setup.vm.drop_connections() == 1
    why = await asyncio.wait_for(tunnel.wait_closed(), 60)
    assert why.startswith("exit 255") and "closed by remote host" in why, why
    await tunnel.close()


def test_the_client_takes_nothing_from_the_users_ssh_configuration(tmp_path):
    login = SshLogin("ubuntu", tmp_path / "key")
    tunnel = OpenSshTunnel("/usr/bin/ssh", login, "10.1.2.3", "burla-node-7", "ssh-rsa AAAAB3Nza comment",
                           tmp_path / "known", ("127.0.0.1", 8080), lambda _: None)
    command = tunnel.command(41000)
    assert command[:4] == ["/usr/bin/ssh", "-T", "-F", "none"]
    options = dict(command[i + 1].split("=", 1) for i, word in enumerate(command) if word == "-o")
    assert options["IdentitiesOnly"] == "yes" and options["IdentityAgent"] == "none" and options["BatchMode"] == "yes"
    assert options["StrictHostKeyChecking"] == "yes" and options["HostKeyAlias"] == "burla-node-7"
    assert options["UserKnownHostsFile"] == options["GlobalKnownHostsFile"] == str(tmp_path / "known")
    assert options["HostKeyAlgorithms"] == "rsa-sha2-512,rsa-sha2-256,ssh-rsa"  # the pinned key's type only
    assert options["ExitOnForwardFailure"] == "yes" and options["ControlPath"] == "none"
    assert command[command.index("-i") + 1] == str(tmp_path / "key") and command[command.index("-p") + 1] == "22"
    assert command[-4:] == ["-R", "127.0.0.1:41000:127.0.0.1:8080", "10.1.2.3", REMOTE_COMMAND]
