"""The Cloud Billing Catalog's list of Compute Engine SKUs, as the Compute Engine stand-in
(`tests.support.clouds.fake_gce.FakeGce` mixes this in) serves it: per series an on-demand Core and Ram SKU per
billing region, GPU SKUs, and the SKUs a price reader must pass over (Spot, commitments, custom
and sole-tenant cores, network egress), in the shape services.skus.list answers
(cloud.google.com/billing/docs/reference/rest/v1/services.skus/list): `category`, `serviceRegions`,
`pricingInfo[].pricingExpression.tieredRates[].unitPrice` as `units` + `nanos`, pages joined by
`nextPageToken`. Prices are the stand-in's own, close to the public list prices.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tests.support.clouds.fake_cloud_api import json_response

SERVICE = "6F81-5844-456A"
# Billing regions as SKU descriptions name them, and the regions each covers.
BILLING_REGIONS = {"Americas": ("us-central1", "us-east1"), "Netherlands": ("europe-west4",)}
# USD per vCPU-hour and per GiB-hour, by series (N1's SKUs say "Predefined Instance", AMD series'
# "AMD Instance": "N2D AMD Instance Core running in Americas").
SERIES_RATES = {"E2": (0.021811, 0.002923), "N1": (0.031611, 0.004237), "N2": (0.031611, 0.004237),
                "N2D": (0.027502, 0.003686),
                "N4": (0.030294, 0.004070), "C4": (0.03465, 0.003938), "C4A": (0.03086, 0.003455),
                "A2": (0.031611, 0.004237), "A3": (0.03984, 0.00534), "G2": (0.024988, 0.002927)}
GPU_RATES = {"Tesla A100": 2.933908, "A100 80GB": 3.92808, "H100 80GB": 11.06125, "L4": 0.560706,
             "Tesla T4": 0.35, "H100 80GB Mega": 11.8}  # A3 Mega's H100s are billed apart from A3 High's


def _sku(description: str, regions: tuple[str, ...], usd: float, group: str, usage: str = "OnDemand",
         family: str = "Compute", unit: str = "h") -> dict[str, Any]:
    units, nanos = int(usd), round((usd - int(usd)) * 1e9)
    return {"name": f"services/{SERVICE}/skus/{abs(hash(description)) % 10**12:012d}", "description": description,
            "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": family, "resourceGroup": group,
                         "usageType": usage},
            "serviceRegions": list(regions),
            "pricingInfo": [{"pricingExpression": {"usageUnit": unit, "tieredRates": [
                {"startUsageAmount": 0, "unitPrice": {"currencyCode": "USD", "units": str(units), "nanos": nanos}}]}}]}


def compute_skus() -> list[dict[str, Any]]:
    skus = []
    for place, regions in BILLING_REGIONS.items():
        for series, (core, ram) in SERIES_RATES.items():
            kind = {"N1": "Predefined Instance", "N2D": "AMD Instance"}.get(series, "Instance")
            skus += [_sku(f"{series} {kind} Core running in {place}", regions, core, "CPU"),
                     _sku(f"{series} {kind} Ram running in {place}", regions, ram, "RAM", unit="GiBy.h"),
                     _sku(f"Spot Preemptible {series} Instance Core running in {place}", regions, core * 0.3, "CPU",
                          usage="Preemptible"),
                     _sku(f"Commitment v1: {series} Cpu in {place} for 1 Year", regions, core * 0.63, "CPU",
                          usage="Commit1Yr")]
        skus += [_sku(f"Nvidia {model} GPU running in {place}", regions, usd, "GPU")
                 for model, usd in GPU_RATES.items()]
        skus += [_sku(f"Custom Instance Core running in {place}", regions, 0.033174, "CPU"),
                 _sku(f"N2 Sole Tenancy Instance Core running in {place}", regions, 0.034773, "CPU"),
                 _sku(f"Network Internet Egress from {place} to Americas", regions, 0.12, "PremiumInternetEgress",
                      family="Network", unit="GiBy")]
    return skus


class BillingCatalog:
    """The route and its knobs: page size, and an API the project has not enabled (403)."""

    def _init_billing(self) -> None:
        self.sku_page_size = 5000
        self.billing_disabled = False  # the project has not enabled the Cloud Billing API
        self.sku_listings = 0  # pages served

    def billing_routes(self, app: web.Application) -> None:
        app.router.add_get(f"/v1/services/{SERVICE}/skus", self.list_skus)

    async def list_skus(self, request: web.Request) -> web.Response:
        if self.billing_disabled:
            return json_response({"error": {"code": 403, "status": "PERMISSION_DENIED", "message": (
                "Cloud Billing API has not been used in project 123456789 before or it is disabled. Enable it by "
                "visiting the API library, then retry.")}}, 403)
        if request.query.get("currencyCode", "USD") != "USD":
            return json_response({"error": {"code": 400, "message": "Only USD is served here."}}, 400)
        skus = compute_skus()
        size = min(int(request.query.get("pageSize", 5000)), self.sku_page_size)
        start = int(request.query.get("pageToken") or 0)
        self.sku_listings += 1
        page: dict[str, Any] = {"skus": skus[start:start + size]}
        if start + size < len(skus):
            page["nextPageToken"] = str(start + size)
        return json_response(page)
