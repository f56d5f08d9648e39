"""The GCE driver against recorded Compute Engine API responses served on 127.0.0.1
(`tests/support/clouds/fake_gce.py`): the exact create request (startup script, labels, Spot, GPUs), listing,
deletion, boot logs, credential discovery from fake gcloud files, and a head that boots an
instance whose startup script (played here) joins, runs a job and is deleted when idle."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from burla.drivers.base import BootRequest
from tests.conftest import REPO, start_head, wait_for_nodes
from tests.support.clouds.fake_gce import FakeGce
from tests.support.clouds.vm_farms import GceVmFarm
from tests.support.helpers import get_json, run_client_in, wait_until

PROJECT = "burla-test"


def _service_account_key(token_uri: str) -> dict:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    return {"type": "service_account", "project_id": PROJECT, "private_key_id": "k1", "private_key": pem,
            "client_email": f"burla@{PROJECT}.iam.gserviceaccount.com", "client_id": "1", "token_uri": token_uri}


def _gcloud_config(directory, project: str | None = PROJECT, zone: str | None = "us-central1-a") -> None:
    (directory / "configurations").mkdir(parents=True, exist_ok=True)
    (directory / "active_config").write_text("work")
    lines = ["[core]", f"project = {project}" if project else "", "[compute]", f"zone = {zone}" if zone else ""]
    (directory / "configurations" / "config_work").write_text("\n".join(lines) + "\n")


def _clean_google_environment(monkeypatch, home) -> None:
    for key in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "GCLOUD_PROJECT",
                "CLOUDSDK_COMPUTE_ZONE", "CLOUDSDK_COMPUTE_REGION", "CLOUDSDK_ACTIVE_CONFIG_NAME", "BURLA_GCP_IMAGE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(home / "gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "true")  # never look for a GCE metadata server
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")


@pytest.fixture
def gce(monkeypatch, tmp_path):
    fake = FakeGce()
    home = tmp_path / "home"
    home.mkdir()
    _clean_google_environment(monkeypatch, home)
    _gcloud_config(home / "gcloud")
    key_file = home / "sa.json"
    key_file.write_text(json.dumps(_service_account_key(fake.url + "/token")))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file))
    monkeypatch.setenv("CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE", fake.url + "/compute/v1/")
    monkeypatch.setenv("CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDRESOURCEMANAGER", fake.url + "/")
    monkeypatch.setenv("CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDBILLING", fake.url + "/")
    monkeypatch.setenv("BURLA_BAKE_IMAGES", "0")  # heads bake after a first boot: test_bake turns it on
    try:
        yield fake
    finally:
        fake.stop()


def _driver(region: str | None = None, cluster_id: str = "cluster-1"):
    from burla.drivers.gcp.driver import GceConfig, GceDriver

    return GceDriver(GceConfig.from_environment(dict(os.environ), region, cluster_id))


CLUSTER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGSoU/Sv+4Aho0bDRzg6Jfw/gNeQpWA7MK3bgrvqtfIJ burla-cluster-1"


def test_create_request_carries_the_ssh_key_labels_spot_and_gpus_then_list_and_delete(gce):
    driver = _driver(region="us-east1")

    async def scenario():
        t4 = BootRequest(1, "http://10.0.0.2:5001", "secret-token", 4, "n1-standard-8", None, 50, None, True, "T4",
                         2, python_version="3.12", ssh_public_key=CLUSTER_KEY)
        a100 = BootRequest(1, "http://10.0.0.2:5001", "secret-token", None, "a2-highgpu-1g", None, None, None, False,
                           "A100_40G", 1, ssh_public_key=CLUSTER_KEY)
        booted = await driver.boot(t4) + await driver.boot(a100)
        listed = await driver.list_nodes()
        console = await driver.boot_log(booted[0])
        deleted = [await driver.delete(booted[0]), await driver.delete("burla-node-unknown")]
        after = await driver.list_nodes()
        await driver.close()
        return booted, listed, console, deleted, after

    booted, listed, console, deleted, after = asyncio.run(scenario())
    t4_body, a100_body = (r.body for r in gce.logged("POST", "/instances"))
    # The region has zones b, c, d: the first is used; the token came from the service-account key.
    assert [r.path for r in gce.logged("POST", "/instances")] == [
        f"/compute/v1/projects/{PROJECT}/zones/us-east1-b/instances"] * 2
    assert gce.token_assertions[0]["iss"] == f"burla@{PROJECT}.iam.gserviceaccount.com"
    assert t4_body["name"] == booted[0]
    assert t4_body["machineType"].endswith("/zones/us-east1-b/machineTypes/n1-standard-8")
    assert t4_body["labels"] == {"burla-cluster": "cluster-1", "burla-node-id": booted[0]}
    assert t4_body["scheduling"] == {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE",
                                     "automaticRestart": False, "onHostMaintenance": "TERMINATE"}
    [accelerator] = t4_body["guestAccelerators"]
    assert accelerator["acceleratorType"].endswith("/acceleratorTypes/nvidia-tesla-t4")
    assert accelerator["acceleratorCount"] == 2
    boot_disk = t4_body["disks"][0]["initializeParams"]
    # GPUs boot a Deep Learning VM image, told to install the NVIDIA driver where it lacks it.
    assert boot_disk["diskSizeGb"] == 50 and boot_disk["sourceImage"].endswith(
        "/deeplearning-platform-release/global/images/common-cu128-ubuntu-2204-nvidia-570-v20261110")
    # The cluster's key for user burla, and guest attributes on (the guest agent reports the SSH
    # host keys there) are the only other metadata: no startup script, no secret.
    assert t4_body["metadata"]["items"] == [{"key": "ssh-keys", "value": f"burla:{CLUSTER_KEY}"},
                                            {"key": "enable-oslogin", "value": "FALSE"},
                                            {"key": "enable-guest-attributes", "value": "TRUE"},
                                            {"key": "install-nvidia-driver", "value": "True"}]
    assert "secret-token" not in json.dumps([r.body for r in gce.requests])
    # A machine type with GPUs built in gets no extra accelerators, but can't live-migrate.
    assert "guestAccelerators" not in a100_body
    assert a100_body["scheduling"] == {"onHostMaintenance": "TERMINATE"}
    assert sorted(n.node_id for n in listed) == sorted(booted) and {n.state for n in listed} == {"RUNNING"}
    assert all(r.query["filter"] == "labels.burla-cluster = cluster-1" for r in gce.logged("GET", "/aggregated/"))
    assert "startup-script" in console
    assert deleted == [True, False]
    assert [n.node_id for n in after] == [booted[1]]
    assert gce.logged("DELETE") and gce.logged("DELETE")[0].path.endswith(f"/us-east1-b/instances/{booted[0]}")


def test_an_unknown_gpu_is_refused_before_any_instance_is_created(gce):
    from burla.errors import CloudSetupError

    driver = _driver()
    request = BootRequest(1, "http://10.0.0.2:5001", "tok", gpu="Z9000", gpu_count=1)
    with pytest.raises(CloudSetupError, match="no accelerator for GPU 'Z9000'"):
        asyncio.run(driver.boot(request))
    asyncio.run(driver.close())
    assert not gce.instances


def test_boot_disks_fit_their_machine_series(gce):
    # N4 boots from Hyperdisk Balanced only, N1 from Persistent Disk only: a boot of either works.
    driver = _driver()

    async def scenario():
        for machine_type in ("n4-standard-4", "n1-standard-4", None, "c4a-standard-4"):  # None: the default
            await driver.boot(BootRequest(1, "http://10.0.0.2:5001", "tok", machine_type=machine_type,
                                          ssh_public_key=CLUSTER_KEY))
        await driver.close()

    asyncio.run(scenario())
    boots = [r.body["disks"][0]["initializeParams"] for r in gce.logged("POST", "/instances")]
    assert [boot["diskType"].rsplit("/", 1)[-1] for boot in boots] == [
        "hyperdisk-balanced", "pd-balanced", "hyperdisk-balanced", "hyperdisk-balanced"]
    # The Arm machine boots the Arm twin of the image family.
    assert ["/debian-12-arm64-" in boot["sourceImage"] for boot in boots] == [False, False, False, True]
    assert len(gce.instances) == 4


def test_the_stand_in_refuses_what_compute_engine_refuses(gce):
    # The rules the driver must meet, on the stand-in itself: a boot disk its series does not take,
    # a machine type the zone lacks, and the region's CPU quota, each in the API's own words.
    import urllib.error
    import urllib.request

    def insert(name: str, machine_type: str, disk_type: str) -> tuple[int, str]:
        zone = f"{gce.url}/compute/v1/projects/{PROJECT}/zones/us-central1-a"
        image = "projects/debian-cloud/global/images/debian-12-v20261110"  # x86
        body = {"name": name, "machineType": f"{zone}/machineTypes/{machine_type}",
                "disks": [{"boot": True, "initializeParams": {"diskType": f"{zone}/diskTypes/{disk_type}",
                                                              "sourceImage": image}}]}
        request = urllib.request.Request(f"{zone}/instances", json.dumps(body).encode(), method="POST",
                                         headers={"Authorization": f"Bearer {gce.tokens_issued[-1]}",
                                                  "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request) as answer:
                return answer.status, ""
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())["error"]["message"]

    asyncio.run(_driver().list_nodes())  # a token, as the driver gets one
    assert insert("a", "n4-standard-4", "pd-balanced") == (
        400, "[pd-balanced, n4-standard-4] features are not compatible for creating instance.")
    assert insert("b", "n2-standard-4", "hyperdisk-balanced")[0] == 400
    assert insert("e", "c4a-standard-4", "hyperdisk-balanced") == (
        400, "Invalid resource usage: 'The machine type c4a-standard-4 has architecture ARM64, which is not compatible "
             "with the image architecture X86_64.'")
    assert insert("c", "n4-standard-16", "hyperdisk-balanced") == (200, "")
    assert insert("d", "n4-standard-16", "hyperdisk-balanced") == (
        403, "Quota 'CPUS' exceeded.  Limit: 24.0 in region us-central1.")
    assert [name for (_, _, name) in gce.instances] == ["c"]


def test_a_refused_boot_names_the_clouds_reason_and_keeps_what_did_start(gce):
    from burla.errors import CloudRefused

    driver = _driver()

    async def boot(request: BootRequest):
        try:
            return await driver.boot(request)
        finally:
            await driver.close()

    with pytest.raises(CloudRefused, match="machineTypes/zz9-standard-4' was not found") as unknown:
        asyncio.run(boot(BootRequest(1, "http://10.0.0.2:5001", "tok", machine_type="zz9-standard-4")))
    assert unknown.value.booted == [] and not gce.instances
    # Three 8-vCPU machines against the region's 24 CPUs, less the 8 of one already there: two start.
    driver = _driver()
    asyncio.run(boot(BootRequest(1, "http://10.0.0.2:5001", "tok", machine_type="n4-standard-8")))
    driver = _driver()
    with pytest.raises(CloudRefused, match=r"1 of 3 machine\(s\) of type n4-standard-8 could not start: .*"
                                           r"Quota 'CPUS' exceeded.  Limit: 24.0 in region us-central1") as quota:
        asyncio.run(boot(BootRequest(3, "http://10.0.0.2:5001", "tok", machine_type="n4-standard-8")))
    assert len(quota.value.booted) == 2 and all(any(name == n for (_, _, name) in gce.instances)
                                                for n in quota.value.booted)
    assert len(gce.instances) == 3


def test_project_and_zone_come_from_the_active_gcloud_configuration(monkeypatch, tmp_path):
    from burla.drivers.gcp.config import GceConfig, GoogleToken

    _clean_google_environment(monkeypatch, tmp_path)
    _gcloud_config(tmp_path / "gcloud", project="from-gcloud", zone="europe-west4-b")
    # gcloud's application-default login file (a user's refresh token); found without any network call.
    (tmp_path / "gcloud" / "application_default_credentials.json").write_text(json.dumps(
        {"type": "authorized_user", "client_id": "c.apps.googleusercontent.com", "client_secret": "s",
         "refresh_token": "1//r"}))
    config = GceConfig.from_environment(dict(os.environ), None, "c1")
    assert (config.project, config.zone, config.region) == ("from-gcloud", "europe-west4-b", None)
    assert type(GoogleToken()._load()).__module__ == "google.oauth2.credentials"
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "from-env")  # the environment wins, as with gcloud
    assert GceConfig.from_environment(dict(os.environ), None, "c1").project == "from-env"


def test_an_unset_project_or_missing_credentials_name_the_gcloud_fix(monkeypatch, tmp_path):
    from burla.drivers.gcp.config import GceConfig, GoogleToken
    from burla.errors import CloudSetupError

    _clean_google_environment(monkeypatch, tmp_path)
    _gcloud_config(tmp_path / "gcloud", project=None)
    with pytest.raises(CloudSetupError, match=r"gcloud config set project PROJECT_ID"):
        GceConfig.from_environment(dict(os.environ), None, "c1")
    with pytest.raises(CloudSetupError, match=r"gcloud auth application-default login"):
        _ = GoogleToken().access_token


def test_a_refused_key_names_the_fix(gce):
    from burla.errors import CloudSetupError

    gce.refuse_tokens = True
    driver = _driver()
    with pytest.raises(CloudSetupError, match="refused.*gcloud auth application-default login"):
        asyncio.run(driver.list_nodes())
    asyncio.run(driver.close())


def _burla(head, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "burla", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120, env=dict(os.environ, **head.env()))
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])["data"]


def _cloud_head(tmp_path, farm, wheelhouse, *extra: str):
    return start_head(tmp_path / "config", local_nodes=0, extra=[
        "--driver", "gce", "--node-wheelhouse", str(wheelhouse), "--ssh-address-map", str(farm.map_path), *extra])


@pytest.fixture
def farm(gce, tmp_path):
    farm = GceVmFarm(gce, tmp_path / "vms")
    yield farm
    farm.close()


def test_cluster_start_boots_gce_instances_that_join_run_jobs_and_go_when_idle(gce, farm, tmp_path, wheelhouse,
                                                                               client_venv):
    gce.project_metadata["enable-oslogin"] = "TRUE"  # the project turns OS Login on; burla's VMs turn it off
    head = _cloud_head(tmp_path, farm, wheelhouse)  # idle timeout set after the job: see below
    try:
        _burla(head, "settings", "update", "--quantity", "1", "--machine-type", "n4-standard-4", "--spot",
               "--disk-gb", "40")
        assert len(_burla(head, "cluster", "start")["booted"]) == 1
        [insert] = gce.logged("POST", "/instances")
        assert insert.path == f"/compute/v1/projects/{PROJECT}/zones/us-central1-a/instances"  # gcloud's zone
        assert insert.body["machineType"].endswith("/machineTypes/n4-standard-4")
        assert insert.body["scheduling"]["provisioningModel"] == "SPOT"
        assert insert.body["disks"][0]["initializeParams"]["diskSizeGb"] == 40
        metadata, oslogin, startup, guest_attributes = insert.body["metadata"]["items"]
        assert guest_attributes == {"key": "enable-guest-attributes", "value": "TRUE"}  # host keys reported there
        assert metadata["key"] == "ssh-keys" and metadata["value"].startswith("burla:ssh-ed25519 ")
        assert oslogin == {"key": "enable-oslogin", "value": "FALSE"}
        # The power-off timer a VM runs at boot: two boot deadlines (900 s each by default).
        assert startup["key"] == "startup-script" and "--on-active=1800s" in startup["value"]
        assert head.token not in json.dumps(insert.body)
        node_id = insert.body["labels"]["burla-node-id"]
        wait_for_nodes(head, 1, timeout=240)
        assert farm.vm(node_id).logins[0] == "burla"  # the user the ssh-keys metadata names
        # The project has no default-allow-ssh rule (the stand-in's firewall lets nothing in
        # unless a rule does): the driver made the nodes' own.
        rules = {f.body["name"]: f.body for f in gce.logged("POST", "/global/firewalls")}
        assert rules["burla-nodes-ssh-default"]["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]
        [peers] = [rule for name, rule in rules.items() if name.startswith("burla-peers-")]
        assert peers["sourceTags"] == peers["targetTags"] and peers["sourceTags"][0].startswith("burla-node-")
        assert get_json(head, "/v1/cluster")["nodes"][0]["node_id"] == node_id
        assert run_client_in(client_venv, head, """
            import json
            from burla import remote_parallel_map
            print(json.dumps(remote_parallel_map(abs, [-1, -2, -3], spinner=False)))
        """, tmp_path) == [[1, 2, 3]]
        # Idle past the timeout: the head deletes the instance through the driver. (Set now: with
        # it set from the start, a client slow to start on a loaded machine found the node gone.)
        _burla(head, "settings", "update", "--inactivity-timeout", "3")
        wait_until(lambda: not gce.instances, timeout=60, what="instance deleted")
        assert gce.logged("DELETE")[0].path.endswith(f"/zones/us-central1-a/instances/{node_id}")
    finally:
        head.stop()


def test_cluster_start_past_the_quota_says_so_and_keeps_the_machines_that_started(gce, farm, tmp_path,
                                                                                   wheelhouse):
    gce.cpus_quota = 8
    head = _cloud_head(tmp_path, farm, wheelhouse)
    try:
        _burla(head, "settings", "update", "--quantity", "3", "--machine-type", "n4-standard-4")
        done = subprocess.run([sys.executable, "-m", "burla", "cluster", "start"], capture_output=True, text=True,
                              cwd=REPO, timeout=120, env=dict(os.environ, **head.env()))
        assert done.returncode == 9, done.stdout + done.stderr  # EXIT_CLOUD, not a head error
        error = json.loads(done.stdout.strip().splitlines()[-1])["error"]
        assert error["code"] == "cloud_refused"
        assert "Quota 'CPUS' exceeded.  Limit: 8.0 in region us-central1" in error["message"]
        started = error["message"].split("Started anyway: ")[1].rstrip(".").split(", ")
        assert len(started) == 2 and {name for (_, _, name) in gce.instances} == set(started)
        wait_for_nodes(head, 2, timeout=240)  # the two that started join and are the cluster's
    finally:
        head.stop()


def test_a_node_that_stops_on_its_own_has_its_instance_deleted_by_the_head(gce, farm, tmp_path, wheelhouse):
    head = _cloud_head(tmp_path, farm, wheelhouse)  # no idle timeout
    try:
        _burla(head, "settings", "update", "--quantity", "1")
        [node_id] = _burla(head, "cluster", "start")["booted"]
        wait_for_nodes(head, 1, timeout=240)
        farm.vm(node_id).node_process().terminate()  # SIGTERM: the node tells the head it is leaving
        wait_until(lambda: not gce.instances, timeout=60, what="instance deleted")
        assert gce.logged("DELETE")[0].path.endswith(f"/instances/{node_id}")

        def recorded() -> set[str]:
            return {e["event"] for e in get_json(head, f"/v1/nodes/{node_id}/events")["events"]}

        wait_until(lambda: {"leaving", "deleted"} <= recorded(), what="leaving and deletion in history")
    finally:
        head.stop()


def test_a_silent_node_has_its_instance_deleted_once_declared_dead(gce, farm, tmp_path, wheelhouse):
    head = _cloud_head(tmp_path, farm, wheelhouse, "--node-deadline", "2")
    try:
        _burla(head, "settings", "update", "--quantity", "1")
        [node_id] = _burla(head, "cluster", "start")["booted"]
        wait_for_nodes(head, 1, timeout=240)
        farm.vm(node_id).node_process().suspend()  # a frozen VM: it costs money and does nothing
        wait_until(lambda: not gce.instances, timeout=60, what="instance deleted")
        assert gce.logged("DELETE")[0].path.endswith(f"/instances/{node_id}")
    finally:
        head.stop()


def _cloud_check(*args: str) -> tuple[int, dict[str, dict]]:
    done = subprocess.run([sys.executable, "-m", "burla", "cloud", "check", "--cloud", "gcp", "--json", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    return done.returncode, {c["name"]: c for c in json.loads(done.stdout)["data"]["checks"]}


def test_cloud_check_reads_the_project_the_machine_type_image_quota_and_firewall(gce, tmp_path, monkeypatch):
    monkeypatch.setenv("BURLA_CONFIG_DIR", str(tmp_path / "config"))
    code, checks = _cloud_check()
    assert code == 0 and [c["status"] for c in checks.values()] == ["ok"] * 6
    assert checks["credentials"]["detail"].startswith(f"project {PROJECT}")
    assert checks["permissions"]["detail"] == "all 17 permissions booting needs are held"
    assert "hyperdisk-balanced" in checks["machine type"]["detail"]  # the default n4's boot disk
    assert checks["vCPU quota"]["detail"] == "CPUS in us-central1: 24 vCPUs, 0 in use"
    assert "the first boot makes firewall rule burla-nodes-ssh-default" in checks["ssh path"]["detail"]
    gce.cpus_quota = 2
    code, checks = _cloud_check("--machine-type", "n2-standard-8")
    assert code == 9 and checks["vCPU quota"]["status"] == "fail" and "Quotas" in checks["vCPU quota"]["fix"]
    code, checks = _cloud_check("--machine-type", "zz9-standard-4")
    assert code == 9 and checks["machine type"]["status"] == "fail"
    gce.denied_permissions |= {"compute.firewalls.create", "compute.instances.create"}  # e.g. a viewer's role
    code, checks = _cloud_check()
    assert code == 9 and checks["permissions"]["status"] == "fail"
    assert checks["permissions"]["detail"] == "the account lacks compute.instances.create, compute.firewalls.create"
    assert "roles/compute.instanceAdmin.v1" in checks["permissions"]["fix"]


def test_grow_reads_the_regions_cpu_quota_and_boots_within_it(gce, farm, tmp_path, wheelhouse, client_venv):
    from tests.support.helpers import start_grow_job

    gce.cpus_quota = 8  # 20 calls would want n4-standard-16 + n4-standard-4
    head = _cloud_head(tmp_path, farm, wheelhouse, "--inactivity-timeout", "3")
    try:
        job = start_grow_job(client_venv, head, tmp_path, 20)
        out, err = job.communicate(timeout=300)
        assert job.returncode == 0, err
        assert out.strip() == str(list(range(20)))
        inserts = [r.body["machineType"].rsplit("/", 1)[-1] for r in gce.logged("POST", "/instances")]
        assert inserts == ["n4-standard-4", "n4-standard-4"]  # nothing was refused: planned within the quota
        assert "growing for this job was limited (20 vCPUs planned)" in err
        assert "'CPUS in us-central1' is 8 vCPUs" in err and "compute.googleapis.com/cpus" in err
        assert set(gce.machine_listings) == {"us-central1-a", "us-central1-b", "us-central1-c", "us-central1-d"}
    finally:
        head.stop()


def test_a_gpu_job_boots_a_deep_learning_vm_whose_driver_lists_its_gpus(gce, farm, tmp_path, wheelhouse,
                                                                         client_venv):
    from tests.support.helpers import start_gpu_job

    head = _cloud_head(tmp_path, farm, wheelhouse)
    try:
        job = start_gpu_job(client_venv, head, tmp_path, "A100")
        out, err = job.communicate(timeout=300)
        assert job.returncode == 0, err
        assert out.strip() == '["0"]'  # the node offered the GPU nvidia-smi listed; the call had it to itself
        [insert] = gce.logged("POST", "/instances")
        assert insert.body["machineType"].endswith("/machineTypes/a2-highgpu-1g")  # A100 40 GB built in
        assert "guestAccelerators" not in insert.body
        assert "/deeplearning-platform-release/" in insert.body["disks"][0]["initializeParams"]["sourceImage"]
        items = {i["key"]: i["value"] for i in insert.body["metadata"]["items"]}
        assert items["install-nvidia-driver"] == "True"
    finally:
        head.stop()


def test_a_zone_out_of_capacity_is_passed_over_for_the_regions_next(gce):
    from burla.errors import CloudRefused

    async def boot(machine_type: str):
        driver = _driver()
        try:
            return await driver.boot(BootRequest(1, "http://10.0.0.2:5001", "tok", machine_type=machine_type))
        finally:
            await driver.close()

    gce.exhausted.add(("n4-standard-8", "us-central1-a"))  # the configured zone
    asyncio.run(boot("n4-standard-8"))
    assert [zone for (_, zone, _) in gce.instances] == ["us-central1-b"]
    gce.exhausted |= {("n4-standard-2", zone) for zone in ("us-central1-a", "us-central1-b", "us-central1-c",
                                                             "us-central1-d")}
    with pytest.raises(CloudRefused, match="no zone had capacity for n4-standard-2: us-central1-a: The zone") as none:
        asyncio.run(boot("n4-standard-2"))
    assert none.value.kind == CloudRefused.CAPACITY and len(gce.instances) == 1


def test_with_os_login_on_for_a_vm_its_ssh_keys_metadata_is_ignored(gce, farm):
    # The stand-in's rule itself: a VM without enable-oslogin=FALSE of its own, in a project with
    # OS Login on, authorises no ssh-keys key (so the head's login would be refused).
    gce.project_metadata["enable-oslogin"] = "TRUE"
    gce.instances[(PROJECT, "us-central1-a", "plain")] = {
        "id": "1", "name": "plain", "status": "RUNNING", "labels": {},
        "machineType": "zones/us-central1-a/machineTypes/e2-standard-2",
        "metadata": {"items": [{"key": "ssh-keys", "value": "burla:ssh-ed25519 AAAA burla"}]},
        "networkInterfaces": [{"networkIP": "10.0.0.9", "accessConfigs": []}]}
    [record] = farm._records()
    assert (record.login_user, record.authorized_key) == (None, "")
    gce.project_metadata["enable-oslogin"] = "FALSE"
    [record] = farm._records()
    assert (record.login_user, record.authorized_key) == ("burla", "ssh-ed25519 AAAA burla")


def test_machine_types_are_listed_for_each_zone_of_the_region_page_by_page(gce, tmp_path):
    from burla.drivers.machine_catalog import FROM_CLOUD, region_catalog

    def catalog(region: str):
        async def read():
            driver = _driver(region=region)
            try:
                return await region_catalog(driver, "gcp", tmp_path / region)
            finally:
                await driver.close()
        return asyncio.run(read())

    gce.page_size = 7  # the API's pages are 500 long; zones list more machine types than that
    gce.sku_page_size = 40  # the price catalog's are 5,000 long, over tens of thousands of SKUs
    gce.withdrawn |= {("n4-standard-80", zone) for zone in ("us-central1-a", "us-central1-b", "us-central1-c",
                                                            "us-central1-d")}
    central = catalog("us-central1")
    assert central.source == FROM_CLOUD and central.region == "us-central1"
    assert sorted(set(gce.machine_listings)) == ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-d"]
    assert len(gce.logged("GET", "/machineTypes")) > 4 * 7  # more than one page per zone
    by_name = {m.name: m for m in central.machines}
    assert "n4-standard-80" not in by_name  # no zone of the region offers it
    n4 = by_name["n4-standard-8"]
    assert (n4.vcpus, n4.memory_gb, n4.gpu, n4.arch) == (8, 32.0, None, "x86_64")
    # Prices from the Cloud Billing Catalog's on-demand rates (read page by page; Spot, commitment,
    # custom and sole-tenant SKUs passed over): a series' vCPU and GiB rates, plus built-in GPUs.
    assert gce.sku_listings > 1
    assert n4.usd_per_hour == pytest.approx(8 * 0.030294 + 32 * 0.004070, abs=1e-4)
    assert by_name["n1-standard-8"].usd_per_hour == pytest.approx(8 * 0.031611 + 30 * 0.004237, abs=1e-4)
    assert by_name["n2d-standard-8"].usd_per_hour == pytest.approx(8 * 0.027502 + 32 * 0.003686, abs=1e-4)
    assert by_name["a2-highgpu-2g"].usd_per_hour == pytest.approx(24 * 0.031611 + 170 * 0.004237 + 2 * 2.933908,
                                                                  abs=1e-3)
    assert by_name["a3-highgpu-8g"].usd_per_hour == pytest.approx(208 * 0.03984 + 1872 * 0.00534 + 8 * 11.06125,
                                                                  abs=1e-3)  # A3 High's H100 rate, not A3 Mega's
    assert by_name["g2-standard-24"].usd_per_hour == pytest.approx(24 * 0.024988 + 96 * 0.002927 + 2 * 0.560706,
                                                                   abs=1e-3)
    assert (by_name["a2-highgpu-2g"].gpu, by_name["a2-highgpu-2g"].gpu_count, by_name["a2-highgpu-2g"].vcpus) == (
        "A100_40G", 2, 24)
    assert by_name["a2-ultragpu-1g"].gpu == "A100_80G" and by_name["a3-highgpu-8g"].gpu == "H100_80G"
    assert (by_name["g2-standard-24"].gpu, by_name["g2-standard-24"].gpu_count) == ("L4", 2)
    assert by_name["c4a-standard-8"].arch == "arm64"
    east = {m.name for m in catalog("us-east1").machines}
    assert "a2-highgpu-1g" in east and "a3-highgpu-8g" not in east  # A3 is not offered in us-east1's zones
    # A project without the Cloud Billing API: libcloud's rates where it has them, else the offline estimate.
    gce.billing_disabled = True
    fallback = {m.name: m for m in catalog("europe-west4").machines}
    assert fallback["n4-standard-8"].usd_per_hour == pytest.approx(8 * 0.0474)
    assert fallback["n2-standard-8"].usd_per_hour is not None


@pytest.mark.timeout(600)
def test_a_baked_image_of_a_builders_disk_serves_the_next_vm(gce, farm, tmp_path, wheelhouse, monkeypatch):
    from tests.support.helpers import wait_until

    monkeypatch.setenv("BURLA_BAKE_IMAGES", "1")
    head = _cloud_head(tmp_path, farm, wheelhouse)
    try:
        _burla(head, "settings", "update", "--quantity", "1", "--machine-type", "n4-standard-4")
        _burla(head, "cluster", "start")
        [first] = wait_for_nodes(head, 1, timeout=240)
        wait_until(lambda: [i["status"] for i in gce.images.values()] == ["READY"], timeout=240, what="an image")
        [builder] = [r.body for r in gce.logged("POST", "/instances") if r.body["name"].startswith("burla-bake-")]
        assert builder["machineType"].endswith("/n4-standard-2")  # the series' smallest: cheap, little quota
        [image] = gce.images.values()
        assert image["labels"]["burla-image-key"].endswith("-debian-12-x86_64")
        assert image["sourceDisk"].startswith("zones/us-central1-a/disks/burla-bake-")
        wait_until(lambda: not any(name.startswith("burla-bake-") for (_, _, name) in gce.instances), timeout=120,
                   what="the builder deleted")
        assert (tmp_path / "vms" / "images" / image["name"] / "home" / ".ssh" / "authorized_keys").read_text() == ""
        _burla(head, "settings", "update", "--quantity", "2")
        _burla(head, "cluster", "start")
        [second] = [n for n in wait_for_nodes(head, 2, timeout=240) if n["node_id"] != first["node_id"]]
        [instance] = [i for i in gce.instances.values() if i["labels"].get("burla-node-id") == second["node_id"]]
        assert instance["sourceImage"] == image["selfLink"]
        assert list((farm.vm(second["node_id"]).home / ".burla" / "build").glob("*.whl")) == []  # nothing installed
        listed = _burla(head, "cloud", "images", "list", "--cloud", "gcp", "--json")
        assert [(i["image_id"], i["state"]) for i in listed["images"]] == [(image["name"], "available")]
        _burla(head, "cloud", "images", "delete", "--all", "--cloud", "gcp")
        assert gce.images == {}
    finally:
        head.stop()


def test_a_token_near_its_expiry_is_renewed_before_the_api_would_refuse_it(gce):
    gce.token_lifetime_s = 60  # inside google-auth's refresh margin: each use asks for a fresh one

    async def twice():
        driver = _driver()
        try:
            await driver.list_nodes()
            gce.expired_tokens |= set(gce.tokens_issued)  # a head that lives for days: its tokens expired
            await driver.list_nodes()
        finally:
            await driver.close()

    asyncio.run(twice())
    assert len(gce.tokens_issued) >= 2 and gce.tokens_issued[-1] not in gce.expired_tokens


def test_an_image_builder_is_the_smallest_standard_type_its_series_offers(gce):
    async def builders() -> list[str | None]:
        driver = _driver()
        try:
            asked = [("n4-standard-32", None), ("c3-standard-22", None), (None, None), ("n4-standard-2", None),
                     ("n1-standard-1", None), ("c4a-standard-16", "europe-west4"), ("c4a-standard-16", "us-east1")]
            return [await driver.builder_machine_type(BootRequest(1, "http://127.0.0.1:1", "t", machine_type=name,
                                                                  region=region)) for name, region in asked]
        finally:
            await driver.close()

    # Never larger than the node's own type (n4-standard-2, n1-standard-1 build on themselves), and
    # asked of the zone the node boots in: C4A is offered in europe-west4, not in us-east1.
    assert asyncio.run(builders()) == ["n4-standard-2", "c3-standard-4", "n4-standard-2", "n4-standard-2",
                                       "n1-standard-1", "c4a-standard-2", "c4a-standard-16"]


def test_a_baked_image_deleted_since_the_lookup_leaves_the_boot_on_the_stock_image(gce, monkeypatch):
    """`burla cloud images delete` runs in another process: the head's lookup still names the image,
    Compute Engine has no such image (404), and the boot goes on from the stock image."""
    monkeypatch.setenv("BURLA_BAKE_IMAGES", "1")

    async def boot() -> list[str]:
        driver = _driver()
        try:
            request = BootRequest(1, "", "", machine_type="n4-standard-2", ssh_public_key=CLUSTER_KEY)
            driver.baked.remember(await driver.bake_key(request), "burla-node-1-0123456789ab")
            return await driver.boot(request)
        finally:
            await driver.close()

    assert len(asyncio.run(boot())) == 1
    [vm] = gce.instances.values()
    assert "/debian-cloud/global/images/debian-12" in vm["sourceImage"]


def test_a_nodes_ports_admit_its_own_clusters_nodes_only(gce):
    # Fails on the previous code: one rule admitted any port from every instance tagged burla-node,
    # whichever cluster it belonged to.
    async def boot(cluster_id: str, count: int) -> list[str]:
        driver = _driver(cluster_id=cluster_id)
        try:
            return await driver.boot(BootRequest(count, "http://10.0.0.2:5001", "t", 2, "n4-standard-2",
                                                 ssh_public_key=CLUSTER_KEY))
        finally:
            await driver.close()

    mine, [stranger] = asyncio.run(boot("ours", 2)), asyncio.run(boot("theirs", 1))
    node_port = 41234  # nodes listen on a port of their choosing
    assert gce.admits(mine[0], node_port, mine[1]) and gce.admits(mine[1], node_port, mine[0])
    assert not gce.admits(mine[0], node_port, stranger) and not gce.admits(stranger, node_port, mine[0])
    assert not gce.admits(mine[0], node_port, "internet")
    assert gce.admits(mine[0], 22, "internet")  # the head's SSH (logins take the cluster's key only)
