"""Compute Engine's on-demand prices in a region, from the Cloud Billing Catalog API (blocking:
run it in the driver's pool).

`GET /v1/services/6F81-5844-456A/skus` lists Compute Engine's SKUs, 5,000 to a page joined by
`nextPageToken` (cloud.google.com/billing/docs/reference/rest/v1/services.skus/list). A machine's
price is not a SKU of its own: it is its series' per-vCPU and per-GiB rates ("N4 Instance Core
running in Americas", "N4 Instance Ram running in Americas"; N1's say "Predefined Instance") plus
its built-in GPUs' ("Nvidia Tesla A100 GPU running in Americas") for A2, A3 and G2
(cloud.google.com/compute/vm-instance-pricing). Only SKUs of `usageType` OnDemand whose
`serviceRegions` hold the region count; Spot, commitments, custom and sole-tenant SKUs don't.
Each tier's `unitPrice` is `units` + `nanos` / 1e9 USD per hour (per GiB-hour for RAM).

The catalog's descriptions are how a SKU names its series and GPU; one that doesn't read as
either is passed over, and a machine with no rate read here keeps libcloud's price or the offline
estimate (`burla.drivers.machine_catalog.priced`).
"""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from burla.drivers.catalog import model_of_reported

BILLING = "https://cloudbilling.googleapis.com"  # CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDBILLING overrides it
SERVICE = "6F81-5844-456A"  # Compute Engine in the Cloud Billing Catalog
PAGE_SIZE = 5000
MAX_PAGES = 40
TIMEOUT_S = 60.0
_SERIES_RATE = re.compile(  # "N4 Instance Core", "N1 Predefined Instance Ram", "N2D AMD Instance Core", "T2A Arm ..."
    r"^(?P<series>[A-Z][A-Z0-9]*) (?:Predefined )?(?:AMD |Arm |Intel )?Instance (?P<part>Core|Ram) running in ")
_GPU_RATE = re.compile(r"^Nvidia (?P<model>.+?) GPU running in ")
_NOT_STANDARD = ("Custom", "Sole Tenancy", "Extended", "Spot", "Preemptible", "Commitment", "DWS", "Reserved")
# GPU SKUs of machine series burla's catalog does not boot, whose model names would read as another's
# ("Nvidia H100 80GB Mega GPU" is A3 Mega's: A3 High's H100s are "Nvidia H100 80GB GPU")
_OTHER_GPU_SERIES = ("Mega", "Plus")


@dataclass
class GceRates:
    """Per series, USD per vCPU-hour and per GiB-hour; per GPU model, USD per GPU-hour."""

    cpu: dict[str, float] = field(default_factory=dict)
    ram: dict[str, float] = field(default_factory=dict)
    gpu: dict[str, float] = field(default_factory=dict)

    def price(self, series: str, vcpus: int, memory_gb: float, gpu: str | None, gpu_count: int) -> float | None:
        cpu, ram = self.cpu.get(series), self.ram.get(series)
        if cpu is None or ram is None:
            return None
        total = vcpus * cpu + memory_gb * ram
        if gpu is not None:
            per_gpu = self.gpu.get(gpu)
            if per_gpu is None:
                return None
            total += gpu_count * per_gpu
        return round(total, 4)


def _usd(sku: dict[str, Any]) -> float | None:
    try:
        rate = sku["pricingInfo"][0]["pricingExpression"]["tieredRates"][-1]["unitPrice"]
    except (KeyError, IndexError):
        return None
    return int(rate.get("units") or 0) + int(rate.get("nanos") or 0) / 1e9


def read_rates(skus: list[dict[str, Any]], region: str) -> GceRates:
    rates = GceRates()
    for sku in skus:
        category = sku.get("category", {})
        description = sku.get("description", "")
        if (category.get("usageType") != "OnDemand" or region not in sku.get("serviceRegions", [])
                or any(word in description for word in _NOT_STANDARD)):
            continue
        usd = _usd(sku)
        if usd is None:
            continue
        series_rate = _SERIES_RATE.match(description)
        gpu_rate = _GPU_RATE.match(description)
        if category.get("resourceFamily") != "Compute":
            continue
        if series_rate:
            table = rates.cpu if series_rate.group("part") == "Core" else rates.ram
            table[series_rate.group("series").lower()] = usd
        elif gpu_rate and not any(word in gpu_rate.group("model").split() for word in _OTHER_GPU_SERIES):
            rates.gpu[model_of_reported(gpu_rate.group("model"))] = usd
    return rates


def catalog_rates(access_token: str, region: str, endpoint: str | None = None,
                  quota_project: str | None = None) -> GceRates:
    """The region's rates, read page by page (raises OSError, ValueError or http.client's
    HTTPException: the caller falls back). `quota_project` is the credentials' own (an ADC file's
    `quota_project_id`), sent as Google's client libraries send it: user credentials need one to
    call some APIs (cloud.google.com/docs/quotas/set-quota-project)."""
    headers = {"Authorization": f"Bearer {access_token}", **({"x-goog-user-project": quota_project}
                                                             if quota_project else {})}
    base = (endpoint or BILLING).rstrip("/")
    skus: list[dict[str, Any]] = []
    token = ""
    for _ in range(MAX_PAGES):
        query = urllib.parse.urlencode({"currencyCode": "USD", "pageSize": PAGE_SIZE,
                                        **({"pageToken": token} if token else {})})
        request = urllib.request.Request(f"{base}/v1/services/{SERVICE}/skus?{query}",
                                         headers=headers)
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
            page = json.loads(answer.read() or b"{}")
        skus += page.get("skus", [])
        token = page.get("nextPageToken") or ""
        if not token:
            break
    return read_rates(skus, region)
