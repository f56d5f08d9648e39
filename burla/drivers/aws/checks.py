"""`burla cloud check` on AWS: what booting a node needs, asked of EC2 before any VM boots.

Permissions are asked with EC2's dry runs (a `DryRunOperation` answer means allowed,
`UnauthorizedOperation` means not), so nothing is created and nothing is billed.
https://docs.aws.amazon.com/AWSEC2/latest/APIReference/CommonParameters.html (DryRun)
"""

from __future__ import annotations

from typing import Any, Protocol

from burla.drivers.aws.images import InstanceType, architecture_of, instance_type
from burla.drivers.aws.quotas import quota_room
from burla.drivers.base import CloudCheck
from burla.errors import CloudSetupError

NODE_GROUP_NAME = "burla-nodes"  # port 22 from anywhere (key-only logins), any port between nodes


def node_group_name(cluster_id: str) -> str:
    """One cluster's nodes' security group: its nodes' ports admit that group's members only (a
    rule naming a group admits the instances it is attached to:
    docs.aws.amazon.com/vpc/latest/userguide/security-group-rules.html#security-group-referencing)."""
    return f"{NODE_GROUP_NAME}-{cluster_id}"
NO_INSTANCE = "i-0000000000000000f"  # dry runs of calls on an instance name one that need not exist
DENIED = ("UnauthorizedOperation", "AccessDenied", "AccessDeniedException")


class CheckedEc2(Protocol):
    """What the checks ask of the EC2 driver."""

    @property
    def region(self) -> str: ...

    def client(self, service: str) -> Any: ...

    def image_for(self, driver: Any, machine: InstanceType, gpu: bool) -> tuple[Any, str]: ...

    def subnets_offering(self, driver: Any, machine_type: str) -> list: ...

    @property
    def node_group(self) -> str: ...


def ec2_checks(ec2: CheckedEc2, driver: Any, machine_type: str) -> list[CloudCheck]:
    import botocore.exceptions

    region = ec2.region
    try:
        identity = ec2.client("sts").get_caller_identity()
    except botocore.exceptions.ClientError as e:
        return [CloudCheck("credentials", CloudCheck.FAIL, f"AWS refused the credentials: {e}",
                           "sign in again: `aws sso login`, or `aws configure`")]
    checks = [CloudCheck("credentials", CloudCheck.OK,
                         f"signed in as {identity['Arn']} (account {identity['Account']}); region {region}")]
    try:
        machine = instance_type(driver, region, machine_type)
    except CloudSetupError as e:
        return [*checks, CloudCheck("machine type", CloudCheck.FAIL, str(e),
                                    "pick a type the region offers: `burla settings update --machine-type TYPE`")]
    checks.append(CloudCheck("machine type", CloudCheck.OK, f"{machine.name}: {machine.vcpus} vCPUs, "
                             f"{machine.memory_gb:g} GB, {architecture_of(machine)}"
                             + (f", {machine.gpu_count} {machine.gpu} GPU(s)" if machine.gpu_count else "")))
    try:
        image, user = ec2.image_for(driver, machine, gpu=machine.gpu_count > 0)
        checks.append(CloudCheck("image", CloudCheck.OK, f"{image.name} ({image.id}), login user {user}"))
    except CloudSetupError as e:
        return [*checks, CloudCheck("image", CloudCheck.FAIL, str(e))]
    try:
        zones = sorted({subnet.extra.get("zone") or subnet.id for subnet in ec2.subnets_offering(driver, machine.name)})
        checks.append(CloudCheck("network", CloudCheck.OK, f"subnets in {', '.join(zones)}"))
    except CloudSetupError as e:
        checks.append(CloudCheck("network", CloudCheck.FAIL, str(e)))
    checks.append(_permissions(ec2.client("ec2"), image.id, machine.name))
    checks.append(_quota(ec2, driver, machine))
    checks.append(_ssh_path(ec2.client("ec2"), ec2.node_group))
    return checks


def _permissions(client: Any, image_id: str, machine_type: str) -> CloudCheck:
    """Each call the head makes that changes something, as a dry run; the reads ran above."""
    import botocore.exceptions

    tags = [{"ResourceType": "instance", "Tags": [{"Key": "burla-cluster", "Value": "check"}]}]
    calls = {
        "ec2:RunInstances (with tags, so ec2:CreateTags too)": lambda: client.run_instances(
            ImageId=image_id, InstanceType=machine_type, MinCount=1, MaxCount=1, TagSpecifications=tags, DryRun=True),
        "ec2:TerminateInstances": lambda: client.terminate_instances(InstanceIds=[NO_INSTANCE], DryRun=True),
        "ec2:CreateSecurityGroup": lambda: client.create_security_group(
            GroupName="burla-check", Description="burla cloud check (dry run)", DryRun=True),
        "ec2:DescribeInstances": lambda: client.describe_instances(MaxResults=5),
        "ec2:DescribeKeyPairs": lambda: client.describe_key_pairs(),
        "ec2:GetConsoleOutput": lambda: client.get_console_output(InstanceId=NO_INSTANCE, DryRun=True),
    }
    missing, unclear = [], []
    for action, call in calls.items():
        try:
            call()
        except botocore.exceptions.ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if code in DENIED:
                missing.append(action)
            elif code != "DryRunOperation" and not code.startswith("InvalidInstanceID"):
                unclear.append(f"{action}: {code}")
    if missing:
        return CloudCheck("permissions", CloudCheck.FAIL, "missing " + "; ".join(missing),
                          "allow these actions in the IAM policy of the user or role burla runs as")
    if unclear:
        return CloudCheck("permissions", CloudCheck.WARN, "could not tell " + "; ".join(unclear))
    return CloudCheck("permissions", CloudCheck.OK, f"{len(calls)} calls allowed (dry runs)")


def _quota(ec2: CheckedEc2, driver: Any, machine: InstanceType) -> CloudCheck:
    import botocore.exceptions

    try:
        room = quota_room(driver, ec2.client("service-quotas"), ec2.region, machine.name, spot=False)
    except botocore.exceptions.ClientError as e:
        return CloudCheck("vCPU quota", CloudCheck.WARN, f"could not read it ({e.response['Error']['Code']}); "
                          "grow plans without it and learns the limit from refusals",
                          "allow servicequotas:GetServiceQuota")
    if room is None:
        return CloudCheck("vCPU quota", CloudCheck.WARN, f"no known vCPU quota for {machine.name}")
    if room.free < machine.vcpus:
        return CloudCheck("vCPU quota", CloudCheck.FAIL, f"no room for one {machine.name} ({machine.vcpus} vCPUs): "
                          f"{room.sentence()}", room.how_to_raise)
    return CloudCheck("vCPU quota", CloudCheck.OK, f"{room.name}: {room.limit} vCPUs, {room.used} in use (room for "
                      f"{room.free // machine.vcpus} {machine.name})")


def _ssh_path(client: Any, group_name: str) -> CloudCheck:
    groups = client.describe_security_groups(Filters=[{"Name": "group-name", "Values": [group_name]}])
    opened = [g for g in groups["SecurityGroups"] for rule in g.get("IpPermissions", [])
              if rule.get("FromPort", -1) <= 22 <= rule.get("ToPort", -1)
              and any(r.get("CidrIp") == "0.0.0.0/0" for r in rule.get("IpRanges", []))]
    if opened:
        return CloudCheck("ssh path", CloudCheck.OK, f"security group {group_name} opens port 22")
    what = "exists without port 22 open" if groups["SecurityGroups"] else "does not exist yet"
    return CloudCheck("ssh path", CloudCheck.OK, f"security group {group_name} {what}; the first boot opens 22 "
                      "(logins take the cluster's key only)")
