"""Compute Engine's machine types in a region, as machineTypes.list tells them for each of its
zones (runs in the driver's pool).

machineTypes.list pages at `maxResults` (500 at most) with a nextPageToken; each machine type
carries guestCpus, memoryMb, its architecture and, for accelerator-optimised series (A2, A3, G2),
the GPUs built into it (cloud.google.com/compute/docs/reference/rest/v1/machineTypes). A type
listed by any zone of the region is kept; deprecated ones are not. Prices come from the Cloud
Billing Catalog's rates (`burla.drivers.gcp.prices`), else libcloud's bundled per-vCPU and per-GB
rates for the series where it has them (no GPU prices there).
"""

from __future__ import annotations

from typing import Any

from burla.drivers.catalog import MachineType, model_of_reported
from burla.drivers.gcp.prices import GceRates
from burla.drivers.machine_catalog import libcloud_prices, priced

MAX_PAGES = 50  # a guard against a page token that never ends


def list_machines(driver: Any, region: str, zones: list[str], catalog: GceRates | None = None) -> list[MachineType]:
    rates = libcloud_prices("gce_instances")
    found: dict[str, MachineType] = {}
    for zone in zones:
        token = ""
        for _ in range(MAX_PAGES):
            params = {"maxResults": "500", **({"pageToken": token} if token else {})}
            page = driver.connection.request(f"/zones/{zone}/machineTypes", method="GET", params=params).object
            for listed in page.get("items", []):
                if listed.get("deprecated", {}).get("state") or listed["name"] in found:
                    continue
                found[listed["name"]] = _machine(listed, region, rates, catalog)
            token = page.get("nextPageToken") or ""
            if not token:
                break
    return priced(found.values(), "gcp")


def _machine(listed: dict[str, Any], region: str, rates: dict[str, Any], catalog: GceRates | None) -> MachineType:
    vcpus = int(listed.get("guestCpus", 0))
    memory_gb = int(listed.get("memoryMb", 0)) / 1024
    accelerators = listed.get("accelerators") or []
    gpu = model_of_reported(accelerators[0]["guestAcceleratorType"]) if accelerators else None
    gpu_count = sum(int(a.get("guestAcceleratorCount", 0)) for a in accelerators)
    series = listed["name"].split("-", 1)[0]
    usd = catalog.price(series, vcpus, memory_gb, gpu, gpu_count) if catalog is not None else None
    if usd is None and gpu is None:
        usd = _price(series, vcpus, memory_gb, region, rates)
    return MachineType(name=listed["name"], vcpus=vcpus, memory_gb=memory_gb, gpu=gpu, gpu_count=gpu_count,
                       usd_per_hour=usd, arch="arm64" if listed.get("architecture") == "ARM64" else "x86_64")


def _price(series: str, vcpus: int, memory_gb: float, region: str, rates: dict[str, Any]) -> float | None:
    try:
        cpu = rates[series]["cpu"]["on_demand"][region]["price"]
        ram = rates[series]["ram"]["on_demand"][region]["price"]
    except KeyError:
        return None
    return round(vcpus * cpu + memory_gb * ram, 4) if cpu and ram else None
