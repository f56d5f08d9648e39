"""How many more vCPUs of a machine type this AWS account may start in the region: EC2 caps the
vCPUs of running instances per bucket of instance families (on-demand and spot apart); Service
Quotas reports each cap, and the running instances tell what is in use.
https://docs.aws.amazon.com/ec2/latest/instancetypes/ec2-instance-quotas.html
"""

from __future__ import annotations

import re
from typing import Any

from burla.drivers.aws.images import instance_type
from burla.drivers.base import QuotaRoom

# bucket -> (quota code, quota name), from the page above.
ON_DEMAND = {
    "standard": ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
    "f": ("L-74FC7D96", "Running On-Demand F instances"),
    "g": ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    "inf": ("L-1945791B", "Running On-Demand Inf instances"),
    "p": ("L-417A185B", "Running On-Demand P instances"),
    "x": ("L-7295265B", "Running On-Demand X instances"),
    "dl": ("L-6E869C2A", "Running On-Demand DL instances"),
    "trn": ("L-2C3B7624", "Running On-Demand Trn instances"),
}
SPOT = {
    "standard": ("L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"),
    "g": ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    "p": ("L-7212CCBC", "All P Spot Instance Requests"),
}
_NAMED_BUCKETS = {"inf": "inf", "trn": "trn", "dl": "dl", "vt": "g"}


def bucket_of(machine_type: str) -> str | None:
    """The quota bucket of an instance type (m7i.large -> standard, g4dn.xlarge -> g); None if none."""
    letters = re.match(r"[a-z]+", machine_type)
    if letters is None:
        return None
    prefix = letters.group(0)
    if prefix in _NAMED_BUCKETS:
        return _NAMED_BUCKETS[prefix]
    if prefix[0] in "acdhimrtz":
        return "standard"
    return prefix[0] if prefix[0] in "fgpx" else None


def quota_room(driver: Any, quotas: Any, region: str, machine_type: str, spot: bool) -> QuotaRoom | None:
    """The room left under the machine type's vCPU quota (None if it has no known quota).
    `quotas` is a botocore Service Quotas client."""
    bucket = bucket_of(machine_type)
    table = SPOT if spot else ON_DEMAND
    if bucket is None or bucket not in table:
        return None
    code, name = table[bucket]
    limit = int(quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
    used = 0
    for node in driver.list_nodes(ex_filters={"instance-state-name": ["pending", "running"]}):
        other = node.extra.get("instance_type") or ""
        if bucket_of(other) == bucket and (node.extra.get("instance_lifecycle") == "spot") == spot:
            used += instance_type(driver, region, other).vcpus
    how = (f"ask for more in the Service Quotas console, or run `aws service-quotas request-service-quota-increase "
           f"--service-code ec2 --quota-code {code} --desired-value <vCPUs> --region {region}`")
    return QuotaRoom(name=name, limit=limit, used=used, how_to_raise=how)
