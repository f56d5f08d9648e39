"""EC2's machine types in a region, as DescribeInstanceTypes lists them (runs in the driver's pool).

DescribeInstanceTypes describes the types of the caller's region, at most 100 per page with a
NextToken for the rest (docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeInstanceTypes
.html). Only current-generation, virtualised types are kept: previous generations cost more per
vCPU, and bare-metal types boot in many minutes. Prices are libcloud's bundled on-demand Linux
prices for the region, where it has them.
"""

from __future__ import annotations

from typing import Any

from burla.drivers.catalog import MachineType, model_of_reported
from burla.drivers.machine_catalog import libcloud_prices, priced

PAGE_SIZE = 100  # DescribeInstanceTypes' largest page
MAX_PAGES = 100  # a guard against a NextToken that never ends


def list_machines(driver: Any, region: str) -> list[MachineType]:
    from libcloud.compute.drivers.ec2 import NAMESPACE
    from libcloud.utils.xml import findall, findtext

    prices = libcloud_prices("ec2_linux")
    machines: list[MachineType] = []
    token = ""
    for _ in range(MAX_PAGES):
        params = {"Action": "DescribeInstanceTypes", "MaxResults": str(PAGE_SIZE),
                  "Filter.1.Name": "current-generation", "Filter.1.Value.1": "true",
                  "Filter.2.Name": "bare-metal", "Filter.2.Value.1": "false"}
        if token:
            params["NextToken"] = token
        body = driver.connection.request(driver.path, params=params).object
        for item in findall(body, "instanceTypeSet/item", NAMESPACE):
            name = findtext(item, "instanceType", NAMESPACE) or ""
            # NVIDIA GPUs only (nodes find theirs with nvidia-smi); a fractional GPU counts as none
            gpus = [g for g in findall(item, "gpuInfo/gpus/item", NAMESPACE)
                    if findtext(g, "manufacturer", NAMESPACE) == "NVIDIA" and int(findtext(g, "count", NAMESPACE) or 0)]
            gpu = None
            if gpus:
                named = findtext(gpus[0], "name", NAMESPACE) or ""
                memory_gb = round(int(findtext(gpus[0], "memoryInfo/sizeInMiB", NAMESPACE) or 0) / 1024)
                gpu = model_of_reported(f"{named} {memory_gb}GB" if named in ("A100", "H100") else named)
            architectures = [e.text or "" for e in findall(item, "processorInfo/supportedArchitectures/item",
                                                           NAMESPACE)]
            price = prices.get(name, {}).get(region) or None  # libcloud writes 0.0 for "not known"
            machines.append(MachineType(
                name=name,
                vcpus=int(findtext(item, "vCpuInfo/defaultVCpus", NAMESPACE) or 0),
                memory_gb=int(findtext(item, "memoryInfo/sizeInMiB", NAMESPACE) or 0) / 1024,
                gpu=gpu,
                gpu_count=sum(int(findtext(g, "count", NAMESPACE) or 0) for g in gpus),
                usd_per_hour=float(price) if price else None,
                arch="arm64" if "arm64" in architectures else "x86_64",
            ))
        token = findtext(body, "nextToken", NAMESPACE) or ""
        if not token:
            break
    return priced(machines, "aws")
