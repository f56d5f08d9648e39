"""The GCE driver: nodes are VMs in the user's Google Cloud project, through apache-libcloud.

- Credentials are Google's application default credentials through google-auth (the gcloud
  `application-default login` file, `GOOGLE_APPLICATION_CREDENTIALS` service-account keys,
  workload identity, the metadata server on a GCE VM). libcloud's own OAuth is bypassed: it reads
  none of those and caches tokens in the home directory.
- The project comes from `GOOGLE_CLOUD_PROJECT` / `CLOUDSDK_CORE_PROJECT`, then gcloud's active
  configuration, then the credentials; unset, `CloudSetupError` says `gcloud config set project`.
- gcloud's `CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE` is honoured (private endpoints; the tests'
  recorded-API server on 127.0.0.1).
- Node VMs carry no startup script: their `ssh-keys` metadata authorises the cluster's SSH key
  for user `burla` (the guest agent creates it) and the head sets them up over SSH
  (`burla.drivers.ssh.driver`); the default network's `default-allow-ssh` and `default-allow-internal`
  rules let the head and the peers in. VMs are labelled with the cluster and node id and listed
  with a server-side label filter. Spot VMs use the SPOT provisioning model, deleted when
  preempted (see `_spot_scheduling`).
"""

from __future__ import annotations

import http.client
import logging
import urllib.error
import urllib.parse
from typing import Any

from burla.drivers.bake import image_key, until_available
from burla.drivers.base import BakedImage, BootRequest, CloudCheck, NodeHandle, QuotaRoom, VmAddress
from burla.drivers.catalog import MachineType, gpu_model
from burla.drivers.cloud import CLUSTER_TAG, NODE_TAG, ThreadedCloudDriver, first_with_capacity
from burla.drivers.gcp.bake import delete_baked, find_baked, image_state, list_baked, start_image
from burla.drivers.gcp.config import SCOPES, GceConfig, GoogleToken
from burla.drivers.gcp.firewall import HEAD_NETWORK_TAG, NETWORK_TAG, create_rules, head_rule, node_rules, peer_tag
from burla.drivers.gcp.machines import list_machines
from burla.drivers.gcp.permissions import REQUIRED, ROLES_FIX, missing_permissions
from burla.drivers.gcp.prices import catalog_rates
from burla.drivers.head_vm import ROLE_TAG, HeadMachine
from burla.drivers.ssh.bootstrap import dead_man_script, this_python
from burla.errors import CloudRefused, CloudSetupError
from burla.process.build import build_hash
from burla.protocol.states import MachineState

log = logging.getLogger("burla.gce")
DEFAULT_MACHINE_TYPE = "n4-standard-4"
ARM_SERIES = frozenset({"t2a", "c4a", "n4a"})  # Arm machine series (they boot arm64 images)
DEFAULT_ZONE = "us-central1-a"
# Boot disks per machine series (cloud.google.com/compute/docs/disks, "Machine series support"):
# the fourth-generation series and X4 boot from Hyperdisk only; every other series burla boots
# (E2, N1, N2, N2D, C3, A2, A3...) takes a balanced Persistent Disk.
HYPERDISK_SERIES = frozenset({"n4", "n4a", "n4d", "c4", "c4a", "c4d", "x4"})
SSH_USER = "burla"  # created by the guest agent from the ssh-keys metadata
DEFAULT_HEAD_MACHINE_TYPE = "n4-standard-2"
# GPU models (catalog names) to the accelerator types attached to general-purpose machines.
ACCELERATORS = {
    "T4": "nvidia-tesla-t4", "L4": "nvidia-l4", "V100": "nvidia-tesla-v100", "P100": "nvidia-tesla-p100",
    "A100_40G": "nvidia-tesla-a100", "A100_80G": "nvidia-a100-80gb", "H100_80G": "nvidia-h100-80gb",
}
def boot_disk_type(machine_type: str) -> str:
    """The boot disk a machine type accepts: Hyperdisk Balanced for the series that take only
    Hyperdisk, else a balanced Persistent Disk (the series without Hyperdisk refuse it)."""
    return "hyperdisk-balanced" if machine_type.split("-", 1)[0] in HYPERDISK_SERIES else "pd-balanced"


def _ssh_metadata(public_key: str) -> dict[str, str]:
    """The key for user burla, and OS Login off for this VM (where a project turns it on, the guest
    agent ignores ssh-keys metadata; an organisation policy that enforces it still wins)."""
    return {"ssh-keys": f"{SSH_USER}:{public_key}", "enable-oslogin": "FALSE"}


def _guest_host_keys(driver: Any, instances: list[dict[str, Any]]) -> list[str]:
    """The SSH host keys the instance's guest agent wrote as guest attributes (`hostkeys/`); []
    before it has (or without `enable-guest-attributes`)."""
    from libcloud.common.google import ResourceNotFoundError

    if not instances:
        return []
    zone = instances[0]["zone"].rsplit("/", 1)[-1]
    try:
        answer = driver.connection.request(f"/zones/{zone}/instances/{instances[0]['name']}/getGuestAttributes",
                                           method="GET", params={"queryPath": "hostkeys/"}).object
    except ResourceNotFoundError:  # not written yet
        return []
    return [f"{item['key']} {item['value']}" for item in answer.get("queryValue", {}).get("items", [])
            if item.get("namespace") == "hostkeys" and item.get("key") and item.get("value")]


def _spot_scheduling() -> dict[str, Any]:
    return {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE", "automaticRestart": False,
            "onHostMaintenance": "TERMINATE"}


def _libcloud_driver_class(token: GoogleToken, endpoint: str | None) -> type:
    from libcloud.common.google import GoogleBaseConnection
    from libcloud.compute.drivers.gce import API_VERSION, GCEConnection, GCENodeDriver

    class Connection(GCEConnection):
        def __init__(self, user_id, key, secure, auth_type=None, credential_file=None, project=None, scopes=None,
                     **kwargs):
            # Skip GoogleBaseConnection's OAuth setup (token file in the home directory, no ADC).
            super(GoogleBaseConnection, self).__init__(user_id, key, secure=secure, **kwargs)
            if endpoint:  # libcloud passes a host override into GCE's auth arguments, so set it here
                parsed = urllib.parse.urlsplit(endpoint)
                self.secure = 1 if parsed.scheme == "https" else 0
                self.host = parsed.hostname
                self.port = parsed.port or (443 if self.secure else 80)
            self.oauth2_credential = token
            self.request_path = f"/compute/{API_VERSION}/projects/{project}"
            self.gce_params = None

    class NodeDriver(GCENodeDriver):
        connectionCls = Connection

        def _build_scheduling_gce_struct(self, on_host_maintenance=None, automatic_restart=None, preemptible=None):
            if preemptible:  # libcloud knows only legacy preemptible VMs; ask for Spot
                return _spot_scheduling()
            return super()._build_scheduling_gce_struct(on_host_maintenance, automatic_restart, preemptible)

        def ex_get_node(self, name, zone=None):
            # create_node ends here; libcloud's Node conversion would list every disk in the project.
            zone_name = getattr(zone, "name", zone)
            return self.connection.request(f"/zones/{zone_name}/instances/{name}", method="GET").object

    return NodeDriver


class GceDriver(ThreadedCloudDriver):
    name = "gce"
    ssh_user = SSH_USER

    def __init__(self, config: GceConfig, token: GoogleToken | None = None) -> None:
        self.config = config
        self._token = token or GoogleToken()
        self._zones_of_region: dict[str, str] = {}
        self._firewalls_made: set[str] = set()  # networks whose node rules exist
        super().__init__()

    def _new_libcloud_driver(self) -> Any:
        driver_class = _libcloud_driver_class(self._token, self.config.endpoint)
        return driver_class("burla", "application-default", project=self.config.project, timeout=60)

    # --- placement -------------------------------------------------------------------------

    def _zone(self, driver, region: str | None) -> str:
        """The configured zone if it lies in the wanted region, else the region's first zone."""
        region = region or self.config.region
        zone = self.config.zone
        if zone and (region is None or zone.startswith(region + "-")):
            return zone
        if region is None:
            return DEFAULT_ZONE
        if region not in self._zones_of_region:
            info = driver.connection.request(f"/regions/{region}", method="GET").object
            zones = sorted(url.rsplit("/", 1)[-1] for url in info.get("zones", []))
            if not zones:
                raise CloudSetupError(f"GCP region {region} has no zones available to project {self.config.project}.")
            self._zones_of_region[region] = zones[0]
        return self._zones_of_region[region]

    def _image(self, driver, gpu: bool = False, key: str | None = None, arm: bool = False):
        """The image to boot: the newest baked for `key` (see bake_key) if there is one, else the
        configured family's newest; on an Arm machine the family's Arm twin (`debian-12-arm64`:
        Debian and Ubuntu publish each release for both; cloud.google.com/compute/docs/images/os-details)."""
        baked = self.baked.find(key, lambda wanted: find_baked(driver, wanted))
        if baked is not None:
            # by its exact name (libcloud's ex_get_image lists the project and matches prefixes); one
            # deleted since the lookup is a 404 naming it, and the boot goes on without it (cloud.py)
            return driver._to_node_image(driver.connection.request(f"/global/images/{baked}", method="GET").object)
        named = self.config.gpu_image if gpu else self.config.image
        if named.startswith("https://"):
            return driver.ex_get_image_from_family(named)
        project, _, family = named.partition("/")
        if arm and not family.endswith("-arm64"):
            family = f"{family}-arm64"
        image = driver.ex_get_image_from_family(family, ex_project_list=[project], ex_standard_projects=False)
        if image is None:
            variable = "BURLA_GCP_GPU_IMAGE" if gpu else "BURLA_GCP_IMAGE"
            needs = "Python 3 and the NVIDIA driver" if gpu else "Python 3" + (" for Arm" if arm else "")
            raise CloudSetupError(f"No image in family {family!r} of project {project!r}; set {variable} to "
                                  f"PROJECT/FAMILY of an image with {needs}.")
        return image

    # --- the driver interface --------------------------------------------------------------

    def _boot_one(self, driver, request: BootRequest, node_id: str) -> str:
        """Insert the VM in the chosen zone, or, when a zone has no capacity for it, in the
        region's next zone (Compute Engine says so with ZONE_RESOURCE_POOL_EXHAUSTED)."""
        return first_with_capacity(self._zones_to_try(driver, request.region),
                                   lambda zone: self._insert(driver, request, node_id, zone), str,
                                   request.machine_type or DEFAULT_MACHINE_TYPE)

    def _zones_to_try(self, driver, region: str | None) -> list[str]:
        first = self._zone(driver, region)
        info = driver.connection.request(f"/regions/{first.rsplit('-', 1)[0]}", method="GET").object
        others = sorted(url.rsplit("/", 1)[-1] for url in info.get("zones", []))
        return [first, *(zone for zone in others if zone != first)]

    def _insert(self, driver, request: BootRequest, node_id: str, zone: str) -> str:
        machine_type = request.machine_type or DEFAULT_MACHINE_TYPE
        kwargs: dict[str, Any] = {
            "location": zone,
            "ex_network": self.config.network,
            "ex_tags": [NETWORK_TAG, peer_tag(self.config.cluster_id)],
            "ex_metadata": {**(_ssh_metadata(request.ssh_public_key) if request.ssh_public_key else {}),
                            **({"startup-script": dead_man_script(request.power_off_after_s)}
                               if request.power_off_after_s else {}),
                            "enable-guest-attributes": "TRUE"},  # its guest agent reports its SSH host keys
            "ex_labels": {CLUSTER_TAG: self.config.cluster_id, NODE_TAG: node_id},
            "ex_disk_type": boot_disk_type(machine_type),
            "ex_disk_size": request.disk_gb,
        }
        if request.spot:
            kwargs["ex_preemptible"] = True
        if request.gpu is not None:
            kwargs["ex_on_host_maintenance"] = "TERMINATE"  # GPU VMs can't live-migrate
            kwargs["ex_metadata"]["install-nvidia-driver"] = "True"
            listed = driver.connection.request(f"/zones/{zone}/machineTypes/{machine_type}", method="GET").object
            if not listed.get("accelerators"):  # A2, A3, G2 have theirs built in; others get them attached
                accelerator = ACCELERATORS.get(gpu_model(request.gpu))
                if accelerator is None:
                    raise CloudSetupError(f"GCP has no accelerator for GPU {request.gpu!r}; known: "
                                          f"{', '.join(sorted(ACCELERATORS))}.")
                kwargs.update(ex_accelerator_type=accelerator, ex_accelerator_count=max(1, request.gpu_count))
        self._node_firewall(driver)
        image = self._image(driver, request.gpu is not None, self._bake_key(machine_type, request),
                            machine_type.split("-", 1)[0] in ARM_SERIES)
        driver.create_node(node_id, machine_type, image, **kwargs)
        return node_id

    def _node_firewall(self, driver) -> None:
        """The nodes' firewall rules (burla.drivers.gcp.firewall), made once per network."""
        if self.config.network not in self._firewalls_made:
            create_rules(driver, self.config.network, node_rules(self.config.network, self.config.cluster_id))
            self._firewalls_made.add(self.config.network)

    def _cluster_instances(self, driver) -> list[dict[str, Any]]:
        """This cluster's instances in every zone: one aggregated request with a label filter."""
        params = {"filter": f"labels.{CLUSTER_TAG} = {self.config.cluster_id}", "maxResults": 500}
        instances: list[dict[str, Any]] = []
        while True:
            page = driver.connection.request("/aggregated/instances", method="GET", params=params).object
            for scope in page.get("items", {}).values():
                instances.extend(scope.get("instances", []))
            if not page.get("nextPageToken"):
                return instances
            params["pageToken"] = page["nextPageToken"]

    async def list_nodes(self) -> list[NodeHandle]:
        instances = await self._call(self._cluster_instances)
        return [NodeHandle(i.get("labels", {}).get(NODE_TAG, i["name"]), self.name,
                           _STATES.get(i.get("status", ""), MachineState.BOOTING), i.get("selfLink", i["name"]))
                for i in instances if i.get("labels", {}).get(ROLE_TAG) != "head"]

    def _find(self, driver, node_id: str) -> list[dict[str, Any]]:
        return [i for i in self._cluster_instances(driver) if i.get("labels", {}).get(NODE_TAG) == node_id]

    def _address(self, driver, node_id: str) -> VmAddress | None:
        for instance in self._find(driver, node_id):
            if instance.get("status") != "RUNNING":
                continue
            for interface in instance.get("networkInterfaces", []):
                public = next((a["natIP"] for a in interface.get("accessConfigs", []) if a.get("natIP")), None)
                return VmAddress(public, interface.get("networkIP"))
        return None

    def _delete(self, driver, node_id: str) -> bool:
        matches = self._find(driver, node_id)
        for instance in matches:
            zone = instance["zone"].rsplit("/", 1)[-1]
            driver.connection.async_request(f"/zones/{zone}/instances/{instance['name']}", method="DELETE")
        return bool(matches)

    @property
    def region(self) -> str:
        zone = self.config.zone or DEFAULT_ZONE
        return self.config.region or zone.rsplit("-", 1)[0]

    async def machine_types(self) -> list[MachineType]:
        def listed(driver) -> list[MachineType]:
            try:
                rates = catalog_rates(self._token.access_token, self.region, self.config.billing_endpoint,
                                      self._token.quota_project)
            except (OSError, ValueError, http.client.HTTPException) as e:  # e.g. API not enabled: other prices serve
                log.warning("could not read Compute Engine's prices from the Cloud Billing Catalog: %s", e)
                rates = None
            return list_machines(driver, self.region, self._zones_to_try(driver, None), rates)

        return await self._call(listed)

    # --- baked images (burla.drivers.bake) -----------------------------------------------------

    def _bake_key(self, machine_type: str, request: BootRequest) -> str | None:
        if not self.config.bake or request.gpu is not None or request.image is not None:
            return None
        major, minor = (request.python_version or this_python()).split(".")[:2]
        architecture = "arm64" if machine_type.split("-", 1)[0] in ARM_SERIES else "x86_64"
        return image_key(build_hash(), f"{major}.{minor}", self.config.image.rsplit("/", 1)[-1], architecture)

    async def bake_key(self, request: BootRequest) -> str | None:
        return self._bake_key(request.machine_type or DEFAULT_MACHINE_TYPE, request)

    async def builder_machine_type(self, request: BootRequest) -> str | None:
        """`<series>-standard-2`, else `-4` (C3's smallest), as the zone the node boots in describes
        them (n4-highmem-32 -> n4-standard-2), if it has fewer vCPUs than the node's type; else the
        node's own type."""
        from libcloud.common.google import ResourceNotFoundError

        name = request.machine_type or DEFAULT_MACHINE_TYPE
        series = name.split("-", 1)[0]

        def vcpus(driver, machine: str) -> int | None:
            try:
                described = driver.connection.request(
                    f"/zones/{self._zone(driver, request.region)}/machineTypes/{machine}", method="GET").object
            except ResourceNotFoundError:
                return None
            return int(described.get("guestCpus") or 0)

        node = await self._call(vcpus, name)
        for candidate in (f"{series}-standard-2", f"{series}-standard-4"):
            offered = await self._call(vcpus, candidate)
            if offered is not None and node is not None and offered < node:
                return candidate
        return name

    async def baked_images(self) -> list[BakedImage]:
        return await self._call(list_baked)

    async def bake(self, node_id: str, key: str) -> BakedImage:
        def start(driver) -> str:
            [instance] = self._find(driver, node_id)
            return start_image(driver, instance, key)

        name = await self._call(start)
        baked = await until_available(lambda: self._call(image_state, name), f"gce: baking image {name}")
        self.baked.remember(key, name)
        return baked

    def _delete_baked(self, driver, image_id: str) -> bool:
        return delete_baked(driver, image_id)

    async def quota_room(self, machine_type: str, spot: bool) -> QuotaRoom | None:
        """The region's CPUS quota and its use, as the region reports them (Spot VMs count against
        it too unless a PREEMPTIBLE_CPUS quota is set; that one is not read).
        https://cloud.google.com/compute/resource-usage#cpu_quota"""
        try:
            return await self._call(self._quota_room)
        except CloudRefused as e:
            log.warning("could not read the region's CPUS quota: %s", e)
            return None

    def _quota_room(self, driver) -> QuotaRoom | None:
        region = self._zone(driver, None).rsplit("-", 1)[0]
        info = driver.connection.request(f"/regions/{region}", method="GET").object
        quota = next((q for q in info.get("quotas", []) if q.get("metric") == "CPUS"), None)
        if quota is None:
            return None
        return QuotaRoom(name=f"CPUS in {region}", limit=int(quota.get("limit", 0)), used=int(quota.get("usage", 0)),
                         how_to_raise="ask for more on the console's Quotas page (IAM & Admin > Quotas), metric "
                                      f"compute.googleapis.com/cpus, region {region}")

    def _checks(self, driver, machine_type: str | None) -> list[CloudCheck]:
        """Project and credentials, the permissions booting needs (Cloud Resource Manager), the
        machine type and image, the region's CPU quota, and the SSH path (firewall, OS Login)."""
        from libcloud.common.google import ResourceNotFoundError

        machine_type = machine_type or DEFAULT_MACHINE_TYPE
        zone = self._zone(driver, None)
        region = zone.rsplit("-", 1)[0]
        checks = [CloudCheck("credentials", CloudCheck.OK, f"project {self.config.project}, zone {zone}"),
                  self._permissions_check()]
        try:
            described = driver.connection.request(f"/zones/{zone}/machineTypes/{machine_type}", method="GET").object
        except ResourceNotFoundError:
            return [*checks, CloudCheck("machine type", CloudCheck.FAIL, f"{zone} has no machine type {machine_type}",
                                        "pick one the zone offers: `burla settings update --machine-type TYPE`")]
        cpus = int(described.get("guestCpus") or 0)
        checks.append(CloudCheck("machine type", CloudCheck.OK, f"{machine_type}: {cpus} vCPUs; boot disk "
                                 f"{boot_disk_type(machine_type)}"))
        try:
            image = self._image(driver, arm=machine_type.split("-", 1)[0] in ARM_SERIES)
            checks.append(CloudCheck("image", CloudCheck.OK, f"{image.name} ({self.config.image})"))
        except (CloudSetupError, ResourceNotFoundError) as e:
            checks.append(CloudCheck("image", CloudCheck.FAIL, f"{self.config.image}: {e}",
                                     "set BURLA_GCP_IMAGE to PROJECT/FAMILY of an image with Python 3"))
        room = self._quota_room(driver)
        if room is None:
            checks.append(CloudCheck("vCPU quota", CloudCheck.WARN, f"region {region} reports no CPUS quota"))
        else:
            status = CloudCheck.OK if room.free >= cpus else CloudCheck.FAIL
            checks.append(CloudCheck("vCPU quota", status, f"{room.name}: {room.limit} vCPUs, {room.used} in use",
                                     "" if status == CloudCheck.OK else room.how_to_raise))
        try:
            driver.connection.request(f"/global/firewalls/burla-nodes-ssh-{self.config.network}", method="GET")
            path = f"firewall rule burla-nodes-ssh-{self.config.network} opens port 22"
        except ResourceNotFoundError:
            path = f"the first boot makes firewall rule burla-nodes-ssh-{self.config.network} (port 22)"
        checks.append(CloudCheck("ssh path", CloudCheck.OK, f"{path}; VMs turn OS Login off for themselves (an "
                                 "organisation policy enforcing compute.requireOsLogin would keep nodes unreachable)"))
        return checks

    def _permissions_check(self) -> CloudCheck:
        try:
            missing = missing_permissions(self.config.project, self._token.access_token,
                                          self.config.resource_manager_endpoint)
        except urllib.error.HTTPError as e:
            said = e.read().decode(errors="replace")[:300]
            return CloudCheck("permissions", CloudCheck.WARN, f"Cloud Resource Manager answered {e.code}: {said}",
                              "enable the Cloud Resource Manager API (cloudresourcemanager.googleapis.com) in the "
                              "project, or allow resourcemanager.projects.get, to have permissions checked ahead")
        except (OSError, ValueError) as e:
            return CloudCheck("permissions", CloudCheck.WARN, f"could not ask Cloud Resource Manager: {e}")
        if missing:
            return CloudCheck("permissions", CloudCheck.FAIL, "the account lacks " + ", ".join(missing), ROLES_FIX)
        return CloudCheck("permissions", CloudCheck.OK, f"all {len(REQUIRED)} permissions booting needs are held")

    async def reported_host_keys(self, node_id: str) -> list[str]:
        """The host keys the guest agent wrote as guest attributes (namespace `hostkeys/`)."""
        return await self._call(lambda driver: _guest_host_keys(driver, self._find(driver, node_id)))

    async def reported_head_host_keys(self, name: str) -> list[str]:
        return await self._call(lambda driver: _guest_host_keys(driver, self._heads(driver, name)))

    def _console(self, driver, node_id: str) -> str:
        matches = self._find(driver, node_id)
        if not matches:
            return ""
        zone = matches[0]["zone"].rsplit("/", 1)[-1]
        path = f"/zones/{zone}/instances/{matches[0]['name']}/serialPort"
        return driver.connection.request(path, method="GET", params={"port": 1}).object.get("contents") or ""


    # --- the head VM of `burla deploy` --------------------------------------------------------

    def _boot_head(self, driver, head: HeadMachine) -> None:
        create_rules(driver, self.config.network, [head_rule(head.port)])
        machine_type = head.machine_type or DEFAULT_HEAD_MACHINE_TYPE
        driver.create_node(
            head.name, machine_type, self._image(driver, arm=machine_type.split("-", 1)[0] in ARM_SERIES),
            location=self._zone(driver, head.region), ex_network=self.config.network, ex_tags=[HEAD_NETWORK_TAG],
            # set up over SSH by `burla deploy`, once its guest agent reported its host keys
            ex_metadata={**_ssh_metadata(head.ssh_public_key), "enable-guest-attributes": "TRUE"},
            ex_labels={CLUSTER_TAG: self.config.cluster_id, ROLE_TAG: "head"},
            ex_disk_type=boot_disk_type(machine_type), ex_disk_size=head.disk_gb,
            # The head boots and deletes nodes as the project's default service account.
            ex_service_accounts=[{"email": "default", "scopes": list(SCOPES)}],
        )

    def _heads(self, driver, name: str) -> list[dict[str, Any]]:
        return [i for i in self._cluster_instances(driver)
                if i.get("labels", {}).get(ROLE_TAG) == "head" and i["name"] == name]

    def _head_address(self, driver, name: str) -> str | None:
        for instance in self._heads(driver, name):
            for interface in instance.get("networkInterfaces", []):
                for access in interface.get("accessConfigs", []):
                    if access.get("natIP"):
                        return access["natIP"]
        return None

    def _delete_head(self, driver, name: str) -> bool:
        heads = self._heads(driver, name)
        for instance in heads:
            zone = instance["zone"].rsplit("/", 1)[-1]
            driver.connection.async_request(f"/zones/{zone}/instances/{name}", method="DELETE")
        return bool(heads)

_STATES = {"PROVISIONING": MachineState.BOOTING, "STAGING": MachineState.BOOTING, "RUNNING": MachineState.RUNNING,
           "STOPPING": MachineState.STOPPED, "SUSPENDED": MachineState.STOPPED, "TERMINATED": MachineState.STOPPED}


CONFIG = GceConfig  # for burla.drivers.registry
DRIVER = GceDriver
