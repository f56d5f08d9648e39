"""What the cloud drivers (EC2, GCE, Azure) share: the tags that mark a cluster's machines, which
clouds this machine is signed in to, and the thread pool libcloud's blocking calls run in. (VMs
are set up over SSH by the head: `burla.drivers.ssh`.)

libcloud is blocking and its driver objects are not thread safe (connection state, GCE paging
parameters, zone caches), so every call runs in a dedicated pool with one libcloud driver per
thread (DESIGN.md §2). Cancelling an awaiting task does not stop its thread, so each driver also
sets request timeouts.
"""

from __future__ import annotations

import abc
import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from burla.drivers.base import BootRequest, Driver, VmAddress

if TYPE_CHECKING:
    from burla.drivers.head_vm import HeadMachine

CLUSTER_TAG = "burla-cluster"
NODE_TAG = "burla-node-id"
POOL_THREADS = 8


def signed_in_clouds(environ: dict[str, str]) -> list[str]:
    """The clouds ("aws", "gcp", "azure") this machine has credentials for, judged from their CLIs'
    environment variables and files only (no network: a laptop must not wait on metadata servers)."""
    home = Path(environ.get("HOME") or Path.home())
    found = []
    aws_files = [environ.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials",
                 environ.get("AWS_CONFIG_FILE") or home / ".aws" / "config"]
    if environ.get("AWS_ACCESS_KEY_ID") or environ.get("AWS_PROFILE") or any(Path(f).is_file() for f in aws_files):
        found.append("aws")
    gcloud = Path(environ.get("CLOUDSDK_CONFIG") or home / ".config" / "gcloud")
    if environ.get("GOOGLE_APPLICATION_CREDENTIALS") or (gcloud / "application_default_credentials.json").is_file():
        found.append("gcp")
    azure = Path(environ.get("AZURE_CONFIG_DIR") or home / ".azure")
    if (environ.get("AZURE_CLIENT_ID") and environ.get("AZURE_TENANT_ID")) or (azure / "azureProfile.json").is_file():
        found.append("azure")
    return found


def resolve_driver(chosen: str | None, configured_cloud: str | None, environ: dict[str, str]) -> str:
    """The driver a head boots nodes with: `chosen` (--driver), else the cloud `burla config set
    cloud` configured, else the one cloud this machine is signed in to, else "local"."""
    from burla.config import CLOUD_DRIVERS
    from burla.errors import CloudSetupError

    if chosen is not None:
        return chosen
    if configured_cloud:
        if configured_cloud not in CLOUD_DRIVERS:
            raise CloudSetupError(f"the configured cloud {configured_cloud!r} is not one of aws, gcp, azure; run "
                                  "`burla config set cloud aws|gcp|azure`.")
        return CLOUD_DRIVERS[configured_cloud]
    signed_in = signed_in_clouds(environ)
    if len(signed_in) > 1:
        raise CloudSetupError(f"signed in to several clouds ({', '.join(signed_in)}); choose one with "
                              "`burla config set cloud aws|gcp|azure`, or pass --driver.")
    return CLOUD_DRIVERS[signed_in[0]] if signed_in else "local"


def cluster_id_of(token: str) -> str:
    """The id that tags a cluster's machines: derived from its token, revealing nothing of it."""
    import hashlib

    return hashlib.sha256(token.encode()).hexdigest()[:12]


class ThreadedCloudDriver(Driver):
    """A driver whose libcloud calls run in its own pool, one libcloud driver object per thread."""

    ssh_user: str  # the login its VMs' images accept

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=POOL_THREADS, thread_name_prefix=f"libcloud-{self.name}")
        self._local = threading.local()
        self.on_boot_failed = None

    @abc.abstractmethod
    def _new_libcloud_driver(self) -> Any:
        """A libcloud driver for the calling thread (runs in the pool)."""

    def _driver(self) -> Any:
        driver = getattr(self._local, "driver", None)
        if driver is None:
            driver = self._local.driver = self._new_libcloud_driver()
        return driver

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(self._driver(), *args))

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- nodes: each call runs in the pool ---------------------------------------------------

    async def boot(self, request: BootRequest) -> list[str]:
        node_ids = request.ids("burla-node")
        await asyncio.gather(*(self._call(self._boot_one, request, node_id) for node_id in node_ids))
        return node_ids

    async def delete(self, node_id: str) -> bool:
        return await self._call(self._delete, node_id)

    async def boot_log(self, node_id: str) -> str:
        return await self._call(self._console, node_id)

    async def address(self, node_id: str) -> VmAddress | None:
        """The VM's public and private addresses once it runs; None before."""
        return await self._call(self._address, node_id)

    @abc.abstractmethod
    def _boot_one(self, driver: Any, request: BootRequest, node_id: str) -> str: ...

    @abc.abstractmethod
    def _delete(self, driver: Any, node_id: str) -> bool: ...

    @abc.abstractmethod
    def _console(self, driver: Any, node_id: str) -> str: ...

    @abc.abstractmethod
    def _address(self, driver: Any, node_id: str) -> VmAddress | None: ...

    # --- the head VM of `burla deploy` --------------------------------------------------------

    async def boot_head(self, head: HeadMachine) -> None:
        """Start the head VM: reachable on its port from anywhere (token and TLS guard it), allowed
        to boot and delete this cluster's nodes with the cloud's own credentials for VMs."""
        await self._call(self._boot_head, head)

    async def head_address(self, name: str) -> str | None:
        """The head VM's public IP address, once it has one."""
        return await self._call(self._head_address, name)

    async def delete_head(self, name: str) -> bool:
        return await self._call(self._delete_head, name)

    @abc.abstractmethod
    def _boot_head(self, driver: Any, head: HeadMachine) -> None: ...

    @abc.abstractmethod
    def _head_address(self, driver: Any, name: str) -> str | None: ...

    @abc.abstractmethod
    def _delete_head(self, driver: Any, name: str) -> bool: ...


def cloud_config(driver_name: str, environ: dict[str, str], region: str | None, cluster_id: str) -> Any:
    """The named cloud driver's settings, resolved once from the environment (raises CloudSetupError)."""
    if driver_name == "ec2":
        from burla.drivers.ec2 import Ec2Config

        return Ec2Config.from_environment(environ, region, cluster_id)
    if driver_name == "gce":
        from burla.drivers.gce import GceConfig

        return GceConfig.from_environment(environ, region, cluster_id)
    if driver_name == "azure":
        from burla.drivers.azure import AzureConfig

        return AzureConfig.from_environment(environ, region, cluster_id)
    raise ValueError(f"no cloud driver named {driver_name!r}")


def cloud_driver(config: Any) -> ThreadedCloudDriver:
    """The driver for settings made by `cloud_config`."""
    kind = type(config).__name__
    if kind == "Ec2Config":
        from burla.drivers.ec2 import Ec2Driver

        return Ec2Driver(config)
    if kind == "GceConfig":
        from burla.drivers.gce import GceDriver

        return GceDriver(config)
    if kind == "AzureConfig":
        from burla.drivers.azure import AzureDriver

        return AzureDriver(config)
    raise ValueError(f"no cloud driver takes {kind}")
