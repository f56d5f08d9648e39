"""The part of the Compute Engine v1 API that burla's GCE driver uses, answered from recorded
responses (`tests/fixtures/gce/`) with instance state kept like the real API, plus Google's OAuth
token endpoint for service-account keys whose `token_uri` points here."""

from __future__ import annotations

import base64
import itertools
import json
import re

from aiohttp import web

from tests.fake_cloud_api import JSON_BODY, FakeCloudApi, json_response

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


# The machine series this stand-in's zones offer; another name is not found, as in a zone that
# does not have it (the API's 404 for machineTypes/NAME).
MACHINE_SERIES = ("e2", "n1", "n2", "n2d", "t2d", "n4", "c4", "c3", "a2", "a3", "g2")
# A new project's regional CPU quota ("CPUS"; cloud.google.com/compute/resource-usage, "CPU
# quota"): vCPUs of the project's VMs in one region. Past it, insert answers 403 quotaExceeded with
# the API's wording.
DEFAULT_CPUS_QUOTA = 24


def vcpus_of(machine_type: str) -> int:
    """vCPUs of a predefined machine type by its name (n4-standard-8: 8; a2-highgpu-1g: 12 per GPU)."""
    last = machine_type.rsplit("-", 1)[-1]
    if last.endswith("g") and last[:-1].isdigit():
        return 12 * int(last[:-1])
    return int(last) if last.isdigit() else 2


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


class FakeGce(FakeCloudApi):
    fixture_dir = "gce"

    def __init__(self) -> None:
        self.instances: dict[tuple[str, str, str], dict] = {}  # (project, zone, name) -> instance
        self.operations: dict[str, dict] = {}
        self.firewalls: dict[tuple[str, str], dict] = {}
        self.tokens_issued: list[str] = []
        self.token_assertions: list[dict] = []
        self.refuse_tokens = False
        self.cpus_quota = DEFAULT_CPUS_QUOTA  # per region
        self.exhausted: set[tuple[str, str]] = set()  # (machine type, zone) the zone has no capacity for
        self.project_metadata: dict[str, str] = {}  # e.g. {"enable-oslogin": "TRUE"}, as an organisation sets
        self._ids = itertools.count(4_861_000_000_000_000_001)
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
        return json_response({"access_token": token, "expires_in": 3599, "token_type": "Bearer"})

    # --- the compute API ------------------------------------------------------------------

    @web.middleware
    async def _authorize(self, request: web.Request, handler) -> web.StreamResponse:
        if request.path.startswith("/compute/"):
            bearer = request.headers.get("Authorization", "").removeprefix("Bearer ")
            if bearer not in self.tokens_issued:
                return _error(401, "authError", "Request had invalid authentication credentials.")
        return await handler(request)

    def routes(self, app: web.Application) -> None:
        app.middlewares.append(self._authorize)
        p = PREFIX
        app.router.add_post("/token", self.token)
        app.router.add_get(p + "/regions/{region}", self.region)
        app.router.add_get(p + "/zones", self.zones)
        app.router.add_get(p + "/zones/{zone}", self.zone)
        app.router.add_get(p + "/zones/{zone}/machineTypes/{name}", self.machine_type)
        app.router.add_get(p + "/zones/{zone}/diskTypes/{name}", self.disk_type)
        app.router.add_get(p + "/zones/{zone}/acceleratorTypes/{name}", self.zonal("accelerator_type"))
        app.router.add_get(p + "/global/networks/{name}", self.network)
        app.router.add_get(p + "/global/images/family/{family}", self.image_family)
        app.router.add_post(p + "/zones/{zone}/instances", self.insert)
        app.router.add_get(p + "/zones/{zone}/instances/{name}", self.get_instance)
        app.router.add_delete(p + "/zones/{zone}/instances/{name}", self.delete_instance)
        app.router.add_get(p + "/zones/{zone}/instances/{name}/serialPort", self.serial_port)
        app.router.add_get(p + "/zones/{zone}/disks/{name}", self.disk)
        app.router.add_get(p + "/zones/{zone}/operations/{op}", self.operation)
        app.router.add_get(p + "/aggregated/instances", self.aggregated_instances)
        app.router.add_post(p + "/global/firewalls", self.insert_firewall)
        app.router.add_get(p + "/global/firewalls/{name}", self.get_firewall)
        app.router.add_get(p + "/global/operations/{op}", self.operation)

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

    async def machine_type(self, request: web.Request) -> web.Response:
        m = request.match_info
        if m["name"].split("-", 1)[0] not in MACHINE_SERIES:
            return _error(404, "notFound", f"The resource 'projects/{m['project']}/zones/{m['zone']}/machineTypes/"
                                           f"{m['name']}' was not found")
        return json_response(self.fixture("machine_type", project=m["project"], zone=m["zone"], name=m["name"]))

    async def disk_type(self, request: web.Request) -> web.Response:
        m = request.match_info
        if m["name"] not in DISK_TYPES:
            return _error(404, "notFound", f"The resource 'projects/{m['project']}/zones/{m['zone']}/diskTypes/"
                                           f"{m['name']}' was not found")
        return json_response(self.fixture("disk_type", project=m["project"], zone=m["zone"], name=m["name"]))

    async def network(self, request: web.Request) -> web.Response:
        m = request.match_info
        return json_response(self.fixture("network", project=m["project"], name=m["name"]))

    async def image_family(self, request: web.Request) -> web.Response:
        m = request.match_info
        if m["family"] not in ("debian-12", "ubuntu-2204-lts"):
            return _error(404, "notFound", f"The resource 'projects/{m['project']}/global/images/family/"
                                           f"{m['family']}' was not found")
        return json_response(self.fixture("image", image_project=m["project"], family=m["family"]))

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
                                source_ranges=body.get("sourceRanges", []), target_tags=body.get("targetTags", []),
                                allowed=body.get("allowed", []))
        self.firewalls[(project, body["name"])] = firewall
        op_name = f"operation-{next(self._ids)}"
        op = self.fixture("global_operation", project=project, name=body["name"], op_id=str(next(self._ids)),
                          op_name=op_name, op_type="insert", target_id=firewall["id"])
        self.operations[op_name] = op
        return json_response(op)

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
        instance = self.fixture(
            "instance", project=m["project"], zone=m["zone"], region=self._region_of(m["zone"]), name=body["name"],
            instance_id=str(next(self._ids)), machine_type=body["machineType"].rsplit("/", 1)[-1], status="RUNNING",
            internal_ip=f"10.128.0.{len(self.instances) + 2}", external_ip=f"34.10.0.{len(self.instances) + 2}",
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
