"""Azure's VM sizes in a region, as the Resource SKUs API lists them for this subscription (runs
in the driver's pool).

Resource SKUs (learn.microsoft.com/rest/api/compute/resource-skus/list) gives each size's
capabilities (vCPUs, MemoryGB, GPUs, CpuArchitectureType) and its restrictions: a size marked
NotAvailableForSubscription for the region can't be created there by this subscription, so it is
left out. The API names no GPU model, so it is read from the size's name as Azure's size pages
spell it (learn.microsoft.com/azure/virtual-machines/sizes/gpu-accelerated/): NC…as_T4_v3 (T4),
NC…ads_A100_v4 (A100 80 GB), ND96asr_v4 (A100 40 GB), ND96amsr_A100_v4 (A100 80 GB),
ND96isr_H100_v5 (H100 80 GB). Prices are libcloud's bundled Linux prices where it has them.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

from burla.drivers.catalog import MachineType
from burla.drivers.machine_catalog import libcloud_prices, priced

SKUS_API = "2021-07-01"
MAX_PAGES = 50
GPU_BY_NAME = ((re.compile(r"_T4_"), "T4"), (re.compile(r"_A100_"), "A100_80G"), (re.compile(r"^Standard_ND\d+asr_v4$"),
               "A100_40G"), (re.compile(r"_H100_v5$"), "H100_80G"), (re.compile(r"_A10_"), "A10"),
               (re.compile(r"^Standard_NC\d+s_v3$"), "V100"))


def list_machines(driver: Any, subscription_id: str, region: str) -> list[MachineType]:
    prices = libcloud_prices("azure_linux")
    machines: list[MachineType] = []
    path = f"/subscriptions/{subscription_id}/providers/Microsoft.Compute/skus"
    params = {"api-version": SKUS_API, "$filter": f"location eq '{region}'"}
    for _ in range(MAX_PAGES):
        page = driver.connection.request(path, params=params).object
        for sku in page.get("value", []):
            if sku.get("resourceType") == "virtualMachines" and not _restricted(sku, region):
                machines.append(_machine(sku, region, prices))
        next_link = page.get("nextLink")
        if not next_link:
            break
        link = urllib.parse.urlsplit(next_link)  # on the same host, with its own query (a skip token)
        path, params = link.path, dict(urllib.parse.parse_qsl(link.query))
    return priced(machines, "azure")


def _restricted(sku: dict[str, Any], region: str) -> bool:
    return any(r.get("type") == "Location" and r.get("reasonCode") == "NotAvailableForSubscription"
               and region.lower() in [v.lower() for v in r.get("values", [])] for r in sku.get("restrictions", []))


def _machine(sku: dict[str, Any], region: str, prices: dict[str, Any]) -> MachineType:
    capabilities = {c.get("name"): c.get("value") for c in sku.get("capabilities", [])}
    name = sku["name"]
    gpu_count = int(float(capabilities.get("GPUs") or 0))
    gpu = next((model for pattern, model in GPU_BY_NAME if pattern.search(name)), "UNKNOWN") if gpu_count else None
    price = prices.get(re.sub(r"[^a-z0-9]", "", name.lower()), {}).get(region) or None
    return MachineType(
        name=name, vcpus=int(capabilities.get("vCPUs") or 0), memory_gb=float(capabilities.get("MemoryGB") or 0),
        gpu=gpu, gpu_count=gpu_count, usd_per_hour=float(price) if price else None,
        arch="arm64" if capabilities.get("CpuArchitectureType") == "Arm64" else "x86_64",
    )
