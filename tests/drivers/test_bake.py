"""Faster second boots: after a VM had to install the node runtime, the head bakes an image of it
on a builder VM (EC2 in moto; the builder and the nodes are stand-in VMs whose disks CreateImage
copies), later VMs boot from that image and skip the install, and `burla cloud images` lists and
deletes what was baked."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, start_head, wait_for_nodes
from tests.support.clouds.vm_farms import MotoVmFarm
from tests.support.helpers import client_env, wait_until

KEY_TAG = "burla-image-key"


def _baked(moto) -> list[dict]:
    return moto.describe_images(Owners=["self"], Filters=[{"Name": "tag-key", "Values": [KEY_TAG]}])["Images"]


def _instances(moto) -> list[dict]:
    reservations = moto.describe_instances(Filters=[{"Name": "tag-key", "Values": ["burla-cluster"]}])
    return [i for r in reservations["Reservations"] for i in r["Instances"]]


def _burla(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "burla", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=180, env=env)


@pytest.mark.timeout(600)
def test_a_second_boot_comes_from_the_image_baked_after_the_first(moto, ec2_rules, tmp_path, wheelhouse,
                                                                   client_venv, monkeypatch):
    monkeypatch.setenv("BURLA_BAKE_IMAGES", "1")
    farm = MotoVmFarm(moto, tmp_path / "vms", rules=ec2_rules)
    head = start_head(tmp_path / "config", local_nodes=0, extra=[
        "--driver", "ec2", "--node-wheelhouse", str(wheelhouse), "--ssh-address-map", str(farm.map_path)])
    env = client_env(head)
    try:
        assert _burla(env, "settings", "update", "--quantity", "1", "--machine-type", "m7i.xlarge").returncode == 0
        started = _burla(env, "cluster", "start")
        assert started.returncode == 0, started.stdout + started.stderr
        [first] = wait_for_nodes(head, 1, timeout=240)
        assert "burla: this build is installed already" not in "".join(farm.vm(first["node_id"]).commands)
        # The builder: booted, set up without the token, imaged, deleted.
        wait_until(lambda: [i["State"] for i in _baked(moto)] == ["available"], timeout=240, what="an image baked")
        [image] = _baked(moto)
        assert image["State"] == "available" and image["Name"].startswith("burla-node-")
        key = {t["Key"]: t["Value"] for t in image["Tags"]}[KEY_TAG]
        assert key.endswith("-al2023-x86_64") and f"-py{sys.version_info[0]}{sys.version_info[1]}-" in key
        builders = [i for i in _instances(moto) if any(t["Value"].startswith("burla-bake-") for t in i["Tags"])]
        assert [b["InstanceType"] for b in builders] == ["m7i.large"]  # the family's smallest: cheap, little quota
        wait_until(lambda: [i["State"]["Name"] for i in _instances(moto) if i["InstanceId"] ==
                            builders[0]["InstanceId"]] == ["terminated"], timeout=120, what="the builder deleted")
        disk = tmp_path / "vms" / "images" / image["ImageId"] / "home"
        assert not (disk / ".burla" / "config").exists() and not (disk / ".burla" / "build").exists()
        assert (disk / ".ssh" / "authorized_keys").read_text() == ""  # no cluster's key in the image
        assert (disk / ".burla" / "installed-build").read_text().strip().endswith(
            f"py{sys.version_info[0]}.{sys.version_info[1]}")

        # A second node boots from the baked image and skips the install.
        assert _burla(env, "settings", "update", "--quantity", "2").returncode == 0
        again = _burla(env, "cluster", "start")
        assert again.returncode == 0, again.stdout + again.stderr
        nodes = wait_for_nodes(head, 2, timeout=240)
        [second] = [n for n in nodes if n["node_id"] != first["node_id"]]
        [instance] = [i for i in _instances(moto) if {"Key": "burla-node-id", "Value": second["node_id"]} in i["Tags"]]
        assert instance["ImageId"] == image["ImageId"]
        vm = farm.vm(second["node_id"])
        assert list((vm.home / ".burla" / "build").glob("*.whl")) == []  # the build was not uploaded again
        assert not (vm.home / ".burla" / "uv-env").exists()
        script = ("import json\nfrom burla import remote_parallel_map\n"
                  "print(json.dumps(remote_parallel_map(abs, [-4, -5])))")
        # A user's environment with only burla: the VM has every package of the job already.
        ran = subprocess.run([str(client_venv), "-c", script], capture_output=True, text=True, env=env, timeout=120)
        assert ran.returncode == 0 and json.loads(ran.stdout) == [4, 5], ran.stderr

        # Listed, then deleted with its snapshots.
        listed = _burla(env, "cloud", "images", "list", "--cloud", "aws", "--json")
        assert listed.returncode == 0, listed.stdout + listed.stderr
        [shown] = json.loads(listed.stdout)["data"]["images"]
        assert shown["image_id"] == image["ImageId"] and shown["key"] == key and shown["state"] == "available"
        snapshots = [m["Ebs"]["SnapshotId"] for m in image["BlockDeviceMappings"] if "Ebs" in m]
        unknown = _burla(env, "cloud", "images", "delete", "ami-00000000000000000", "--cloud", "aws")
        assert unknown.returncode == 4 and "no baked image ami-00000000000000000" in unknown.stdout
        deleted = _burla(env, "cloud", "images", "delete", image["ImageId"], "--cloud", "aws")
        assert deleted.returncode == 0, deleted.stdout + deleted.stderr
        assert _baked(moto) == []
        remaining = moto.describe_snapshots(OwnerIds=["self"])["Snapshots"]
        assert not {s["SnapshotId"] for s in remaining} & set(snapshots)
        assert _burla(env, "cloud", "images", "delete", "--cloud", "aws").returncode == 2  # nothing named
    finally:
        head.stop()
        farm.close()


def test_baking_can_be_turned_off(moto, ec2_rules, tmp_path, wheelhouse):
    farm = MotoVmFarm(moto, tmp_path / "vms", rules=ec2_rules)  # BURLA_BAKE_IMAGES=0 (the moto fixture's)
    head = start_head(tmp_path / "config", local_nodes=0, extra=[
        "--driver", "ec2", "--node-wheelhouse", str(wheelhouse), "--ssh-address-map", str(farm.map_path)])
    try:
        env = client_env(head)
        assert _burla(env, "settings", "update", "--quantity", "1", "--machine-type", "m7i.large").returncode == 0
        assert _burla(env, "cluster", "start").returncode == 0
        wait_for_nodes(head, 1, timeout=240)
        assert len(_instances(moto)) == 1 and _baked(moto) == []
    finally:
        head.stop()
        farm.close()


def test_the_baked_image_key_names_build_python_family_and_architecture():
    from burla.drivers.bake import image_key

    assert image_key("0.2.0+c18313333c8f7d18", "3.11", "al2023", "arm64") == (
        "0-2-0-c18313333c8f7d18-py311-al2023-arm64")  # what AMI names and GCE labels take


def test_a_baked_image_lookup_serves_boots_for_a_while_and_a_failed_one_serves_none():
    from burla.drivers.bake import BakedLookup

    now = [1000.0]
    lookup = BakedLookup(ttl_s=60, failed_ttl_s=10, clock=lambda: now[0])  # a clock the test moves
    looked: list[str] = []

    def look(key: str) -> str | None:
        looked.append(key)
        return None

    assert lookup.find("k", look) is None and lookup.find("k", look) is None
    assert looked == ["k"]  # one list call serves every VM of the grow
    lookup.remember("k", "ami-1")  # this head baked one
    assert lookup.find("k", look) == "ami-1" and looked == ["k"]
    now[0] += 61
    assert lookup.find("k", lambda key: "ami-2") == "ami-2"  # older than the TTL: asked again
    lookup.forget()
    refusals: list[str] = []

    def refused(key: str) -> str | None:
        refusals.append(key)
        raise PermissionError("no ec2:DescribeImages")

    assert lookup.find("k", refused) is None and lookup.find("k", refused) is None  # the stock image serves...
    assert refusals == ["k"]  # ...and the VMs of one grow don't each wait on the failing call
    now[0] += 11
    assert lookup.find("k", lambda key: "ami-3") == "ami-3"  # ...but it is asked again soon
    assert lookup.find(None, look) is None and looked == ["k"]  # no key (GPU, image=): nothing to look for


def test_a_lookup_under_way_when_an_image_is_deleted_does_not_keep_its_answer():
    import threading

    from burla.drivers.bake import BakedLookup

    lookup = BakedLookup()
    listing, deleted = threading.Event(), threading.Event()

    def slow_look(key: str) -> str | None:  # the list call answered just before the delete
        listing.set()
        deleted.wait(30)
        return "ami-old"

    answers: list[str | None] = []
    finder = threading.Thread(target=lambda: answers.append(lookup.find("k", slow_look)))
    finder.start()
    assert listing.wait(30)
    lookup.forget()  # the image was deleted meanwhile
    deleted.set()
    finder.join(30)
    assert answers == ["ami-old"]  # that boot was already on its way...
    assert lookup.find("k", lambda key: None) is None  # ...but the next one looks again


def test_a_boot_refused_for_a_deleted_baked_image_names_it_and_drops_it():
    from burla.drivers.bake import BakedLookup

    lookup = BakedLookup()
    lookup.remember("k", "/subscriptions/s/resourceGroups/burla-images/providers/Microsoft.Compute/images/burla-n-1")
    assert lookup.refused("InvalidParameterValue: disk type pd-balanced is not supported") is None
    assert lookup.refused("The Resource 'Microsoft.Compute/images/other' was not found.") is None
    gone = lookup.refused("The Resource 'Microsoft.Compute/images/burla-n-1' under resource group "
                          "'burla-images' was not found.")
    assert gone is not None and gone.endswith("/burla-n-1")
    assert lookup.find("k", lambda key: None) is None  # looked up again: none now, the stock image serves
