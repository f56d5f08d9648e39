"""The cloud drivers by name: which cloud each serves, where it lives, and which one a head uses.

One table names them all. A driver's module loads only when that driver is used (libcloud and
the cloud SDKs take hundreds of milliseconds to import), and the modules don't import this one,
so nothing here is circular. Each driver module exports `CONFIG` (its settings class, with
`from_environment`) and `DRIVER` (its `ThreadedCloudDriver`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from burla.errors import CloudSetupError

if TYPE_CHECKING:
    from burla.drivers.cloud import ThreadedCloudDriver

LOCAL = "local"  # the driver that runs nodes as processes of this machine


@dataclass(frozen=True)
class CloudDriverEntry:
    name: str  # as `--driver` takes it
    cloud: str  # as users name the cloud (`burla config set cloud`, `burla deploy`)
    module: str

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)

    def config(self, environ: dict[str, str], region: str | None, cluster_id: str) -> Any:
        """The driver's settings, resolved once from the environment (raises CloudSetupError)."""
        return self.load().CONFIG.from_environment(environ, region, cluster_id)


CLOUD_DRIVERS = (
    CloudDriverEntry("ec2", "aws", "burla.drivers.aws.driver"),
    CloudDriverEntry("gce", "gcp", "burla.drivers.gcp.driver"),
    CloudDriverEntry("azure", "azure", "burla.drivers.azure.driver"),
)
BY_NAME = {entry.name: entry for entry in CLOUD_DRIVERS}
BY_CLOUD = {entry.cloud: entry for entry in CLOUD_DRIVERS}
CLOUDS = tuple(BY_CLOUD)  # "aws", "gcp", "azure"
DRIVER_NAMES = (LOCAL, *BY_NAME)


def for_cloud(cloud: str) -> CloudDriverEntry:
    entry = BY_CLOUD.get(cloud)
    if entry is None:
        raise CloudSetupError(f"cloud {cloud!r} is not one of {', '.join(CLOUDS)}")
    return entry


def cloud_config(driver_name: str, environ: dict[str, str], region: str | None, cluster_id: str) -> Any:
    entry = BY_NAME.get(driver_name)
    if entry is None:
        raise CloudSetupError(f"no cloud driver named {driver_name!r}; there are {', '.join(BY_NAME)}")
    return entry.config(environ, region, cluster_id)


def cloud_driver(config: Any) -> ThreadedCloudDriver:
    """The driver for settings `cloud_config` made (each settings class names its driver)."""
    return BY_NAME[config.driver_name].load().DRIVER(config)


def signed_in_clouds(environ: dict[str, str]) -> list[str]:
    """The clouds this machine has credentials for, judged from their CLIs' environment variables
    and files only (no network: a laptop must not wait on metadata servers)."""
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
    if chosen is not None:
        return chosen
    if configured_cloud:
        if configured_cloud not in BY_CLOUD:
            raise CloudSetupError(f"the configured cloud {configured_cloud!r} is not one of {', '.join(CLOUDS)}; "
                                  "run `burla config set cloud aws|gcp|azure`.")
        return BY_CLOUD[configured_cloud].name
    signed_in = signed_in_clouds(environ)
    if len(signed_in) > 1:
        raise CloudSetupError(f"signed in to several clouds ({', '.join(signed_in)}); choose one with "
                              "`burla config set cloud aws|gcp|azure`, or pass --driver.")
    return BY_CLOUD[signed_in[0]].name if signed_in else LOCAL


def cluster_id_of(token: str) -> str:
    """The id that tags a cluster's machines: derived from its token, revealing nothing of it."""
    import hashlib

    return hashlib.sha256(token.encode()).hexdigest()[:12]
