"""Which actions booting needs the caller may not take, as Azure's permissions API tells the
caller's effective permissions at a scope (learn.microsoft.com/rest/api/authorization/permissions:
one entry per role the caller holds there, each with `actions` and `notActions`).

An action is allowed when an entry's actions match it and none of that entry's notActions do;
patterns use `*` as a wildcard and compare case-insensitively
(learn.microsoft.com/azure/role-based-access-control/role-definitions, "Actions", "NotActions").
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from typing import Any

PERMISSIONS_API = "2022-04-01"
REQUIRED = (
    "Microsoft.Compute/virtualMachines/read", "Microsoft.Compute/virtualMachines/write",
    "Microsoft.Compute/virtualMachines/delete", "Microsoft.Compute/virtualMachines/retrieveBootDiagnosticsData/action",
    "Microsoft.Network/virtualNetworks/read", "Microsoft.Network/virtualNetworks/write",
    "Microsoft.Network/virtualNetworks/subnets/join/action", "Microsoft.Network/networkSecurityGroups/write",
    "Microsoft.Network/networkSecurityGroups/join/action", "Microsoft.Network/publicIPAddresses/write",
    "Microsoft.Network/publicIPAddresses/join/action", "Microsoft.Network/networkInterfaces/write",
    "Microsoft.Network/networkInterfaces/join/action", "Microsoft.Network/applicationSecurityGroups/write",
    "Microsoft.Network/applicationSecurityGroups/joinIpConfiguration/action",
)
# Baking images of the node runtime (burla.drivers.azure.bake): on the builder VM, in the cluster's
# group, and on the images, in the images' group. Without them boots go on, installing each time.
BAKING_VM = ("Microsoft.Compute/virtualMachines/deallocate/action",
             "Microsoft.Compute/virtualMachines/generalize/action")
BAKING_IMAGES = ("Microsoft.Compute/images/read", "Microsoft.Compute/images/write", "Microsoft.Compute/images/delete")
BAKING_FIX = ("allow these actions (Contributor on the subscription has them) for faster second boots, or set "
              "BURLA_BAKE_IMAGES=0 to stop trying")
GROUP_WRITE = "Microsoft.Resources/subscriptions/resourceGroups/write"  # when the group is still to be made
FIX = ("assign the account the Contributor role (or Virtual Machine Contributor with Network Contributor) on the "
       "resource group or subscription, or a role allowing these actions")


def allowed(entries: Iterable[dict[str, Any]], action: str) -> bool:
    wanted = action.lower()

    def matches(patterns: Iterable[str]) -> bool:
        return any(fnmatch.fnmatchcase(wanted, pattern.lower()) for pattern in patterns)

    return any(matches(e.get("actions", [])) and not matches(e.get("notActions", [])) for e in entries)


def missing_actions(entries: list[dict[str, Any]], group_exists: bool,
                    needed: tuple[str, ...] = REQUIRED) -> list[str]:
    needed = needed if group_exists else (GROUP_WRITE, *needed)
    return [action for action in needed if not allowed(entries, action)]
