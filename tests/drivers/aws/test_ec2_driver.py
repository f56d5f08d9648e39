"""The EC2 driver end to end against moto (a real EC2 API emulator) on 127.0.0.1.

`burla cluster start` makes the head create instances in moto with the right type, tags and spot
flag; each running instance is played by an SSH server on 127.0.0.1 (`tests.support.clouds.vm_standin`) that the
head sets up as a node, so a real node joins, a job runs, the node idles, and the head terminates
the instance.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, start_head, wait_for_nodes
from tests.support.clouds.vm_farms import MotoVmFarm
from tests.support.helpers import client_env, finish_client, get_json, run_client_in, start_client, wait_until


def _instances(ec2, state: str | None = None) -> list[dict]:
    filters = [{"Name": "tag-key", "Values": ["burla-node-id"]}]
    if state:
        filters.append({"Name": "instance-state-name", "Values": [state]})
    reservations = ec2.describe_instances(Filters=filters)["Reservations"]
    return [i for r in reservations for i in r["Instances"]]


def _join_script() -> str:
    return """
        import json
        from burla import remote_parallel_map
        print(json.dumps(remote_parallel_map(abs, [-1, -2, -3], spinner=False)))
    """


def test_cluster_start_boots_ec2_instances_that_join_run_jobs_and_go_when_idle(moto, tmp_path, wheelhouse,
                                                                               client_venv):
    farm = MotoVmFarm(moto, tmp_path / "vms")
    head = start_head(tmp_path / "config", local_nodes=0, extra=[  # idle timeout set after the job: see below
        "--driver", "ec2", "--node-wheelhouse", str(wheelhouse),
        "--ssh-address-map", str(farm.map_path)])
    try:
        env = client_env(head)
        subprocess.run([sys.executable, "-m", "burla", "settings", "update", "--quantity", "1", "--machine-type",
                        "t3.micro", "--spot", "--disk-gb", "40"], check=True, env=env, capture_output=True)
        done = subprocess.run([sys.executable, "-m", "burla", "cluster", "start"], env=env, capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        [instance] = _instances(moto)
        tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
        assert instance["InstanceType"] == "t3.micro"
        assert instance.get("InstanceLifecycle") == "spot"
        assert tags["burla-cluster"] and tags["burla-node-id"].startswith("burla-node-")
        wait_for_nodes(head, 1, timeout=240)
        assert get_json(head, "/v1/cluster")["nodes"][0]["node_id"] == tags["burla-node-id"]
        # Amazon Linux 2023: ec2-user, and its Python 3.9 is not the client's, so uv made the node's.
        from tests.drivers.aws.test_ec2_images import _bootstrap_ran_as_on
        from tests.support.clouds.vm_standin import AL2023

        vm = farm.vm(tags["burla-node-id"])
        assert vm.image == AL2023 and set(vm.logins) == {"ec2-user"}
        _bootstrap_ran_as_on(vm, AL2023)
        assert (vm.units / "burla-dead-man.stopped").exists()  # set up: its power-off timer was stopped
        assert run_client_in(client_venv, head, _join_script(), tmp_path) == [[1, 2, 3]]
        # Idle past the timeout: the head terminates the VM through the driver. (Set now: with it
        # set from the start, a client slow to start on a loaded machine found the node gone.)
        subprocess.run([sys.executable, "-m", "burla", "settings", "update", "--inactivity-timeout", "3"], check=True,
                       env=env, capture_output=True)
        wait_until(lambda: not _instances(moto, "running") and not _instances(moto, "pending"), timeout=60,
                   what="instance terminated")
        assert _instances(moto, "terminated")
        # Its hours, at the catalog's price: one spot t3.micro, ended.
        done = subprocess.run([sys.executable, "-m", "burla", "usage", "--since", "1"], env=env, capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stderr
        [row] = json.loads(done.stdout)["data"]["machine_types"]
        assert (row["cloud"], row["machine_type"], row["machines"], row["spot_machines"]) == ("aws", "t3.micro", 1, 1)
        assert row["still_running"] == 0 and row["node_hours"] > 0 and row["usd_per_hour"] == 0.0104
    finally:
        head.stop()
        farm.close()


def _no_aws_environment(monkeypatch, home) -> None:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask an instance metadata service


def test_credentials_come_from_the_shared_files(monkeypatch, tmp_path):
    from burla.drivers.aws.config import Ec2Config, resolve_credentials

    _no_aws_environment(monkeypatch, tmp_path)
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text(
        "[default]\naws_access_key_id = AKIADEFAULT\naws_secret_access_key = s1\n"
        "[work]\naws_access_key_id = AKIAWORK\naws_secret_access_key = s2\naws_session_token = t2\n")
    assert resolve_credentials(Ec2Config(region="us-east-1")) == ("AKIADEFAULT", "s1", None)
    assert resolve_credentials(Ec2Config(region="us-east-1", profile="work")) == ("AKIAWORK", "s2", "t2")


def test_missing_credentials_name_the_fix(monkeypatch, tmp_path):
    from burla.drivers.aws.config import Ec2Config, resolve_credentials
    from burla.errors import CloudSetupError

    _no_aws_environment(monkeypatch, tmp_path)
    with pytest.raises(CloudSetupError, match="aws configure"):
        resolve_credentials(Ec2Config(region="us-east-1"))
    with pytest.raises(CloudSetupError, match="aws configure list-profiles"):
        resolve_credentials(Ec2Config(region="us-east-1", profile="nope"))


def test_endpoint_variables_are_honoured():
    from burla.drivers.aws.config import Ec2Config

    config = Ec2Config.from_environment({"AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_REGION": "eu-west-1"},
                                        None, "c1")
    assert (config.endpoint, config.region) == ("http://127.0.0.1:1", "eu-west-1")
    specific = Ec2Config.from_environment({"AWS_ENDPOINT_URL": "http://a:1", "AWS_ENDPOINT_URL_EC2": "http://b:2"},
                                          "us-west-2", "c1")
    assert (specific.endpoint, specific.region) == ("http://b:2", "us-west-2")


def test_grow_boots_what_a_job_lacks_then_removes_it_when_idle(moto, tmp_path, wheelhouse, client_venv):
    farm = MotoVmFarm(moto, tmp_path / "vms")
    head = start_head(tmp_path / "config", local_nodes=0, extra=[
        "--driver", "ec2", "--inactivity-timeout", "3", "--node-wheelhouse", str(wheelhouse),
        "--ssh-address-map", str(farm.map_path)])
    try:
        job = start_client(client_venv, head, """
            import json
            from burla import remote_parallel_map
            print(json.dumps(remote_parallel_map(abs, [0, -1, -2], grow=True, spinner=False)))
        """, tmp_path)
        wait_until(lambda: _instances(moto), what="grown instance")
        [instance] = _instances(moto)
        assert instance["InstanceType"] == "m7i.xlarge"  # 3 calls: the smallest machine with 3+ vCPUs
        # The dashboard's cluster state shows the VM's stage as it boots, in order, until it joins.
        import time

        seen: list[str] = []
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            state = get_json(head, "/v1/cluster")
            seen += [s for s in state["booting_stages"].values() if not seen or seen[-1] != s]
            if state["nodes"]:
                break
            time.sleep(0.1)
        order = ["requested", "running", "ssh", "installing", "starting"]
        assert "installing" in seen and seen == sorted(seen, key=order.index), seen
        assert finish_client(job, timeout=240) == [[0, 1, 2]]
        wait_until(lambda: _instances(moto, "terminated"), timeout=60, what="grown instance terminated")
    finally:
        head.stop()
        farm.close()


def test_config_set_cloud_aws_makes_started_heads_boot_ec2(moto, tmp_path, monkeypatch):
    import json
    import signal as signals

    from burla.config import HeadRecord

    env = dict(os.environ, BURLA_CONFIG_DIR=str(tmp_path))
    for key in ("BURLA_CLUSTER_DASHBOARD_URL", "BURLA_CLUSTER_TOKEN"):
        env.pop(key, None)

    def burla(*args: str) -> dict:
        done = subprocess.run([sys.executable, "-m", "burla", *args], env=env, cwd=REPO, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    burla("config", "set", "cloud", "aws")
    try:
        started = burla("cluster", "start")  # starts this machine's head, with the ec2 driver
        assert started["data"]["booted"] == []  # quantity 0 nodes booted until configured
        burla("settings", "update", "--quantity", "2", "--machine-type", "m7i.large")
        assert len(burla("cluster", "start")["data"]["booted"]) == 2
        assert sorted(i["InstanceType"] for i in _instances(moto)) == ["m7i.large", "m7i.large"]
        # The driver lists this cluster's machines by tag, and deletes one by its node id.
        import asyncio

        from burla.drivers.aws.driver import Ec2Config, Ec2Driver

        token = (tmp_path / "cluster_token").read_text().strip()
        import hashlib

        config = Ec2Config.from_environment(dict(os.environ), None, hashlib.sha256(token.encode()).hexdigest()[:12])

        async def list_then_delete():
            driver = Ec2Driver(config)
            try:
                handles = await driver.list_nodes()
                deleted = await driver.delete(handles[0].node_id)
                return handles, deleted, await driver.delete("burla-node-unknown")
            finally:
                await driver.close()

        handles, deleted, unknown = asyncio.run(list_then_delete())
        assert len(handles) == 2 and deleted is True and unknown is False
        assert len(_instances(moto, "terminated")) == 1
    finally:
        record = HeadRecord.read(tmp_path)
        if record is not None:
            os.kill(record.pid, signals.SIGTERM)
            wait_until(lambda: HeadRecord.read(tmp_path) is None, what="head stopped")


def test_a_node_that_never_registers_is_deleted_with_its_console_kept(moto, tmp_path):
    farm = MotoVmFarm(moto, tmp_path / "vms", answer=False)
    head = start_head(tmp_path / "config", local_nodes=0, extra=["--driver", "ec2", "--boot-deadline", "2",
                                                                 "--ssh-address-map", str(farm.map_path)])
    try:
        env = dict(os.environ, **head.env())
        subprocess.run([sys.executable, "-m", "burla", "settings", "update", "--quantity", "1"], check=True, env=env,
                       capture_output=True)
        subprocess.run([sys.executable, "-m", "burla", "cluster", "start"], check=True, env=env, capture_output=True)
        [instance] = _instances(moto)
        node_id = {t["Key"]: t["Value"] for t in instance["Tags"]}["burla-node-id"]
        # Nothing answers SSH on it: it never registers, so the head deletes it after the deadline.
        wait_until(lambda: _instances(moto, "terminated"), timeout=60, what="unready instance deleted")
        events = get_json(head, f"/v1/nodes/{node_id}/events")["events"]
        kinds = {e["event"]: e["detail"] for e in events}
        assert "deleted" in kinds["failed to boot"]  # at the deadline, or as soon as SSH gave up
        assert "boot log" in kinds  # the console output and the SSH attempts, kept for debugging
        assert "nothing answered SSH on port 22" in kinds["boot log"]
    finally:
        head.stop()
        farm.close()


def test_nodes_for_a_container_image_run_inside_it(monkeypatch):
    from burla.drivers.ssh.bootstrap import PackageSource, install_script
    from burla.process import supervisor
    from burla.process.build import wheel_name

    script = install_script("3.11", PackageSource(), image="ghcr.io/acme/model:3")
    assert "as_root docker pull --quiet ghcr.io/acme/model:3" in script
    monkeypatch.setattr(supervisor.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(supervisor.sys, "executable", "/home/ec2-user/.burla/env/bin/python")
    command = supervisor.node_command(supervisor.SupervisorSettings(
        ("--head", "http://127.0.0.1:4000", "--node-id", "n1", "--image", "ghcr.io/acme/model:3"), 600,
        "ghcr.io/acme/model:3", gpus=True))
    assert command[:12] == ["sudo", "-n", "-E", "docker", "run", "--rm", "--network", "host", "-v",
                            "/home/ec2-user/.burla:/home/ec2-user/.burla", "-e", "BURLA_CONFIG_DIR"]
    assert command[12:16] == ["--gpus", "all", "ghcr.io/acme/model:3", "sh"]
    # The image's own Python gets the head's build from the uploaded wheel, then runs the node.
    assert command[-1] == (f"python3 -m pip install --quiet --disable-pip-version-check /home/ec2-user/.burla/build/"
                           f"{wheel_name()} && exec python3 -m burla node join --head http://127.0.0.1:4000 "
                           "--node-id n1 --image ghcr.io/acme/model:3")


def test_an_expired_sso_session_names_the_login_command(monkeypatch, tmp_path):
    import hashlib
    import json

    from burla.drivers.aws.config import Ec2Config, resolve_credentials
    from burla.errors import CloudSetupError

    _no_aws_environment(monkeypatch, tmp_path)
    start_url = "https://example.awsapps.com/start"
    (tmp_path / ".aws" / "sso" / "cache").mkdir(parents=True)
    (tmp_path / ".aws" / "config").write_text(
        f"[profile dev]\nsso_start_url = {start_url}\nsso_region = us-east-1\nsso_account_id = 123456789012\n"
        "sso_role_name = Admin\nregion = us-east-1\n")
    # What `aws sso login` left in its cache, long expired.
    (tmp_path / ".aws" / "sso" / "cache" / f"{hashlib.sha1(start_url.encode()).hexdigest()}.json").write_text(
        json.dumps({"startUrl": start_url, "region": "us-east-1", "accessToken": "t",
                    "expiresAt": "2020-01-01T00:00:00Z"}))
    with pytest.raises(CloudSetupError, match=r"SSO session has expired. Run `aws sso login --profile dev`"):
        resolve_credentials(Ec2Config(region="us-east-1", profile="dev"))


def test_renewed_credentials_are_used_and_expired_ones_name_the_login(moto, ec2_rules):
    import asyncio

    from burla.drivers.aws.driver import Ec2Config, Ec2Driver
    from burla.errors import CloudSetupError

    issued = [("AKIAFIRST", "s1", "t1")]  # what the credential chain gives now (it renews itself)
    driver = Ec2Driver(Ec2Config.from_environment(dict(os.environ), None, "renew"), credentials=lambda _: issued[-1])

    async def scenario():
        try:
            first = await driver._call(lambda d: d.key)
            issued.append(("AKIASECOND", "s2", "t2"))  # renewed, as an SSO or role session is
            second = await driver._call(lambda d: d.key)
            await driver.list_nodes()
            ec2_rules.expired_keys.add("AKIASECOND")  # expired, and the chain could not renew it
            with pytest.raises(CloudSetupError, match=r"expired .*Run `aws sso login`"):
                await driver.list_nodes()
            issued.append(("AKIATHIRD", "s3", "t3"))  # the user ran `aws sso login`: no restart needed
            return first, second, await driver.list_nodes()
        finally:
            await driver.close()

    first, second, listed = asyncio.run(scenario())
    assert (first, second, listed) == ("AKIAFIRST", "AKIASECOND", [])


def _admits(ec2, target: dict, port: int, source: dict | None) -> bool:
    """Whether EC2 lets a TCP connection to `port` of instance `target` in from instance `source`
    (None: the internet), by the instance's security groups as AWS evaluates them: rules only
    allow, any rule of any attached group that matches allows; a rule naming a group matches the
    instances that group is attached to (docs.aws.amazon.com/vpc/latest/userguide/security-group-rules.html)."""
    group_ids = sorted(_groups_of(target))
    source_groups = _groups_of(source) if source is not None else set()
    for group in ec2.describe_security_groups(GroupIds=group_ids)["SecurityGroups"]:
        for rule in group.get("IpPermissions", []):
            if rule.get("IpProtocol") not in ("tcp", "-1") or not rule.get("FromPort", 0) <= port <= rule.get("ToPort",
                                                                                                           65535):
                continue
            if any(r.get("CidrIp") == "0.0.0.0/0" for r in rule.get("IpRanges", [])):
                return True
            if {pair["GroupId"] for pair in rule.get("UserIdGroupPairs", [])} & source_groups:
                return True
    return False


def _groups_of(instance: dict) -> set[str]:
    """An instance's security groups: those of its network interfaces (where a launch with a
    network interface puts them), as the instance's own list reports them on AWS."""
    return ({g["GroupId"] for g in instance["SecurityGroups"]}
            | {g["GroupId"] for interface in instance.get("NetworkInterfaces", []) for g in interface["Groups"]})


def test_a_nodes_ports_admit_its_own_clusters_nodes_only(moto, ec2_rules):
    # Fails on the previous code: every cluster's nodes shared one group "burla-nodes" admitting
    # any port from its members, so another cluster's node in the VPC reached this cluster's.
    import asyncio

    from burla.drivers.aws.driver import Ec2Config, Ec2Driver
    from burla.drivers.base import BootRequest

    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGSoU/Sv+4Aho0bDRzg6Jfw/gNeQpWA7MK3bgrvqtfIJ burla-cluster"

    async def boot(cluster_id: str, count: int) -> list[str]:
        driver = Ec2Driver(Ec2Config.from_environment(dict(os.environ), None, cluster_id))
        try:
            return await driver.boot(BootRequest(count, "http://10.0.0.2:5001", "t", 2, "m7i.large",
                                                 ssh_public_key=key))
        finally:
            await driver.close()

    mine, theirs = asyncio.run(boot("ours", 2)), asyncio.run(boot("theirs", 1))
    by_name = {next(t["Value"] for t in i["Tags"] if t["Key"] == "burla-node-id"): i for i in _instances(moto)}
    a, b, stranger = by_name[mine[0]], by_name[mine[1]], by_name[theirs[0]]
    node_port = 41234  # nodes listen on a port of their choosing
    assert _admits(moto, a, node_port, b) and _admits(moto, b, node_port, a)
    assert not _admits(moto, a, node_port, stranger) and not _admits(moto, stranger, node_port, a)
    assert not _admits(moto, a, node_port, None)
    assert _admits(moto, a, 22, None)  # the head's SSH (logins take the cluster's key only)
