"""Baked images on Azure: managed images of the node runtime made from a builder VM (see
burla.drivers.bake), tagged with the key they serve and kept in one resource group for every
cluster of the subscription (`burla-images`: like AMIs and GCE images, they hold no secret and
serve any cluster of the same build). Each call here is blocking: run it in the driver's pool.

Azure images a Linux VM in four steps (learn.microsoft.com/azure/virtual-machines/linux/capture-image-resource):
the guest is deprovisioned by its agent (`waagent -deprovision`, run over SSH by the builder's
preparation: host keys and the machine's identity go; the login user and its home, where the
runtime lives, stay), the VM is deallocated (generalizing a running VM is refused, "Operation
'generalize' is not allowed ... since the VM is running"), generalized (for good: a generalized VM
can't start again), and a managed image is made from it (Images - Create Or Update with
`sourceVirtualMachine`). An image is used in its own region only, and keeps the Hyper-V
generation of its source. Image names are 1-80 letters, digits, `_`, `.` and `-`
(learn.microsoft.com/azure/azure-resource-manager/management/resource-name-rules#microsoftcompute).
"""

from __future__ import annotations

import hashlib
import time
import urllib.parse
from typing import Any

from burla.drivers.azure.config import location_name
from burla.drivers.base import BakedImage
from burla.errors import CloudRefused

KEY_TAG = "burla-image-key"
IMAGE_API = "2024-07-01"
STATES = {"Succeeded": "available", "Creating": "pending", "Updating": "pending", "Failed": "failed",
          "Deleting": "deleting"}
DEALLOCATE_WAIT_S = 600.0
POLL_S = 3.0
# The deprovision the builder's guest agent runs before its disk is imaged; the login user stays
# (its home holds the runtime), so VMs of the image are made with that same admin user.
PREPARE = "as_root waagent -deprovision -force"


def _baked(image: dict[str, Any]) -> BakedImage:
    properties = image.get("properties", {})
    state = properties.get("provisioningState", "")
    return BakedImage(image["name"], image["name"], (image.get("tags") or {}).get(KEY_TAG, ""),
                      (image.get("tags") or {}).get("burla-created", ""), STATES.get(state, state.lower()),
                      location_name(image.get("location", "")))


def image_id(group_path: str, name: str) -> str:
    """The resource id of the image `name` in the resource group at `group_path`."""
    return f"{group_path}/providers/Microsoft.Compute/images/{name}"


def _images(driver: Any, group_path: str) -> list[dict[str, Any]]:
    from libcloud.common.exceptions import BaseHTTPError

    path, params = f"{group_path}/providers/Microsoft.Compute/images", {"api-version": IMAGE_API}
    items: list[dict[str, Any]] = []
    for _ in range(20):
        try:
            page = driver.connection.request(path, params=params).object
        except BaseHTTPError as e:
            if e.code == 404:  # no resource group yet: nothing baked
                return []
            raise
        items += [i for i in page.get("value", []) if KEY_TAG in (i.get("tags") or {})]
        if not page.get("nextLink"):
            break
        link = urllib.parse.urlsplit(page["nextLink"])  # on the same host, with its own query (a skip token)
        path, params = link.path, dict(urllib.parse.parse_qsl(link.query))
    return items


def list_baked(driver: Any, group_path: str) -> list[BakedImage]:
    return sorted((_baked(i) for i in _images(driver, group_path)), key=lambda b: b.created, reverse=True)


def find_baked(driver: Any, group_path: str, key: str, region: str) -> str | None:
    """The resource id of the newest image baked for `key` in `region`, if there is one."""
    ready = [i for i in _images(driver, group_path)
             if i["tags"][KEY_TAG] == key and location_name(i.get("location", "")) == region
             and i.get("properties", {}).get("provisioningState") == "Succeeded"]
    return max(ready, key=lambda image: image["tags"].get("burla-created", ""))["id"] if ready else None


def _power_state(driver: Any, vm_path: str, api: str) -> tuple[str | None, str | None]:
    view = driver.connection.request(f"{vm_path}/instanceView", params={"api-version": api}).object
    power = next((s["code"].split("/", 1)[1] for s in view.get("statuses", [])
                  if s.get("code", "").startswith("PowerState/")), None)
    return power, view.get("hyperVGeneration")


def start_image(driver: Any, vm_path: str, group_path: str, key: str, region: str) -> str:
    """Deallocate and generalize the (deprovisioned) builder at `vm_path`, then ask for an image of
    it in the resource group at `group_path`; returns the image's name (Creating until
    `image_state` says Succeeded)."""
    params = {"api-version": IMAGE_API}
    _, generation = _power_state(driver, vm_path, IMAGE_API)
    if generation not in ("V1", "V2"):  # an image must state its source's; a wrong one never boots
        raise CloudRefused(f"azure: the instance view of image builder {vm_path.rsplit('/', 1)[-1]} states no Hyper-V "
                           f"generation ({generation!r}), so its image's can't be told; nothing was imaged")
    driver.connection.request(f"{vm_path}/deallocate", params=params, method="POST")
    deadline = time.monotonic() + DEALLOCATE_WAIT_S
    while _power_state(driver, vm_path, IMAGE_API)[0] != "deallocated":
        if time.monotonic() > deadline:
            raise CloudRefused(f"azure: the image builder {vm_path.rsplit('/', 1)[-1]} was not deallocated within "
                               f"{DEALLOCATE_WAIT_S:.0f} s")
        time.sleep(POLL_S)
    driver.connection.request(f"{vm_path}/generalize", params=params, method="POST")
    name = f"burla-node-{int(time.time())}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    properties: dict[str, Any] = {"sourceVirtualMachine": {"id": vm_path}, "hyperVGeneration": generation}
    image_tags = {KEY_TAG: key, "burla-created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    driver.connection.request(image_id(group_path, name), params=params, method="PUT",
                              data={"location": region, "tags": image_tags, "properties": properties})
    return name


def image_state(driver: Any, group_path: str, name: str) -> BakedImage:
    from libcloud.common.exceptions import BaseHTTPError

    try:
        return _baked(driver.connection.request(image_id(group_path, name),
                                                params={"api-version": IMAGE_API}).object)
    except BaseHTTPError as e:
        if e.code == 404:
            raise CloudRefused(f"azure: the image {name} being baked is gone") from None
        raise


def delete_baked(driver: Any, group_path: str, name: str) -> bool:
    """A managed image keeps its own copy of the disk (no snapshot is left behind)."""
    from libcloud.common.exceptions import BaseHTTPError

    path, params = image_id(group_path, name), {"api-version": IMAGE_API}
    try:
        image = driver.connection.request(path, params=params).object
    except BaseHTTPError as e:
        if e.code == 404:
            return False
        raise
    if KEY_TAG not in (image.get("tags") or {}):
        return False
    driver.connection.request(path, params=params, method="DELETE")
    return True
