"""Managed images in the Azure stand-in (`tests.support.clouds.fake_azure.FakeAzure` mixes this in): deallocating
and generalizing a VM, images made from it, VMs made from an image, with the refusals Azure gives.

- Generalizing a VM that is not deallocated is refused: "Operation 'generalize' is not allowed on VM
  '...' since the VM is running" (learn.microsoft.com/azure/virtual-machines/generalize); a
  generalized VM can't be started again.
- An image is made only from a generalized VM (learn.microsoft.com/azure/virtual-machines/
  capture-image-resource), keeps its source's Hyper-V generation (Images - Create Or Update,
  `hyperVGeneration`), is Creating, then Succeeded.
- A size boots images of its CPU's architecture only (Arm64 for `p` sizes).
- A VM made from a managed image must be in the image's region
  (learn.microsoft.com/azure/virtual-machines/capture-image-resource: "...in the same region").
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web

from tests.support.clouds.fake_cloud_api import JSON_BODY, json_response

GROUP = "/subscriptions/{subscription}/resourceGroups/{group}"
IMAGES = GROUP + "/providers/Microsoft.Compute/images"


def generation_of(reference: dict[str, Any], images: dict[tuple[str, str, str], dict]) -> str:
    """A VM's Hyper-V generation, from what it was made from: Ubuntu's `server` SKUs are generation
    2 and `*-gen1` SKUs generation 1 (learn.microsoft.com/azure/virtual-machines/generation-2); a
    managed image states its own."""
    if "id" in reference:
        image = next((i for i in images.values() if i["id"].lower() == reference["id"].lower()), None)
        return image["properties"].get("hyperVGeneration", "V1") if image else "V1"
    return "V1" if reference.get("sku", "").endswith("gen1") else "V2"


def architecture_of(reference: dict[str, Any], sources: dict[str, dict[str, Any]]) -> str:
    """What CPU an image is for: Canonical publishes Arm builds as `*-arm64` SKUs
    (learn.microsoft.com/azure/virtual-machines/linux/quick-create-cli, "Arm64"); a managed image
    is for its source VM's."""
    if "id" in reference:
        source = sources.get(reference["id"].lower())
        return architecture_of(source, sources) if source is not None else "x64"
    return "Arm64" if reference.get("sku", "").endswith("arm64") else "x64"


class ImageApi:
    """Routes and state for VM deallocation, generalization and managed images."""

    machines: dict[tuple[str, str, str], dict]
    power_states: dict[tuple[str, str, str], str]
    _error: Callable[..., web.Response]
    _group_or_404: Callable[[web.Request], web.Response | None]

    def _init_images(self) -> None:
        self.images: dict[tuple[str, str, str], dict] = {}
        self.generalized: set[tuple[str, str, str]] = set()
        self.image_sources: dict[str, dict[str, Any]] = {}  # image id (lowercase) -> its VM's imageReference
        # Told (VM id, image name) as an image is made from a VM's disk (the stand-in VMs copy it).
        self.image_made: list[Callable[[str, str], None]] = []

    def image_routes(self, app: web.Application) -> None:
        machine = GROUP + "/providers/Microsoft.Compute/virtualMachines/{name}"
        app.router.add_post(machine + "/deallocate", self.deallocate)
        app.router.add_post(machine + "/generalize", self.generalize)
        app.router.add_get(IMAGES, self.list_images)
        app.router.add_put(IMAGES + "/{name}", self.put_image)
        app.router.add_get(IMAGES + "/{name}", self.get_image)
        app.router.add_delete(IMAGES + "/{name}", self.delete_image)

    def _machine_key(self, request: web.Request) -> tuple[str, str, str]:
        m = request.match_info
        return m["subscription"], m["group"], m["name"]

    async def deallocate(self, request: web.Request) -> web.Response:
        key = self._machine_key(request)
        if key not in self.machines:
            return self._error(404, "ResourceNotFound", f"The Resource '{key[2]}' was not found.")
        self.power_states[key] = "deallocated"
        return web.Response(status=202, headers={"Azure-AsyncOperation": f"/operations/{uuid.uuid4()}"})

    async def generalize(self, request: web.Request) -> web.Response:
        key = self._machine_key(request)
        if key not in self.machines:
            return self._error(404, "ResourceNotFound", f"The Resource '{key[2]}' was not found.")
        if self.power_states.get(key) not in ("stopped", "deallocated"):
            return self._error(409, "OperationNotAllowed", f"Operation 'generalize' is not allowed on VM '{key[2]}' "
                                                           "since the VM is running. Please stop or deallocate it.")
        self.generalized.add(key)
        return web.Response(status=200)

    def image_reference_refusal(self, subscription: str, reference: dict[str, Any], location: str, size: str,
                                size_architecture: str) -> web.Response | None:
        """Why a VM of `size` can't be made from this image (None when it can)."""
        image_architecture = architecture_of(reference, self.image_sources)
        if image_architecture != size_architecture:
            # A size runs images of its CPU's architecture only (`p` sizes are Arm64).
            # https://learn.microsoft.com/azure/virtual-machines/sizes/general-purpose/dpsv5-series
            return self._error(400, "BadRequest", f"Cannot create a VM of size '{size}' because this VM size only "
                               f"supports a CPU Architecture of '{size_architecture}', but an image or disk with CPU "
                               f"Architecture '{image_architecture}' was given. Please check that the CPU "
                               "Architecture of the image or disk is compatible with that of the VM size.")
        if "id" not in reference:
            return None
        image = next((i for (sub, _, _), i in self.images.items()
                      if sub == subscription and i["id"].lower() == reference["id"].lower()), None)
        if image is None:
            return self._error(404, "NotFound", f"The Image '{reference['id']}' cannot be found.")
        if image["location"] != location:
            return self._error(400, "InvalidParameter", f"The image {reference['id']} is in region "
                                                        f"{image['location']}; a VM in {location} can't use it.")
        if image["properties"]["provisioningState"] != "Succeeded":
            return self._error(409, "ImageNotReady", f"The image {reference['id']} is still being created.")
        return None

    async def put_image(self, request: web.Request) -> web.Response:
        missing = self._group_or_404(request)
        if missing is not None:
            return missing
        m, body = request.match_info, request[JSON_BODY]
        source_id = body["properties"]["sourceVirtualMachine"]["id"]
        source_key = next((k for k, vm in self.machines.items() if vm["id"].lower() == source_id.lower()), None)
        if source_key is None:
            return self._error(404, "NotFound", f"The virtual machine '{source_id}' cannot be found.")
        if source_key not in self.generalized:
            return self._error(409, "OperationNotAllowed", f"The source virtual machine '{source_id}' must be "
                                                           "generalized to create an image.")
        source = self.machines[source_key]
        generation = generation_of(source["properties"]["storageProfile"]["imageReference"], self.images)
        asked = body["properties"].get("hyperVGeneration", generation)
        if asked != generation:
            return self._error(400, "InvalidParameter", f"The Hyper-V generation {asked} does not match the source "
                                                        f"virtual machine's ({generation}).")
        image = {"name": m["name"], "id": request.path, "type": "Microsoft.Compute/images",
                 "location": body["location"], "tags": body.get("tags", {}),
                 "properties": {"sourceVirtualMachine": {"id": source["id"]}, "hyperVGeneration": generation,
                                "storageProfile": {"osDisk": {"osType": "Linux", "osState": "Generalized"}},
                                "provisioningState": "Creating"}}
        self.images[(m["subscription"], m["group"], m["name"])] = image
        self.image_sources[image["id"].lower()] = source["properties"]["storageProfile"]["imageReference"]
        for told in list(self.image_made):
            told(source["properties"]["vmId"], m["name"])
        return json_response(image, 201)

    def _image_or_404(self, request: web.Request) -> dict | web.Response:
        m = request.match_info
        image = self.images.get((m["subscription"], m["group"], m["name"]))
        if image is None:
            return self._error(404, "ResourceNotFound", f"The Resource 'Microsoft.Compute/images/{m['name']}' under "
                                                        f"resource group '{m['group']}' was not found.")
        return image

    async def get_image(self, request: web.Request) -> web.Response:
        image = self._image_or_404(request)
        if isinstance(image, web.Response):
            return image
        image["properties"]["provisioningState"] = "Succeeded"  # made by the time it is asked again
        return json_response(image)

    async def list_images(self, request: web.Request) -> web.Response:
        missing = self._group_or_404(request)
        if missing is not None:
            return missing
        m = request.match_info
        return json_response({"value": [i for (sub, group, _), i in self.images.items()
                                        if (sub, group) == (m["subscription"], m["group"])]})

    async def delete_image(self, request: web.Request) -> web.Response:
        m = request.match_info
        if self.images.pop((m["subscription"], m["group"], m["name"]), None) is None:
            return web.Response(status=204)
        return web.Response(status=202, headers={"Location": f"/operations/{uuid.uuid4()}-{int(time.time())}"})
