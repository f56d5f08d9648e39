"""Baked images on Compute Engine: images of the node runtime made from a builder VM's boot disk
(see burla.drivers.bake), labelled with the key they serve (each call here is blocking: run it
in the driver's pool).

images.insert copies a disk; the disk of a running VM needs `forceCreate` (the builder synced it
after the scrub). The image is usable once its status is READY, and FAILED is final. Image
names are `[a-z]([-a-z0-9]*[a-z0-9])?` of at most 63 characters and label values lowercase
letters, digits, `-` and `_` (cloud.google.com/compute/docs/reference/rest/v1/images, and
cloud.google.com/compute/docs/labeling-resources). images.list filters on labels with
`labels.KEY:*` and `labels.KEY = "VALUE"`.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from burla.drivers.base import BakedImage
from burla.errors import CloudRefused

KEY_LABEL = "burla-image-key"
STATES = {"READY": "available", "PENDING": "pending", "FAILED": "failed", "DELETING": "deleting"}


def _baked(image: dict[str, Any]) -> BakedImage:
    return BakedImage(image["name"], image["name"], image.get("labels", {}).get(KEY_LABEL, ""),
                      image.get("creationTimestamp", ""), STATES.get(image.get("status", ""), image.get("status", "")))


def _listed(driver: Any, wanted: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    token = ""
    for _ in range(20):
        params = {"filter": wanted, **({"pageToken": token} if token else {})}
        page = driver.connection.request("/global/images", method="GET", params=params).object
        items += page.get("items", [])
        token = page.get("nextPageToken") or ""
        if not token:
            break
    return items


def list_baked(driver: Any) -> list[BakedImage]:
    return sorted((_baked(i) for i in _listed(driver, f"labels.{KEY_LABEL}:*")), key=lambda b: b.created, reverse=True)


def find_baked(driver: Any, key: str) -> str | None:
    """The name of the newest READY image baked for `key`, if there is one."""
    ready = [i for i in _listed(driver, f'labels.{KEY_LABEL} = "{key}"') if i.get("status") == "READY"]
    return max(ready, key=lambda image: image.get("creationTimestamp", ""))["name"] if ready else None


def start_image(driver: Any, instance: dict[str, Any], key: str) -> str:
    """Ask for an image of the builder's boot disk; returns its name (PENDING until READY)."""
    zone = instance["zone"].rsplit("/", 1)[-1]
    disk = instance["disks"][0]["source"].rsplit("/", 1)[-1]
    name = f"burla-node-{int(time.time())}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    driver.connection.request("/global/images", method="POST", params={"forceCreate": "true"}, data={
        "name": name, "sourceDisk": f"zones/{zone}/disks/{disk}", "labels": {KEY_LABEL: key},
        "description": "burla node runtime (baked by a burla head; `burla cloud images`)"})
    return name


def image_state(driver: Any, name: str) -> BakedImage:
    from libcloud.common.google import ResourceNotFoundError

    try:
        return _baked(driver.connection.request(f"/global/images/{name}", method="GET").object)
    except ResourceNotFoundError:
        raise CloudRefused(f"gce: the image {name} being baked is gone") from None


def delete_baked(driver: Any, name: str) -> bool:
    from libcloud.common.google import ResourceNotFoundError

    try:
        image = driver.connection.request(f"/global/images/{name}", method="GET").object
    except ResourceNotFoundError:
        return False
    if KEY_LABEL not in image.get("labels", {}):
        return False
    driver.connection.request(f"/global/images/{name}", method="DELETE")
    return True
