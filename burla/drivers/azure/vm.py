"""The Azure VM resource burla creates for a node (Microsoft.Compute/virtualMachines, PUT body),
and what a size's name says (vCPUs, quota family, CPU architecture)."""

from __future__ import annotations

import base64
import re
from typing import Any

from burla.errors import CloudSetupError

ADMIN_USER = "burla"  # the login user the VM is made with (the cluster's key only)
DEFAULT_MACHINE_TYPE = "Standard_D8as_v5"
VM_API = "2024-07-01"
GROUP_API = "2021-04-01"


def size_vcpus(size: str) -> int:
    """Standard_D8as_v5 -> 8: the vCPUs in an Azure size's name."""
    digits = re.search(r"\d+", size.split("_")[1]) if "_" in size else None
    return int(digits.group(0)) if digits else 0


def size_family(size: str) -> str:
    """Standard_D8as_v5 -> standardDASv5Family: the quota name of a size's family (the usage API's)."""
    _, name, *rest = size.split("_") if size.count("_") >= 1 else ("", size)
    return f"standard{re.sub(r'[0-9]+', '', name).upper()}{''.join(rest)}Family"


def size_architecture(size: str) -> str:
    """Standard_D8ps_v5 -> arm64: `p` among a size's additive features marks an Arm CPU
    (learn.microsoft.com/azure/virtual-machines/vm-naming-conventions)."""
    name = size.split("_")[1] if "_" in size else size
    return "arm64" if "p" in re.sub(r"^[A-Za-z]+[0-9]+", "", name) else "x86_64"


def vm_body(image: str, name: str, size: str, disk_gb: int | None, spot: bool, script: str | None, region: str,
            subnet: str, tags: dict[str, str], security_group: str | None, ssh_key: str | None,
            application_security_group: str | None = None) -> dict[str, Any]:
    """A VM's resource body: the cluster's key for the login user, only the power-off timer as
    custom data, its NIC, public IP and OS disk deleted with it. `image` is publisher:offer:sku:version,
    or the resource id of a managed image (one burla baked)."""
    if image.startswith("/subscriptions/"):
        reference = {"id": image}
    else:
        publisher, offer, sku, version = image.split(":")
        reference = {"publisher": publisher, "offer": offer, "sku": sku, "version": version}
    if ssh_key is None:
        raise CloudSetupError("Azure Linux VMs need an SSH key; burla authorises the cluster's key on every VM")
    os_disk: dict[str, Any] = {"createOption": "FromImage", "deleteOption": "Delete",
                               "managedDisk": {"storageAccountType": "StandardSSD_LRS"}}
    if disk_gb:
        os_disk["diskSizeGB"] = disk_gb
    ip_configuration: dict[str, Any] = {"name": "ipconfig", "properties": {
        "subnet": {"id": subnet},
        "publicIPAddressConfiguration": {"name": f"{name}-ip", "sku": {"name": "Standard"},
                                         "properties": {"deleteOption": "Delete",
                                                        "publicIPAllocationMethod": "Static"}},
    }}
    if application_security_group is not None:  # what the node's security group admits peers by
        ip_configuration["properties"]["applicationSecurityGroups"] = [{"id": application_security_group}]
    nic: dict[str, Any] = {"primary": True, "deleteOption": "Delete", "ipConfigurations": [ip_configuration]}
    if security_group is not None:
        nic["networkSecurityGroup"] = {"id": security_group}
    properties: dict[str, Any] = {
        "hardwareProfile": {"vmSize": size},
        "storageProfile": {"imageReference": reference, "osDisk": os_disk},
        "osProfile": {
            "computerName": name, "adminUsername": ADMIN_USER,
            "linuxConfiguration": {"disablePasswordAuthentication": True, "ssh": {"publicKeys": [
                {"path": f"/home/{ADMIN_USER}/.ssh/authorized_keys", "keyData": ssh_key}]}},
        },
        "networkProfile": {"networkApiVersion": "2022-11-01", "networkInterfaceConfigurations": [
            {"name": f"{name}-nic", "properties": nic}]},
        "diagnosticsProfile": {"bootDiagnostics": {"enabled": True}},
    }
    if script is not None:
        properties["osProfile"]["customData"] = base64.b64encode(script.encode())  # the connection encodes bytes
    if spot:
        properties.update(priority="Spot", evictionPolicy="Delete", billingProfile={"maxPrice": -1})
    return {"location": region, "tags": tags, "properties": properties}


def stock_image(image: str, size: str) -> str:
    """The configured image (publisher:offer:sku:version) for `size`: an Arm size boots Canonical's
    Arm build of it, the SKU named `-arm64` in place of `-gen2` (ubuntu-24_04-lts:server-arm64,
    0001-com-ubuntu-server-jammy:22_04-lts-arm64; Arm VMs are Gen2 only)."""
    publisher, offer, sku, version = image.split(":")
    if size_architecture(size) == "arm64" and not sku.endswith("arm64"):
        return f"{publisher}:{offer}:{sku.removesuffix('-gen2')}-arm64:{version}"
    return image
