"""What an EC2 node boots from, against moto taught EC2's refusals (`tests.support.clouds.fake_ec2`): images from
their publishers only, per architecture, GPU machines on the NVIDIA-driver image, the next zone
when one has no capacity, and the account's vCPU quota as EC2 enforces it."""

from __future__ import annotations

import asyncio
import os

import pytest

from tests.support.clouds.fake_ec2 import CANONICAL, DEBIAN, DLAMI_OWNER, STRANGER
from tests.support.helpers import start_gpu_job, start_grow_job


def _driver(**config):
    from burla.drivers.aws.driver import Ec2Config, Ec2Driver

    base = Ec2Config.from_environment(dict(os.environ), None, "images")
    return Ec2Driver(Ec2Config(**{**base.__dict__, **config}))


def _boot(driver, machine_type: str, gpu_count: int = 0) -> list[str]:
    from burla.drivers.base import BootRequest

    async def boot() -> list[str]:
        try:
            return await driver.boot(BootRequest(1, "http://127.0.0.1:1", "t", machine_type=machine_type,
                                                 gpu_count=gpu_count))
        finally:
            await driver.close()

    return asyncio.run(boot())


def _launched(ec2) -> list[dict]:
    reservations = ec2.describe_instances(Filters=[{"Name": "tag-key", "Values": ["burla-node-id"]}])["Reservations"]
    instances = [i for r in reservations for i in r["Instances"]]
    for instance in instances:
        instance["Image"] = ec2.describe_images(ImageIds=[instance["ImageId"]])["Images"][0]
    return instances


def test_the_image_comes_from_its_publisher_not_from_a_newer_look_alike(moto):
    # A stranger's public image matches the Amazon Linux name and is newer: it must not be picked.
    stranger = moto.describe_images(Owners=[STRANGER])["Images"]
    assert stranger and stranger[0]["Name"].startswith("al2023-ami-2023")
    driver = _driver()
    node_id = _boot(driver, "t3.micro")[0]
    [instance] = _launched(moto)
    assert instance["Image"]["ImageOwnerAlias"] == "amazon" and instance["Image"]["OwnerId"] != STRANGER
    assert instance["Image"]["Name"].startswith("al2023-ami-2023") and instance["Image"]["Architecture"] == "x86_64"
    assert driver.login_user(node_id) == "ec2-user"


def test_graviton_machines_boot_arm64_images(moto):
    _boot(_driver(), "m7g.large")
    [instance] = _launched(moto)
    assert instance["InstanceType"] == "m7g.large"
    assert instance["Image"]["Architecture"] == "arm64" and instance["Image"]["ImageOwnerAlias"] == "amazon"


def test_gpu_machines_boot_the_image_with_the_nvidia_driver(moto):
    _boot(_driver(), "g4dn.xlarge", gpu_count=1)
    [instance] = _launched(moto)
    assert instance["Image"]["OwnerId"] == DLAMI_OWNER
    assert instance["Image"]["Name"].startswith("Deep Learning Base OSS Nvidia Driver GPU AMI")


@pytest.mark.parametrize(("family", "owner", "user"), [("debian-12", DEBIAN, "admin"),
                                                       ("ubuntu-24.04", CANONICAL, "ubuntu")])
def test_other_image_families_come_from_their_publishers_with_their_login_user(moto, family, owner, user):
    driver = _driver(image_family=family)
    node_id = _boot(driver, "m7i.large")[0]
    [instance] = _launched(moto)
    assert instance["Image"]["OwnerId"] == owner
    assert driver.login_user(node_id) == user


def test_an_ami_of_another_architecture_is_refused_before_launching(moto):
    from burla.errors import CloudSetupError

    arm = moto.describe_images(Owners=[DEBIAN], Filters=[{"Name": "architecture", "Values": ["arm64"]}])["Images"][0]
    with pytest.raises(CloudSetupError, match=r"is arm64, but m7i.large runs x86_64"):
        _boot(_driver(ami=arm["ImageId"]), "m7i.large")
    assert _launched(moto) == []


def test_an_unknown_machine_type_is_refused_with_its_name(moto):
    from burla.errors import CloudRefused, CloudSetupError

    with pytest.raises((CloudSetupError, CloudRefused), match="m7i.huge"):
        _boot(_driver(), "m7i.huge")


def test_a_zone_without_capacity_is_passed_over_for_the_next(moto, ec2_rules):
    zones = sorted(z["ZoneName"] for z in moto.describe_availability_zones()["AvailabilityZones"])
    ec2_rules.exhausted |= {("m7i.large", zones[0]), ("m7i.large", zones[1])}
    _boot(_driver(), "m7i.large")
    [instance] = _launched(moto)
    assert instance["Placement"]["AvailabilityZone"] not in zones[:2]
    assert [r.split(":")[0] for r in ec2_rules.refused] == ["InsufficientInstanceCapacity"] * 2


def test_no_zone_with_capacity_is_a_capacity_refusal(moto, ec2_rules):
    from burla.errors import CloudRefused

    zones = [z["ZoneName"] for z in moto.describe_availability_zones()["AvailabilityZones"]]
    ec2_rules.exhausted |= {("m7i.large", zone) for zone in zones}
    with pytest.raises(CloudRefused, match="capacity for m7i.large") as refused:
        _boot(_driver(), "m7i.large")
    assert refused.value.kind == CloudRefused.CAPACITY


def test_the_vcpu_quota_is_a_quota_refusal_in_ec2s_words(moto, ec2_rules):
    from burla.errors import CloudRefused

    ec2_rules.vcpu_quotas["L-1216C47A"] = 4
    with pytest.raises(CloudRefused, match="current vCPU limit of 4") as refused:
        _boot(_driver(), "m7i.2xlarge")
    assert refused.value.kind == CloudRefused.QUOTA and _launched(moto) == []


def _ec2_head(moto, tmp_path, wheelhouse):
    from tests.conftest import start_head
    from tests.support.clouds.vm_farms import MotoVmFarm

    farm = MotoVmFarm(moto, tmp_path / "vms")
    # No idle timeout: a node that joined must still be there when a client slow to start (a loaded
    # machine) sends its job; the head deletes its VMs as it stops.
    head = start_head(tmp_path / "config", local_nodes=0, extra=[
        "--driver", "ec2", "--node-wheelhouse", str(wheelhouse), "--ssh-address-map", str(farm.map_path)])
    return farm, head


def test_grow_plans_within_the_vcpu_quota_and_says_what_limited_it(moto, ec2_rules, tmp_path, wheelhouse,
                                                                   client_venv):
    """Also: the head's first grow job waits for the region's machine list, here slower than the
    client's heartbeat allows a silent head (each page a second, as a cloud's API may take): its
    connection is kept answering meanwhile, where the client used to take the head for gone."""
    from burla.client.runner import HEARTBEAT_S

    ec2_rules.vcpu_quotas["L-1216C47A"] = 8  # 20 calls would want m7i.4xlarge + m7i.xlarge (20 vCPUs)
    ec2_rules.slow_type_pages_s = 1.0
    farm, head = _ec2_head(moto, tmp_path, wheelhouse)
    try:
        job = start_grow_job(client_venv, head, tmp_path, 20)
        out, err = job.communicate(timeout=300)
        assert job.returncode == 0, err
        assert out.strip() == str(list(range(20)))
        assert len(ec2_rules.type_pages) * ec2_rules.slow_type_pages_s > 1.5 * HEARTBEAT_S
        assert sorted(i["InstanceType"] for i in _launched(moto)) == ["m7i.xlarge", "m7i.xlarge"]
        assert ec2_rules.refused == []  # planned within the quota: nothing was refused
        assert "growing for this job was limited (20 vCPUs planned)" in err
        assert "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances' is 8 vCPUs" in err
        assert "--quota-code L-1216C47A" in err
    finally:
        head.stop()
        farm.close()


def test_a_machine_no_zone_has_is_replaced_by_the_next_size_down(moto, ec2_rules, tmp_path, wheelhouse,
                                                                 client_venv):
    zones = [z["ZoneName"] for z in moto.describe_availability_zones()["AvailabilityZones"]]
    ec2_rules.exhausted |= {("m7i.xlarge", zone) for zone in zones}
    farm, head = _ec2_head(moto, tmp_path, wheelhouse)
    try:
        job = start_grow_job(client_venv, head, tmp_path, 3)  # would be one m7i.xlarge
        out, err = job.communicate(timeout=300)
        assert job.returncode == 0, err
        assert out.strip() == "[0, 1, 2]"
        assert [i["InstanceType"] for i in _launched(moto)] == ["m7i.large"]
        assert "InsufficientInstanceCapacity" in ec2_rules.refused[0]
        assert "growing for this job was limited" in err and "capacity for m7i.xlarge" in err
    finally:
        head.stop()
        farm.close()


def _bootstrap_ran_as_on(vm, image) -> None:
    """What the image made the bootstrap do: its package manager's venv package, uv when its
    Python is not the client's, and a node environment of the client's Python either way."""
    import subprocess
    import sys

    log = (vm.root / "package-log").read_text() if (vm.root / "package-log").exists() else ""
    assert ("installed python3-venv" in log) == (image.venv_package == "python3-venv")
    assert (vm.home / ".burla" / "uv-env").exists() == (vm.python != sys.executable)
    version = subprocess.run([str(vm.home / ".burla" / "env" / "bin" / "python"), "-c",
                              "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True)
    assert version.stdout.strip() == f"{sys.version_info[0]}.{sys.version_info[1]}"


@pytest.mark.parametrize("family", ["debian-12", "ubuntu-24.04"])
def test_debian_and_ubuntu_images_become_nodes(moto, tmp_path, wheelhouse, client_venv, monkeypatch, family):
    import subprocess
    import sys

    from tests.conftest import wait_for_nodes
    from tests.support.clouds.vm_standin import DEBIAN_12, UBUNTU_2404
    from tests.support.helpers import client_env, run_client_in

    monkeypatch.setenv("BURLA_AWS_IMAGE_FAMILY", family)
    farm, head = _ec2_head(moto, tmp_path, wheelhouse)
    try:
        env = client_env(head)
        subprocess.run([sys.executable, "-m", "burla", "settings", "update", "--quantity", "1", "--machine-type",
                        "m7i.large"], check=True, env=env, capture_output=True)
        started = subprocess.run([sys.executable, "-m", "burla", "cluster", "start"], env=env, capture_output=True,
                                 text=True)
        assert started.returncode == 0, started.stdout + started.stderr
        [node] = wait_for_nodes(head, 1, timeout=240)
        vm = farm.vm(node["node_id"])
        assert vm.image == {"debian-12": DEBIAN_12, "ubuntu-24.04": UBUNTU_2404}[family]
        assert set(vm.logins) == {vm.login_user} and vm.refused_users == []
        _bootstrap_ran_as_on(vm, vm.image)
        script = "import json\nfrom burla import remote_parallel_map\nprint(json.dumps(remote_parallel_map(abs, [-4])))"
        assert run_client_in(client_venv, head, script, tmp_path) == [[4]]
    finally:
        head.stop()
        farm.close()


def test_a_gpu_machine_joins_with_the_gpus_its_images_driver_lists(moto, tmp_path, wheelhouse, client_venv):
    farm, head = _ec2_head(moto, tmp_path, wheelhouse)
    try:
        job = start_gpu_job(client_venv, head, tmp_path, "T4")
        out, err = job.communicate(timeout=300)
        assert job.returncode == 0, err
        assert out.strip() == '["0"]'  # the node offered the GPU nvidia-smi listed; the call had it to itself
        [instance] = _launched(moto)
        assert instance["InstanceType"] == "g4dn.xlarge" and instance["Image"]["OwnerId"] == DLAMI_OWNER
    finally:
        head.stop()
        farm.close()


def test_a_gpu_machine_whose_image_lacks_the_driver_is_deleted_at_once(moto, tmp_path, wheelhouse, client_venv,
                                                                       monkeypatch):
    plain = moto.describe_images(Owners=["amazon"], Filters=[
        {"Name": "name", "Values": ["al2023-ami-2023.*-x86_64"]}])["Images"][0]
    monkeypatch.setenv("BURLA_AWS_AMI", plain["ImageId"])  # a stock image: no NVIDIA driver
    farm, head = _ec2_head(moto, tmp_path, wheelhouse)
    try:
        job = start_gpu_job(client_venv, head, tmp_path, "T4")
        out, err = job.communicate(timeout=300)
        assert job.returncode != 0 and "NoNodes" in err
        assert "booted as g4dn.xlarge with 1 T4 GPU(s), but nvidia-smi on it lists 0" in err
        from tests.support.helpers import wait_until

        [instance] = _launched(moto)
        wait_until(lambda: _launched(moto)[0]["State"]["Name"] == "terminated", timeout=60, what="the GPU VM deleted")
        assert instance["InstanceType"] == "g4dn.xlarge"
    finally:
        head.stop()
        farm.close()


def test_grow_fails_fast_naming_a_missing_permission_and_its_fix(moto, ec2_rules, tmp_path, wheelhouse, client_venv):
    ec2_rules.denied |= {"ec2:RunInstances"}
    farm, head = _ec2_head(moto, tmp_path, wheelhouse)
    try:
        job = start_grow_job(client_venv, head, tmp_path, 3)
        out, err = job.communicate(timeout=120)
        assert job.returncode != 0 and "NoNodes" in err
        assert "burla cloud check failed: permissions: missing ec2:RunInstances" in err
        assert "fix: allow these actions in the IAM policy" in err
        assert _launched(moto) == []
    finally:
        head.stop()
        farm.close()


def test_a_failed_boot_names_its_stage(moto, tmp_path, wheelhouse, client_venv, monkeypatch):
    from tests.conftest import start_head
    from tests.support.clouds.vm_farms import MotoVmFarm

    monkeypatch.setenv("BURLA_AWS_IMAGE_FAMILY", "debian-12")  # needs python3-venv installed as root
    farm = MotoVmFarm(moto, tmp_path / "vms", vm_environment={"STANDIN_NO_SUDO": "1"})
    head = start_head(tmp_path / "config", local_nodes=0, extra=[
        "--driver", "ec2", "--node-wheelhouse", str(wheelhouse), "--ssh-address-map", str(farm.map_path)])
    try:
        job = start_grow_job(client_venv, head, tmp_path, 1)
        out, err = job.communicate(timeout=240)
        assert job.returncode != 0 and "NoNodes" in err
        assert "failed at stage installing: the bootstrap exited with 1" in err
        assert "sudo: a password is required" in err
    finally:
        head.stop()
        farm.close()


def test_a_baked_image_deleted_since_the_lookup_leaves_the_boot_on_the_stock_image(moto):
    """`burla cloud images delete` runs in another process: the head's lookup still names the image."""
    from burla.drivers.aws.images import instance_type
    from burla.drivers.base import BootRequest

    driver = _driver(bake=True)
    ec2 = driver.client("ec2")

    async def boot() -> list[str]:
        try:
            machine = await driver._call(instance_type, driver.config.region, "m7i.large")
            driver.baked.remember(driver._bake_key(machine, False, None), "ami-0123456789abcdef0")
            return await driver.boot(BootRequest(1, "http://127.0.0.1:1", "t", machine_type="m7i.large"))
        finally:
            await driver.close()

    assert len(asyncio.run(boot())) == 1
    [instance] = _launched(ec2)
    assert instance["Image"]["Name"].startswith("al2023-ami-2023")  # the stock image served
