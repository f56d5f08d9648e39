"""The part of the Compute Engine v1 API that burla's GCE driver uses, answered from recorded
responses (`tests/support/clouds/fixtures/gce/`) with instance state kept like the real API, plus Google's OAuth
token endpoint for service-account keys whose `token_uri` points here."""

from __future__ import annotations

import base64
import itertools
import json
import re

from aiohttp import web

from tests.support.clouds.fake_cloud_api import JSON_BODY, FakeCloudApi, json_response
from tests.support.clouds.fake_gce_billing import BillingCatalog

PREFIX = "/compute/v1/projects/{project}"
LABEL_FILTER = re.compile(r"^labels\.([\w-]+)\s*=\s*\"?([\w-]+)\"?$")
ZONES = ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "us-east1-b", "us-east1-c",
         "us-east1-d", "europe-west4-a", "europe-west4-b")
BOOT_LOG = "Booting Linux on physical CPU 0x0\ngoogle_metadata_script_runner: startup-script: python3 -m venv\n"


# Boot disk types per machine series, as Compute Engine enforces them (cloud.google.com/compute/
# docs/disks "Disk types", its "Machine series support" table, and each series' page under
# compute/docs/general-purpose-machines): the fourth-generation series (N4, N4A, N4D, C4, C4A, C4D)
# and X4 boot from Hyperdisk Balanced only; E2, N1, N2, N2D, T2D and A2 from Persistent Disk only. The
# refusal is the API's own wording: "[pd-balanced, n4-standard-4] features are not compatible for
# creating instance."
DISK_TYPES = ("pd-standard", "pd-balanced", "pd-ssd", "pd-extreme", "hyperdisk-balanced", "hyperdisk-extreme",
              "hyperdisk-throughput")
HYPERDISK_ONLY_SERIES = ("n4", "n4a", "n4d", "c4", "c4a", "c4d", "x4")
PERSISTENT_DISK_ONLY_SERIES = ("e2", "n1", "n2", "n2d", "t2d", "a2")


# The predefined machine types this stand-in's zones offer, as machineTypes.get/list describe them
# (cloud.google.com/compute/docs/general-purpose-machines, .../compute-optimized-machines and
# .../accelerator-optimized-machines): vCPUs, memory and the GPUs built into A2, A3 and G2 types.
# A name not listed is not found, as in a zone that does not have it (the API's 404 for
# machineTypes/NAME). Accelerator-optimised series are offered only in some zones
# (cloud.google.com/compute/docs/gpus/gpu-regions-zones): SERIES_ZONES says which.
def _sizes(series: str, kind: str, sizes: tuple[int, ...], gb_per_vcpu: float, arch: str = "X86_64"
           ) -> dict[str, dict]:
    return {f"{series}-{kind}-{n}": {"guestCpus": n, "memoryMb": int(n * gb_per_vcpu * 1024), "architecture": arch}
            for n in sizes}


def _gpu_sizes(series: str, kind: str, accelerator: str, per_gpu_vcpus: int, per_gpu_gb: int) -> dict[str, dict]:
    return {f"{series}-{kind}-{n}g": {"guestCpus": per_gpu_vcpus * n, "memoryMb": per_gpu_gb * n * 1024,
                                      "architecture": "X86_64",
                                      "accelerators": [{"guestAcceleratorType": accelerator,
                                                        "guestAcceleratorCount": n}]}
            for n in (1, 2, 4, 8)}


MACHINE_TYPES: dict[str, dict] = {
    **_sizes("e2", "standard", (2, 4, 8, 16, 32), 4), **_sizes("n1", "standard", (1, 2, 4, 8, 16, 32, 64, 96), 3.75),
    **_sizes("n2", "standard", (2, 4, 8, 16, 32, 48, 64, 80, 96, 128), 4),
    **_sizes("n2d", "standard", (2, 4, 8, 16, 32, 48, 64, 80, 96, 128, 224), 4),
    **_sizes("n4", "standard", (2, 4, 8, 16, 32, 48, 64, 80), 4),
    **_sizes("c4", "standard", (2, 4, 8, 16, 32, 48, 96, 144, 192), 3.75),
    **_sizes("c3", "standard", (4, 8, 22, 44, 88, 176), 4),  # C3 starts at 4 vCPUs
    **_sizes("c4a", "standard", (1, 2, 4, 8, 16, 32, 48, 64, 72), 4, arch="ARM64"),
    **_gpu_sizes("a2", "highgpu", "nvidia-tesla-a100", 12, 85),
    **_gpu_sizes("a2", "ultragpu", "nvidia-a100-80gb", 12, 170),
    "a3-highgpu-8g": {"guestCpus": 208, "memoryMb": 1872 * 1024, "architecture": "X86_64",
                      "accelerators": [{"guestAcceleratorType": "nvidia-h100-80gb", "guestAcceleratorCount": 8}]},
    **{f"g2-standard-{n}": {"guestCpus": n, "memoryMb": 4 * n * 1024, "architecture": "X86_64",
                            "accelerators": [{"guestAcceleratorType": "nvidia-l4", "guestAcceleratorCount": gpus}]}
       for n, gpus in ((4, 1), (8, 1), (12, 1), (16, 1), (24, 2), (32, 1), (48, 4), (96, 8))},
}
SERIES_ZONES = {"a2": ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "us-east1-b",
                       "europe-west4-a", "europe-west4-b"),
                "a3": ("us-central1-a", "us-central1-c", "europe-west4-b"),
                "g2": ("us-central1-a", "us-central1-b", "us-central1-c", "us-east1-b", "us-east1-c",
                       "europe-west4-a"),
                "c4a": ("us-central1-a", "us-central1-b", "us-central1-c", "europe-west4-a", "europe-west4-b")}
# A new project's regional CPU quota ("CPUS"; cloud.google.com/compute/resource-usage, "CPU
# quota"): vCPUs of the project's VMs in one region. Past it, insert answers 403 quotaExceeded with
# the API's wording.
DEFAULT_CPUS_QUOTA = 24


def vcpus_of(machine_type: str) -> int:
    return MACHINE_TYPES[machine_type]["guestCpus"]


def boot_disk_fits(machine_type: str, disk_type: str) -> bool:
    series = machine_type.split("-", 1)[0]
    if series in HYPERDISK_ONLY_SERIES:
        return disk_type == "hyperdisk-balanced"
    if series in PERSISTENT_DISK_ONLY_SERIES:
        return disk_type.startswith("pd-")
    return True


def _error(status: int, reason: str, message: str) -> web.Response:
    return json_response({"error": {"code": status, "message": message,
                                    "errors": [{"message": message, "domain": "global", "reason": reason}]}}, status)


class FakeGce(BillingCatalog, FakeCloudApi):
    fixture_dir = "gce"

    def __init__(self) -> None:
        self.instances: dict[tuple[str, str, str], dict] = {}  # (project, zone, name) -> instance
        # (project, zone, name) -> the hostkeys/ guest attributes its guest agent wrote: [(key type, base64)]
        self.guest_attributes: dict[tuple[str, str, str], list[tuple[str, str]]] = {}
        self.operations: dict[str, dict] = {}
        self.firewalls: dict[tuple[str, str], dict] = {}
        self.tokens_issued: list[str] = []
        self.token_lifetime_s = 3599  # as Google's token endpoint answers (expires_in)
        self.expired_tokens: set[str] = set()  # refused from now on, as once their hour is up
        self.token_assertions: list[dict] = []
        self.refuse_tokens = False
        self.cpus_quota = DEFAULT_CPUS_QUOTA  # per region
        self.exhausted: set[tuple[str, str]] = set()  # (machine type, zone) the zone has no capacity for
        self.project_metadata: dict[str, str] = {}  # e.g. {"enable-oslogin": "TRUE"}, as an organisation sets
        self.withdrawn: set[tuple[str, str]] = set()  # (machine type, zone) a zone does not offer
        self.machine_listings: list[str] = []  # zones whose machineTypes were listed
        self.page_size = 500
        self.denied_permissions: set[str] = set()  # IAM permissions the caller lacks in the project
        self.images: dict[tuple[str, str], dict] = {}  # (project, name) -> an image the project made
        # Told (instance id, image name) as images.insert copies an instance's disk: the stand-in VM
        # farm copies that VM's disk then.
        self.image_made: list = []
        self._ids = itertools.count(4_861_000_000_000_000_001)
        # Each VM's addresses are its own: a deleted VM's are not handed out again while a test runs
        # (a stand-in still answering at a reused address would be dialled for the new VM).
        self._addresses = itertools.count(2)
        self._init_billing()
        super().__init__()

    # --- OAuth ----------------------------------------------------------------------------

    async def token(self, request: web.Request) -> web.Response:
        form = dict(await request.post())
        if self.refuse_tokens:
            return json_response({"error": "invalid_grant", "error_description": "Invalid JWT Signature."}, 400)
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            return json_response({"error": "unsupported_grant_type"}, 400)
        claims_part = form["assertion"].split(".")[1]
        self.token_assertions.append(json.loads(base64.urlsafe_b64decode(claims_part + "=" * (-len(claims_part) % 4))))
        token = f"ya29.fake-{len(self.tokens_issued) + 1}"
        self.tokens_issued.append(token)
        return json_response({"access_token": token, "expires_in": self.token_lifetime_s, "token_type": "Bearer"})

    # --- the compute API ------------------------------------------------------------------

    @web.middleware
    async def _authorize(self, request: web.Request, handler) -> web.StreamResponse:
        if request.path.startswith(("/compute/", "/v1/projects/", "/v1/services/")):
            bearer = request.headers.get("Authorization", "").removeprefix("Bearer ")
            if bearer not in self.tokens_issued or bearer in self.expired_tokens:
                return _error(401, "authError", "Request had invalid authentication credentials.")
        return await handler(request)

    def routes(self, app: web.Application) -> None:
        app.middlewares.append(self._authorize)
        p = PREFIX
        app.router.add_post("/token", self.token)
        app.router.add_get(p + "/regions/{region}", self.region)
        app.router.add_get(p + "/zones", self.zones)
        app.router.add_get(p + "/zones/{zone}", self.zone)
        app.router.add_get(p + "/zones/{zone}/machineTypes", self.machine_types)
        app.router.add_get(p + "/zones/{zone}/machineTypes/{name}", self.machine_type)
        app.router.add_get(p + "/zones/{zone}/diskTypes/{name}", self.disk_type)
        app.router.add_get(p + "/zones/{zone}/acceleratorTypes/{name}", self.zonal("accelerator_type"))
        app.router.add_get(p + "/global/networks/{name}", self.network)
        app.router.add_get(p + "/global/images/family/{family}", self.image_family)
        app.router.add_post(p + "/zones/{zone}/instances", self.insert)
        app.router.add_get(p + "/zones/{zone}/instances/{name}", self.get_instance)
        app.router.add_delete(p + "/zones/{zone}/instances/{name}", self.delete_instance)
        app.router.add_get(p + "/zones/{zone}/instances/{name}/serialPort", self.serial_port)
        app.router.add_get(p + "/zones/{zone}/instances/{name}/getGuestAttributes", self.guest_attributes_of)
        app.router.add_get(p + "/zones/{zone}/disks/{name}", self.disk)
        app.router.add_get(p + "/zones/{zone}/operations/{op}", self.operation)
        app.router.add_get(p + "/aggregated/instances", self.aggregated_instances)
        app.router.add_post("/v1/projects/{target}", self.test_iam_permissions)
        app.router.add_post(p + "/global/images", self.insert_image)
        app.router.add_get(p + "/global/images", self.list_images)
        app.router.add_get(p + "/global/images/{name}", self.get_image)
        app.router.add_delete(p + "/global/images/{name}", self.delete_image)
        app.router.add_post(p + "/global/firewalls", self.insert_firewall)
        app.router.add_get(p + "/global/firewalls/{name}", self.get_firewall)
        app.router.add_get(p + "/global/operations/{op}", self.operation)
        self.billing_routes(app)

    @staticmethod
    def _region_of(zone: str) -> str:
        return zone.rsplit("-", 1)[0]

    async def region(self, request: web.Request) -> web.Response:
        """The region with its CPUS quota: the limit the inserts enforce, and what they used."""
        m = request.match_info
        region = self.fixture("region", project=m["project"], region=m["region"])
        used = sum(vcpus_of(i["machineType"].rsplit("/", 1)[-1]) for (project, zone, _), i in self.instances.items()
                   if project == m["project"] and self._region_of(zone) == m["region"])
        region["quotas"] = [{"metric": "CPUS", "limit": float(self.cpus_quota), "usage": float(used)}]
        return json_response(region)

    async def zones(self, request: web.Request) -> web.Response:
        project = request.match_info["project"]
        items = [self.fixture("zone", project=project, zone=zone, region=self._region_of(zone)) for zone in ZONES]
        return json_response({"kind": "compute#zoneList", "id": f"projects/{project}/zones", "items": items,
                              "selfLink": f"https://www.googleapis.com/compute/v1/projects/{project}/zones"})

    async def zone(self, request: web.Request) -> web.Response:
        m = request.match_info
        return json_response(self.fixture("zone", project=m["project"], zone=m["zone"],
                                          region=self._region_of(m["zone"])))

    def zonal(self, fixture: str):
        async def handler(request: web.Request) -> web.Response:
            m = request.match_info
            return json_response(self.fixture(fixture, project=m["project"], zone=m["zone"], name=m["name"]))
        return handler

    def _offered(self, zone: str, name: str) -> bool:
        series = name.split("-", 1)[0]
        return (name in MACHINE_TYPES and zone in SERIES_ZONES.get(series, (zone,))
                and (name, zone) not in self.withdrawn)

    def _machine_type(self, project: str, zone: str, name: str) -> dict:
        return {**self.fixture("machine_type", project=project, zone=zone, name=name), **MACHINE_TYPES[name]}

    async def machine_type(self, request: web.Request) -> web.Response:
        m = request.match_info
        if not self._offered(m["zone"], m["name"]):
            return _error(404, "notFound", f"The resource 'projects/{m['project']}/zones/{m['zone']}/machineTypes/"
                                           f"{m['name']}' was not found")
        return json_response(self._machine_type(m["project"], m["zone"], m["name"]))

    async def machine_types(self, request: web.Request) -> web.Response:
        """machineTypes.list: pages of at most maxResults (500, the API's largest) with a nextPageToken."""
        m = request.match_info
        self.machine_listings.append(m["zone"])
        names = [name for name in MACHINE_TYPES if self._offered(m["zone"], name)]
        size = min(int(request.query.get("maxResults", "500")), 500, self.page_size)
        start = int(request.query.get("pageToken") or 0)
        page: dict = {"kind": "compute#machineTypeList",
                      "items": [self._machine_type(m["project"], m["zone"], n) for n in names[start:start + size]]}
        if start + size < len(names):
            page["nextPageToken"] = str(start + size)
        return json_response(page)

    async def disk_type(self, request: web.Request) -> web.Response:
        m = request.match_info
        if m["name"] not in DISK_TYPES:
            return _error(404, "notFound", f"The resource 'projects/{m['project']}/zones/{m['zone']}/diskTypes/"
                                           f"{m['name']}' was not found")
        return json_response(self.fixture("disk_type", project=m["project"], zone=m["zone"], name=m["name"]))

    async def network(self, request: web.Request) -> web.Response:
        m = request.match_info
        return json_response(self.fixture("network", project=m["project"], name=m["name"]))

    # --- images made from disks (cloud.google.com/compute/docs/reference/rest/v1/images) -----------

    async def insert_image(self, request: web.Request) -> web.Response:
        """images.insert from a zonal disk. A name is [a-z]([-a-z0-9]*[a-z0-9])?, at most 63 long;
        label values lowercase letters, digits, - and _. The disk of a running instance needs
        forceCreate=true. The image is PENDING while the disk is copied, then READY."""
        project, body = request.match_info["project"], request[JSON_BODY]
        name = body.get("name", "")
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
            return _error(400, "invalid", f"Invalid value for field 'resource.name': '{name}'. Must be a match of "
                                          "regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?|[1-9][0-9]{0,19})'")
        bad = [v for v in body.get("labels", {}).values() if not re.fullmatch(r"[a-z0-9_-]{0,63}", v)]
        if bad:
            return _error(400, "invalid", f"Invalid value for field 'resource.labels': '{bad[0]}'.")
        match = re.search(r"zones/([\w-]+)/disks/([\w-]+)$", body.get("sourceDisk", ""))
        instance = self.instances.get((project, match.group(1), match.group(2))) if match else None
        if instance is None:
            return _error(404, "notFound", f"The resource '{body.get('sourceDisk')}' was not found")
        if instance["status"] == "RUNNING" and request.query.get("forceCreate") != "true":
            return _error(400, "resourceInUseByAnotherResource", f"The disk resource '{body['sourceDisk']}' is "
                                                                  "already being used by an instance")
        if (project, name) in self.images:
            return _error(409, "alreadyExists", f"The resource 'projects/{project}/global/images/{name}' already "
                                                "exists")
        image = {**self.fixture("image", image_project=project, family=name), "name": name, "family": None,
                 "labels": body.get("labels", {}), "sourceDisk": body["sourceDisk"], "status": "PENDING",
                 "architecture": self._image_architecture(instance["sourceImage"]),
                 "id": str(next(self._ids)), "creationTimestamp": f"2026-12-03T10:{len(self.images):02d}:00.000-08:00",
                 "selfLink": f"https://www.googleapis.com/compute/v1/projects/{project}/global/images/{name}"}
        self.images[(project, name)] = image
        try:
            for told in list(self.image_made):
                told(instance["id"], name)
        finally:
            image["status"] = "READY"
        op_name = f"operation-{next(self._ids)}"
        op = self.fixture("global_operation", project=project, name=name, op_id=str(next(self._ids)),
                          op_name=op_name, op_type="insert", target_id=image["id"])
        self.operations[op_name] = op
        return json_response(op)

    async def list_images(self, request: web.Request) -> web.Response:
        """images.list with a `labels.KEY:*` (has the label) or `labels.KEY = "VALUE"` filter."""
        project, wanted = request.match_info["project"], request.query.get("filter", "")
        has = re.fullmatch(r"labels\.([\w-]+):\*", wanted)
        equals = re.fullmatch(r'labels\.([\w-]+)\s*=\s*"?([\w-]+)"?', wanted)
        items = [image for (owner, _), image in self.images.items() if owner == project
                 and (not wanted or (has and has.group(1) in image["labels"])
                      or (equals and image["labels"].get(equals.group(1)) == equals.group(2)))]
        return json_response({"kind": "compute#imageList", "items": items} if items else {"kind": "compute#imageList"})

    async def get_image(self, request: web.Request) -> web.Response:
        m = request.match_info
        image = self.images.get((m["project"], m["name"]))
        if image is None:
            return _error(404, "notFound", f"The resource 'projects/{m['project']}/global/images/{m['name']}' was "
                                           "not found")
        return json_response(image)

    async def delete_image(self, request: web.Request) -> web.Response:
        m = request.match_info
        image = self.images.pop((m["project"], m["name"]), None)
        if image is None:
            return _error(404, "notFound", f"The resource 'projects/{m['project']}/global/images/{m['name']}' was "
                                           "not found")
        op_name = f"operation-{next(self._ids)}"
        op = self.fixture("global_operation", project=m["project"], name=m["name"], op_id=str(next(self._ids)),
                          op_name=op_name, op_type="delete", target_id=image["id"])
        self.operations[op_name] = op
        return json_response(op)

    async def test_iam_permissions(self, request: web.Request) -> web.Response:
        """Cloud Resource Manager's projects.testIamPermissions: the asked permissions the caller
        holds (all but `denied_permissions`); an empty answer is `{}`, as the API gives it."""
        project, _, method = request.match_info["target"].partition(":")
        if method != "testIamPermissions":
            return _error(404, "notFound", f"no method {method!r}")
        asked = request[JSON_BODY].get("permissions", [])
        held = [permission for permission in asked if permission not in self.denied_permissions]
        return json_response({"permissions": held} if held else {})

    def gpus_of(self, instance: dict) -> tuple[str, ...]:
        """The GPUs a VM has, as nvidia-smi names them: its machine type's own, or those attached."""
        machine = MACHINE_TYPES.get(instance["machineType"].rsplit("/", 1)[-1], {})
        attached = [{"guestAcceleratorType": a["acceleratorType"].rsplit("/", 1)[-1],
                     "guestAcceleratorCount": a.get("acceleratorCount", 1)}
                    for a in instance.get("guestAccelerators", [])]
        names = {"nvidia-tesla-t4": "Tesla T4", "nvidia-l4": "NVIDIA L4", "nvidia-tesla-a100": "NVIDIA A100-SXM4-40GB",
                 "nvidia-a100-80gb": "NVIDIA A100-SXM4-80GB", "nvidia-h100-80gb": "NVIDIA H100 80GB HBM3"}
        return tuple(names.get(a["guestAcceleratorType"], a["guestAcceleratorType"])
                     for a in machine.get("accelerators", []) + attached for _ in range(a["guestAcceleratorCount"]))

    def _image_architecture(self, source_image: str) -> str:
        baked = next((i for i in self.images.values() if i["selfLink"] == source_image), None)
        if baked is not None:
            return baked["architecture"]
        return "ARM64" if "-arm64-" in source_image else "X86_64"

    async def image_family(self, request: web.Request) -> web.Response:
        """Public families, x86 and Arm: Debian and Ubuntu publish each release twice, the Arm one
        under `FAMILY-arm64` (cloud.google.com/compute/docs/images/os-details)."""
        m = request.match_info
        dlvm = m["project"] == "deeplearning-platform-release" and m["family"] == "common-cu128-ubuntu-2204-nvidia-570"
        if m["family"].removesuffix("-arm64") not in ("debian-12", "ubuntu-2204-lts") and not dlvm:
            return _error(404, "notFound", f"The resource 'projects/{m['project']}/global/images/family/"
                                           f"{m['family']}' was not found")
        image = self.fixture("image", image_project=m["project"], family=m["family"])
        return json_response({**image, "architecture": "ARM64" if m["family"].endswith("-arm64") else "X86_64"})

    def _operation(self, project: str, zone: str, name: str, kind: str, instance_id: str) -> dict:
        op_name = f"operation-{next(self._ids)}"
        op = self.fixture("operation", project=project, zone=zone, name=name, op_id=str(next(self._ids)),
                          op_name=op_name, op_type=kind, instance_id=instance_id, status="RUNNING", progress=0)
        self.operations[op_name] = op
        return op

    async def operation(self, request: web.Request) -> web.Response:
        op = self.operations.get(request.match_info["op"])
        if op is None:
            return _error(404, "notFound", "operation not found")
        op.update(status="DONE", progress=100, endTime="2026-11-29T10:00:05.000-08:00")
        return json_response(op)

    async def insert_firewall(self, request: web.Request) -> web.Response:
        project, body = request.match_info["project"], request[JSON_BODY]
        if (project, body["name"]) in self.firewalls:
            return _error(409, "alreadyExists", f"The resource 'projects/{project}/global/firewalls/{body['name']}' "
                                                "already exists")
        firewall = self.fixture("firewall", project=project, name=body["name"], firewall_id=str(next(self._ids)),
                                description=body.get("description") or "", network=body["network"],
                                # An ingress rule with no source admits every address (0.0.0.0/0):
                                # cloud.google.com/firewall/docs/firewalls#sources_for_rules
                                source_ranges=body.get("sourceRanges") or ([] if body.get("sourceTags") else
                                                                           ["0.0.0.0/0"]),
                                source_tags=body.get("sourceTags", []), target_tags=body.get("targetTags", []),
                                allowed=body.get("allowed", []))
        self.firewalls[(project, body["name"])] = firewall
        op_name = f"operation-{next(self._ids)}"
        op = self.fixture("global_operation", project=project, name=body["name"], op_id=str(next(self._ids)),
                          op_name=op_name, op_type="insert", target_id=firewall["id"])
        self.operations[op_name] = op
        return json_response(op)

    def admits(self, target_name: str, port: int, source: str) -> bool:
        """Whether VPC firewall rules let a TCP connection to `port` of instance `target_name` in from
        instance `source` (by name) or "internet": ingress is denied unless a rule allows it; a rule
        applies to instances with one of its target tags (or to all), and admits sources in its
        source ranges, or instances of the same network carrying one of its source tags
        (cloud.google.com/firewall/docs/firewalls#sources_for_rules)."""
        target = next(i for i in self.instances.values() if i["name"] == target_name)
        origin = next((i for i in self.instances.values() if i["name"] == source), None)

        def tags(instance: dict | None) -> set[str]:
            return set((instance or {}).get("tags", {}).get("items", []))

        def network(instance: dict) -> str:
            return instance["networkInterfaces"][0].get("network", "").rsplit("/", 1)[-1]

        for rule in self.firewalls.values():
            targets = set(rule.get("targetTags", []))
            if targets and not targets & tags(target):
                continue
            if not any(a.get("IPProtocol") in ("tcp", "all") and _port_in(port, a.get("ports")) for a in
                       rule.get("allowed", [])):
                continue
            if "0.0.0.0/0" in rule.get("sourceRanges", []):
                return True
            if origin is not None and network(origin) == network(target) and set(rule.get("sourceTags", [])) & tags(
                    origin):
                return True
        return False

    async def get_firewall(self, request: web.Request) -> web.Response:
        m = request.match_info
        firewall = self.firewalls.get((m["project"], m["name"]))
        if firewall is None:
            return _error(404, "notFound", f"The resource 'projects/{m['project']}/global/firewalls/{m['name']}' "
                                           "was not found")
        return json_response(firewall)

    async def insert(self, request: web.Request) -> web.Response:
        m, body = request.match_info, request[JSON_BODY]
        key = (m["project"], m["zone"], body.get("name", ""))
        if key in self.instances:
            return _error(409, "alreadyExists", f"The resource 'projects/{key[0]}/zones/{key[1]}/instances/"
                                                f"{key[2]}' already exists")
        boot = body["disks"][0]["initializeParams"]
        machine_type = body["machineType"].rsplit("/", 1)[-1]
        disk_type = boot.get("diskType", "pd-standard").rsplit("/", 1)[-1]  # the API's default boot disk
        if not self._offered(m["zone"], machine_type):
            return _error(400, "invalid", f"Invalid value for field 'resource.machineType': 'zones/{m['zone']}/"
                                          f"machineTypes/{machine_type}'. Machine type with name '{machine_type}' "
                                          f"does not exist in zone '{m['zone']}'.")
        image_arch, machine_arch = self._image_architecture(boot["sourceImage"]), MACHINE_TYPES[machine_type][
            "architecture"]
        if image_arch != machine_arch:
            # Arm machine types boot Arm images only, x86 ones x86 images (an image states its
            # `architecture`). https://cloud.google.com/compute/docs/instances/arm-on-compute
            return _error(400, "badRequest", f"Invalid resource usage: 'The machine type {machine_type} has "
                                             f"architecture {machine_arch}, which is not compatible with the image "
                                             f"architecture {image_arch}.'")
        if not boot_disk_fits(machine_type, disk_type):
            return _error(400, "badRequest", f"[{disk_type}, {machine_type}] features are not compatible for "
                                             "creating instance.")
        region = self._region_of(m["zone"])
        used = sum(vcpus_of(i["machineType"].rsplit("/", 1)[-1]) for (project, zone, _), i in self.instances.items()
                   if project == m["project"] and self._region_of(zone) == region)
        if used + vcpus_of(machine_type) > self.cpus_quota:
            return _error(403, "quotaExceeded", f"Quota 'CPUS' exceeded.  Limit: {self.cpus_quota:.1f} in region "
                                                f"{region}.")
        if (machine_type, m["zone"]) in self.exhausted:
            # Accepted, then the operation ends in error: a zone out of a resource is told
            # asynchronously. https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-resource-availability
            op = self._operation(m["project"], m["zone"], body["name"], "insert", "0")
            op["error"] = {"errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": (
                f"The zone 'projects/{m['project']}/zones/{m['zone']}' does not have enough resources available to "
                "fulfill the request.  Try a different zone, or try again later.")}]}
            op.update(httpErrorStatusCode=503, httpErrorMessage="SERVICE UNAVAILABLE")
            return json_response(op)
        host = next(self._addresses)
        instance = self.fixture(
            "instance", project=m["project"], zone=m["zone"], region=self._region_of(m["zone"]), name=body["name"],
            instance_id=str(next(self._ids)), machine_type=body["machineType"].rsplit("/", 1)[-1], status="RUNNING",
            internal_ip=f"10.128.0.{host}", external_ip=f"34.10.0.{host}",
            size_gb=str(boot.get("diskSizeGb") or 10),
        )
        for copied in ("labels", "scheduling", "guestAccelerators", "tags", "serviceAccounts"):
            if copied in body:
                instance[copied] = body[copied]
        if "tags" in body:
            instance["tags"] = {**body["tags"], "fingerprint": "6smc4R4d39I="}
        instance["metadata"] = {"kind": "compute#metadata", "fingerprint": "5CvkSjLsr9E=",
                                "items": body.get("metadata", {}).get("items", [])}
        instance["sourceImage"] = boot["sourceImage"]
        self.instances[key] = instance
        return json_response(self._operation(m["project"], m["zone"], body["name"], "insert", instance["id"]))

    def _instance_or_404(self, request: web.Request) -> dict | web.Response:
        m = request.match_info
        instance = self.instances.get((m["project"], m["zone"], m["name"]))
        if instance is None:
            return _error(404, "notFound", f"The resource 'projects/{m['project']}/zones/{m['zone']}/instances/"
                                           f"{m['name']}' was not found")
        return instance

    async def get_instance(self, request: web.Request) -> web.Response:
        found = self._instance_or_404(request)
        return found if isinstance(found, web.Response) else json_response(found)

    async def delete_instance(self, request: web.Request) -> web.Response:
        found = self._instance_or_404(request)
        if isinstance(found, web.Response):
            return found
        m = request.match_info
        del self.instances[(m["project"], m["zone"], m["name"])]
        return json_response(self._operation(m["project"], m["zone"], m["name"], "delete", found["id"]))

    async def guest_attributes_of(self, request: web.Request) -> web.Response:
        """instances.getGuestAttributes: what the guest wrote under `queryPath`, once it has
        (cloud.google.com/compute/docs/reference/rest/v1/instances/getGuestAttributes); none is
        written unless the metadata says `enable-guest-attributes: TRUE`
        (cloud.google.com/compute/docs/metadata/manage-guest-attributes)."""
        found = self._instance_or_404(request)
        if isinstance(found, web.Response):
            return found
        m = request.match_info
        path = request.query.get("queryPath", "")
        written = self.guest_attributes.get((m["project"], m["zone"], m["name"]), [])
        items = [{"namespace": "hostkeys", "key": key, "value": value} for key, value in written
                 if path == "hostkeys/"]
        if not items:
            return _error(404, "notFound", f"The resource '{path}' of type 'Guest Attribute' was not found.")
        return json_response({"kind": "compute#guestAttributes", "queryPath": path,
                              "selfLink": str(request.url), "queryValue": {"items": items}})

    @staticmethod
    def guest_attributes_enabled(instance: dict) -> bool:
        return any(item.get("key") == "enable-guest-attributes" and str(item.get("value")).upper() == "TRUE"
                   for item in instance.get("metadata", {}).get("items", []))

    async def serial_port(self, request: web.Request) -> web.Response:
        found = self._instance_or_404(request)
        if isinstance(found, web.Response):
            return found
        m = request.match_info
        return json_response(self.fixture("serial_port", project=m["project"], zone=m["zone"], name=m["name"],
                                          contents=BOOT_LOG, length=str(len(BOOT_LOG))))

    async def disk(self, request: web.Request) -> web.Response:
        m = request.match_info
        instance = self.instances.get((m["project"], m["zone"], m["name"]))
        if instance is None:
            return _error(404, "notFound", f"The resource 'projects/{m['project']}/zones/{m['zone']}/disks/"
                                           f"{m['name']}' was not found")
        return json_response(self.fixture("disk", project=m["project"], zone=m["zone"], name=m["name"],
                                          disk_id=str(next(self._ids)), size_gb=instance["disks"][0]["diskSizeGb"],
                                          source_image=instance["sourceImage"]))

    async def aggregated_instances(self, request: web.Request) -> web.Response:
        project = request.match_info["project"]
        wanted = None
        if "filter" in request.query:
            match = LABEL_FILTER.match(request.query["filter"].strip())
            if match is None:
                return _error(400, "invalid", f"Invalid value for field 'filter': '{request.query['filter']}'.")
            wanted = match.groups()
        items: dict[str, dict] = {}
        for (proj, zone, _), instance in self.instances.items():
            if proj != project or (wanted and instance.get("labels", {}).get(wanted[0]) != wanted[1]):
                continue
            items.setdefault(f"zones/{zone}", {"instances": []})["instances"].append(instance)
        link = f"https://www.googleapis.com/compute/v1/projects/{project}/aggregated/instances"
        return json_response({"kind": "compute#instanceAggregatedList", "items": items, "selfLink": link,
                              "id": f"projects/{project}/aggregated/instances"})


def _port_in(port: int, ports: list[str] | None) -> bool:
    """Whether a firewall rule's ports ("22", "0-65535"; none: every port) include `port`."""
    if not ports:
        return True
    for entry in ports:
        low, _, high = entry.partition("-")
        if int(low) <= port <= int(high or low):
            return True
    return False
