"""Azure's VM sizes in a region, as the Resource SKUs API lists them for this subscription (runs
in the driver's pool).

Resource SKUs (learn.microsoft.com/rest/api/compute/resource-skus/list) gives each size's
capabilities (vCPUs, MemoryGB, GPUs, CpuArchitectureType) and its restrictions: a size marked
NotAvailableForSubscription for the region can't be created there by this subscription, so it is
left out. The API names no GPU model, so it is read from the size's name as Azure's size pages
spell it (learn.microsoft.com/azure/virtual-machines/sizes/gpu-accelerated/): NC…as_T4_v3 (T4),
NC…ads_A100_v4 (A100 80 GB), ND96asr_v4 (A100 40 GB), ND96amsr_A100_v4 (A100 80 GB),
ND96isr_H100_v5 (H100 80 GB). Prices come from Azure's Retail Prices API, else libcloud's bundled
Linux prices, else burla's offline estimate.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from burla.drivers.catalog import MachineType
from burla.drivers.machine_catalog import libcloud_prices, priced

log = logging.getLogger(__name__)

SKUS_API = "2021-07-01"
PRICES_ENDPOINT = "https://prices.azure.com"
MAX_PRICE_PAGES = 200  # a region lists a few thousand VM meters, 1,000 per page
MAX_PAGES = 50
GPU_BY_NAME = ((re.compile(r"_T4_"), "T4"), (re.compile(r"_A100_"), "A100_80G"), (re.compile(r"^Standard_ND\d+asr_v4$"),
               "A100_40G"), (re.compile(r"_H100_v5$"), "H100_80G"), (re.compile(r"_A10_"), "A10"),
               (re.compile(r"^Standard_NC\d+s_v3$"), "V100"))


def retail_prices(endpoint: str, region: str) -> dict[str, float]:
    """On-demand Linux prices per size in a region (USD per hour), from the Azure Retail Prices API:
    public, no sign-in, pages joined by NextPageLink
    (learn.microsoft.com/rest/api/cost-management/retail-prices/azure-retail-prices). Windows
    (its product name says so), Spot and Low Priority meters are left out."""
    query = urllib.parse.urlencode({"$filter": f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' "
                                               "and priceType eq 'Consumption'"})
    url: str | None = f"{endpoint}/api/retail/prices?{query}"
    prices: dict[str, float] = {}
    for _ in range(MAX_PRICE_PAGES):
        if not url:
            break
        with urllib.request.urlopen(url, timeout=30) as answer:
            page = json.loads(answer.read())
        for item in page.get("Items", []):
            sku, name = item.get("armSkuName") or "", item.get("skuName") or ""
            if (not sku or "Windows" in (item.get("productName") or "") or "Spot" in name or "Low Priority" in name
                    or item.get("unitOfMeasure") != "1 Hour"):
                continue
            price = float(item.get("retailPrice") or 0)
            if price > 0:
                prices[sku] = min(price, prices.get(sku, price))
        url = page.get("NextPageLink")
    return prices


def list_machines(driver: Any, subscription_id: str, region: str, prices_endpoint: str) -> list[MachineType]:
    try:
        retail = retail_prices(prices_endpoint, region)
    except (OSError, ValueError) as e:  # the prices are an estimate: libcloud's, or the offline table's
        if isinstance(e, urllib.error.HTTPError):
            e.close()  # it holds the refused response's connection
        log.warning("could not read Azure's retail prices for %s: %s", region, e)
        retail = {}
    prices = libcloud_prices("azure_linux")
    machines: list[MachineType] = []
    for sku in vm_skus(driver, subscription_id, region):
        machine = _machine(sku, region, prices)
        listed_price = retail.get(machine.name)
        machines.append(dataclasses.replace(machine, usd_per_hour=listed_price) if listed_price else machine)
    return priced(machines, "azure")


def vm_skus(driver: Any, subscription_id: str, region: str) -> list[dict[str, Any]]:
    """The VM sizes Resource SKUs lists for the region that this subscription may use."""
    found: list[dict[str, Any]] = []
    path = f"/subscriptions/{subscription_id}/providers/Microsoft.Compute/skus"
    params = {"api-version": SKUS_API, "$filter": f"location eq '{region}'"}
    for _ in range(MAX_PAGES):
        page = driver.connection.request(path, params=params).object
        found += [sku for sku in page.get("value", [])
                  if sku.get("resourceType") == "virtualMachines" and not _restricted(sku, region)]
        next_link = page.get("nextLink")
        if not next_link:
            break
        link = urllib.parse.urlsplit(next_link)  # on the same host, with its own query (a skip token)
        path, params = link.path, dict(urllib.parse.parse_qsl(link.query))
    return found


def _restricted(sku: dict[str, Any], region: str) -> bool:
    return any(r.get("type") == "Location" and r.get("reasonCode") == "NotAvailableForSubscription"
               and region.lower() in [v.lower() for v in r.get("values", [])] for r in sku.get("restrictions", []))


def sku_vcpus(sku: dict[str, Any]) -> int:
    return int(next((c.get("value") for c in sku.get("capabilities", []) if c.get("name") == "vCPUs"), None) or 0)


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
