"""`burla deploy`: a head VM per cloud serving https with a pinned certificate.

EC2 end to end against moto: `burla deploy aws` creates the head instance (role, security group,
user data), the test plays that VM's head here from its user data, the client and CLI reach it
through the deployment record (pinned certificate, token), the head boots a node instance whose
user data (played too) pins the same certificate, a job runs, and `burla deploy delete` removes
the head and its nodes. GCE and Azure: the head VM requests against their recorded APIs.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from burla import remote_parallel_map
from tests import functions
from tests.conftest import REPO
from tests.helpers import wait_until
from tests.play_vm import boot_from_startup_script, heredoc, start_played_head
from tests.test_azure_driver import azure  # noqa: F401 - fixture
from tests.test_ec2_driver import _instances
from tests.test_gce_driver import gce  # noqa: F401 - fixture


def _burla(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "burla", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=180, env=env)


def _ok(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])["data"]


def _client_env(config_dir) -> dict[str, str]:
    env = dict(os.environ, BURLA_CONFIG_DIR=str(config_dir))
    for key in ("BURLA_CLUSTER_DASHBOARD_URL", "BURLA_CLUSTER_TOKEN", "BURLA_HEAD_CERT", "BURLA_CLOUD"):
        env.pop(key, None)
    return env


def _user_data(ec2, instance: dict) -> str:
    data = ec2.describe_instance_attribute(InstanceId=instance["InstanceId"], Attribute="userData")
    return base64.b64decode(data["UserData"]["Value"]).decode()


def _heads(ec2) -> list[dict]:
    return [i for i in _instances_with_tag(ec2, "burla-role") if i["State"]["Name"] in ("pending", "running")]


def _instances_with_tag(ec2, key: str) -> list[dict]:
    reservations = ec2.describe_instances(Filters=[{"Name": "tag-key", "Values": [key]}])["Reservations"]
    return [i for r in reservations for i in r["Instances"]]


def test_deploy_aws_runs_a_pinned_https_head_that_boots_nodes_and_delete_removes_everything(
        moto, tmp_path, monkeypatch):  # noqa: F811
    config = tmp_path / "client"
    env = _client_env(config)
    deployed = _ok(_burla("deploy", "aws", "--wait", "0", "--machine-type", "t3.micro", env=env))
    deployment = deployed["deployment"]
    [head_vm] = _heads(moto)
    tags = {t["Key"]: t["Value"] for t in head_vm["Tags"]}
    assert (tags["burla-role"], tags["Name"], head_vm["InstanceType"]) == ("head", deployment["head_id"], "t3.micro")
    assert deployment["head_url"] == f"https://{head_vm['PublicIpAddress']}:5001" and deployed["serving"] is False
    # The head VM boots nodes with its own role, and its port is open.
    assert head_vm["IamInstanceProfile"]["Arn"].endswith("instance-profile/burla-head")
    iam = boto3.client("iam", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
    policy = iam.get_role_policy(RoleName="burla-head", PolicyName="burla-nodes")["PolicyDocument"]
    assert "ec2:RunInstances" in policy["Statement"][0]["Action"]
    [group] = moto.describe_security_groups(GroupNames=["burla-head"])["SecurityGroups"]
    assert [(p["FromPort"], p["IpRanges"][0]["CidrIp"]) for p in group["IpPermissions"]] == [(5001, "0.0.0.0/0")]
    interface_groups = [g["GroupId"] for n in head_vm["NetworkInterfaces"] for g in n["Groups"]]
    assert group["GroupId"] in [g["GroupId"] for g in head_vm["SecurityGroups"]] + interface_groups
    script = _user_data(moto, head_vm)
    assert "burla[aws]==" in script and "systemctl enable --now burla-head.service" in script
    assert "--driver ec2 --region us-east-1 --url ${BURLA_HEAD_PRIVATE_URL}" in script
    assert heredoc(script, "BURLA_HEAD_CERT") == Path(deployment["head_cert"]).read_text().strip()
    # The client's config now names that head; a second deploy is refused.
    shown = _ok(_burla("deploy", "show", env=env))
    assert shown["deployment"] == deployment and shown["serving"] is False  # moto's addresses lead nowhere
    again = _burla("deploy", "aws", "--wait", "0", env=env)
    assert again.returncode == 2 and "already deployed" in json.loads(again.stdout)["error"]["message"]

    # Play the head VM here; reach it with the deployment's certificate and token.
    head = start_played_head(script, tmp_path / "head-vm")
    node = None
    try:
        assert head.url.startswith("https://127.0.0.1:")
        monkeypatch.setenv("BURLA_CONFIG_DIR", str(config))
        monkeypatch.setenv("BURLA_CLUSTER_DASHBOARD_URL", head.url)
        monkeypatch.setenv("BURLA_CLUSTER_TOKEN", head.token)
        monkeypatch.delenv("BURLA_HEAD_CERT", raising=False)  # the deployment's certificate is used
        env = dict(os.environ)
        _ok(_burla("settings", "update", "--quantity", "1", "--machine-type", "t3.micro", env=env))
        [node_id] = _ok(_burla("cluster", "start", env=env))["booted"]
        [node_vm] = [i for i in _instances(moto) if {"Key": "burla-node-id", "Value": node_id} in i["Tags"]]
        node_script = _user_data(moto, node_vm)
        assert heredoc(node_script, "BURLA_HEAD_CERT") == heredoc(script, "BURLA_HEAD_CERT")  # nodes pin it too
        node = boot_from_startup_script(node_script)
        wait_for_nodes_https(env)
        assert remote_parallel_map(functions.double, [1, 2, 3], spinner=False) == [2, 4, 6]
    finally:
        head.stop()  # the head first: a node killed after it can't ask for its VM's deletion
        if node is not None:
            node.kill()
            node.wait(15)

    removed = _ok(_burla("deploy", "delete", env=_client_env(config)))
    assert removed["head_deleted"] is True and removed["nodes_deleted"] == [node_id]
    wait_until(lambda: not _heads(moto), what="head instance terminated")
    assert not (config / "deployment.json").exists()
    gone = _burla("deploy", "show", env=_client_env(config))
    assert gone.returncode == 4 and "burla deploy aws|gcp|azure" in json.loads(gone.stdout)["error"]["message"]


def wait_for_nodes_https(env: dict[str, str]) -> None:
    def joined() -> bool:
        done = _burla("nodes", "list", env=env)
        return done.returncode == 0 and len(json.loads(done.stdout)["data"]) == 1

    wait_until(joined, timeout=90, what="the node joined the https head")


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


def _head_machine(environment: dict[str, str], region: str | None = None):
    from burla.drivers.head_vm import HeadMachine

    return HeadMachine(name="burla-head-abc", token="tok", cert_pem="-----BEGIN CERTIFICATE-----\nMIIB\n-----END "
                       "CERTIFICATE-----", key_pem="-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----",
                       region=region, environment=environment)


def test_the_gce_head_vm_gets_its_port_opened_and_the_default_service_account(gce):  # noqa: F811
    from burla.drivers.gce import GceConfig, GceDriver

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
    assert firewall.body["allowed"] == [{"IPProtocol": "tcp", "ports": ["5001"]}]
    assert (firewall.body["sourceRanges"], firewall.body["targetTags"]) == (["0.0.0.0/0"], ["burla-head"])
    [insert] = gce.logged("POST", "/instances")
    assert insert.body["tags"]["items"] == ["burla-head"]
    assert insert.body["labels"] == {"burla-cluster": "cluster-1", "burla-role": "head"}
    assert insert.body["serviceAccounts"] == [{"email": "default",
                                               "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}]
    script = next(i["value"] for i in insert.body["metadata"]["items"] if i["key"] == "startup-script")
    assert "burla[gcp]==" in script and "--driver gce" in script and "GOOGLE_CLOUD_PROJECT=burla-test" in script
    assert address == "34.10.0.2" and nodes == [] and deleted is True and not gce.instances


def test_the_azure_head_vm_gets_an_identity_with_a_role_and_its_port_opened(azure):  # noqa: F811
    from burla.drivers.azure import CONTRIBUTOR_ROLE, AzureConfig, AzureDriver

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
    [rule] = nsg.body["properties"]["securityRules"]
    assert (rule["properties"]["destinationPortRange"], rule["properties"]["access"]) == ("5001", "Allow")
    [vm] = azure.logged("PUT", "/virtualMachines/")
    assert vm.body["identity"] == {"type": "SystemAssigned"}
    assert vm.body["tags"] == {"burla-cluster": "cluster-1", "burla-role": "head"}
    nic = vm.body["properties"]["networkProfile"]["networkInterfaceConfigurations"][0]["properties"]
    assert nic["networkSecurityGroup"] == {"id": nsg.path}
    [grant] = azure.logged("PUT", "/roleAssignments/")
    assert grant.path.startswith(f"{group}/providers/Microsoft.Authorization/roleAssignments/")
    assert grant.body["properties"]["roleDefinitionId"].endswith(f"/roleDefinitions/{CONTRIBUTOR_ROLE}")
    assert grant.body["properties"]["principalId"] == azure.identities["burla-head-abc"]
    script = base64.b64decode(azure.custom_data["burla-head-abc"]).decode()
    assert "burla[azure]==" in script and "BURLA_AZURE_MANAGED_IDENTITY=1" in script
    assert address == "20.61.0.4" and nodes == [] and deleted is True and not azure.machines


def test_a_deployed_azure_head_takes_tokens_from_its_managed_identity(azure, monkeypatch):  # noqa: F811
    from burla.drivers.azure import AzureConfig, AzureDriver

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


def _gce_scripts(fake) -> dict[str, str]:
    return {i["name"]: next(m["value"] for m in i["metadata"]["items"] if m["key"] == "startup-script")
            for i in fake.instances.values()}


def _azure_scripts(fake) -> dict[str, str]:
    return {key[2]: base64.b64decode(fake.custom_data[key[2]]).decode() for key in fake.machines}


@pytest.mark.parametrize("cloud", ["gcp", "azure"])
def test_deploy_then_a_job_through_the_played_head_then_delete(cloud, request, tmp_path, monkeypatch):
    fake = request.getfixturevalue({"gcp": "gce", "azure": "azure"}[cloud])
    scripts = {"gcp": _gce_scripts, "azure": _azure_scripts}[cloud]
    config = tmp_path / "client"
    deployment = _ok(_burla("deploy", cloud, "--wait", "0", env=_client_env(config)))["deployment"]
    head_script = scripts(fake)[deployment["head_id"]]
    assert deployment["head_url"].startswith("https://") and f"--driver {'gce' if cloud == 'gcp' else 'azure'}" in \
        head_script
    if cloud == "azure":  # the played head asks its managed identity for tokens: the fake answers for IMDS
        monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", fake.url)
    head = start_played_head(head_script, tmp_path / "head-vm")
    node = None
    try:
        monkeypatch.setenv("BURLA_CONFIG_DIR", str(config))
        monkeypatch.setenv("BURLA_CLUSTER_DASHBOARD_URL", head.url)  # the fake's address leads nowhere
        monkeypatch.setenv("BURLA_CLUSTER_TOKEN", head.token)
        env = dict(os.environ)
        _ok(_burla("settings", "update", "--quantity", "1", env=env))
        [node_id] = _ok(_burla("cluster", "start", env=env))["booted"]
        node = boot_from_startup_script(scripts(fake)[node_id])
        wait_for_nodes_https(env)
        assert remote_parallel_map(functions.double, [4, 5], spinner=False) == [8, 10]
    finally:
        head.stop()
        if node is not None:
            node.kill()
            node.wait(15)
    removed = _ok(_burla("deploy", "delete", env=_client_env(config)))
    assert removed["head_deleted"] is True and removed["nodes_deleted"] == [node_id]
    assert scripts(fake) == {}
    if cloud == "azure":
        assert fake.logged("GET", "/metadata/identity/oauth2/token")  # the head used its own identity
