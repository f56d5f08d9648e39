"""`burla deploy`: a head VM in the user's cloud serving https, and this machine pointed at it.

The head gets a fresh cluster token and a certificate made here (clients pin it, so the address
in the URL needs no matching name); it boots and deletes nodes with the cloud's own credentials
for VMs (an instance role, a service account, a managed identity). The VM is set up the way a
head sets up its nodes: over SSH with a key the cloud authorises, this machine uploading the
exact burla build it runs, the token, the certificate and its key (0600 files; nothing secret
goes in user data or metadata). Whether the head serves is checked through that same SSH
connection. The deployment record in the config directory makes clients and the CLI use that
head until `burla deploy delete`.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from burla.config import Deployment
from burla.drivers.head_vm import EXTRAS, HEAD_CERT, HEAD_KEY, HEAD_PORT, HeadMachine, start_command
from burla.drivers.registry import BY_CLOUD, CLOUDS, cloud_config, cloud_driver, cluster_id_of, for_cloud
from burla.drivers.ssh.bootstrap import SCRIPT_FILE, PackageSource, install_script, installed_tag, remote, this_python
from burla.drivers.ssh.host_keys import verified_connection
from burla.errors import BootstrapFailed, DeployError

DEPLOYMENT_DIR = "deployment"  # in the config directory: the deployed head's certificate and key
ADDRESS_TIMEOUT_S = 300.0
SSH_TIMEOUT_S = 600.0  # a new VM may take minutes to accept SSH


@dataclass(frozen=True)
class DeploySettings:
    """How this machine sets the head VM up (resolved once, from the environment)."""

    packages: PackageSource = PackageSource()  # where the VM gets burla's dependencies
    ssh_address_map: Path | None = None  # stand-in VMs: where to dial instead (forwarded to the head)


@dataclass(frozen=True)
class DeployRequest:
    cloud: str
    region: str | None = None
    machine_type: str | None = None
    disk_gb: int | None = None
    port: int = HEAD_PORT
    wait_s: float = 600.0  # how long to wait for the head to serve (0: don't)


def deploy(request: DeployRequest, directory: Path, environ: dict[str, str],
           settings: DeploySettings = DeploySettings()) -> dict[str, Any]:
    existing = Deployment.read(directory)
    if existing is not None:
        raise DeployError(f"a head is already deployed on {existing.cloud} ({existing.head_url}); remove it with "
                          "`burla deploy delete` first")
    if request.cloud not in BY_CLOUD:
        raise DeployError(f"cloud must be one of {', '.join(CLOUDS)}, got {request.cloud!r}")
    driver_name = BY_CLOUD[request.cloud].name
    token = secrets.token_urlsafe(32)
    cluster_id = cluster_id_of(token)
    config = cloud_config(driver_name, environ, request.region, cluster_id)
    cert_path, key_path = _fresh_certificate(directory / DEPLOYMENT_DIR)
    from burla.drivers.ssh.login import cluster_key

    ssh_key, public_key = cluster_key(directory, cluster_id)
    environment = dict(config.head_environment())
    if settings.ssh_address_map is not None:
        environment["BURLA_SSH_ADDRESS_MAP"] = str(settings.ssh_address_map)
    if settings.packages.index_url:
        environment["BURLA_NODE_INDEX_URL"] = settings.packages.index_url
    head = HeadMachine(
        name=f"burla-head-{cluster_id[:8]}", ssh_public_key=public_key, machine_type=request.machine_type,
        region=config.region, disk_gb=request.disk_gb, environment=environment, port=request.port,
        python_version=this_python(),
    )
    driver = cloud_driver(config)
    address = asyncio.run(_boot(driver, head))
    deployment = Deployment(request.cloud, head.name, f"https://{address}:{request.port}", str(cert_path), token,
                            config.region)
    deployment.write(directory)  # from here on, `burla deploy delete` removes what was made
    from burla.drivers.ssh.login import SshLogin
    from burla.process.build import build_wheel

    asking = cloud_driver(config)  # a driver of its own: the one that booted it closed with its loop
    setup = HeadSetup(head, asking, driver_name, SshLogin(driver.ssh_user, ssh_key, settings.ssh_address_map), address,
                      token, cert_path.read_text(), key_path.read_text(), build_wheel(directory / "builds"),
                      settings.packages)
    try:
        serving = asyncio.run(_closing(asking, setup.run(request.wait_s)))
    except BootstrapFailed as e:
        raise DeployError(f"the head VM {head.name} at {address} could not be set up: {e}. Its setup log: "
                          f"{setup.transcript_tail()}. `burla deploy delete` removes it.") from None
    return {"deployment": _public(deployment), "serving": serving}


@dataclass
class HeadSetup:
    """The head VM over SSH: upload, install, start; then whether it serves (through the tunnel)."""

    head: HeadMachine
    driver: Any  # the cloud driver that booted it (its host keys, as the cloud reports them)
    driver_name: str
    login: Any  # burla.drivers.ssh.login.SshLogin
    address: str
    token: str
    cert_pem: str
    key_pem: str
    wheel: Path
    packages: PackageSource
    transcript: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        self.transcript.append(text)

    def transcript_tail(self) -> str:
        return " | ".join(line.replace("\n", " ")[:300] for line in self.transcript[-4:])

    async def run(self, wait_s: float) -> bool:
        from burla.drivers.ssh.login import completed_output, secret_files, upload_setup

        deadline = time.monotonic() + max(wait_s, SSH_TIMEOUT_S)
        connection = await verified_connection(
            lambda: self.login.connect_until(self.address, deadline, None, self.note),
            lambda: self.driver.reported_head_host_keys(self.head.name), deadline, f"head VM {self.head.name}",
            self.address, self.note)
        try:
            script = install_script(self.head.python_version, self.packages, extra=EXTRAS[self.driver_name])
            secrets = {**secret_files(self.token, self.cert_pem), remote(HEAD_CERT): self.cert_pem,
                       remote(HEAD_KEY): self.key_pem}
            await upload_setup(connection, self.wheel, self.packages, script,
                               installed_tag(self.head.python_version, EXTRAS[self.driver_name]), secrets,
                               self.head.python_version, EXTRAS[self.driver_name], whole_wheelhouse=True)
            for step, command in (("bootstrap", f"bash {remote(SCRIPT_FILE)}"),
                                  ("start", start_command(self.driver_name, self.head,
                                                          wheelhouse=bool(self.packages.wheelhouse)))):
                result = await connection.run(command, timeout=max(60.0, deadline - time.monotonic()))
                self.note(f"{step}: exit {result.exit_status}: {completed_output(result)[-2000:]}")
                if result.exit_status != 0:
                    tail = "\n".join(completed_output(result).splitlines()[-15:])
                    raise BootstrapFailed(f"the head's {step} exited with {result.exit_status}: {tail}")
            return await self._serves(connection, wait_s)
        finally:
            connection.close()

    async def _serves(self, connection: Any, wait_s: float) -> bool:
        """Whether the head answers on its port, asked through the SSH connection (no firewall rule
        or public route needed), within `wait_s` seconds."""
        import tempfile

        from burla.client.local_cluster import head_is_healthy

        listener = await connection.forward_local_port("127.0.0.1", 0, "127.0.0.1", self.head.port)
        with tempfile.NamedTemporaryFile("w", suffix=".pem") as cert:
            cert.write(self.cert_pem)
            cert.flush()
            url = f"https://127.0.0.1:{listener.get_port()}"
            deadline = time.monotonic() + wait_s
            try:
                while True:
                    if await asyncio.to_thread(head_is_healthy, url, 5.0, cert.name):
                        return True
                    if time.monotonic() >= deadline:
                        return False
                    await asyncio.sleep(2)
            finally:
                listener.close()


def _fresh_certificate(directory: Path) -> tuple[Path, Path]:
    from burla.web.tls import make_self_signed

    shutil.rmtree(directory, ignore_errors=True)  # a new head gets a new certificate
    return make_self_signed(["burla-head"], directory)


async def _closing(driver: Any, work: Any) -> Any:
    try:
        return await work
    finally:
        await driver.close()


async def _boot(driver: Any, head: HeadMachine) -> str:
    try:
        await driver.boot_head(head)
        deadline = time.monotonic() + ADDRESS_TIMEOUT_S
        while True:
            address = await driver.head_address(head.name)
            if address:
                return address
            if time.monotonic() > deadline:
                raise DeployError(f"the head VM {head.name} got no public address within {ADDRESS_TIMEOUT_S:.0f} s; "
                                  "check it in the cloud console, then `burla deploy delete`")
            await asyncio.sleep(3)
    finally:
        await driver.close()


def _public(deployment: Deployment) -> dict[str, Any]:
    return {"cloud": deployment.cloud, "head_id": deployment.head_id, "head_url": deployment.head_url,
            "head_cert": deployment.head_cert, "region": deployment.region}


def show(directory: Path) -> dict[str, Any]:
    from burla.client.local_cluster import head_is_healthy

    deployment = _required(directory)
    serving = head_is_healthy(deployment.head_url, timeout=5.0, cert=deployment.head_cert)
    return {"deployment": _public(deployment), "serving": serving}


def _required(directory: Path) -> Deployment:
    deployment = Deployment.read(directory)
    if deployment is None:
        raise DeployError("no head is deployed from this machine; deploy one with `burla deploy aws|gcp|azure`")
    return deployment


def delete(directory: Path, environ: dict[str, str]) -> dict[str, Any]:
    """Delete the deployed head VM and every node of its cluster, then forget the deployment."""
    deployment = _required(directory)
    config = cloud_config(for_cloud(deployment.cloud).name, environ, deployment.region, cluster_id_of(deployment.token))

    async def remove() -> tuple[bool, list[str]]:
        driver = cloud_driver(config)
        try:
            head_deleted = await driver.delete_head(deployment.head_id)
            nodes = [handle.node_id for handle in await driver.list_nodes()]
            for node_id in nodes:
                await driver.delete(node_id)
            return head_deleted, nodes
        finally:
            await driver.close()

    head_deleted, nodes = asyncio.run(remove())
    Deployment.remove(directory)
    shutil.rmtree(directory / DEPLOYMENT_DIR, ignore_errors=True)
    return {"head_deleted": head_deleted, "nodes_deleted": nodes, "head_id": deployment.head_id}


