"""The part of Azure Resource Manager that burla's Azure driver uses (resource groups, virtual
networks, virtual machines, boot diagnostics), answered from recorded responses
(`tests/support/clouds/fixtures/azure/`) with state kept like the real API, plus the identity platform's token
endpoint for service principals (reached through AZURE_AUTHORITY_HOST)."""

from __future__ import annotations

import itertools
import json
import re
import time
import uuid

from aiohttp import web

from tests.support.clouds.fake_azure_images import ImageApi, generation_of
from tests.support.clouds.fake_cloud_api import JSON_BODY, FakeCloudApi, json_response

GROUP = "/subscriptions/{subscription}/resourceGroups/{group}"


def size_vcpus(size: str) -> int:
    """Standard_D8as_v5 -> 8: the number in an Azure size's name."""
    return int(re.search(r"\d+", size.split("_")[1]).group(0))


def size_family(size: str) -> str:
    """Standard_D8as_v5 -> standardDASv5Family: the quota an Azure size counts against."""
    _, name, *rest = size.split("_")
    letters = re.sub(r"\d+", "", name).upper()
    return f"standard{letters}{''.join(rest)}Family"


# The VM sizes this stand-in's regions list in Resource SKUs, with the capabilities the API states
# for them (learn.microsoft.com/rest/api/compute/resource-skus/list; sizes from
# learn.microsoft.com/azure/virtual-machines/sizes/): vCPUs, memory in GB, GPUs, architecture.
def _sku(size: str, vcpus: int, memory_gb: float, gpus: int = 0, arch: str = "x64") -> tuple[str, dict[str, str]]:
    return size, {"vCPUs": str(vcpus), "MemoryGB": str(memory_gb), "GPUs": str(gpus), "CpuArchitectureType": arch}


VM_SIZES: dict[str, dict[str, str]] = dict([
    *(_sku(f"Standard_D{n}as_v5", n, 4 * n) for n in (2, 4, 8, 16, 32, 48, 64, 96)),
    *(_sku(f"Standard_D{n}ps_v5", n, 4 * n, arch="Arm64") for n in (2, 4, 8, 16, 32, 48, 64)),
    _sku("Standard_NC4as_T4_v3", 4, 28, 1), _sku("Standard_NC8as_T4_v3", 8, 56, 1),
    _sku("Standard_NC16as_T4_v3", 16, 110, 1), _sku("Standard_NC64as_T4_v3", 64, 440, 4),
    _sku("Standard_NC24ads_A100_v4", 24, 220, 1), _sku("Standard_NC48ads_A100_v4", 48, 440, 2),
    _sku("Standard_NC96ads_A100_v4", 96, 880, 4), _sku("Standard_ND96asr_v4", 96, 900, 8),
    _sku("Standard_ND96isr_H100_v5", 96, 1900, 8),
])
# Regions with availability zones (1, 2, 3) among those the tests use; a zonal VM elsewhere is
# refused. https://learn.microsoft.com/azure/reliability/availability-zones-region-support
ZONED_REGIONS = ("eastus", "eastus2", "westus2", "westus3", "westeurope", "northeurope")
GPU_NAMES = (("_T4_", "Tesla T4"), ("ads_A100_v4", "NVIDIA A100 80GB PCIe"), ("ND96asr_v4", "NVIDIA A100-SXM4-40GB"),
             ("_H100_", "NVIDIA H100 80GB HBM3"))


def linux_price(size: str) -> float:
    """The stand-in's on-demand Linux price of a size (USD per hour): per vCPU, more with GPUs."""
    capabilities = VM_SIZES[size]
    return int(capabilities["vCPUs"]) * 0.0431 + int(capabilities["GPUs"]) * 0.9


def gpus_of_size(size: str) -> tuple[str, ...]:
    """A size's GPUs as nvidia-smi names them."""
    count = int(VM_SIZES.get(size, {}).get("GPUs", "0"))
    name = next((named for part, named in GPU_NAMES if part in size), "NVIDIA GPU")
    return (name,) * count


BOOT_LOG = "[    0.000000] Linux version 6.8.0-1017-azure\ncloud-init[812]: python3 -m venv /opt/burla-bootstrap\n"


class FakeAzure(ImageApi, FakeCloudApi):
    fixture_dir = "azure"

    def __init__(self, client_id: str = "", client_secret: str = "") -> None:
        self.client_id = client_id
        self.client_secret = client_secret
        self.groups: dict[tuple[str, str], dict] = {}
        self.networks: dict[tuple[str, str, str], dict] = {}
        self.machines: dict[tuple[str, str, str], dict] = {}
        self.custom_data: dict[str, str] = {}  # VM name -> base64 custom data (never returned by GET)
        self.power_states: dict[tuple[str, str, str], str] = {}  # VM -> "running", "stopped", "deallocated"
        # vCPU quotas per region: "cores" (Total Regional vCPUs) and per size family, e.g.
        # {"standardDASv5Family": 10}. https://learn.microsoft.com/azure/quotas/regional-quota-requests
        self.quotas: dict[str, int] = {"cores": 350, "lowPriorityCores": 100}
        self.unavailable: set[tuple[str, str]] = set()  # (VM size, location) the region can't place now
        self.unavailable_zones: set[tuple[str, str, str]] = set()  # (VM size, location, zone) likewise per zone
        # (VM size, location) this subscription may not create: Resource SKUs lists them with a
        # NotAvailableForSubscription restriction, and creating one fails with SkuNotAvailable.
        self.not_for_subscription: set[tuple[str, str]] = set()
        self.serial_logs: dict[str, str] = {}  # VM name -> what its guest printed to the serial console
        self.views_state_generation = True  # instance views carry hyperVGeneration (False: an older API's)
        self.sku_listings: list[str] = []  # locations whose SKUs were listed
        self.sku_page_size = 1000
        self.price_page_size = 100  # the Retail Prices API's pages
        self.prices_down = False  # the Retail Prices API answers 503
        # The caller's effective permissions (one entry per role it holds), as the permissions API
        # lists them; by default Contributor's: everything but granting access.
        # https://learn.microsoft.com/azure/role-based-access-control/built-in-roles/privileged#contributor
        self.permissions: list[dict] = [{"actions": ["*"], "notActions": [
            "Microsoft.Authorization/*/Delete", "Microsoft.Authorization/*/Write",
            "Microsoft.Authorization/elevateAccess/Action"], "dataActions": [], "notDataActions": []}]
        self.security_groups: dict[str, dict] = {}
        self.application_groups: dict[str, dict] = {}  # resource id -> the group (its location)
        self.role_assignments: dict[str, dict] = {}
        self.public_ips: dict[tuple[str, str, str], dict] = {}
        self.network_interfaces: dict[tuple[str, str, str], dict] = {}
        self.identities: dict[str, str] = {}  # VM name -> principal id of its system-assigned identity
        self.tokens_issued: list[str] = []
        self.token_lifetime_s = 3599  # as the identity platform answers (expires_in)
        self.expired_tokens: set[str] = set()  # refused from now on, as once their hour is up
        self._ids = itertools.count(1)
        # Each VM's addresses are its own: a deleted VM's are not handed out again while a test runs
        # (a stand-in still answering at a reused address would be dialled for the new VM).
        self._addresses = itertools.count(4)
        self._init_images()
        super().__init__()

    def _error(self, status: int, code: str, message: str) -> web.Response:
        return json_response(self.fixture("not_found", code=code, message=message), status)

    # --- identity platform ------------------------------------------------------------------

    async def token(self, request: web.Request) -> web.Response:
        form = dict(await request.post())
        if form.get("client_id") != self.client_id or form.get("client_secret") != self.client_secret:
            return json_response(self.fixture("token_error", client_id=form.get("client_id", "")), 401)
        token = f"eyJ0eXAiOiJKV1QifQ.fake-{len(self.tokens_issued) + 1}"
        self.tokens_issued.append(token)
        return json_response({**self.fixture("token", access_token=token), "expires_in": self.token_lifetime_s})

    def issue_token(self) -> str:
        """A token as `az account get-access-token` would print it (the CLI's own login)."""
        token = f"eyJ0eXAiOiJKV1QifQ.cli-{len(self.tokens_issued) + 1}"
        self.tokens_issued.append(token)
        return token

    # --- Resource Manager -------------------------------------------------------------------

    @web.middleware
    async def _authorize(self, request: web.Request, handler) -> web.StreamResponse:
        if request.path.startswith("/subscriptions/"):
            if "api-version" not in request.query:
                return self._error(400, "MissingApiVersionParameter",
                                   "The api-version query parameter (?api-version=) is required for all requests.")
            bearer = request.headers.get("Authorization", "").removeprefix("Bearer ")
            if bearer not in self.tokens_issued or bearer in self.expired_tokens:
                return self._error(401, "InvalidAuthenticationToken", "The access token is invalid.")
        return await handler(request)

    def routes(self, app: web.Application) -> None:
        app.middlewares.append(self._authorize)
        app.router.add_post("/{tenant}/oauth2/v2.0/token", self.token)
        app.router.add_put(GROUP, self.put_group)
        app.router.add_get("/subscriptions/{subscription}/providers/Microsoft.Compute/locations/{location}/usages",
                           self.usages)
        app.router.add_get("/subscriptions/{subscription}/providers/Microsoft.Compute/skus", self.skus)
        app.router.add_get("/api/retail/prices", self.retail_prices)
        app.router.add_get("/subscriptions/{subscription}/providers/Microsoft.Authorization/permissions",
                           self.list_permissions)
        app.router.add_get(GROUP + "/providers/Microsoft.Authorization/permissions", self.list_permissions)
        app.router.add_get(GROUP, self.get_group)
        app.router.add_put(GROUP + "/providers/Microsoft.Network/virtualNetworks/{name}", self.put_network)
        app.router.add_get(GROUP + "/providers/Microsoft.Network/virtualNetworks/{name}", self.get_network)
        app.router.add_get(GROUP + "/providers/Microsoft.Compute/virtualMachines", self.list_machines)
        app.router.add_put(GROUP + "/providers/Microsoft.Compute/virtualMachines/{name}", self.put_machine)
        app.router.add_get(GROUP + "/providers/Microsoft.Compute/virtualMachines/{name}", self.get_machine)
        app.router.add_delete(GROUP + "/providers/Microsoft.Compute/virtualMachines/{name}", self.delete_machine)
        app.router.add_get(GROUP + "/providers/Microsoft.Compute/virtualMachines/{name}/instanceView",
                           self.instance_view)
        app.router.add_post(GROUP + "/providers/Microsoft.Compute/virtualMachines/{name}/retrieveBootDiagnosticsData",
                            self.boot_diagnostics)
        app.router.add_get("/blobs/{blob}", self.blob)
        network, authorization = GROUP + "/providers/Microsoft.Network", GROUP + "/providers/Microsoft.Authorization"
        app.router.add_put(network + "/networkSecurityGroups/{name}", self.put_security_group)
        app.router.add_put(network + "/applicationSecurityGroups/{name}", self.put_application_group)
        app.router.add_get(network + "/publicIPAddresses/{name}", self.get_public_ip)
        app.router.add_get(network + "/networkInterfaces/{name}", self.get_network_interface)
        app.router.add_put(authorization + "/roleAssignments/{name}", self.put_role_assignment)
        app.router.add_get("/metadata/identity/oauth2/token", self.managed_identity_token)
        self.image_routes(app)

    async def put_group(self, request: web.Request) -> web.Response:
        m, body = request.match_info, request[JSON_BODY] or {}
        key = (m["subscription"], m["group"])
        created = key not in self.groups
        if not created and self.groups[key]["location"] != body.get("location"):
            # A group's location is fixed when it is made.
            # https://learn.microsoft.com/azure/azure-resource-manager/management/overview#resource-group-location-alignment
            return self._error(409, "InvalidResourceGroupLocation", f"Invalid resource group location "
                               f"'{body.get('location')}'. The Resource group already exists in location "
                               f"'{self.groups[key]['location']}'.")
        self.groups[key] = self.fixture("resource_group", subscription=m["subscription"], group=m["group"],
                                        location=body.get("location", ""), tags=body.get("tags", {}))
        return json_response(self.groups[key], 201 if created else 200)

    async def get_group(self, request: web.Request) -> web.Response:
        missing = self._group_or_404(request)
        if missing is not None:
            return missing
        m = request.match_info
        return json_response(self.groups[(m["subscription"], m["group"])])

    def _group_or_404(self, request: web.Request) -> web.Response | None:
        m = request.match_info
        if (m["subscription"], m["group"]) not in self.groups:
            return self._error(404, "ResourceGroupNotFound", f"Resource group '{m['group']}' could not be found.")
        return None

    async def put_network(self, request: web.Request) -> web.Response:
        missing = self._group_or_404(request)
        if missing is not None:
            return missing
        m, body = request.match_info, request[JSON_BODY]
        properties = body["properties"]
        network = self.fixture(
            "virtual_network", subscription=m["subscription"], group=m["group"], name=m["name"],
            location=body["location"], tags=body.get("tags", {}), state="Updating",
            address_space=properties["addressSpace"], subnets=[
                {"name": s["name"], "id": f"{request.path}/subnets/{s['name']}", "properties": s["properties"]}
                for s in properties.get("subnets", [])],
        )
        self.networks[(m["subscription"], m["group"], m["name"])] = network
        return json_response(network, 201)

    async def get_network(self, request: web.Request) -> web.Response:
        m = request.match_info
        network = self.networks.get((m["subscription"], m["group"], m["name"]))
        if network is None:
            return self._error(404, "ResourceNotFound", f"The Resource '{m['name']}' was not found.")
        network["properties"]["provisioningState"] = "Succeeded"  # provisioned by the time it is asked again
        return json_response(network)

    async def put_machine(self, request: web.Request) -> web.Response:
        missing = self._group_or_404(request)
        if missing is not None:
            return missing
        m, body = request.match_info, request[JSON_BODY]
        properties = body["properties"]
        subnet = properties["networkProfile"]["networkInterfaceConfigurations"][0]["properties"][
            "ipConfigurations"][0]["properties"]["subnet"]["id"]
        size, location = properties["hardwareProfile"]["vmSize"], body["location"]
        refused = self._nic_refusal(properties, location, request.path, (m["subscription"], m["group"]))
        if refused is not None:
            return refused
        if size not in VM_SIZES:
            return self._error(400, "InvalidParameter", f"The value {size} provided for the VM size is not valid. "
                               "The valid sizes in the current region are listed by `az vm list-sizes`.")
        zones = body.get("zones") or []
        if zones and location not in ZONED_REGIONS:
            return self._error(400, "InvalidParameter", f"The requested VM size {size} does not support availability "
                               f"zones in location '{location}': the region has none.")
        if zones and (size, location, zones[0]) in self.unavailable_zones:
            return self._error(409, "ZonalAllocationFailed", "Allocation failed. We do not have sufficient capacity "
                               "for the requested VM size in this zone. Read more about improving likelihood of "
                               "allocation success at http://aka.ms/allocation-guidance")
        if (size, location) in self.not_for_subscription or (not zones and (size, location) in self.unavailable):
            return self._error(409, "SkuNotAvailable", f"The requested VM size {size} is currently not available in "
                               f"location '{location}'. Please try another size or deploy to a different location "
                               "or different zone. See https://aka.ms/azureskunotavailable for details.")
        refused = self.image_reference_refusal(m["subscription"], properties["storageProfile"]["imageReference"],
                                               location, size, VM_SIZES[size]["CpuArchitectureType"])
        if refused is not None:
            return refused
        over = self._over_quota(m["subscription"], location, size, properties.get("priority") == "Spot")
        if over is not None:
            return self._error(409, "OperationNotAllowed", over)
        linux = dict(properties["osProfile"]["linuxConfiguration"])
        machine = self.fixture(
            "virtual_machine", subscription=m["subscription"], group=m["group"], name=m["name"],
            location=body["location"], tags=body.get("tags", {}), vm_id=str(uuid.UUID(int=next(self._ids))),
            hardware=properties["hardwareProfile"], image=properties["storageProfile"]["imageReference"],
            disk_suffix=f"{next(self._ids):032x}", disk_gb=properties["storageProfile"]["osDisk"].get("diskSizeGB", 30),
            linux=linux, nic_configurations=properties["networkProfile"]["networkInterfaceConfigurations"],
            state="Creating",
        )
        for copied in ("priority", "evictionPolicy", "billingProfile"):
            if copied in properties:
                machine["properties"][copied] = properties[copied]
        if body.get("identity", {}).get("type") == "SystemAssigned":
            principal = str(uuid.UUID(int=next(self._ids)))
            self.identities[m["name"]] = principal
            machine["identity"] = {"type": "SystemAssigned", "principalId": principal, "tenantId": "tenant"}
        host = next(self._addresses)
        ip_name = f"{m['name']}-ip"
        self.public_ips[(m["subscription"], m["group"], ip_name)] = self.fixture(
            "public_ip", subscription=m["subscription"], group=m["group"], name=ip_name, vm=m["name"],
            location=body["location"], address=f"20.61.0.{host}")
        nic_name = f"{m['name']}-nic"
        self.network_interfaces[(m["subscription"], m["group"], nic_name)] = self.fixture(
            "network_interface", subscription=m["subscription"], group=m["group"], name=nic_name, vm=m["name"],
            location=body["location"], subnet=subnet, private_address=f"10.42.0.{host}")
        self.custom_data[m["name"]] = properties["osProfile"].get("customData", "")
        self.machines[(m["subscription"], m["group"], m["name"])] = machine
        self.power_states[(m["subscription"], m["group"], m["name"])] = "running"
        return json_response(machine, 201)

    async def get_machine(self, request: web.Request) -> web.Response:
        m = request.match_info
        machine = self.machines.get((m["subscription"], m["group"], m["name"]))
        if machine is None:
            return self._error(404, "ResourceNotFound", f"The Resource 'Microsoft.Compute/virtualMachines/{m['name']}'"
                                                        f" under resource group '{m['group']}' was not found.")
        return json_response(machine)

    async def list_machines(self, request: web.Request) -> web.Response:
        missing = self._group_or_404(request)
        if missing is not None:
            return missing
        m = request.match_info
        for machine in self.machines.values():  # created by the time anyone lists again
            machine["properties"]["provisioningState"] = "Succeeded"
        value = [vm for (sub, group, _), vm in self.machines.items() if (sub, group) == (m["subscription"], m["group"])]
        return json_response({"value": value})

    async def delete_machine(self, request: web.Request) -> web.Response:
        m = request.match_info
        if self.machines.pop((m["subscription"], m["group"], m["name"]), None) is None:
            return web.Response(status=204)
        self.public_ips.pop((m["subscription"], m["group"], f"{m['name']}-ip"), None)  # deleteOption: Delete
        self.network_interfaces.pop((m["subscription"], m["group"], f"{m['name']}-nic"), None)
        return web.Response(status=202, headers={"Location": f"{self.url}/operations/{uuid.uuid4()}"})

    def _usage(self, subscription: str, location: str) -> dict[str, int]:
        used: dict[str, int] = {}
        for (sub, _, _), machine in self.machines.items():
            if sub != subscription or machine["location"] != location:
                continue
            size = machine["properties"]["hardwareProfile"]["vmSize"]
            spot = machine["properties"].get("priority") == "Spot"
            for name in ("lowPriorityCores",) if spot else ("cores", size_family(size)):
                used[name] = used.get(name, 0) + size_vcpus(size)
        return used

    def _over_quota(self, subscription: str, location: str, size: str, spot: bool) -> str | None:
        """The refusal of a VM past a vCPU quota, in Azure's words (a 409 OperationNotAllowed)."""
        used = self._usage(subscription, location)
        for name in ("lowPriorityCores",) if spot else ("cores", size_family(size)):
            limit = self.quotas.get(name)
            if limit is not None and used.get(name, 0) + size_vcpus(size) > limit:
                label = "Total Regional" if name == "cores" else name
                return (f"Operation could not be completed as it results in exceeding approved {label} Cores quota. "
                        f"Additional details - Deployment Model: Resource Manager, Location: {location}, Current "
                        f"Limit: {limit}, Current Usage: {used.get(name, 0)}, Additional Required: "
                        f"{size_vcpus(size)}, (Minimum) New Limit Required: {used.get(name, 0) + size_vcpus(size)}. "
                        "Submit a request for Quota increase at https://aka.ms/ProdCoreReqV2")
        return None

    async def list_permissions(self, request: web.Request) -> web.Response:
        if "group" in request.match_info:
            missing = self._group_or_404(request)
            if missing is not None:
                return missing
        return json_response({"value": self.permissions})

    async def retail_prices(self, request: web.Request) -> web.Response:
        """The public Retail Prices API for `serviceName eq 'Virtual Machines' and armRegionName eq
        'X' and priceType eq 'Consumption'`: per size a Linux, a Windows, a Spot and a Low Priority
        meter, 100 to a page joined by an absolute NextPageLink (no sign-in)."""
        if self.prices_down:
            return json_response({"Error": {"Code": "ServiceUnavailable"}}, 503)
        match = re.search(r"armRegionName eq '([\w-]+)'", request.query.get("$filter", ""))
        if match is None or "serviceName eq 'Virtual Machines'" not in request.query.get("$filter", ""):
            return json_response({"Error": {"Code": "BadRequest", "Message": "Invalid OData parameters supplied"}},
                                 400)
        region = match.group(1)
        items = []
        for size in VM_SIZES:
            linux = linux_price(size)
            short = size.removeprefix("Standard_").replace("_", " ")
            series = re.sub(r"^\D+?(\d+)", "", size.removeprefix("Standard_"))
            series_name = f"Virtual Machines {series} Series"
            for sku_name, product, price in ((short, series_name, linux),
                                             (short, f"{series_name} Windows", linux * 1.8),
                                             (f"{short} Spot", series_name, linux * 0.2),
                                             (f"{short} Low Priority", series_name, linux * 0.2)):
                items.append({"currencyCode": "USD", "retailPrice": round(price, 4), "unitPrice": round(price, 4),
                              "armRegionName": region, "serviceName": "Virtual Machines", "skuName": sku_name,
                              "productName": product, "armSkuName": size, "type": "Consumption",
                              "unitOfMeasure": "1 Hour"})
        start = int(request.query.get("$skip") or 0)
        page: dict = {"BillingCurrency": "USD", "Items": items[start:start + self.price_page_size],
                      "Count": len(items[start:start + self.price_page_size])}
        if start + self.price_page_size < len(items):
            page["NextPageLink"] = str(request.url.update_query({"$skip": str(start + self.price_page_size)}))
        return json_response(page)

    async def skus(self, request: web.Request) -> web.Response:
        """Resource SKUs for `$filter=location eq 'X'`, in pages joined by a nextLink."""
        match = re.fullmatch(r"location eq '([\w-]+)'", request.query.get("$filter", ""))
        if match is None:
            return self._error(400, "InvalidFilter", "Only a filter on location is supported here.")
        location = match.group(1)
        self.sku_listings.append(location)
        start = int(request.query.get("$skiptoken") or 0)
        names = list(VM_SIZES)[start:start + self.sku_page_size]
        value = [{
            "resourceType": "virtualMachines", "name": size, "tier": "Standard", "size": size.split("_", 1)[1],
            "family": size_family(size), "locations": [location],
            "locationInfo": [{"location": location, "zones": ["1", "2", "3"]}],
            "capabilities": [{"name": k, "value": v} for k, v in VM_SIZES[size].items()],
            "restrictions": [{"type": "Location", "values": [location], "reasonCode": "NotAvailableForSubscription",
                              "restrictionInfo": {"locations": [location]}}]
            if (size, location) in self.not_for_subscription else [],
        } for size in names]
        if start == 0:  # the list holds other resource types too (disks, availability sets)
            value.insert(0, {"resourceType": "disks", "name": "Premium_LRS", "locations": [location],
                             "capabilities": [], "restrictions": []})
        page: dict = {"value": value}
        if start + self.sku_page_size < len(VM_SIZES):
            page["nextLink"] = str(request.url.update_query({"$skiptoken": str(start + self.sku_page_size)}))
        return json_response(page)

    async def usages(self, request: web.Request) -> web.Response:
        m = request.match_info
        used = self._usage(m["subscription"], m["location"])
        return json_response({"value": [
            {"name": {"value": name, "localizedValue": name}, "currentValue": used.get(name, 0), "limit": limit,
             "unit": "Count"} for name, limit in self.quotas.items()]})

    async def instance_view(self, request: web.Request) -> web.Response:
        """The VM's power state: "running", or "stopped" after a guest shutdown, which leaves it
        allocated and billed (only a deallocation through the API frees it).
        https://learn.microsoft.com/azure/virtual-machines/states-billing"""
        m = request.match_info
        key = (m["subscription"], m["group"], m["name"])
        if key not in self.machines:
            return self._error(404, "ResourceNotFound", f"The Resource '{m['name']}' was not found.")
        power = self.power_states.get(key, "running")
        generalized = [{"code": "OSState/generalized", "level": "Info", "displayStatus": "VM generalized"}]
        reference = self.machines[key]["properties"]["storageProfile"]["imageReference"]
        generation = {"hyperVGeneration": generation_of(reference, self.images)} if self.views_state_generation else {}
        return json_response({**generation, "statuses": [
            {"code": "ProvisioningState/succeeded", "level": "Info", "displayStatus": "Provisioning succeeded"},
            *(generalized if key in self.generalized else []),
            {"code": f"PowerState/{power}", "level": "Info", "displayStatus": f"VM {power}"}]})

    async def boot_diagnostics(self, request: web.Request) -> web.Response:
        m = request.match_info
        if (m["subscription"], m["group"], m["name"]) not in self.machines:
            return self._error(404, "ResourceNotFound", f"The Resource '{m['name']}' was not found.")
        return json_response(self.fixture("boot_diagnostics", name=m["name"], blob_base=f"{self.url}/blobs"))

    async def blob(self, request: web.Request) -> web.Response:
        blob = request.match_info["blob"]
        if blob.endswith(".serialconsole.log") and request.query.get("sig"):
            return web.Response(text=BOOT_LOG + self.serial_logs.get(blob.removesuffix(".serialconsole.log"), ""))
        return web.Response(status=403, text=json.dumps({"error": "AuthenticationFailed"}))

    async def put_security_group(self, request: web.Request) -> web.Response:
        missing = self._group_or_404(request)
        if missing is not None:
            return missing
        m, body = request.match_info, request[JSON_BODY]
        rules = body["properties"].get("securityRules", [])
        refused = self._rules_refusal(rules, body["location"], request.path)
        if refused is not None:
            return refused
        group = self.fixture("network_security_group", subscription=m["subscription"], group=m["group"],
                             name=m["name"], location=body["location"], tags=body.get("tags", {}), rules=rules)
        self.security_groups[request.path] = group
        return json_response(group, 201)

    def _rules_refusal(self, rules: list, location: str, path: str) -> web.Response | None:
        """What Network refuses in a security group's rules: a priority outside 100-4096 or used twice
        in one direction, a rule with both or neither of an address prefix and application security
        groups as its source, and a group that doesn't exist or is in another region
        (learn.microsoft.com/azure/virtual-network/network-security-groups-overview#security-rules,
        learn.microsoft.com/azure/virtual-network/application-security-groups#allow-database-businesslogic)."""
        seen: set[tuple[str, int]] = set()
        for rule in rules:
            props = rule["properties"]
            key = (props["direction"], props["priority"])
            if not 100 <= props["priority"] <= 4096 or key in seen:
                return self._error(400, "SecurityRuleInvalidPriority" if key not in seen else
                                   "SecurityRulesWithSamePriorityAndDirection",
                                   f"Security rule {rule['name']} has an invalid or repeated priority.")
            seen.add(key)
            for side in ("source", "destination"):
                groups = props.get(f"{side}ApplicationSecurityGroups")
                if (groups is None) == (f"{side}AddressPrefix" not in props):
                    return self._error(400, "SecurityRuleParameterContainsUnsupportedValue",
                                       f"Security rule {rule['name']} needs exactly one {side}: an address prefix "
                                       "or application security groups.")
                for asg in groups or []:
                    found = self.application_groups.get(asg["id"])
                    if found is None:
                        return self._error(400, "InvalidResourceReference", f"Resource {asg['id']} referenced by "
                                           f"resource {path} was not found.")
                    if found["location"] != location:
                        return self._error(400, "ApplicationSecurityGroupNotInSameRegion",
                                           f"Application security group {asg['id']} is not in region {location}.")
        return None

    def _nic_refusal(self, properties: dict, location: str, path: str, group: tuple[str, str]) -> web.Response | None:
        """A NIC's subnet and application security groups must exist, the groups in the VM's region."""
        ip_configuration = properties["networkProfile"]["networkInterfaceConfigurations"][0]["properties"][
            "ipConfigurations"][0]["properties"]
        subnet = ip_configuration["subnet"]["id"]
        if (*group, subnet.split("/virtualNetworks/")[1].split("/")[0]) not in self.networks:
            return self._error(404, "InvalidResourceReference", f"Resource {subnet} referenced by resource "
                                                                f"{path} was not found.")
        for asg in ip_configuration.get("applicationSecurityGroups", []):
            found = self.application_groups.get(asg["id"])
            if found is None or found["location"] != location:
                return self._error(400, "InvalidResourceReference", f"Resource {asg['id']} referenced by resource "
                                   f"{path} was not found in {location}.")
        return None

    async def put_application_group(self, request: web.Request) -> web.Response:
        missing = self._group_or_404(request)
        if missing is not None:
            return missing
        body = request[JSON_BODY]
        group = {"id": request.path, "name": request.match_info["name"], "location": body["location"],
                 "tags": body.get("tags", {}), "type": "Microsoft.Network/applicationSecurityGroups",
                 "properties": {"provisioningState": "Succeeded"}}
        self.application_groups[request.path] = group
        return json_response(group, 201)

    def admits(self, vm_name: str, port: int, source: str) -> bool:
        """Whether the security group of VM `vm_name` lets a TCP connection to `port` in from
        `source` (another VM of this fake, by name, or "internet"), as Azure evaluates it: the
        inbound rules by priority, the first match decides; then the default rules
        AllowVnetInBound (65000), AllowAzureLoadBalancerInBound (65001), DenyAllInBound (65500)."""
        target = self._nic_of(vm_name)
        nsg = self.security_groups[target["networkSecurityGroup"]["id"]]
        source_nic = self._nic_of(source) if source != "internet" else None
        # The VirtualNetwork tag covers the target's own virtual network (peerings aside).
        same_network = source_nic is not None and _network_of(source_nic) == _network_of(target)

        def matches_side(props: dict, side: str, nic: dict | None) -> bool:
            groups = props.get(f"{side}ApplicationSecurityGroups")
            if groups is not None:
                return nic is not None and bool({g["id"] for g in groups} & {g["id"] for g in
                                                 nic.get("applicationSecurityGroups", [])})
            prefix = props[f"{side}AddressPrefix"]
            return prefix == "*" or (prefix == "VirtualNetwork" and (side == "destination" or same_network))

        rules = sorted((r["properties"] for r in nsg["properties"]["securityRules"]
                        if r["properties"]["direction"] == "Inbound"), key=lambda p: p["priority"])
        for props in rules:
            ports = props["destinationPortRange"]
            if (props["protocol"] in ("Tcp", "*") and (ports == "*" or ports == str(port))
                    and matches_side(props, "source", source_nic) and matches_side(props, "destination", target)):
                return props["access"] == "Allow"
        return same_network  # AllowVnetInBound, else DenyAllInBound

    def _nic_of(self, vm_name: str) -> dict:
        """The NIC configuration a VM was created with (its ip configuration's properties, and its NSG)."""
        machine = next(vm for (_, _, name), vm in self.machines.items() if name == vm_name)
        nic = machine["properties"]["networkProfile"]["networkInterfaceConfigurations"][0]["properties"]
        return {**nic["ipConfigurations"][0]["properties"], "networkSecurityGroup": nic.get("networkSecurityGroup")}

    async def get_public_ip(self, request: web.Request) -> web.Response:
        m = request.match_info
        address = self.public_ips.get((m["subscription"], m["group"], m["name"]))
        if address is None:
            return self._error(404, "ResourceNotFound", f"The Resource 'Microsoft.Network/publicIPAddresses/"
                                                        f"{m['name']}' was not found.")
        return json_response(address)

    async def get_network_interface(self, request: web.Request) -> web.Response:
        m = request.match_info
        nic = self.network_interfaces.get((m["subscription"], m["group"], m["name"]))
        if nic is None:
            return self._error(404, "ResourceNotFound", f"The Resource 'Microsoft.Network/networkInterfaces/"
                                                        f"{m['name']}' was not found.")
        return json_response(nic)

    async def put_role_assignment(self, request: web.Request) -> web.Response:
        m, body = request.match_info, request[JSON_BODY]
        scope = request.path.split("/providers/Microsoft.Authorization/")[0]
        if body["properties"]["principalId"] not in self.identities.values():
            return self._error(400, "PrincipalNotFound", f"Principal {body['properties']['principalId']} does not "
                                                         "exist in the directory.")
        assignment = self.fixture("role_assignment", role=body["properties"]["roleDefinitionId"], scope=scope,
                                  principal=body["properties"]["principalId"], name=m["name"])
        self.role_assignments[m["name"]] = assignment
        return json_response(assignment, 201)

    async def managed_identity_token(self, request: web.Request) -> web.Response:
        if request.headers.get("Metadata") != "true" or request.query.get("api-version") != "2018-02-01":
            return json_response({"error": "invalid_request", "error_description": "Required metadata header not "
                                                                                   "specified"}, 400)
        token = f"eyJ0eXAiOiJKV1QifQ.identity-{len(self.tokens_issued) + 1}"
        self.tokens_issued.append(token)
        now = int(time.time())
        return json_response(self.fixture("managed_identity_token", access_token=token, expires_on=str(now + 86399),
                                          not_before=str(now - 300), resource=request.query.get("resource", "")))


def _network_of(ip_configuration: dict) -> str:
    return ip_configuration["subnet"]["id"].split("/subnets/")[0]
