"""The Azure driver: nodes are VMs in the user's Azure subscription, through apache-libcloud's
Resource Manager connection.

- Credentials (`burla.drivers.azure.auth`): a service principal from `AZURE_CLIENT_ID` /
  `AZURE_CLIENT_SECRET` / `AZURE_TENANT_ID` (the names Azure's SDKs use), else the Azure CLI's
  login (`az account get-access-token`). libcloud's own login (AAD v1, secret only) is bypassed. `AZURE_AUTHORITY_HOST`
  is honoured, as in Azure's SDKs.
- The subscription comes from `AZURE_SUBSCRIPTION_ID`, else the Azure CLI's default one.
- libcloud's VM calls use an old API version without Spot or custom data that works on Python 3
  (apache/libcloud#1893), so burla sends its own PUT through libcloud's connection: NIC, public IP
  and OS disk are created inline and deleted with the VM. Listing and deletion use libcloud's calls.
- Node VMs carry only the power-off timer as custom data (no secret): `linuxConfiguration.ssh`
  authorises the cluster's SSH key for user `burla`, and the head sets them up over SSH
  (`burla.drivers.ssh.driver`). Their network security group `burla-nodes-<cluster>-<region>` opens
  port 22, admits the nodes' own ports only from the cluster's application security group (which
  every node's NIC joins), and denies the rest of the virtual network, which Azure's default rule
  AllowVnetInBound (priority 65000) would otherwise let in: other clusters in the same resource
  group share the network.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from burla.drivers.azure.auth import AzureToken
from burla.drivers.azure.bake import (
    PREPARE,
    delete_baked,
    find_baked,
    image_id,
    image_state,
    list_baked,
    start_image,
)
from burla.drivers.azure.checks import azure_checks
from burla.drivers.azure.config import AzureConfig, location_name
from burla.drivers.azure.machines import list_machines, sku_vcpus, vm_skus
from burla.drivers.azure.vm import (
    ADMIN_USER,
    DEFAULT_MACHINE_TYPE,
    GROUP_API,
    VM_API,
    size_architecture,
    size_family,
    stock_image,
    vm_body,
)
from burla.drivers.bake import image_key, until_available
from burla.drivers.base import BakedImage, BootRequest, CloudCheck, NodeHandle, QuotaRoom, VmAddress
from burla.drivers.catalog import MachineType
from burla.drivers.cloud import CLUSTER_TAG, NODE_TAG, ThreadedCloudDriver, refusal_kind
from burla.drivers.head_vm import ROLE_TAG, HeadMachine
from burla.drivers.ssh.bootstrap import dead_man_script, this_python
from burla.errors import CloudRefused, CloudSetupError
from burla.process.build import build_hash
from burla.protocol.states import MachineState

log = logging.getLogger("burla.azure")
# A size a region can't place (AllocationFailed, SkuNotAvailable) is asked for in each of its
# availability zones (learn.microsoft.com/azure/reliability/availability-zones-overview: regions
# with zones have three, named 1, 2 and 3; a region without them refuses a zonal request).
ZONES = ("1", "2", "3")
NETWORK_API = "2024-05-01"
ADDRESS_SPACE = "10.42.0.0/16"
ROLE_API = "2022-04-01"
CONTRIBUTOR_ROLE = "b24988ac-6180-42a0-ab88-20f7382dd24c"  # built-in role id, the same in every tenant
DEFAULT_HEAD_MACHINE_TYPE = "Standard_D2as_v5"


def _libcloud_driver_class(token: AzureToken, endpoint: str) -> type:
    from libcloud.common.azure_arm import AzureResourceManagementConnection
    from libcloud.compute.drivers.azure_arm import AzureNodeDriver

    parsed = urllib.parse.urlsplit(endpoint)

    class Connection(AzureResourceManagementConnection):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            # libcloud takes the host from the cloud environment but not the port or scheme.
            self.secure = 1 if parsed.scheme == "https" else 0
            self.host = parsed.hostname
            self.port = parsed.port or (443 if self.secure else 80)

        def get_token_from_credentials(self):
            self.access_token, self.expires_on = token.get()

        def encode_data(self, data):
            return json.dumps(data, default=lambda o: o.decode() if isinstance(o, bytes) else str(o))

    class NodeDriver(AzureNodeDriver):
        connectionCls = Connection

    return NodeDriver


class AzureDriver(ThreadedCloudDriver):
    name = "azure"
    ssh_user = ADMIN_USER
    image_preparation = PREPARE  # a builder's guest is deprovisioned before it is generalized

    def __init__(self, config: AzureConfig, token: AzureToken | None = None) -> None:
        self.config = config
        self._token = token or AzureToken(config)
        self._networks_ready: set[str] = set()
        self._network_lock = threading.Lock()
        super().__init__()

    def _new_libcloud_driver(self) -> Any:
        c = self.config
        environment = {"resourceManagerEndpointUrl": c.arm_endpoint, "activeDirectoryEndpointUrl": c.authority,
                       "activeDirectoryResourceId": f"{c.arm_endpoint}/", "storageEndpointSuffix": "core.windows.net"}
        driver_class = _libcloud_driver_class(self._token, c.arm_endpoint)
        return driver_class(c.tenant_id or "", c.subscription_id, "burla", "unused", region=c.region,
                            cloud_environment=environment, timeout=60)

    # --- resources ---------------------------------------------------------------------------

    @property
    def group_path(self) -> str:
        return f"/subscriptions/{self.config.subscription_id}/resourceGroups/{self.config.resource_group}"

    def _put(self, driver, path: str, api_version: str, body: dict[str, Any]) -> dict[str, Any]:
        return driver.connection.request(path, params={"api-version": api_version}, data=body, method="PUT").object

    def _ensure_group(self, driver, path: str, region: str, tags: dict[str, str] | None = None) -> None:
        """Make a resource group unless it exists: its location is fixed once made, and a PUT naming
        another is refused (InvalidResourceGroupLocation), while its resources may be in any region.
        https://learn.microsoft.com/azure/azure-resource-manager/management/manage-resource-groups-portal"""
        from libcloud.common.exceptions import BaseHTTPError

        try:
            driver.connection.request(path, params={"api-version": GROUP_API})
        except BaseHTTPError as e:
            if e.code != 404:
                raise
            self._put(driver, path, GROUP_API, {"location": region, **({"tags": tags} if tags else {})})

    def _ensure_network(self, driver, region: str) -> str:
        """The resource group and this region's virtual network (created once); returns the subnet id."""
        vnet = f"{self.group_path}/providers/Microsoft.Network/virtualNetworks/burla-{region}"
        subnet = f"{vnet}/subnets/nodes"
        with self._network_lock:
            if region in self._networks_ready:
                return subnet
            self._ensure_group(driver, self.group_path, region, {CLUSTER_TAG: self.config.cluster_id})
            state = self._put(driver, vnet, NETWORK_API, {
                "location": region, "tags": {CLUSTER_TAG: self.config.cluster_id},
                "properties": {"addressSpace": {"addressPrefixes": [ADDRESS_SPACE]},
                               "subnets": [{"name": "nodes", "properties": {"addressPrefix": ADDRESS_SPACE}}]},
            })
            deadline = time.monotonic() + 120
            while state.get("properties", {}).get("provisioningState") not in ("Succeeded", None):
                if state["properties"]["provisioningState"] == "Failed" or time.monotonic() > deadline:
                    raise CloudSetupError(f"Azure could not create the virtual network {vnet.rsplit('/', 1)[-1]}.")
                time.sleep(2)
                state = driver.connection.request(vnet, params={"api-version": NETWORK_API}).object
            self._networks_ready.add(region)
        return subnet

    # --- the driver interface ----------------------------------------------------------------

    def image_region(self, request: BootRequest) -> str:
        return location_name(request.region or self.config.region)  # an image serves its own region only

    def _boot_one(self, driver, request: BootRequest, node_id: str) -> str:
        region = self.image_region(request)
        subnet = self._ensure_network(driver, region)
        path = f"{self.group_path}/providers/Microsoft.Compute/virtualMachines/{node_id}"
        size = request.machine_type or DEFAULT_MACHINE_TYPE
        body = vm_body(self._image(driver, request, region), node_id, size, request.disk_gb, request.spot,
                       dead_man_script(request.power_off_after_s) if request.power_off_after_s else None,
                       region, subnet, {CLUSTER_TAG: self.config.cluster_id, NODE_TAG: node_id},
                       security_group=self._node_security_group(driver, region), ssh_key=request.ssh_public_key,
                       application_security_group=self._node_application_group(driver, region))
        try:
            self._put(driver, path, VM_API, body)
            return node_id
        except Exception as e:  # the region's placement had no room: each availability zone in turn
            if refusal_kind(e) != CloudRefused.CAPACITY:
                raise
            regional = e
        for zone in ZONES:
            try:
                self._put(driver, path, VM_API, {**body, "zones": [zone]})
                return node_id
            except Exception as e:  # noqa: BLE001 - a region without zones, or this zone full too
                if refusal_kind(e) != CloudRefused.CAPACITY:
                    break
        raise regional

    def _image(self, driver, request: BootRequest, region: str) -> str:
        """What a node boots: the newest image baked for its key in its region if there is one (a
        resource id), else the configured image (publisher:offer:sku:version), whose Arm build an
        Arm size boots (Canonical's `*-arm64` SKUs, e.g. ubuntu-24_04-lts:server-arm64)."""
        if request.gpu is not None:
            return self.config.gpu_image
        key = self._bake_key(request)  # an image serves its own region only
        baked = self.baked.find(f"{key}@{region}" if key else None,
                                lambda _: find_baked(driver, self.image_group_path, key or "", region))
        if baked is not None:
            return baked
        return stock_image(self.config.image, request.machine_type or DEFAULT_MACHINE_TYPE)

    def _node_application_group(self, driver, region: str) -> str:
        """`burla-nodes-<cluster>-<region>`, the application security group this cluster's nodes join
        (regional, like the NICs in it: learn.microsoft.com/azure/virtual-network/application-security-groups)."""
        path = (f"{self.group_path}/providers/Microsoft.Network/applicationSecurityGroups/"
                f"burla-nodes-{self.config.cluster_id}-{region}")
        with self._network_lock:
            if path not in self._networks_ready:
                tags = {CLUSTER_TAG: self.config.cluster_id}
                self._put(driver, path, NETWORK_API, {"location": region, "tags": tags})
                self._networks_ready.add(path)
        return path

    def _node_security_group(self, driver, region: str) -> str:
        """`burla-nodes-<cluster>-<region>`: SSH in (logins take the cluster's key only), the nodes'
        ports from this cluster's nodes only; created once per region. Rules are taken in priority
        order, the first match decides (learn.microsoft.com/azure/virtual-network/network-security-groups-overview)."""
        path = (f"{self.group_path}/providers/Microsoft.Network/networkSecurityGroups/"
                f"burla-nodes-{self.config.cluster_id}-{region}")
        peers = self._node_application_group(driver, region)
        with self._network_lock:
            if path not in self._networks_ready:
                rules = [_rule("burla-ssh", 1000, "Allow", source="*", ports="22"),
                         _rule("burla-peers", 1100, "Allow", source_group=peers, ports="*", target_group=peers),
                         _rule("burla-deny-network", 4000, "Deny", source="VirtualNetwork", ports="*", protocol="*")]
                self._put(driver, path, NETWORK_API, {"location": region, "tags": {CLUSTER_TAG: self.config.cluster_id},
                                                      "properties": {"securityRules": rules}})
                self._networks_ready.add(path)
        return path

    def _address(self, driver, node_id: str) -> VmAddress | None:
        from libcloud.common.exceptions import BaseHTTPError

        network = f"{self.group_path}/providers/Microsoft.Network"
        try:
            public = driver.connection.request(f"{network}/publicIPAddresses/{node_id}-ip",
                                               params={"api-version": NETWORK_API}).object
            nic = driver.connection.request(f"{network}/networkInterfaces/{node_id}-nic",
                                            params={"api-version": NETWORK_API}).object
        except BaseHTTPError as e:
            if e.code == 404:
                return None  # not created yet
            raise
        configurations = nic.get("properties", {}).get("ipConfigurations") or [{}]
        private = configurations[0].get("properties", {}).get("privateIPAddress")
        return VmAddress(public.get("properties", {}).get("ipAddress"), private)

    def _cluster_nodes(self, driver) -> list:
        from libcloud.common.exceptions import BaseHTTPError

        try:
            nodes = driver.list_nodes(ex_resource_group=self.config.resource_group, ex_fetch_nic=False,
                                      ex_fetch_power_state=False)
        except BaseHTTPError as e:
            if e.code == 404:  # no resource group yet: nothing booted
                return []
            raise
        return [n for n in nodes if (n.extra.get("tags") or {}).get(CLUSTER_TAG) == self.config.cluster_id]

    async def list_nodes(self) -> list[NodeHandle]:
        return await self._call(self._node_handles)

    def _node_handles(self, driver) -> list[NodeHandle]:
        return [NodeHandle(n.extra["tags"].get(NODE_TAG, n.name), self.name, self._machine_state(driver, n), n.id)
                for n in self._cluster_nodes(driver) if n.extra["tags"].get(ROLE_TAG) != "head"]

    def _machine_state(self, driver, node) -> MachineState:
        """From the VM's power state: a VM its guest shut down is "stopped" but still allocated, and
        billed as if running, so it reads as STOPPED here (and is deleted by a sweep), like a
        deallocated one. https://learn.microsoft.com/azure/virtual-machines/states-billing"""
        view = driver.connection.request(f"{node.id}/instanceView", params={"api-version": VM_API}).object
        power = next((s["code"].split("/", 1)[1] for s in view.get("statuses", [])
                      if s.get("code", "").startswith("PowerState/")), None)
        if power is None:
            return _STATES.get(str(node.state), MachineState.BOOTING)
        return _POWER_STATES.get(power, MachineState.BOOTING)

    def _find(self, driver, node_id: str) -> list:
        return [n for n in self._cluster_nodes(driver) if n.extra["tags"].get(NODE_TAG) == node_id]

    def _delete(self, driver, node_id: str) -> bool:
        matches = self._find(driver, node_id)
        for node in matches:  # NIC, public IP and disk go with the VM (deleteOption)
            driver.destroy_node(node, ex_destroy_nic=False, ex_destroy_vhd=False, ex_destroy_os_disk=False)
        return bool(matches)

    @property
    def region(self) -> str:
        return self.config.region

    async def machine_types(self) -> list[MachineType]:
        return await self._call(list_machines, self.config.subscription_id, self.config.region,
                                self.config.prices_endpoint)

    # --- baked images (burla.drivers.bake) -----------------------------------------------------

    def _bake_key(self, request: BootRequest) -> str | None:
        if not self.config.bake or request.gpu is not None or request.image is not None:
            return None
        major, minor = (request.python_version or this_python()).split(".")[:2]
        _, offer, sku, _ = self.config.image.split(":")
        architecture = size_architecture(request.machine_type or DEFAULT_MACHINE_TYPE)
        return image_key(build_hash(), f"{major}.{minor}", f"{offer}-{sku}", architecture)

    async def bake_key(self, request: BootRequest) -> str | None:
        return self._bake_key(request)

    @property
    def image_group_path(self) -> str:
        return f"/subscriptions/{self.config.subscription_id}/resourceGroups/{self.config.image_group}"

    async def builder_machine_type(self, request: BootRequest) -> str | None:
        """The family's 2- or 4-vCPU size the node's region lets this subscription use
        (Standard_D16as_v5 -> Standard_D2as_v5; some families start larger) if it has fewer vCPUs
        than the node's size, else the node's own size."""
        name = request.machine_type or DEFAULT_MACHINE_TYPE
        skus = await self._call(vm_skus, self.config.subscription_id, self.image_region(request))
        offered = {sku["name"]: sku_vcpus(sku) for sku in skus}
        smaller = (re.sub(r"^(Standard_[A-Za-z]+)[0-9]+", rf"\g<1>{vcpus}", name) for vcpus in (2, 4))
        return next((size for size in smaller if size in offered and offered[size] < offered.get(name, 0)), name)

    async def baked_images(self) -> list[BakedImage]:
        return await self._call(list_baked, self.image_group_path)

    async def bake(self, node_id: str, key: str) -> BakedImage:
        [vm] = await self._call(self._find, node_id)
        region = location_name(vm.extra.get("location") or self.region)

        def start(driver) -> str:
            self._ensure_group(driver, self.image_group_path, region)
            return start_image(driver, vm.id, self.image_group_path, key, region)

        name = await self._call(start)
        baked = await until_available(lambda: self._call(image_state, self.image_group_path, name),
                                      f"azure: baking image {name}")
        self.baked.remember(f"{key}@{region}", image_id(self.image_group_path, name))
        return baked

    def _delete_baked(self, driver, image_id: str) -> bool:
        return delete_baked(driver, self.image_group_path, image_id)

    async def quota_room(self, machine_type: str, spot: bool) -> QuotaRoom | None:
        try:
            return await self._call(self.quota_room_now, machine_type, spot)
        except CloudRefused as e:
            log.warning("could not read Azure's vCPU quotas: %s", e)
            return None

    def quota_room_now(self, driver, size: str, spot: bool) -> QuotaRoom | None:
        """The tighter of the region's vCPU quotas the size counts against: Total Regional vCPUs
        and its family's (Spot: the low-priority one), from the usage API.
        https://learn.microsoft.com/rest/api/compute/usage/list"""
        region = self.config.region
        path = f"/subscriptions/{self.config.subscription_id}/providers/Microsoft.Compute/locations/{region}/usages"
        usages = {u["name"]["value"]: u for u in driver.connection.request(
            path, params={"api-version": VM_API}).object.get("value", [])}
        names = ["lowPriorityCores"] if spot else ["cores", size_family(size)]
        rooms = [QuotaRoom(name=f"{usages[n]['name'].get('localizedValue') or n} in {region}",
                           limit=int(usages[n]["limit"]), used=int(usages[n]["currentValue"]),
                           how_to_raise=f"ask for more on the portal's Quotas page (Compute, {region}); "
                                        f"`az vm list-usage --location {region}` shows them")
                 for n in names if n in usages]
        return min(rooms, key=lambda room: room.free) if rooms else None

    def _checks(self, driver, machine_type: str | None) -> list[CloudCheck]:
        return azure_checks(self, driver, machine_type or DEFAULT_MACHINE_TYPE)

    def _console(self, driver, node_id: str) -> str:
        matches = self._find(driver, node_id)
        return self._serial_log(driver, matches[0].id) if matches else ""

    def _head_console(self, driver, name: str) -> str:
        from libcloud.common.exceptions import BaseHTTPError

        try:
            return self._serial_log(driver, f"{self.group_path}/providers/Microsoft.Compute/virtualMachines/{name}")
        except BaseHTTPError as e:
            if e.code == 404:
                return ""  # not created yet
            raise

    def _serial_log(self, driver, vm_path: str) -> str:
        uris = driver.connection.request(f"{vm_path}/retrieveBootDiagnosticsData", method="POST",
                                         params={"api-version": VM_API, "sasUriExpirationTimeInMinutes": 10}).object
        blob = uris.get("serialConsoleLogBlobUri")
        if not blob:
            return ""
        with urllib.request.urlopen(blob, timeout=30) as response:  # a SAS URL: no other credentials
            return response.read().decode(errors="replace")


    # --- the head VM of `burla deploy` --------------------------------------------------------

    def _head_security_group(self, driver, region: str, port: int) -> str:
        path = f"{self.group_path}/providers/Microsoft.Network/networkSecurityGroups/burla-head-{region}"
        rules = [{"name": name, "properties": {
            "priority": priority, "direction": "Inbound", "access": "Allow", "protocol": "Tcp",
            "sourceAddressPrefix": "*", "sourcePortRange": "*", "destinationAddressPrefix": "*",
            "destinationPortRange": str(opened)}} for name, priority, opened in (
            ("burla-head-https", 1000, port), ("burla-ssh", 1010, 22))]  # SSH: `burla deploy` sets it up
        self._put(driver, path, NETWORK_API, {"location": region, "tags": {CLUSTER_TAG: self.config.cluster_id},
                                              "properties": {"securityRules": rules}})
        return path

    def _boot_head(self, driver, head: HeadMachine) -> None:
        import uuid

        from libcloud.common.exceptions import BaseHTTPError

        region = head.region or self.config.region
        subnet = self._ensure_network(driver, region)
        security_group = self._head_security_group(driver, region, head.port)
        size = head.machine_type or DEFAULT_HEAD_MACHINE_TYPE
        body = vm_body(stock_image(self.config.image, size), head.name, size, head.disk_gb,
                       False, None, region, subnet, {CLUSTER_TAG: self.config.cluster_id, ROLE_TAG: "head"},
                       security_group, ssh_key=head.ssh_public_key)
        body["identity"] = {"type": "SystemAssigned"}  # the head boots nodes as the VM itself
        path = f"{self.group_path}/providers/Microsoft.Compute/virtualMachines/{head.name}"
        principal = self._put(driver, path, VM_API, body)["identity"]["principalId"]
        assignment = f"{self.group_path}/providers/Microsoft.Authorization/roleAssignments/{uuid.uuid4()}"
        role = (f"/subscriptions/{self.config.subscription_id}/providers/Microsoft.Authorization/roleDefinitions/"
                f"{CONTRIBUTOR_ROLE}")
        grant = {"properties": {"roleDefinitionId": role, "principalId": principal,
                                "principalType": "ServicePrincipal"}}
        for attempt in range(12):  # a new identity takes a few seconds to be known to role assignments
            try:
                self._put(driver, assignment, ROLE_API, grant)
                return
            except BaseHTTPError as e:
                if "PrincipalNotFound" not in str(e) or attempt == 11:
                    raise CloudSetupError(f"Could not let the head VM manage resource group "
                                          f"{self.config.resource_group} ({e}); deploying needs the Owner or User "
                                          "Access Administrator role on it.") from None
                time.sleep(5)

    def _heads(self, driver, name: str) -> list:
        return [n for n in self._cluster_nodes(driver) if n.extra["tags"].get(ROLE_TAG) == "head" and n.name == name]

    def _head_address(self, driver, name: str) -> str | None:
        from libcloud.common.exceptions import BaseHTTPError

        path = f"{self.group_path}/providers/Microsoft.Network/publicIPAddresses/{name}-ip"
        try:
            answer = driver.connection.request(path, params={"api-version": NETWORK_API}).object
        except BaseHTTPError as e:
            if e.code == 404:
                return None  # not created yet
            raise
        return answer.get("properties", {}).get("ipAddress")

    def _delete_head(self, driver, name: str) -> bool:
        heads = self._heads(driver, name)
        for node in heads:  # NIC, public IP and disk go with the VM
            driver.destroy_node(node, ex_destroy_nic=False, ex_destroy_vhd=False, ex_destroy_os_disk=False)
        return bool(heads)

_POWER_STATES = {"running": MachineState.RUNNING, "starting": MachineState.BOOTING, "stopping": MachineState.STOPPED,
                 "stopped": MachineState.STOPPED, "deallocating": MachineState.STOPPED,
                 "deallocated": MachineState.STOPPED}
_STATES = {"running": MachineState.RUNNING, "pending": MachineState.BOOTING, "updating": MachineState.BOOTING,
           "terminated": MachineState.STOPPED, "error": MachineState.STOPPED, "unknown": MachineState.BOOTING}


CONFIG = AzureConfig  # for burla.drivers.registry
DRIVER = AzureDriver


def _rule(name: str, priority: int, access: str, ports: str, source: str | None = None,
          source_group: str | None = None, target_group: str | None = None, protocol: str = "Tcp") -> dict[str, Any]:
    """An inbound security rule: from an address prefix or service tag (`source`), or from the VMs
    of an application security group (`source_group`), to every address or to a group's VMs."""
    properties: dict[str, Any] = {"priority": priority, "direction": "Inbound", "access": access,
                                  "protocol": protocol, "sourcePortRange": "*", "destinationPortRange": ports}
    if source_group is not None:
        properties["sourceApplicationSecurityGroups"] = [{"id": source_group}]
    else:
        properties["sourceAddressPrefix"] = source
    if target_group is not None:
        properties["destinationApplicationSecurityGroups"] = [{"id": target_group}]
    else:
        properties["destinationAddressPrefix"] = "*"
    return {"name": name, "properties": properties}
