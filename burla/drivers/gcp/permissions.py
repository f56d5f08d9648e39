"""Which of the permissions booting needs the caller lacks in the project, as Cloud Resource
Manager's projects.testIamPermissions answers it (it returns the subset of the asked permissions
the caller holds: cloud.google.com/resource-manager/reference/rest/v1/projects/testIamPermissions).

The list is what burla's calls need (cloud.google.com/compute/docs/access/iam-permissions): make,
read, list and delete VMs with their disks, labels, tags and metadata on the network's subnet with
a public address; read serial output, zones, regions and machine types; make firewall rules.
"""

from __future__ import annotations

import json
import urllib.request

RESOURCE_MANAGER = "https://cloudresourcemanager.googleapis.com/"
REQUIRED = (
    "compute.instances.create", "compute.instances.delete", "compute.instances.get", "compute.instances.list",
    "compute.instances.setMetadata", "compute.instances.setLabels", "compute.instances.setTags",
    "compute.instances.getSerialPortOutput", "compute.disks.create", "compute.subnetworks.use",
    "compute.subnetworks.useExternalIp", "compute.machineTypes.list", "compute.regions.get", "compute.zones.get",
    "compute.zoneOperations.get", "compute.firewalls.create", "compute.firewalls.get",
)
ROLES_FIX = ("grant the account roles/compute.instanceAdmin.v1 and roles/compute.securityAdmin (for the "
             "firewall rules), or a role holding these permissions")
TIMEOUT_S = 30.0


def missing_permissions(project: str, access_token: str, endpoint: str | None = None) -> list[str]:
    """The required permissions the caller does not hold in `project` (blocking: run it in a pool)."""
    base = (endpoint or RESOURCE_MANAGER).rstrip("/")
    request = urllib.request.Request(
        f"{base}/v1/projects/{project}:testIamPermissions", method="POST",
        data=json.dumps({"permissions": list(REQUIRED)}).encode(),
        headers={"Authorization": f"Bearer {access_token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
        held = set(json.loads(answer.read() or b"{}").get("permissions", []))
    return [permission for permission in REQUIRED if permission not in held]
