"""`burla deploy`: a head VM in the user's cloud serving https, and this machine pointed at it.

The head gets a fresh cluster token and a certificate made here (clients pin it, so the address
in the URL needs no matching name); it boots and deletes nodes with the cloud's own credentials
for VMs (an instance role, a service account, a managed identity). The deployment record in the
config directory makes clients and the CLI use that head until `burla deploy delete`.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from burla.config import CLOUD_DRIVERS, Deployment
from burla.drivers.cloud import cloud_config, cloud_driver, cluster_id_of, this_python
from burla.drivers.head_vm import HEAD_PORT, HeadMachine
from burla.errors import DeployError

DEPLOYMENT_DIR = "deployment"  # in the config directory: the deployed head's certificate and key
ADDRESS_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class DeployRequest:
    cloud: str
    region: str | None = None
    machine_type: str | None = None
    disk_gb: int | None = None
    port: int = HEAD_PORT
    wait_s: float = 600.0  # how long to wait for the head to serve (0: don't)


def deploy(request: DeployRequest, directory: Path, environ: dict[str, str]) -> dict[str, Any]:
    existing = Deployment.read(directory)
    if existing is not None:
        raise DeployError(f"a head is already deployed on {existing.cloud} ({existing.head_url}); remove it with "
                          "`burla deploy delete` first")
    if request.cloud not in CLOUD_DRIVERS:
        raise DeployError(f"cloud must be one of {', '.join(CLOUD_DRIVERS)}, got {request.cloud!r}")
    driver_name = CLOUD_DRIVERS[request.cloud]
    token = secrets.token_urlsafe(32)
    config = cloud_config(driver_name, environ, request.region, cluster_id_of(token))
    cert_path, key_path = _fresh_certificate(directory / DEPLOYMENT_DIR)
    head = HeadMachine(
        name=f"burla-head-{cluster_id_of(token)[:8]}", token=token, cert_pem=cert_path.read_text(),
        key_pem=key_path.read_text(), machine_type=request.machine_type, region=config.region,
        disk_gb=request.disk_gb, environment=config.head_environment(), port=request.port,
        python_version=this_python(),
    )
    address = asyncio.run(_boot(cloud_driver(config), head))
    deployment = Deployment(request.cloud, head.name, f"https://{address}:{request.port}", str(cert_path), token,
                            config.region)
    deployment.write(directory)
    serving = _wait_until_serving(deployment, request.wait_s)
    return {"deployment": _public(deployment), "serving": serving}


def _fresh_certificate(directory: Path) -> tuple[Path, Path]:
    from burla.tls import make_self_signed

    shutil.rmtree(directory, ignore_errors=True)  # a new head gets a new certificate
    return make_self_signed(["burla-head"], directory)


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


def _wait_until_serving(deployment: Deployment, wait_s: float) -> bool:
    from burla.local_cluster import head_is_healthy

    deadline = time.monotonic() + wait_s
    while True:
        if head_is_healthy(deployment.head_url, timeout=5.0, cert=deployment.head_cert):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(5)


def _public(deployment: Deployment) -> dict[str, Any]:
    return {"cloud": deployment.cloud, "head_id": deployment.head_id, "head_url": deployment.head_url,
            "head_cert": deployment.head_cert, "region": deployment.region}


def show(directory: Path) -> dict[str, Any]:
    from burla.local_cluster import head_is_healthy

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
    config = cloud_config(CLOUD_DRIVERS[deployment.cloud], environ, deployment.region, cluster_id_of(deployment.token))

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


