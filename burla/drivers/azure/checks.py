"""`burla cloud check` on Azure: what booting a node (and baking its image) needs, asked of
Resource Manager before any VM boots: the subscription and resource group, the caller's
effective actions (`burla.drivers.azure.permissions`), the image, the size's vCPU quota."""

from __future__ import annotations

from typing import Any, Protocol

from burla.drivers.azure.config import AzureConfig
from burla.drivers.azure.permissions import (
    BAKING_FIX,
    BAKING_IMAGES,
    BAKING_VM,
    FIX,
    PERMISSIONS_API,
    missing_actions,
)
from burla.drivers.azure.vm import GROUP_API, size_vcpus
from burla.drivers.base import CloudCheck, QuotaRoom


class CheckedAzure(Protocol):
    """What the checks ask of the Azure driver."""

    config: AzureConfig

    @property
    def group_path(self) -> str: ...

    @property
    def image_group_path(self) -> str: ...

    def quota_room_now(self, driver: Any, size: str, spot: bool) -> QuotaRoom | None: ...


def azure_checks(azure: CheckedAzure, driver: Any, size: str) -> list[CloudCheck]:
    """Credentials and subscription (by reading the cluster's resource group), the actions
    booting needs (the permissions API), the image, the size's vCPU quota."""
    from libcloud.common.exceptions import BaseHTTPError

    try:
        driver.connection.request(azure.group_path, params={"api-version": GROUP_API})
        group, scope = f"resource group {azure.config.resource_group} exists", azure.group_path
    except BaseHTTPError as e:
        if e.code != 404:
            raise
        group = f"resource group {azure.config.resource_group} is made at the first boot"
        scope = f"/subscriptions/{azure.config.subscription_id}"
    checks = [CloudCheck("credentials", CloudCheck.OK, f"subscription {azure.config.subscription_id}; {group}")]
    try:
        entries = _permissions(driver, scope)
        missing = missing_actions(entries, group_exists=scope == azure.group_path)
        checks.append(CloudCheck("permissions", CloudCheck.FAIL, "the account may not " + ", ".join(missing), FIX)
                      if missing else CloudCheck("permissions", CloudCheck.OK, "every action booting needs is "
                                                 "allowed on the " + ("resource group" if scope == azure.group_path
                                                                      else "subscription")))
        if azure.config.bake:
            checks.append(_baking_check(azure, driver, entries))
    except BaseHTTPError as e:
        checks.append(CloudCheck("permissions", CloudCheck.WARN, f"could not read permissions: {e}",
                                 "allow Microsoft.Authorization/permissions/read to have them checked ahead"))
    image_parts = azure.config.image.split(":")
    checks.append(CloudCheck("image", CloudCheck.OK if len(image_parts) == 4 else CloudCheck.FAIL,
                             azure.config.image, "" if len(image_parts) == 4 else
                             "set BURLA_AZURE_IMAGE to publisher:offer:sku:version"))
    room = azure.quota_room_now(driver, size, spot=False)
    if room is None:
        checks.append(CloudCheck("vCPU quota", CloudCheck.WARN, f"no vCPU quota reported for {size}"))
    else:
        fits = room.free >= size_vcpus(size)
        checks.append(CloudCheck("vCPU quota", CloudCheck.OK if fits else CloudCheck.FAIL,
                                 f"{room.name}: {room.limit} vCPUs, {room.used} in use",
                                 "" if fits else room.how_to_raise))
    checks.append(CloudCheck("ssh path", CloudCheck.OK, "network security group burla-nodes-<cluster>-<region> "
                             "opens port 22, and the nodes' ports to the cluster's own nodes only (made at the first "
                             "boot)"))
    return checks


def _permissions(driver: Any, scope: str) -> list[dict[str, Any]]:
    return driver.connection.request(f"{scope}/providers/Microsoft.Authorization/permissions",
                                     params={"api-version": PERMISSIONS_API}).object.get("value", [])


def _baking_check(azure: CheckedAzure, driver: Any, cluster_entries: list[dict[str, Any]]) -> CloudCheck:
    """Baking needs a builder's deallocation and generalization (the cluster's scope) and images
    in resource group `burla-images` (read there, or on the subscription until it exists)."""
    from libcloud.common.exceptions import BaseHTTPError

    try:
        images_entries, exists = _permissions(driver, azure.image_group_path), True
    except BaseHTTPError as e:
        if e.code != 404:
            raise
        images_entries, exists = _permissions(driver, f"/subscriptions/{azure.config.subscription_id}"), False
    missing = (missing_actions(cluster_entries, True, BAKING_VM)
               + missing_actions(images_entries, exists, BAKING_IMAGES))
    if missing:
        return CloudCheck("image baking", CloudCheck.WARN, "second boots will install again: the account may not "
                          + ", ".join(missing), BAKING_FIX)
    return CloudCheck("image baking", CloudCheck.OK, f"images of the node runtime are kept in resource group "
                                                     f"{azure.config.image_group}")
