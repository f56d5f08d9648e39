"""`burla deploy`: a head VM per cloud, set up over SSH from this machine, serving https with a
pinned certificate.

End to end on each cloud (EC2 in moto, Compute Engine and Azure against recorded APIs): `burla
deploy` creates the head VM (role or identity, firewall, the SSH key, no secret anywhere in the
requests), sets it up over SSH on a stand-in VM (`tests.support.clouds.vm_standin`: the upload, the install of
this exact build, the start under burla's supervisor) and sees it serve through the SSH
connection. The client and CLI reach it through the deployment record (pinned certificate,
token); the head boots a node VM that it sets up over SSH in turn and that joins it directly; a
job runs; `burla deploy delete` removes the head and its nodes.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from tests.conftest import REPO
from tests.drivers.azure.test_azure_driver import azure  # noqa: F401 - fixture
from tests.drivers.gcp.test_gce_driver import gce  # noqa: F401 - fixture
from tests.support.clouds.vm_farms import AzureVmFarm, GceVmFarm, MotoVmFarm
from tests.support.helpers import run_client_in, wait_until

pytestmark = pytest.mark.timeout(400)


def _burla(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "burla", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300, env=env)


def _ok(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])["data"]


def _client_env(config_dir, **extra: str) -> dict[str, str]:
    env = dict(os.environ, BURLA_CONFIG_DIR=str(config_dir))
    for key in ("BURLA_CLUSTER_DASHBOARD_URL", "BURLA_CLUSTER_TOKEN", "BURLA_HEAD_CERT", "BURLA_CLOUD"):
        env.pop(key, None)
    return {**env, **extra}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _heads(ec2) -> list[dict]:
    return [i for i in _instances_with_tag(ec2, "burla-role") if i["State"]["Name"] in ("pending", "running")]


def _instances_with_tag(ec2, key: str) -> list[dict]:
    reservations = ec2.describe_instances(Filters=[{"Name": "tag-key", "Values": [key]}])["Reservations"]
    return [i for r in reservations for i in r["Instances"]]


def _deploy_and_run_a_job(cloud: str, farm, tmp_path: Path, wheelhouse: Path, client_venv: Path,
                          *extra: str) -> tuple[dict, str, dict[str, str]]:
    """Deploy through the farm's stand-in VMs, boot one node from the deployed head, run a job.
    Returns the deployment, the node's id and the environment that reaches the deployed head."""
    config = tmp_path / "client"
    port = _free_port()
    env = _client_env(config, BURLA_SSH_ADDRESS_MAP=str(farm.map_path), BURLA_NODE_WHEELHOUSE=str(wheelhouse))
    deployed = _ok(_burla("deploy", cloud, "--port", str(port), "--wait", "120", *extra, env=env))
    deployment = deployed["deployment"]
    assert deployed["serving"] is True  # asked through the SSH connection to the head VM
    assert deployment["head_url"].startswith("https://") and deployment["head_url"].endswith(f":{port}")
    head_vm = farm.vm(deployment["head_id"])
    assert head_vm.logins and set(head_vm.logins) == {head_vm.logins[0]}
    token = json.loads((config / "deployment.json").read_text())["token"]
    for secret in ("config/cluster_token", "head-key.pem"):
        assert stat.S_IMODE((head_vm.home / ".burla" / secret).stat().st_mode) == 0o600
    assert (head_vm.home / ".burla" / "config" / "cluster_token").read_text().strip() == token
    assert not any(token in command for command in head_vm.commands)
    # The stand-in VM's network is this machine's loopback: its head serves on 127.0.0.1.
    reach = _client_env(config, BURLA_CLUSTER_DASHBOARD_URL=f"https://127.0.0.1:{port}", BURLA_CLUSTER_TOKEN=token)
    _ok(_burla("settings", "update", "--quantity", "1", env=reach))
    [node_id] = _ok(_burla("cluster", "start", env=reach))["booted"]

    def joined() -> bool:
        done = _burla("nodes", "list", env=reach)
        return done.returncode == 0 and len(json.loads(done.stdout)["data"]) == 1

    wait_until(joined, timeout=240, what="the node joined the deployed head")
    node_vm = farm.vm(node_id)
    assert any(f"--head https://127.0.0.1:{port}" in c for c in node_vm.commands)  # directly, no tunnel
    script = """
        import json
        from burla import remote_parallel_map
        print(json.dumps(remote_parallel_map(abs, [-4, -5], spinner=False)))
    """
    client = dict(reach)
    client.pop("BURLA_SSH_ADDRESS_MAP")
    assert run_client_in(client_venv, type("Head", (), {"url": reach["BURLA_CLUSTER_DASHBOARD_URL"], "token": token,
                                                       "config_dir": config})(), script, tmp_path) == [[4, 5]]
    return deployment, node_id, env


def test_deploy_aws_sets_up_a_pinned_https_head_over_ssh_that_boots_nodes_and_delete_removes_everything(
        moto, tmp_path, wheelhouse, client_venv):
    # The head VM's instance role, as its metadata service would hand it over.
    farm = MotoVmFarm(moto, tmp_path / "vms", vm_environment={"AWS_ACCESS_KEY_ID": "testing",
                                                               "AWS_SECRET_ACCESS_KEY": "testing"})
    try:
        deployment, node_id, env = _deploy_and_run_a_job("aws", farm, tmp_path, wheelhouse, client_venv,
                                                         "--machine-type", "t3.micro")
        [head_vm] = _heads(moto)
        tags = {t["Key"]: t["Value"] for t in head_vm["Tags"]}
        assert (tags["burla-role"], tags["Name"], head_vm["InstanceType"]) == ("head", deployment["head_id"],
                                                                                "t3.micro")
        assert deployment["head_url"].startswith(f"https://{head_vm['PublicIpAddress']}:")
        # The head VM boots nodes with its own role; its port and SSH are open; no user data.
        assert head_vm["IamInstanceProfile"]["Arn"].endswith("instance-profile/burla-head")
        iam = boto3.client("iam", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
        policy = iam.get_role_policy(RoleName="burla-head", PolicyName="burla-nodes")["PolicyDocument"]
        assert {"ec2:RunInstances", "ec2:ImportKeyPair"} <= set(policy["Statement"][0]["Action"])
        [group] = moto.describe_security_groups(GroupNames=["burla-head"])["SecurityGroups"]
        port = int(deployment["head_url"].rsplit(":", 1)[1])
        assert sorted(p["FromPort"] for p in group["IpPermissions"]) == sorted([port, 22])
        assert head_vm["KeyName"].startswith("burla-")
        user_data = moto.describe_instance_attribute(InstanceId=head_vm["InstanceId"], Attribute="userData")
        assert "Value" not in user_data.get("UserData", {})
        # The client's config now names that head; a second deploy is refused.
        recorded = json.loads((tmp_path / "client" / "deployment.json").read_text())
        assert recorded["head_url"] == deployment["head_url"] and recorded["head_cert"] == deployment["head_cert"]
        again = _burla("deploy", "aws", "--wait", "0", env=env)
        assert again.returncode == 2 and "already deployed" in json.loads(again.stdout)["error"]["message"]

        removed = _ok(_burla("deploy", "delete", env=env))
        assert removed["head_deleted"] is True and removed["nodes_deleted"] == [node_id]
        wait_until(lambda: not _heads(moto), what="head instance terminated")
        assert not (tmp_path / "client" / "deployment.json").exists()
        gone = _burla("deploy", "show", env=env)
        assert gone.returncode == 4 and "burla deploy aws|gcp|azure" in json.loads(gone.stdout)["error"]["message"]
    finally:
        farm.close()


def test_deploy_sends_nothing_to_a_head_vm_whose_host_key_is_not_the_one_the_cloud_reports(moto, tmp_path):
    """Someone answers at the head VM's address with another key: the deploy stops before any upload."""
    farm = MotoVmFarm(moto, tmp_path / "vms", host_keys="impostor")
    try:
        env = _client_env(tmp_path / "client", BURLA_SSH_ADDRESS_MAP=str(farm.map_path))
        done = _burla("deploy", "aws", "--port", str(_free_port()), "--wait", "60", env=env)
        assert done.returncode != 0, done.stdout
        message = json.loads(done.stdout)["error"]["message"]
        assert "presented SSH host key ssh-ed25519 SHA256:" in message and "its cloud reports" in message
        token = json.loads((tmp_path / "client" / "deployment.json").read_text())["token"]
        [head_vm] = _heads(moto)
        assert not [p for p in (tmp_path / "vms" / head_vm["InstanceId"]).rglob("*")
                    if p.is_file() and token.encode() in p.read_bytes()]
        _ok(_burla("deploy", "delete", env=env))
    finally:
        farm.close()


@pytest.mark.parametrize("cloud", ["gcp", "azure"])
def test_deploy_then_a_job_through_the_deployed_head_then_delete(cloud, request, tmp_path, wheelhouse, client_venv):
    fake = request.getfixturevalue({"gcp": "gce", "azure": "azure"}[cloud])
    if cloud == "gcp":  # the VM's service account, as its metadata server would hand it over
        farm = GceVmFarm(fake, tmp_path / "vms", vm_environment={
            "GOOGLE_APPLICATION_CREDENTIALS": os.environ["GOOGLE_APPLICATION_CREDENTIALS"]})
    else:  # the VM's managed identity, answered by the fake's instance metadata endpoint
        farm = AzureVmFarm(fake, tmp_path / "vms", vm_environment={"AZURE_POD_IDENTITY_AUTHORITY_HOST": fake.url})
    try:
        deployment, node_id, env = _deploy_and_run_a_job(cloud, farm, tmp_path, wheelhouse, client_venv)
        token = json.loads((tmp_path / "client" / "deployment.json").read_text())["token"]
        bodies = json.dumps([r.body for r in fake.requests])
        assert token not in bodies and "PRIVATE KEY" not in bodies  # no secret in any request
        removed = _ok(_burla("deploy", "delete", env=env))
        assert removed["head_deleted"] is True and removed["nodes_deleted"] == [node_id]
        assert not (fake.instances if cloud == "gcp" else fake.machines)
        if cloud == "azure":
            assert fake.logged("GET", "/metadata/identity/oauth2/token")  # the head used its own identity
    finally:
        farm.close()


def test_deploy_without_cloud_setup_names_the_fix(tmp_path, monkeypatch):
    env = _client_env(tmp_path)
    for key in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "GOOGLE_APPLICATION_CREDENTIALS"):
        env.pop(key, None)
    env.update(HOME=str(tmp_path), CLOUDSDK_CONFIG=str(tmp_path / "gcloud"))
    done = _burla("deploy", "gcp", "--wait", "0", env=env)
    assert done.returncode == 2
    error = json.loads(done.stdout)["error"]
    assert error["code"] == "cloud_setup" and "gcloud config set project" in error["message"]
    assert not (tmp_path / "deployment.json").exists()
    bad = _burla("deploy", "aws", "--port", "70000", env=env)
    assert bad.returncode == 2 and json.loads(bad.stdout)["error"]["code"] == "bad_usage"


KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGSoU/Sv+4Aho0bDRzg6Jfw/gNeQpWA7MK3bgrvqtfIJ burla-cluster-1"


def _head_machine(environment: dict[str, str], region: str | None = None):
    from burla.drivers.head_vm import HeadMachine

    return HeadMachine(name="burla-head-abc", ssh_public_key=KEY, region=region, environment=environment)


def test_the_gce_head_vm_gets_its_port_opened_the_ssh_key_and_the_default_service_account(gce):  # noqa: F811
    from burla.drivers.gcp.driver import GceConfig, GceDriver

    driver = GceDriver(GceConfig.from_environment(dict(os.environ), None, "cluster-1"))

    async def scenario():
        await driver.boot_head(_head_machine(driver.config.head_environment()))
        address = await driver.head_address("burla-head-abc")
        nodes = await driver.list_nodes()  # the head is not a node
        deleted = await driver.delete_head("burla-head-abc")
        await driver.close()
        return address, nodes, deleted

    address, nodes, deleted = asyncio.run(scenario())
    [firewall] = gce.logged("POST", "/global/firewalls")
    assert firewall.body["allowed"] == [{"IPProtocol": "tcp", "ports": ["5001", "22"]}]  # https, and SSH to set it up
    assert (firewall.body["sourceRanges"], firewall.body["targetTags"]) == (["0.0.0.0/0"], ["burla-head"])
    [insert] = gce.logged("POST", "/instances")
    assert insert.body["tags"]["items"] == ["burla-head"]
    assert insert.body["labels"] == {"burla-cluster": "cluster-1", "burla-role": "head"}
    assert insert.body["serviceAccounts"] == [{"email": "default",
                                               "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}]
    assert insert.body["metadata"]["items"] == [{"key": "ssh-keys", "value": f"burla:{KEY}"},
                                                {"key": "enable-oslogin", "value": "FALSE"},
                                                # its guest agent reports its SSH host keys there
                                                {"key": "enable-guest-attributes", "value": "TRUE"}]  # nothing else
    assert address == "34.10.0.2" and nodes == [] and deleted is True and not gce.instances


def test_the_azure_head_vm_gets_an_identity_with_a_role_the_ssh_key_and_its_ports_opened(azure):  # noqa: F811
    from burla.drivers.azure.driver import CONTRIBUTOR_ROLE, AzureConfig, AzureDriver

    driver = AzureDriver(AzureConfig.from_environment(dict(os.environ), "westeurope", "cluster-1"))

    async def scenario():
        await driver.boot_head(_head_machine(driver.config.head_environment(), "westeurope"))
        address = await driver.head_address("burla-head-abc")
        nodes = await driver.list_nodes()
        deleted = await driver.delete_head("burla-head-abc")
        await driver.close()
        return address, nodes, deleted

    address, nodes, deleted = asyncio.run(scenario())
    group = f"/subscriptions/{os.environ['AZURE_SUBSCRIPTION_ID']}/resourceGroups/burla-cluster-1"
    [nsg] = azure.logged("PUT", "/networkSecurityGroups/")
    assert nsg.path == f"{group}/providers/Microsoft.Network/networkSecurityGroups/burla-head-westeurope"
    rules = nsg.body["properties"]["securityRules"]
    assert [(r["properties"]["destinationPortRange"], r["properties"]["access"]) for r in rules] == [
        ("5001", "Allow"), ("22", "Allow")]
    [vm] = azure.logged("PUT", "/virtualMachines/")
    assert vm.body["identity"] == {"type": "SystemAssigned"}
    assert vm.body["tags"] == {"burla-cluster": "cluster-1", "burla-role": "head"}
    os_profile = vm.body["properties"]["osProfile"]
    assert "customData" not in os_profile
    assert os_profile["linuxConfiguration"]["ssh"]["publicKeys"] == [
        {"path": "/home/burla/.ssh/authorized_keys", "keyData": KEY}]
    nic = vm.body["properties"]["networkProfile"]["networkInterfaceConfigurations"][0]["properties"]
    assert nic["networkSecurityGroup"] == {"id": nsg.path}
    [grant] = azure.logged("PUT", "/roleAssignments/")
    assert grant.path.startswith(f"{group}/providers/Microsoft.Authorization/roleAssignments/")
    assert grant.body["properties"]["roleDefinitionId"].endswith(f"/roleDefinitions/{CONTRIBUTOR_ROLE}")
    assert grant.body["properties"]["principalId"] == azure.identities["burla-head-abc"]
    assert address == "20.61.0.4" and nodes == [] and deleted is True and not azure.machines


async def _boot_head(driver, head) -> None:
    try:
        await driver.boot_head(head)
    finally:
        await driver.close()


def test_a_gce_head_vm_on_an_arm_type_boots_the_arm_twin_of_its_image_family(gce):  # noqa: F811
    """The stand-in refuses an image of another architecture than the machine's, as GCE does."""
    import dataclasses

    from burla.drivers.gcp.driver import GceConfig, GceDriver

    driver = GceDriver(GceConfig.from_environment(dict(os.environ), None, "cluster-1"))
    asyncio.run(_boot_head(driver, dataclasses.replace(_head_machine(driver.config.head_environment()),
                                                       machine_type="c4a-standard-4")))
    [insert] = gce.logged("POST", "/instances")
    assert insert.body["disks"][0]["initializeParams"]["sourceImage"].split("/images/")[1].startswith("debian-12-arm64")


def test_an_azure_head_vm_on_an_arm_size_boots_the_arm_sku_of_its_image(azure):  # noqa: F811
    """Canonical's Arm SKU takes `-arm64` where the x64 one says `-gen2`; the stand-in refuses x64."""
    import dataclasses

    from burla.drivers.azure.driver import AzureConfig, AzureDriver

    config = AzureConfig.from_environment(dict(os.environ), "westeurope", "cluster-1")
    jammy = dataclasses.replace(config, image="Canonical:0001-com-ubuntu-server-jammy:22_04-lts-gen2:latest")
    asyncio.run(_boot_head(AzureDriver(jammy), dataclasses.replace(
        _head_machine(jammy.head_environment(), "westeurope"), machine_type="Standard_D4ps_v5")))
    [vm] = azure.logged("PUT", "/virtualMachines/")
    assert vm.body["properties"]["storageProfile"]["imageReference"]["sku"] == "22_04-lts-arm64"


def test_a_deployed_azure_head_takes_tokens_from_its_managed_identity(azure, monkeypatch):  # noqa: F811
    from burla.drivers.azure.driver import AzureConfig, AzureDriver

    for key in ("AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET"):
        monkeypatch.delenv(key)
    monkeypatch.setenv("BURLA_AZURE_MANAGED_IDENTITY", "1")
    monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", azure.url)
    driver = AzureDriver(AzureConfig.from_environment(dict(os.environ), None, "cluster-1"))
    assert asyncio.run(driver.list_nodes()) == []
    asyncio.run(driver.close())
    [token_request] = azure.logged("GET", "/metadata/identity/oauth2/token")
    assert token_request.query["resource"] == f"{azure.url}/"
    assert not azure.logged("POST", "/oauth2/")


def test_the_head_start_command_runs_the_head_under_systemd_where_the_image_has_it(tmp_path):
    """The systemd branch (real images) holds the same command the supervisor branch (stand-ins) ran;
    run through bash with systemd "present", it writes that unit."""
    import subprocess as sp

    from burla.drivers.head_vm import HeadMachine, start_command

    command = start_command("gce", HeadMachine("h", KEY, region="us-east1", environment={"GOOGLE_CLOUD_PROJECT": "p"},
                                               port=5001), wheelhouse=False)
    home, root, bin_dir = tmp_path / "home", tmp_path / "root", tmp_path / "bin"
    (home / ".burla").mkdir(parents=True)
    (root / "etc" / "systemd" / "system").mkdir(parents=True)
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    # Stand-ins for a systemd machine: `hostname -I`, passwordless sudo writing under `root`, systemctl.
    (bin_dir / "hostname").write_text("#!/bin/sh\necho 10.0.0.7 172.17.0.1\n")
    # The login user is not root (cloud images' default user), so root's work goes through sudo.
    (bin_dir / "id").write_text('#!/bin/sh\ncase "$1" in -u) echo 1000;; -un) echo ubuntu;; *) exec /usr/bin/id "$@";; '
                                'esac\n')
    (bin_dir / "sudo").write_text(f'#!/bin/sh\n[ "$1" = -n ] && shift\nif [ "$1" = tee ]; then exec tee "{root}$2"; '
                                  f'fi\necho "$@" >> {calls}\n')
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\necho systemctl \"$@\" >> {calls}\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    script = command.replace("[ -d /run/systemd/system ]", "true")
    done = sp.run(["bash", "-c", script], env={"HOME": str(home), "PATH": f"{bin_dir}:/usr/bin:/bin"},
                  capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "started under systemd" in done.stdout, done.stderr
    unit = (root / "etc" / "systemd" / "system" / "burla-head.service").read_text()
    burla_dir = home / ".burla"
    assert f"EnvironmentFile={burla_dir}/head.env" in unit and "Restart=always" in unit
    assert (f"ExecStart={burla_dir}/env/bin/burla head serve --host 0.0.0.0 --port 5001 --tls-cert "
            f"{burla_dir}/head-cert.pem") in unit
    assert "--url https://10.0.0.7:5001 --node-link direct --keep-nodes --region us-east1" in unit
    assert "User=ubuntu" in unit
    assert (burla_dir / "head.env").read_text() == f"BURLA_CONFIG_DIR='{burla_dir}/config'\nGOOGLE_CLOUD_PROJECT=p\n"
    assert oct((burla_dir / "head.env").stat().st_mode & 0o777) == "0o600"
    assert calls.read_text().splitlines()[-3:] == ["systemctl daemon-reload", "systemctl enable burla-head.service",
                                                   "systemctl restart burla-head.service"]


def test_no_setting_of_the_head_vm_is_expanded_by_the_shell_or_systemd(tmp_path):
    """A region or environment value holding `$( )`, backquotes, `$VAR` or `%` specifiers is
    written verbatim: the shell runs none of it, and systemd is told to pass it on as it is."""
    import subprocess as sp

    from burla.drivers.head_vm import HeadMachine, start_command

    planted = tmp_path / "planted"
    hostile = f"x$(touch {planted})`touch {planted}`$HOME%h"
    command = start_command("gce", HeadMachine("h", KEY, region=hostile, environment={"GOOGLE_CLOUD_PROJECT": hostile}),
                            wheelhouse=False)
    home, root, bin_dir = tmp_path / "home", tmp_path / "root", tmp_path / "bin"
    (home / ".burla").mkdir(parents=True)
    (root / "etc" / "systemd" / "system").mkdir(parents=True)
    bin_dir.mkdir()
    (bin_dir / "hostname").write_text("#!/bin/sh\necho 10.0.0.7\n")
    # Not root (cloud images' default user), so root's work goes through the sudo stand-in.
    (bin_dir / "id").write_text('#!/bin/sh\ncase "$1" in -u) echo 1000;; -un) echo ubuntu;; *) exec /usr/bin/id "$@";; '
                                'esac\n')
    (bin_dir / "sudo").write_text(f'#!/bin/sh\n[ "$1" = -n ] && shift\nif [ "$1" = tee ]; then exec tee "{root}$2"; '
                                  'fi\n')
    (bin_dir / "systemctl").write_text("#!/bin/sh\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    done = sp.run(["bash", "-c", command.replace("[ -d /run/systemd/system ]", "true")],
                  env={"HOME": str(home), "PATH": f"{bin_dir}:/usr/bin:/bin"}, capture_output=True, text=True,
                  timeout=30)
    assert done.returncode == 0, done.stderr
    assert not planted.exists()
    unit = (root / "etc" / "systemd" / "system" / "burla-head.service").read_text()
    escaped = hostile.replace("$", "$$").replace("%", "%%")
    assert f'--region "{escaped}"' in unit  # systemd passes "$$" as "$" and "%%" as "%"
    env_file = (home / ".burla" / "head.env").read_text()
    assert sp.run(["bash", "-c", f"set -a; . {home / '.burla' / 'head.env'}; printf %s \"$GOOGLE_CLOUD_PROJECT\""],
                  capture_output=True, text=True).stdout == hostile, env_file
    assert not planted.exists()
