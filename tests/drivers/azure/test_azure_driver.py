"""The Azure driver against recorded Resource Manager and identity-platform responses served on
127.0.0.1 (`tests/support/clouds/fake_azure.py`): the exact VM request (custom data, tags, Spot, size, disk,
inline NIC and public IP deleted with the VM), listing, deletion, boot logs, credential
discovery (service principal, the Azure CLI's login through a stand-in `az` on PATH, fake CLI
profile files) and a head that boots a VM whose custom data (played here) joins and runs a job."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import stat
import subprocess
import sys

import pytest

from burla.drivers.base import BootRequest
from tests.conftest import REPO, start_head, wait_for_nodes
from tests.support.clouds.fake_azure import FakeAzure
from tests.support.clouds.vm_farms import AzureVmFarm
from tests.support.helpers import get_json, run_client_in, wait_until

SUBSCRIPTION = "3f6d2b1c-0a4e-4d7b-9c55-2e8f7a1b6c90"
TENANT = "72f988bf-86f1-41af-91ab-2d7cd011db47"
CLIENT_ID = "0d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6"
SECRET = "s3cret~value"


def _clean_azure_environment(monkeypatch, home) -> None:
    for key in ("AZURE_SUBSCRIPTION_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET",
                "AZURE_CONFIG_DIR", "AZURE_DEFAULTS_LOCATION", "BURLA_AZURE_RESOURCE_GROUP", "BURLA_AZURE_IMAGE",
                "BURLA_AZURE_SSH_PUBLIC_KEY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", f"{home / 'bin'}:/usr/bin:/bin")  # only the stand-in `az`, if a test adds one


def _cli_profile(home, subscription: str | None = SUBSCRIPTION) -> None:
    """What `az login` leaves in ~/.azure (azureProfile.json is written with a byte-order mark)."""
    (home / ".azure").mkdir(exist_ok=True)
    subscriptions = [{"id": "00000000-0000-0000-0000-000000000001", "name": "Other", "tenantId": TENANT,
                      "isDefault": False, "state": "Enabled", "user": {"name": "u@example.com", "type": "user"}}]
    if subscription:
        subscriptions.append({"id": subscription, "name": "Research", "tenantId": TENANT, "isDefault": True,
                              "state": "Enabled", "user": {"name": "u@example.com", "type": "user"}})
    (home / ".azure" / "azureProfile.json").write_text(
        json.dumps({"installationId": "i-1", "subscriptions": subscriptions}), encoding="utf-8-sig")
    (home / ".azure" / "config").write_text("[defaults]\nlocation = northeurope\n")


def _stand_in_az(home, stdout: str, stderr: str = "", code: int = 0) -> None:
    """An `az` on PATH that answers `az account get-access-token` as the Azure CLI does."""
    (home / "bin").mkdir(exist_ok=True)
    script = home / "bin" / "az"
    script.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write({stdout!r})\nsys.stderr.write({stderr!r})\n"
                      f"open({str(home / 'az-args')!r}, 'w').write(' '.join(sys.argv[1:]))\nsys.exit({code})\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def azure(monkeypatch, tmp_path):
    fake = FakeAzure(CLIENT_ID, SECRET)
    home = tmp_path / "home"
    home.mkdir()
    _clean_azure_environment(monkeypatch, home)
    for key, value in {"AZURE_SUBSCRIPTION_ID": SUBSCRIPTION, "AZURE_TENANT_ID": TENANT, "AZURE_CLIENT_ID": CLIENT_ID,
                       "AZURE_CLIENT_SECRET": SECRET, "AZURE_AUTHORITY_HOST": fake.url,
                       "BURLA_AZURE_RESOURCE_MANAGER_URL": fake.url, "BURLA_AZURE_PRICES_URL": fake.url}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("BURLA_BAKE_IMAGES", "0")  # heads bake after a first boot: the baking test turns it on
    try:
        yield fake
    finally:
        fake.stop()


def _driver(region: str | None = None, cluster_id: str = "cluster-1", **environ: str):
    from burla.drivers.azure.driver import AzureConfig, AzureDriver

    return AzureDriver(AzureConfig.from_environment({**os.environ, **environ}, region, cluster_id))


def _azure_head(azure, tmp_path, monkeypatch, wheelhouse, *extra: str):
    """Stand-in VMs for the fake's machines, and a head booting them in westus3."""
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + ":/usr/bin:/bin")
    farm = AzureVmFarm(azure, tmp_path / "vms")
    head = start_head(tmp_path / "config", local_nodes=0, extra=[
        "--driver", "azure", "--region", "westus3", "--node-wheelhouse", str(wheelhouse),
        "--ssh-address-map", str(farm.map_path), *extra])
    return farm, head


def _custom_data(fake: FakeAzure, node_id: str) -> str:
    return base64.b64decode(fake.custom_data[node_id]).decode()


CLUSTER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGSoU/Sv+4Aho0bDRzg6Jfw/gNeQpWA7MK3bgrvqtfIJ burla-cluster-1"


def test_vm_request_carries_the_ssh_key_tags_spot_and_size_then_list_and_delete(azure):
    driver = _driver(region="westeurope")

    async def scenario():
        empty = await driver.list_nodes()  # no resource group yet
        request = BootRequest(2, "http://10.0.0.2:5001", "secret-token", 4, "Standard_NC4as_T4_v3", None, 64, None,
                              True, "T4", 1, python_version="3.12", ssh_public_key=CLUSTER_KEY)
        booted = await driver.boot(request)
        listed = await driver.list_nodes()
        address = await driver.address(booted[0])
        console = await driver.boot_log(booted[0])
        deleted = [await driver.delete(booted[0]), await driver.delete("burla-node-unknown")]
        after = await driver.list_nodes()
        await driver.close()
        return empty, booted, listed, address, console, deleted, after

    empty, booted, listed, address, console, deleted, after = asyncio.run(scenario())
    assert empty == []
    group = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/burla-cluster-1"
    # One token for every thread; the group and network are created once, before the VMs.
    assert len(azure.logged("POST", "/oauth2/v2.0/token")) == 1
    assert azure.logged("POST", "/oauth2/v2.0/token")[0].path == f"/{TENANT}/oauth2/v2.0/token"
    puts = [r.path for r in azure.logged("PUT")]
    nodes_group = f"{group}/providers/Microsoft.Network/networkSecurityGroups/burla-nodes-cluster-1-westeurope"
    peers = f"{group}/providers/Microsoft.Network/applicationSecurityGroups/burla-nodes-cluster-1-westeurope"
    assert puts[:4] == [group, f"{group}/providers/Microsoft.Network/virtualNetworks/burla-westeurope", peers,
                        nodes_group]
    assert sorted(puts[4:]) == sorted(f"{group}/providers/Microsoft.Compute/virtualMachines/{n}" for n in booted)
    vm = next(r for r in azure.logged("PUT", "/virtualMachines/") if r.path.endswith(booted[0]))
    assert vm.query["api-version"] == "2024-07-01"
    body = vm.body
    assert body["location"] == "westeurope"
    assert body["tags"] == {"burla-cluster": "cluster-1", "burla-node-id": booted[0]}
    properties = body["properties"]
    assert properties["hardwareProfile"] == {"vmSize": "Standard_NC4as_T4_v3"}
    assert (properties["priority"], properties["evictionPolicy"], properties["billingProfile"]) == (
        "Spot", "Delete", {"maxPrice": -1})
    assert properties["storageProfile"]["osDisk"]["diskSizeGB"] == 64
    assert properties["storageProfile"]["osDisk"]["deleteOption"] == "Delete"
    [nic] = properties["networkProfile"]["networkInterfaceConfigurations"]
    assert nic["properties"]["deleteOption"] == "Delete"
    public_ip = nic["properties"]["ipConfigurations"][0]["properties"]["publicIPAddressConfiguration"]
    assert public_ip["properties"]["deleteOption"] == "Delete"
    assert nic["properties"]["networkSecurityGroup"] == {"id": nodes_group}
    assert nic["properties"]["ipConfigurations"][0]["properties"]["applicationSecurityGroups"] == [{"id": peers}]
    # The cluster's key for user burla; no custom data and no secret anywhere.
    assert properties["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"] == [
        {"path": "/home/burla/.ssh/authorized_keys", "keyData": CLUSTER_KEY}]
    assert "customData" not in properties["osProfile"]
    assert "secret-token" not in json.dumps([r.body for r in azure.requests])
    assert address is not None and address.public.startswith("20.61.0.") and address.private.startswith("10.42.0.")
    assert sorted(n.node_id for n in listed) == sorted(booted)
    assert "cloud-init" in console
    assert deleted == [True, False]
    assert [n.node_id for n in after] == [booted[1]]
    [delete] = azure.logged("DELETE")
    assert delete.path.endswith(f"/virtualMachines/{booted[0]}")  # NIC, IP and disk go with it (deleteOption)


def test_a_wrong_service_principal_secret_names_the_fix(azure, monkeypatch):
    from burla.errors import CloudSetupError

    monkeypatch.setenv("AZURE_CLIENT_SECRET", "not-the-secret")
    driver = _driver()
    with pytest.raises(CloudSetupError, match=r"AADSTS7000215.*az ad sp credential reset"):
        asyncio.run(driver.list_nodes())
    asyncio.run(driver.close())


def test_the_azure_cli_login_and_default_subscription_are_used(azure, monkeypatch, tmp_path):
    home = tmp_path / "home"
    for key in ("AZURE_SUBSCRIPTION_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET"):
        monkeypatch.delenv(key)
    _cli_profile(home)
    token = azure.issue_token()
    _stand_in_az(home, json.dumps({"accessToken": token, "expiresOn": "2099-01-01 00:00:00.000000",
                                   "expires_on": 4070908800, "subscription": SUBSCRIPTION, "tenant": TENANT,
                                   "tokenType": "Bearer"}))
    driver = _driver()
    assert (driver.config.subscription_id, driver.config.region) == (SUBSCRIPTION, "northeurope")
    assert driver.config.client_id is None
    asyncio.run(driver.boot(BootRequest(1, "http://10.0.0.2:5001", "tok", ssh_public_key=CLUSTER_KEY)))
    asyncio.run(driver.close())
    assert not azure.logged("POST", "/oauth2/")  # no service principal login
    assert {r.authorization for r in azure.logged("PUT")} == {f"Bearer {token}"}
    asked = (home / "az-args").read_text()
    assert asked.startswith("account get-access-token") and f"--subscription {SUBSCRIPTION}" in asked


def test_missing_azure_setup_names_the_command_that_fixes_it(monkeypatch, tmp_path):
    from burla.drivers.azure.driver import AzureConfig, AzureToken
    from burla.errors import CloudSetupError

    _clean_azure_environment(monkeypatch, tmp_path)
    with pytest.raises(CloudSetupError, match=r"az login.*AZURE_SUBSCRIPTION_ID"):
        AzureConfig.from_environment(dict(os.environ), None, "c1")
    _cli_profile(tmp_path)
    config = AzureConfig.from_environment(dict(os.environ), None, "c1")
    with pytest.raises(CloudSetupError, match=r"install the Azure CLI and run `az login`"):
        AzureToken(config).get()  # no `az` on PATH and no service principal
    _stand_in_az(tmp_path, "", "ERROR: AADSTS70043: The refresh token has expired. Please run 'az login' to setup "
                               "account.\n", code=1)
    with pytest.raises(CloudSetupError, match=r"expired or is missing.*Run `az login`"):
        AzureToken(config).get()
    monkeypatch.setenv("AZURE_CLIENT_ID", CLIENT_ID)
    monkeypatch.setenv("AZURE_CLIENT_SECRET", SECRET)
    monkeypatch.setenv("AZURE_TENANT_ID", "")
    (tmp_path / ".azure" / "azureProfile.json").unlink()
    monkeypatch.setenv("AZURE_SUBSCRIPTION_ID", SUBSCRIPTION)
    with pytest.raises(CloudSetupError, match="AZURE_TENANT_ID is not"):
        AzureConfig.from_environment(dict(os.environ), None, "c1")


def _burla(head, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "burla", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120, env=dict(os.environ, **head.env()))
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])["data"]


def test_cluster_start_boots_azure_vms_that_join_run_jobs_and_go_when_idle(azure, tmp_path, monkeypatch, wheelhouse,
                                                                           client_venv):
    farm, head = _azure_head(azure, tmp_path, monkeypatch, wheelhouse)  # idle timeout set after the job
    try:
        _burla(head, "settings", "update", "--quantity", "1", "--machine-type", "Standard_D4as_v5", "--disk-gb",
               "40")
        [node_id] = _burla(head, "cluster", "start")["booted"]
        [vm] = azure.logged("PUT", "/virtualMachines/")
        assert vm.body["properties"]["hardwareProfile"]["vmSize"] == "Standard_D4as_v5"
        assert vm.body["location"] == "westus3" and "priority" not in vm.body["properties"]
        assert head.token not in json.dumps(vm.body)
        wait_for_nodes(head, 1, timeout=240)
        assert farm.vm(node_id).logins[0] == "burla"  # the admin user linuxConfiguration authorises
        assert get_json(head, "/v1/cluster")["nodes"][0]["node_id"] == node_id
        assert run_client_in(client_venv, head, """
            import json
            from burla import remote_parallel_map
            print(json.dumps(remote_parallel_map(abs, [-1, -2, -3], spinner=False)))
        """, tmp_path) == [[1, 2, 3]]
        _burla(head, "settings", "update", "--inactivity-timeout", "3")  # now idle past it: deleted
        wait_until(lambda: not azure.machines, timeout=60, what="VM deleted")
        assert azure.logged("DELETE")[0].path.endswith(f"/virtualMachines/{node_id}")
    finally:
        head.stop()
        farm.close()


def test_a_vm_that_powered_itself_off_is_still_allocated_and_the_next_head_deletes_it(azure, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + ":/usr/bin:/bin")
    farm = AzureVmFarm(azure, tmp_path / "vms", answer=False)  # nothing sets it up
    head = start_head(tmp_path / "config", local_nodes=0, extra=[
        "--driver", "azure", "--region", "westus3", "--boot-deadline", "3", "--ssh-address-map", str(farm.map_path)])
    try:
        _burla(head, "settings", "update", "--quantity", "1")
        [node_id] = _burla(head, "cluster", "start")["booted"]
        assert "burla-dead-man --on-active=6s" in _custom_data(azure, node_id)
        head.process.kill()  # gone before it could set the VM up or delete it
        head.process.wait(30)
        # The VM's own timer shuts its guest down: Azure keeps it allocated (billed), "stopped".
        wait_until(lambda: farm.powered_off, timeout=90, what="the VM powered itself off")
        assert list(azure.power_states.values()) == ["stopped"] and azure.machines
        # The next head reads the power state and deletes it at once, not after its boot deadline.
        head = start_head(tmp_path / "config", local_nodes=0, extra=[
            "--driver", "azure", "--region", "westus3", "--boot-deadline", "600",
            "--ssh-address-map", str(farm.map_path)])
        wait_until(lambda: not azure.machines, timeout=60, what="the stopped VM deleted")
        assert azure.logged("DELETE")[0].path.endswith(f"/virtualMachines/{node_id}")
    finally:
        head.stop()
        farm.close()


def test_cloud_check_reads_the_subscription_and_says_what_azure_checks_at_boot(azure, tmp_path, monkeypatch):
    monkeypatch.setenv("BURLA_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("BURLA_BAKE_IMAGES", "1")  # baking's permissions are checked too
    done = subprocess.run([sys.executable, "-m", "burla", "cloud", "check", "--cloud", "azure", "--json"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    checks = {c["name"]: c for c in json.loads(done.stdout)["data"]["checks"]}
    assert checks["image baking"]["status"] == "ok" and "burla-images" in checks["image baking"]["detail"]
    assert checks["credentials"]["status"] == "ok" and SUBSCRIPTION in checks["credentials"]["detail"]
    assert checks["image"]["detail"] == "Canonical:ubuntu-24_04-lts:server:latest"
    assert checks["vCPU quota"]["status"] == "ok" and checks["vCPU quota"]["detail"].startswith("cores in eastus")
    assert checks["permissions"] == {"name": "permissions", "status": "ok", "fix": "",
                                     "detail": "every action booting needs is allowed on the subscription"}
    # A Reader (every */read action, nothing else) can't make the group, the network or the VMs.
    azure.permissions = [{"actions": ["*/read"], "notActions": []}]
    done = subprocess.run([sys.executable, "-m", "burla", "cloud", "check", "--cloud", "azure", "--json"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 9
    permissions = {c["name"]: c for c in json.loads(done.stdout)["data"]["checks"]}["permissions"]
    assert permissions["status"] == "fail" and "Contributor" in permissions["fix"]
    assert permissions["detail"].startswith("the account may not Microsoft.Resources/subscriptions/resourceGroups/"
                                            "write, Microsoft.Compute/virtualMachines/write")
    assert "virtualMachines/read" not in permissions["detail"]
    # Virtual Machine Contributor and Network Contributor on the existing group (no group writes needed).
    azure.groups[(SUBSCRIPTION, "burla-check")] = {}  # the group `cloud check` reads
    azure.permissions = [{"actions": ["Microsoft.Compute/virtualMachines/*", "Microsoft.Network/*"], "notActions": []}]
    done = subprocess.run([sys.executable, "-m", "burla", "cloud", "check", "--cloud", "azure", "--json"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    checks = {c["name"]: c for c in json.loads(done.stdout)["data"]["checks"]}
    permissions = checks["permissions"]
    assert permissions["status"] == "ok" and permissions["detail"].endswith("on the resource group"), permissions
    # Those roles can't keep images in burla-images: baking is told, not failed (boots install again).
    assert done.returncode == 0 and checks["image baking"]["status"] == "warn"
    assert "Microsoft.Compute/images/write" in checks["image baking"]["detail"]
    assert "BURLA_BAKE_IMAGES=0" in checks["image baking"]["fix"]
    azure.quotas["standardDASv5Family"] = 4  # the default Standard_D8as_v5 needs 8
    done = subprocess.run([sys.executable, "-m", "burla", "cloud", "check", "--cloud", "azure", "--json"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 9
    quota = {c["name"]: c for c in json.loads(done.stdout)["data"]["checks"]}["vCPU quota"]
    assert quota["status"] == "fail" and "standardDASv5Family in eastus: 4 vCPUs" in quota["detail"]
    monkeypatch.setenv("AZURE_CLIENT_SECRET", "wrong")
    done = subprocess.run([sys.executable, "-m", "burla", "cloud", "check", "--cloud", "azure", "--json"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 9
    [credentials] = json.loads(done.stdout)["data"]["checks"]
    assert credentials["status"] == "fail"


def test_azure_refusals_are_told_apart_and_grow_plans_within_the_family_quota(azure, tmp_path, monkeypatch,
                                                                             wheelhouse, client_venv):
    from burla.errors import CloudRefused
    from tests.support.helpers import start_grow_job

    async def boot(size: str):
        driver = _driver("westus3")
        try:
            return await driver.boot(BootRequest(1, "http://10.0.0.2:5001", "tok", machine_type=size,
                                                 ssh_public_key=CLUSTER_KEY))
        finally:
            await driver.close()

    azure.unavailable.add(("Standard_D8as_v5", "westus3"))  # the region can't place it; zones 1 and 3 neither
    azure.unavailable_zones |= {("Standard_D8as_v5", "westus3", "1"), ("Standard_D8as_v5", "westus3", "3")}
    asyncio.run(boot("Standard_D8as_v5"))
    tried = [r.body.get("zones") for r in azure.logged("PUT", "/virtualMachines/")]
    assert tried == [None, ["1"], ["2"]] and len(azure.machines) == 1  # zone 2 had room
    azure.unavailable_zones.add(("Standard_D8as_v5", "westus3", "2"))
    with pytest.raises(CloudRefused, match="Standard_D8as_v5 is currently not available") as unavailable:
        asyncio.run(boot("Standard_D8as_v5"))
    assert unavailable.value.kind == CloudRefused.CAPACITY  # what the region said, once no zone had room
    azure.machines.clear()
    azure.quotas["standardDASv5Family"] = 8
    asyncio.run(boot("Standard_D4as_v5"))
    with pytest.raises(CloudRefused, match="exceeding approved standardDASv5Family Cores quota") as quota:
        asyncio.run(boot("Standard_D8as_v5".replace("8", "16")))
    assert quota.value.kind == CloudRefused.QUOTA
    azure.machines.clear()
    azure.unavailable.clear()
    # A grow of 20 calls would want D16as + D4as; the family's 8 vCPUs take two D4as.
    farm, head = _azure_head(azure, tmp_path, monkeypatch, wheelhouse, "--inactivity-timeout", "3")
    try:
        job = start_grow_job(client_venv, head, tmp_path, 20)
        out, err = job.communicate(timeout=300)
        assert job.returncode == 0, err
        assert out.strip() == str(list(range(20)))
        sizes = [r.body["properties"]["hardwareProfile"]["vmSize"] for r in azure.logged("PUT", "/virtualMachines/")]
        assert sizes[-2:] == ["Standard_D4as_v5", "Standard_D4as_v5"]
        assert "'standardDASv5Family in westus3' is 8 vCPUs" in err
    finally:
        head.stop()
        farm.close()


def test_sizes_come_from_resource_skus_without_those_the_subscription_may_not_use(azure, tmp_path):
    from burla.drivers.machine_catalog import FROM_CLOUD, region_catalog
    from burla.errors import CloudRefused

    async def read(refresh: bool = False):
        driver = _driver("westus3")
        try:
            return await region_catalog(driver, "azure", tmp_path, refresh=refresh)
        finally:
            await driver.close()

    azure.sku_page_size = 5  # pages joined by nextLink
    azure.price_page_size = 10
    azure.not_for_subscription.add(("Standard_D96as_v5", "westus3"))
    catalog = asyncio.run(read())
    assert catalog.source == FROM_CLOUD and catalog.region == "westus3"
    assert azure.sku_listings == ["westus3"] * len(azure.logged("GET", "/skus")) and len(azure.sku_listings) > 1
    by_name = {m.name: m for m in catalog.machines}
    assert "Standard_D96as_v5" not in by_name and "Premium_LRS" not in by_name  # restricted; not a VM size
    d8 = by_name["Standard_D8as_v5"]
    assert (d8.vcpus, d8.memory_gb, d8.gpu, d8.arch) == (8, 32.0, None, "x86_64")
    assert d8.usd_per_hour == pytest.approx(8 * 0.0431)  # the Retail Prices API's Linux meter
    assert len(azure.logged("GET", "/api/retail/prices")) > 1  # every page was read
    assert by_name["Standard_D8ps_v5"].arch == "arm64"
    gpus = {name: (m.gpu, m.gpu_count) for name, m in by_name.items() if m.gpu}
    assert gpus["Standard_NC64as_T4_v3"] == ("T4", 4) and gpus["Standard_NC24ads_A100_v4"] == ("A100_80G", 1)
    assert gpus["Standard_ND96asr_v4"] == ("A100_40G", 8) and gpus["Standard_ND96isr_H100_v5"] == ("H100_80G", 8)

    async def boot_restricted():
        driver = _driver("westus3")
        try:
            return await driver.boot(BootRequest(1, "http://10.0.0.2:5001", "tok", machine_type="Standard_D96as_v5",
                                                 ssh_public_key=CLUSTER_KEY))
        finally:
            await driver.close()

    with pytest.raises(CloudRefused, match="Standard_D96as_v5 is currently not available"):
        asyncio.run(boot_restricted())  # what the listing left out, the API refuses too

    azure.prices_down = True  # prices are an estimate: without the API, libcloud's or the offline table's
    estimated = {m.name: m for m in asyncio.run(read(refresh=True)).machines}["Standard_D8as_v5"]
    assert estimated.usd_per_hour == pytest.approx(8 * 0.043)


def test_a_gpu_job_boots_a_size_of_the_listed_model_on_the_image_with_the_nvidia_driver(azure, tmp_path, monkeypatch,
                                                                                       wheelhouse, client_venv):
    from tests.support.helpers import start_gpu_job

    farm, head = _azure_head(azure, tmp_path, monkeypatch, wheelhouse)
    try:
        job = start_gpu_job(client_venv, head, tmp_path, "T4")
        out, err = job.communicate(timeout=300)
        assert job.returncode == 0, err
        assert out.strip() == '["0"]'  # the node offered the GPU nvidia-smi listed; the call had it to itself
        [created] = azure.logged("PUT", "/virtualMachines/")
        properties = created.body["properties"]
        assert properties["hardwareProfile"]["vmSize"] == "Standard_NC4as_T4_v3"  # the smallest T4 size listed
        assert properties["storageProfile"]["imageReference"]["publisher"] == "microsoft-dsvm"
        assert azure.sku_listings == ["westus3"]
    finally:
        head.stop()
        farm.close()


def test_a_token_near_its_expiry_is_renewed_before_resource_manager_would_refuse_it(azure):
    azure.token_lifetime_s = 60  # inside the five minutes before expiry: each use asks for a fresh one

    async def twice():
        driver = _driver("westus3")
        try:
            await driver.list_nodes()
            azure.expired_tokens |= set(azure.tokens_issued)  # a head that lives for days: its tokens expired
            await driver.list_nodes()
        finally:
            await driver.close()

    asyncio.run(twice())
    assert len(azure.tokens_issued) >= 2 and azure.tokens_issued[-1] not in azure.expired_tokens


@pytest.mark.timeout(600)
def test_a_managed_image_of_a_deprovisioned_generalized_builder_serves_the_next_vm(azure, tmp_path, monkeypatch,
                                                                                  wheelhouse):
    monkeypatch.setenv("BURLA_BAKE_IMAGES", "1")
    farm, head = _azure_head(azure, tmp_path, monkeypatch, wheelhouse)
    try:
        _burla(head, "settings", "update", "--quantity", "1", "--machine-type", "Standard_D4as_v5")
        _burla(head, "cluster", "start")
        [first] = wait_for_nodes(head, 1, timeout=240)
        wait_until(lambda: [i["properties"]["provisioningState"] for i in azure.images.values()] == ["Succeeded"],
                   timeout=240, what="an image baked")
        [image] = azure.images.values()
        key = image["tags"]["burla-image-key"]
        assert key.endswith("-ubuntu-24_04-lts-server-x86_64") and image["location"] == "westus3"
        assert image["properties"]["hyperVGeneration"] == "V2"  # the source VM's (Ubuntu's `server` SKU)
        builder = image["properties"]["sourceVirtualMachine"]["id"].rsplit("/", 1)[-1]
        assert builder.startswith("burla-bake-")
        [made] = [r.body for r in azure.logged("PUT", f"/virtualMachines/{builder}")]
        assert made["properties"]["hardwareProfile"]["vmSize"] == "Standard_D2as_v5"  # the family's smallest
        # Deprovisioned by its guest agent, deallocated, then generalized, in that order; then deleted.
        [deallocated] = azure.logged("POST", f"/virtualMachines/{builder}/deallocate")
        [generalized] = azure.logged("POST", f"/virtualMachines/{builder}/generalize")
        assert azure.requests.index(deallocated) < azure.requests.index(generalized)
        wait_until(lambda: not any(name.startswith("burla-bake-") for (_, _, name) in azure.machines), timeout=120,
                   what="the builder deleted")
        disk = tmp_path / "vms" / "images" / image["name"] / "home"
        assert (disk / ".ssh" / "authorized_keys").read_text() == ""  # no cluster's key in the image
        assert not (disk / ".burla" / "config").exists()
        assert (disk / ".burla" / "installed-build").exists()  # the runtime stayed with its user

        _burla(head, "settings", "update", "--quantity", "2")
        _burla(head, "cluster", "start")
        [second] = [n for n in wait_for_nodes(head, 2, timeout=240) if n["node_id"] != first["node_id"]]
        [vm] = [m for (_, _, name), m in azure.machines.items() if name == second["node_id"]]
        assert vm["properties"]["storageProfile"]["imageReference"] == {"id": image["id"]}
        assert list((farm.vm(second["node_id"]).home / ".burla" / "build").glob("*.whl")) == []  # nothing installed

        # An image serves its own region only: a node in eastus installs, and eastus gets its own.
        _burla(head, "settings", "update", "--quantity", "3", "--region", "eastus")
        _burla(head, "cluster", "start")
        wait_for_nodes(head, 3, timeout=240)
        wait_until(lambda: sorted((i["location"], i["properties"]["provisioningState"]) for i in azure.images.values())
                   == [("eastus", "Succeeded"), ("westus3", "Succeeded")], timeout=240, what="an image baked in eastus")
        [east] = [i for i in azure.images.values() if i["location"] == "eastus"]
        assert east["tags"]["burla-image-key"] == key

        listed = _burla(head, "cloud", "images", "list", "--cloud", "azure", "--json")
        assert sorted((i["image_id"], i["key"], i["state"], i["region"]) for i in listed["images"]) == sorted(
            [(image["name"], key, "available", "westus3"), (east["name"], key, "available", "eastus")])
        _burla(head, "cloud", "images", "delete", "--all", "--cloud", "azure", "--region", "westus3")
        assert [i["name"] for i in azure.images.values()] == [east["name"]]  # --all: the region's own
        _burla(head, "cloud", "images", "delete", east["name"], "--cloud", "azure")
        assert azure.images == {}
    finally:
        head.stop()
        farm.close()



def test_azure_refuses_imaging_steps_out_of_order_and_images_from_another_region(azure):
    """The stand-in's rules, which the driver's order of steps meets: no generalizing a running VM, no
    image of a VM that is not generalized, no VM from an image in another region."""
    from burla.drivers.azure.bake import start_image
    from burla.errors import CloudRefused

    def request(path: str, method: str, body: dict | None = None):
        def call(libcloud_driver):
            return libcloud_driver.connection.request(path, params={"api-version": "2024-07-01"}, method=method,
                                                      data=body).object
        return call

    async def steps() -> None:
        driver = _driver("westus3")
        group = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/burla-cluster-1/providers/Microsoft.Compute"
        try:
            [builder] = await driver.boot(BootRequest(1, "", "", machine_type="Standard_D2as_v5",
                                                      ssh_public_key=CLUSTER_KEY, node_ids=("burla-bake-1",)))
            vm = f"{group}/virtualMachines/{builder}"
            with pytest.raises(CloudRefused, match="not allowed on VM 'burla-bake-1' since the VM is running"):
                await driver._call(request(f"{vm}/generalize", "POST"))
            with pytest.raises(CloudRefused, match="must be generalized"):
                await driver._call(request(f"{group}/images/early", "PUT", {
                    "location": "westus3", "properties": {"sourceVirtualMachine": {"id": vm}}}))
            images = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/burla-cluster-1"
            azure.views_state_generation = False  # a generation guessed wrong makes an image that never boots
            with pytest.raises(CloudRefused, match="states no Hyper-V generation"):
                await driver._call(start_image, vm, images, "key-1", "westus3")
            azure.views_state_generation = True
            name = await driver._call(start_image, vm, images, "key-1", "westus3")
            image = await driver._call(request(f"{group}/images/{name}", "GET"))
            assert image["properties"]["provisioningState"] == "Succeeded"
            body = azure.logged("PUT", f"/virtualMachines/{builder}")[0].body
            body["properties"]["storageProfile"]["imageReference"] = {"id": image["id"]}
            nic = body["properties"]["networkProfile"]["networkInterfaceConfigurations"][0]["properties"]
            nic["ipConfigurations"][0]["properties"].pop("applicationSecurityGroups")  # westus3's: refused too
            with pytest.raises(CloudRefused, match="a VM in eastus can't use it"):
                await driver._call(request(f"{group}/virtualMachines/elsewhere", "PUT", {**body, "location": "eastus"}))
        finally:
            await driver.close()

    asyncio.run(steps())


def test_a_second_region_keeps_the_resource_group_and_an_arm_size_boots_the_arm_image(azure):
    """A resource group's location is fixed once made (the stand-in refuses a PUT naming another),
    VMs of any region live in it; an Arm size takes only an Arm image (the stand-in refuses x64)."""
    async def boot_each() -> list[str]:
        booted = []
        for region, size in (("westus3", "Standard_D2as_v5"), ("eastus", "Standard_D2as_v5"),
                             ("eastus", "Standard_D4ps_v5")):
            driver = _driver(region)
            try:
                booted += await driver.boot(BootRequest(1, "", "", machine_type=size, ssh_public_key=CLUSTER_KEY))
            finally:
                await driver.close()
        return booted

    assert len(asyncio.run(boot_each())) == 3
    assert sorted(vm["location"] for vm in azure.machines.values()) == ["eastus", "eastus", "westus3"]
    assert [g["location"] for g in azure.groups.values()] == ["westus3"]
    skus = {r.body["properties"]["hardwareProfile"]["vmSize"]: r.body["properties"]["storageProfile"][
        "imageReference"]["sku"] for r in azure.logged("PUT", "/virtualMachines/")}
    assert skus == {"Standard_D2as_v5": "server", "Standard_D4ps_v5": "server-arm64"}


def test_a_baked_image_deleted_since_the_lookup_leaves_the_boot_on_the_stock_image(azure, monkeypatch):
    """`burla cloud images delete` runs in another process: the head's lookup still names the image,
    Azure refuses the VM (NotFound), and the boot goes on from the stock image."""
    monkeypatch.setenv("BURLA_BAKE_IMAGES", "1")

    async def boot() -> list[str]:
        driver = _driver("westus3")
        try:
            request = BootRequest(1, "", "", machine_type="Standard_D2as_v5", ssh_public_key=CLUSTER_KEY)
            gone = f"{driver.image_group_path}/providers/Microsoft.Compute/images/burla-node-1-0123456789ab"
            driver.baked.remember(f"{driver._bake_key(request)}@westus3", gone)
            return await driver.boot(request)
        finally:
            await driver.close()

    assert len(asyncio.run(boot())) == 1
    references = [r.body["properties"]["storageProfile"]["imageReference"]
                  for r in azure.logged("PUT", "/virtualMachines/")]
    assert [reference.get("id", "").rsplit("/", 1)[-1] or reference["sku"] for reference in references] == [
        "burla-node-1-0123456789ab", "server"]


def test_an_image_builder_is_the_smallest_size_of_its_family_the_subscription_may_use(azure):
    azure.not_for_subscription.add(("Standard_D2ps_v5", "westus3"))

    async def builders() -> list[str | None]:
        driver = _driver("westus3")
        try:
            asked = [("Standard_D16as_v5", None), ("Standard_D8ps_v5", None), ("Standard_NC24ads_A100_v4", None),
                     ("Standard_D2as_v5", None), ("Standard_D4ps_v5", None), ("Standard_D8ps_v5", "East US")]
            return [await driver.builder_machine_type(BootRequest(1, "http://127.0.0.1:1", "t", machine_type=size,
                                                                  region=region)) for size, region in asked]
        finally:
            await driver.close()

    # The Arm family's 2-vCPU size is not for this subscription in westus3: its 4-vCPU one; a family
    # with neither builds on the node's own size, as does a size no larger than the builder; a node
    # in eastus (spelt as the portal does) builds there, where the 2-vCPU Arm size is allowed.
    assert asyncio.run(builders()) == ["Standard_D2as_v5", "Standard_D4ps_v5", "Standard_NC24ads_A100_v4",
                                       "Standard_D2as_v5", "Standard_D4ps_v5", "Standard_D2ps_v5"]


def test_a_nodes_ports_admit_its_own_clusters_nodes_only(azure):
    # Fails on the previous code: the shared group opened only port 22 and left the rest to Azure's
    # default AllowVnetInBound, so any VM in the network (another cluster's, in the same resource
    # group) reached every node's port.
    shared = {"BURLA_AZURE_RESOURCE_GROUP": "shared"}  # one group, so one virtual network, for both clusters
    ours = _driver(region="westeurope", **shared)
    theirs = _driver(region="westeurope", cluster_id="cluster-2", **shared)

    async def boot(driver, count):
        request = BootRequest(count, "http://10.0.0.2:5001", "t", 2, "Standard_D2as_v5", ssh_public_key=CLUSTER_KEY)
        try:
            return await driver.boot(request)
        finally:
            await driver.close()

    mine = asyncio.run(boot(ours, 2))
    [stranger] = asyncio.run(boot(theirs, 1))
    node_port = 41234  # nodes listen on a port of their choosing
    assert azure.admits(mine[0], node_port, mine[1]) and azure.admits(mine[1], node_port, mine[0])
    assert not azure.admits(mine[0], node_port, stranger)  # same network, another cluster
    assert not azure.admits(stranger, node_port, mine[0])
    assert not azure.admits(mine[0], node_port, "internet")
    assert azure.admits(mine[0], 22, "internet") and azure.admits(mine[0], 22, stranger)  # the head's SSH
