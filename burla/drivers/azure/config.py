"""Azure settings: the subscription, tenant and region as the environment or the Azure CLI's
profile name them, the service principal (if any), the images nodes boot, and the endpoints
(Resource Manager, identity platform, the Retail Prices API, the instance metadata service)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from burla.drivers.azure.auth import cli_default, cli_default_subscription
from burla.drivers.azure.machines import PRICES_ENDPOINT
from burla.errors import CloudSetupError

DEFAULT_REGION = "eastus"
DEFAULT_IMAGE = "Canonical:ubuntu-24_04-lts:server:latest"  # publisher:offer:sku:version
# GPU sizes boot Microsoft's Ubuntu-HPC image, which carries the NVIDIA driver and CUDA
# (learn.microsoft.com/azure/virtual-machines/configure, "Ubuntu-HPC"); stock Ubuntu has no driver.
GPU_IMAGE = "microsoft-dsvm:ubuntu-hpc:2204:latest"
ARM_ENDPOINT = "https://management.azure.com"
AUTHORITY = "https://login.microsoftonline.com"
IMDS = "http://169.254.169.254"
IMAGE_GROUP = "burla-images"  # the resource group of baked images, shared by the subscription's clusters


def location_name(region: str) -> str:
    """A region as Resource Manager names it (`East US 2` and `eastus2` are one region; the API
    answers with the second): lowercase, no spaces."""
    return "".join(region.split()).lower()


@dataclass(frozen=True)
class AzureConfig:
    driver_name: ClassVar[str] = "azure"  # its entry in burla.drivers.registry
    subscription_id: str
    tenant_id: str | None = None
    region: str = DEFAULT_REGION
    resource_group: str = "burla"
    client_id: str | None = None  # a service principal, else the Azure CLI's login
    client_secret: str | None = None
    arm_endpoint: str = ARM_ENDPOINT
    authority: str = AUTHORITY
    image: str = DEFAULT_IMAGE
    gpu_image: str = GPU_IMAGE  # publisher:offer:sku:version, for GPU sizes
    prices_endpoint: str = PRICES_ENDPOINT  # the Retail Prices API (BURLA_AZURE_PRICES_URL)
    cluster_id: str = "default"
    managed_identity: bool = False  # a deployed head: tokens from the VM's own identity
    imds_endpoint: str = IMDS
    bake: bool = True  # BURLA_BAKE_IMAGES=0 turns baked images off (see burla.drivers.bake)
    image_group: str = IMAGE_GROUP  # where baked images are kept (BURLA_AZURE_IMAGE_GROUP)

    @classmethod
    def from_environment(cls, environ: dict[str, str], region: str | None, cluster_id: str) -> AzureConfig:
        directory = Path(environ.get("AZURE_CONFIG_DIR") or Path(environ.get("HOME", "~")).expanduser() / ".azure")
        profile = cli_default_subscription(directory)
        subscription = environ.get("AZURE_SUBSCRIPTION_ID") or profile.get("id")
        if not subscription:
            raise CloudSetupError(
                "No Azure subscription is selected. Run `az login` (then `az account set --subscription ID`), or "
                "set AZURE_SUBSCRIPTION_ID."
            )
        client_id, secret = environ.get("AZURE_CLIENT_ID"), environ.get("AZURE_CLIENT_SECRET")
        tenant = environ.get("AZURE_TENANT_ID") or profile.get("tenantId")
        if client_id and secret and not tenant:
            raise CloudSetupError("AZURE_CLIENT_ID and AZURE_CLIENT_SECRET are set but AZURE_TENANT_ID is not; set "
                                  "it to the service principal's tenant (`az account show --query tenantId`).")
        return cls(
            subscription_id=subscription,
            tenant_id=tenant,
            region=location_name(region or environ.get("AZURE_DEFAULTS_LOCATION") or cli_default(directory, "location")
                                 or DEFAULT_REGION),
            resource_group=environ.get("BURLA_AZURE_RESOURCE_GROUP") or f"burla-{cluster_id}",
            client_id=client_id if secret else None,
            client_secret=secret if client_id else None,
            arm_endpoint=(environ.get("BURLA_AZURE_RESOURCE_MANAGER_URL") or ARM_ENDPOINT).rstrip("/"),
            prices_endpoint=(environ.get("BURLA_AZURE_PRICES_URL") or PRICES_ENDPOINT).rstrip("/"),
            authority=(environ.get("AZURE_AUTHORITY_HOST") or AUTHORITY).rstrip("/"),
            image=environ.get("BURLA_AZURE_IMAGE") or DEFAULT_IMAGE,
            gpu_image=environ.get("BURLA_AZURE_GPU_IMAGE") or GPU_IMAGE,
            cluster_id=cluster_id,
            managed_identity=environ.get("BURLA_AZURE_MANAGED_IDENTITY") == "1",
            imds_endpoint=(environ.get("AZURE_POD_IDENTITY_AUTHORITY_HOST") or IMDS).rstrip("/"),
            bake=environ.get("BURLA_BAKE_IMAGES") != "0",
            image_group=environ.get("BURLA_AZURE_IMAGE_GROUP") or IMAGE_GROUP,
        )

    def head_environment(self) -> dict[str, str]:
        """What a deployed head needs to boot nodes like this (its credentials: the VM's managed identity)."""
        settings = {"AZURE_SUBSCRIPTION_ID": self.subscription_id, "AZURE_TENANT_ID": self.tenant_id or "",
                    "BURLA_AZURE_RESOURCE_GROUP": self.resource_group, "AZURE_DEFAULTS_LOCATION": self.region,
                    "BURLA_AZURE_IMAGE": self.image, "BURLA_AZURE_GPU_IMAGE": self.gpu_image,
                    "BURLA_AZURE_MANAGED_IDENTITY": "1", "BURLA_BAKE_IMAGES": "" if self.bake else "0",
                    "BURLA_AZURE_IMAGE_GROUP": self.image_group if self.image_group != IMAGE_GROUP else "",
                    "BURLA_AZURE_RESOURCE_MANAGER_URL": self.arm_endpoint if self.arm_endpoint != ARM_ENDPOINT else ""}
        return {k: v for k, v in settings.items() if v}
