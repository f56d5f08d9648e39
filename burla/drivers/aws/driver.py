"""The EC2 driver: nodes are VMs in the user's AWS account, through apache-libcloud.

- Credentials come from botocore's chain (environment, shared config and credentials files,
  profiles, SSO); an expired SSO session or missing credentials raise `CloudSetupError` naming
  the command that fixes it.
- `AWS_ENDPOINT_URL_EC2` / `AWS_ENDPOINT_URL` are honoured, as AWS SDK users expect (this is also
  how the tests reach a moto server on 127.0.0.1).
- Node VMs carry no user data: the head imports the cluster's SSH key as an EC2 key pair and
  sets each VM up over SSH (`burla.drivers.ssh.driver`). They sit in a security group `burla-nodes`
  that opens port 22 and lets nodes reach each other, and terminate when shut down. VMs are
  tagged with the cluster and node id, listed and deleted by those tags.
- Every libcloud call runs in the driver's own thread pool (`burla.drivers.cloud`).
"""

from __future__ import annotations

import logging
import re
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from burla.drivers.aws.bake import delete_baked, find_baked, image_state, list_baked, start_image
from burla.drivers.aws.checks import ec2_checks, node_group_name
from burla.drivers.aws.config import EXPIRED_CODES, Ec2Config, login_command, resolve_credentials
from burla.drivers.aws.images import (
    FAMILIES,
    GPU_FAMILY,
    LOGIN_USER_BY_OWNER,
    InstanceType,
    architecture_of,
    image_by_id,
    instance_type,
    newest_image,
    zones_offering,
)
from burla.drivers.aws.machines import list_machines
from burla.drivers.aws.quotas import quota_room
from burla.drivers.bake import image_key, until_available
from burla.drivers.base import BakedImage, BootRequest, CloudCheck, NodeHandle, QuotaRoom, VmAddress
from burla.drivers.catalog import MachineType
from burla.drivers.cloud import CLUSTER_TAG, NODE_TAG, ThreadedCloudDriver, first_with_capacity
from burla.drivers.head_vm import ROLE_TAG, HeadMachine
from burla.drivers.ssh.bootstrap import dead_man_script, this_python
from burla.errors import CloudRefused, CloudSetupError
from burla.process.build import build_hash
from burla.protocol.states import MachineState

log = logging.getLogger("burla.ec2")
DEFAULT_MACHINE_TYPE = "m7i.2xlarge"
HEAD_ACCESS_NAME = "burla-head"  # the head VM's IAM role, instance profile and security group
HEAD_ROLE_ACTIONS = [
    "ec2:RunInstances", "ec2:TerminateInstances", "ec2:DescribeInstances", "ec2:DescribeImages",
    "ec2:DescribeSubnets", "ec2:CreateTags", "ec2:GetConsoleOutput", "iam:CreateServiceLinkedRole",
    "ec2:DescribeKeyPairs", "ec2:ImportKeyPair", "ec2:DescribeSecurityGroups", "ec2:CreateSecurityGroup",
    "ec2:AuthorizeSecurityGroupIngress", "ec2:DescribeInstanceTypes", "ec2:DescribeInstanceTypeOfferings",
    "servicequotas:GetServiceQuota", "ec2:CreateImage", "ec2:DeregisterImage", "ec2:DeleteSnapshot",
]
_EC2_NAMESPACE = re.compile(r'\s?xmlns="http://ec2\.amazonaws\.com/doc/[^"]*"')


def _libcloud_driver_class() -> type:
    from libcloud.compute.drivers.ec2 import NAMESPACE, EC2Connection, EC2NodeDriver, EC2Response

    class Response(EC2Response):
        """Normalise the XML namespace: AWS-compatible endpoints (moto among them) vary it."""

        def parse_body(self):
            self.body = _EC2_NAMESPACE.sub(f' xmlns="{NAMESPACE}"', self.body)
            return super().parse_body()

        def parse_error(self):
            self.body = _EC2_NAMESPACE.sub("", self.body)  # AWS error bodies carry no namespace
            return super().parse_error()

    class Connection(EC2Connection):
        responseCls = Response

    class NodeDriver(EC2NodeDriver):
        connectionCls = Connection

    return NodeDriver


class Ec2Driver(ThreadedCloudDriver):
    name = "ec2"

    def __init__(self, config: Ec2Config, credentials: Callable[[Ec2Config], tuple[str, str, str | None]]
                 = resolve_credentials) -> None:
        self.config = config
        self.ssh_user = config.ssh_user or FAMILIES[config.image_family].login_user
        self._login_users: dict[str, str] = {}  # node id -> its image's login user
        self._credentials = credentials
        super().__init__()

    def _driver(self) -> Any:
        """The thread's libcloud driver, made again when the credentials have been renewed."""
        current = self._credentials(self.config)
        driver = getattr(self._local, "driver", None)
        if driver is None or getattr(self._local, "credentials", None) != current:
            driver = self._local.driver = self._new_libcloud_driver(current)
            self._local.credentials = current
        return driver

    def _setup_problem(self, message: str) -> str | None:
        if any(code in message for code in EXPIRED_CODES):
            return (f"The AWS credentials have expired ({message}). Run `{login_command(self.config)}` (or renew "
                    "the keys in your environment); the head picks the new ones up by itself.")
        return None

    def _new_libcloud_driver(self, credentials: tuple[str, str, str | None] | None = None) -> Any:
        key, secret, token = credentials or self._credentials(self.config)
        kwargs: dict[str, Any] = {"region": self.config.region, "signature_version": "4", "token": token,
                                  "timeout": 60}
        if self.config.endpoint:
            parsed = urllib.parse.urlsplit(self.config.endpoint)
            kwargs.update(host=parsed.hostname, port=parsed.port or (443 if parsed.scheme == "https" else 80),
                          secure=parsed.scheme == "https")
        return _libcloud_driver_class()(key, secret, **kwargs)

    # --- the driver interface --------------------------------------------------------------

    def image_for(self, driver, machine: InstanceType, gpu: bool, python_version: str | None = None
                  ) -> tuple[Any, str]:
        """The image to boot `machine` from (the family's baked image for this build and Python,
        once there is one), and the user its VMs accept logins for."""
        if self.config.ami:
            image = image_by_id(driver, self.config.ami, machine, self.config.region)
            return image, self.config.ssh_user or LOGIN_USER_BY_OWNER.get(image.extra.get("owner_id"), "ec2-user")
        family = FAMILIES[GPU_FAMILY if gpu else self.config.image_family]
        baked = self.baked.find(self._bake_key(machine, gpu, python_version),
                                lambda key: find_baked(self.client("ec2"), key))
        if baked is not None:  # one deleted since the lookup is EC2's InvalidAMIID.NotFound (see cloud.py)
            listed = [i for i in driver.list_images(ex_image_ids=[baked]) if i.extra.get("state") == "available"]
            if listed:
                return listed[0], self.config.ssh_user or family.login_user
            self.baked.forget()  # deregistered, still listed for a while: the stock image serves this boot
        image = newest_image(driver, family, architecture_of(machine), self.config.region)
        return image, self.config.ssh_user or family.login_user

    def _bake_key(self, machine: InstanceType, gpu: bool, python_version: str | None) -> str | None:
        if not self.config.bake or self.config.ami or gpu:  # GPU builders would bill a GPU machine
            return None
        major, minor = (python_version or this_python()).split(".")[:2]
        return image_key(build_hash(), f"{major}.{minor}", self.config.image_family, architecture_of(machine))

    async def bake_key(self, request: BootRequest) -> str | None:
        if request.image is not None:  # a container's image is pulled on the node: nothing to bake
            return None
        machine = await self._call(instance_type, self.config.region, request.machine_type or DEFAULT_MACHINE_TYPE)
        return self._bake_key(machine, request.gpu_count > 0, request.python_version)

    async def builder_machine_type(self, request: BootRequest) -> str | None:
        """`<family>.large` (m7i.48xlarge -> m7i.large) if the region describes it and it has fewer
        vCPUs than the node's type (t3.micro builds on itself)."""
        name = request.machine_type or DEFAULT_MACHINE_TYPE
        small = f"{name.split('.', 1)[0]}.large"
        try:
            node = await self._call(instance_type, self.config.region, name)
            builder = await self._call(instance_type, self.config.region, small)
        except (CloudSetupError, CloudRefused):
            return name
        return small if builder.vcpus < node.vcpus else name

    async def baked_images(self) -> list[BakedImage]:
        return await self._call(lambda _: list_baked(self.client("ec2")))

    async def bake(self, node_id: str, key: str) -> BakedImage:
        def start(driver) -> str:
            [node] = [n for n in self._cluster_nodes(driver) if n.extra.get("tags", {}).get(NODE_TAG) == node_id]
            return start_image(self.client("ec2"), node.id, key)

        image_id = await self._call(start)
        baked = await until_available(lambda: self._call(lambda _: image_state(self.client("ec2"), image_id)),
                                      f"ec2: baking image {image_id}")
        self.baked.remember(key, image_id)
        return baked

    def _delete_baked(self, driver, image_id: str) -> bool:
        return delete_baked(self.client("ec2"), image_id)

    def login_user(self, node_id: str) -> str:
        return self._login_users.get(node_id) or self.ssh_user

    def _boot_one(self, driver, request: BootRequest, node_id: str) -> str:
        from libcloud.compute.base import NodeSize

        machine = instance_type(driver, self.config.region, request.machine_type or DEFAULT_MACHINE_TYPE)
        size = NodeSize(machine.name, machine.name, 0, 0, 0, 0, driver)
        image, self._login_users[node_id] = self.image_for(driver, machine, request.gpu_count > 0,
                                                           request.python_version)
        tags = {CLUSTER_TAG: self.config.cluster_id, NODE_TAG: node_id}
        kwargs: dict[str, Any] = {
            "ex_metadata": tags,
            "ex_terminate_on_shutdown": True,  # a node that powers its VM off deletes it
            "ex_spot": request.spot,
        }
        if request.ssh_public_key:
            kwargs["ex_keyname"] = self._key_pair(driver, request.ssh_public_key)
        if request.power_off_after_s:
            kwargs["ex_userdata"] = dead_man_script(request.power_off_after_s)
        if request.disk_gb:
            kwargs["ex_blockdevicemappings"] = [
                {"DeviceName": image.extra.get("root_device_name") or "/dev/xvda",
                 "Ebs": {"VolumeSize": request.disk_gb, "VolumeType": "gp3", "DeleteOnTermination": "true"}}
            ]
        groups = [self._node_security_group(driver), *self.config.security_group_ids]

        def launch(subnet: Any) -> str:
            # A public address: the head reaches the VM over SSH, and the VM reaches the package index.
            driver.create_node(name=node_id, size=size, image=image, ex_subnet=subnet, ex_security_group_ids=groups,
                               ex_assign_public_ip=True, **kwargs)
            return node_id

        return first_with_capacity(self.subnets_offering(driver, machine.name), launch,
                                   lambda subnet: subnet.extra.get("zone") or subnet.id,
                                   f"{machine.name} in {self.config.region}")

    async def machine_types(self) -> list[MachineType]:
        return await self._call(list_machines, self.config.region)

    async def quota_room(self, machine_type: str, spot: bool) -> QuotaRoom | None:
        try:
            return await self._call(self._quota_room, machine_type, spot)
        except CloudRefused as e:  # e.g. no servicequotas:GetServiceQuota: the boot's refusal will say it
            log.warning("could not read the EC2 vCPU quota for %s: %s", machine_type, e)
            return None

    def _quota_room(self, driver, machine_type: str, spot: bool) -> QuotaRoom | None:
        return quota_room(driver, self.client("service-quotas"), self.config.region, machine_type, spot)

    @property
    def region(self) -> str:
        return self.config.region

    def client(self, service: str) -> Any:
        """A botocore client for what libcloud does not cover (IAM, Service Quotas, STS, dry runs)."""
        import botocore.session

        key, secret, token = self._credentials(self.config)
        endpoints = {"ec2": self.config.endpoint, "iam": self.config.iam_endpoint,
                     "service-quotas": self.config.quotas_endpoint, "sts": self.config.sts_endpoint}
        return botocore.session.Session(profile=self.config.profile).create_client(
            service, region_name=self.config.region, endpoint_url=endpoints.get(service), aws_access_key_id=key,
            aws_secret_access_key=secret, aws_session_token=token)

    def _checks(self, driver, machine_type: str | None) -> list[CloudCheck]:
        return ec2_checks(self, driver, machine_type or DEFAULT_MACHINE_TYPE)

    def subnets_offering(self, driver, machine_type: str) -> list:
        """Where the VM may go: the configured subnet, else the region's default subnets in the zones
        that offer the machine type (tried in turn when a zone has no capacity)."""
        if self.config.subnet_id:
            return driver.ex_list_subnets(subnet_ids=[self.config.subnet_id])
        zones = set(zones_offering(driver, machine_type))
        defaults = [s for s in driver.ex_list_subnets(filters={"default-for-az": "true"})
                    if s.extra.get("zone") in zones]
        if not defaults:
            raise CloudSetupError(f"{machine_type} is not offered in a zone of {self.config.region} with a default "
                                  "subnet; pick another machine type or region, or set BURLA_AWS_SUBNET_ID.")
        return sorted(defaults, key=lambda s: s.extra.get("zone") or "")

    def _key_pair(self, driver, public_key: str) -> str:
        """The SSH key as an EC2 key pair (imported once per region). The name carries the key's
        digest: a deploying machine and the deployed head each have their own key for one cluster."""
        import hashlib

        name = f"burla-{self.config.cluster_id}-{hashlib.sha256(public_key.split()[1].encode()).hexdigest()[:8]}"
        try:
            if name not in {pair.name for pair in driver.list_key_pairs()}:
                driver.import_key_pair_from_string(name, public_key)
        except Exception as e:  # noqa: BLE001 - libcloud's errors are untyped
            if "UnauthorizedOperation" in str(e) or "AccessDenied" in str(e):
                raise CloudSetupError(
                    f"Could not import the cluster's SSH key as EC2 key pair {name!r}: {e}. The head needs "
                    "ec2:DescribeKeyPairs and ec2:ImportKeyPair.") from None
            if "Duplicate" not in str(e):
                raise
        return name

    @property
    def node_group(self) -> str:
        return node_group_name(self.config.cluster_id)

    def _node_security_group(self, driver) -> str:
        """`burla-nodes`: port 22 open (logins take the cluster's key only) and any port between
        its members (peers steal through their node's port). Created once per VPC."""
        vpc_id = None
        if self.config.subnet_id:
            vpc_id = driver.ex_list_subnets(subnet_ids=[self.config.subnet_id])[0].extra.get("vpc_id")
        filters = {"group-name": self.node_group, **({"vpc-id": vpc_id} if vpc_id else {})}
        try:
            existing = driver.ex_get_security_groups(filters=filters)
            if existing:
                group_id = existing[0].id
            else:
                try:
                    group_id = driver.ex_create_security_group(
                        self.node_group, "burla nodes: SSH from their head, any port between this cluster's nodes",
                        vpc_id=vpc_id)["group_id"]
                except Exception as e:  # noqa: BLE001 - another boot thread made it meanwhile
                    if "Duplicate" not in str(e):
                        raise
                    group_id = driver.ex_get_security_groups(filters=filters)[0].id
            for rule in ({"cidr_ips": ["0.0.0.0/0"]}, {"group_pairs": [{"group_id": group_id}]}):
                low, high = (22, 22) if "cidr_ips" in rule else (0, 65535)
                try:  # idempotent: a group made by an interrupted boot gets its rules too
                    driver.ex_authorize_security_group_ingress(group_id, low, high, protocol="tcp", **rule)
                except Exception as e:  # noqa: BLE001 - libcloud raises a plain error for an existing rule
                    if "Duplicate" not in str(e):
                        raise
        except Exception as e:  # noqa: BLE001 - libcloud's errors are untyped
            if "UnauthorizedOperation" in str(e) or "AccessDenied" in str(e):
                raise CloudSetupError(
                    f"Could not set up security group {self.node_group!r}: {e}. The head needs "
                    "ec2:DescribeSecurityGroups, ec2:CreateSecurityGroup and ec2:AuthorizeSecurityGroupIngress.",
                ) from None
            raise
        return group_id

    def _address(self, driver, node_id: str) -> VmAddress | None:
        for node in self._cluster_nodes(driver):
            if node.extra.get("tags", {}).get(NODE_TAG) == node_id and str(node.state).lower() == "running":
                return VmAddress(next(iter(node.public_ips), None), next(iter(node.private_ips), None))
        return None

    def _cluster_nodes(self, driver) -> list:
        filters = {f"tag:{CLUSTER_TAG}": self.config.cluster_id,
                   "instance-state-name": ["pending", "running", "stopping", "stopped"]}
        return driver.list_nodes(ex_filters=filters)

    async def list_nodes(self) -> list[NodeHandle]:
        nodes = await self._call(self._cluster_nodes)
        return [NodeHandle(node.extra.get("tags", {}).get(NODE_TAG, node.id), self.name,
                           _STATES.get(node.extra.get("status") or str(node.state), MachineState.BOOTING), node.id)
                for node in nodes if node.extra.get("tags", {}).get(ROLE_TAG) != "head"]

    def _delete(self, driver, node_id: str) -> bool:
        matches = [n for n in self._cluster_nodes(driver) if n.extra.get("tags", {}).get(NODE_TAG) == node_id]
        for node in matches:
            driver.destroy_node(node)
        return bool(matches)

    def _console(self, driver, node_id: str) -> str:
        matches = [n for n in self._cluster_nodes(driver) if n.extra.get("tags", {}).get(NODE_TAG) == node_id]
        if not matches:
            return ""
        return console_output(driver, matches[0].id)

    # --- the head VM of `burla deploy` --------------------------------------------------------

    def _head_profile(self) -> str:
        """An instance profile whose role may boot and delete VMs (created once per account)."""
        import json

        import botocore.exceptions

        iam = self.client("iam")
        trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                         "Principal": {"Service": "ec2.amazonaws.com"}}]}
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": HEAD_ROLE_ACTIONS,
                                                          "Resource": "*"}]}
        steps = [
            lambda: iam.create_role(RoleName=HEAD_ACCESS_NAME, AssumeRolePolicyDocument=json.dumps(trust),
                                    Description="Lets a burla head boot and delete its nodes"),
            lambda: iam.create_instance_profile(InstanceProfileName=HEAD_ACCESS_NAME),
            lambda: iam.add_role_to_instance_profile(InstanceProfileName=HEAD_ACCESS_NAME, RoleName=HEAD_ACCESS_NAME),
        ]
        try:
            for step in steps:
                try:
                    step()
                except botocore.exceptions.ClientError as e:
                    if e.response["Error"]["Code"] not in ("EntityAlreadyExists", "LimitExceeded"):
                        raise
            iam.put_role_policy(RoleName=HEAD_ACCESS_NAME, PolicyName="burla-nodes", PolicyDocument=json.dumps(policy))
        except botocore.exceptions.ClientError as e:
            raise CloudSetupError(
                f"Could not set up the head's IAM role {HEAD_ACCESS_NAME!r}: {e}. Deploying needs iam:CreateRole, "
                "iam:CreateInstanceProfile, iam:PutRolePolicy and iam:PassRole.") from None
        return HEAD_ACCESS_NAME

    def _head_security_group(self, driver, port: int) -> str:
        """A security group open on the head's port (created once per VPC)."""
        vpc_id = None
        if self.config.subnet_id:
            vpc_id = driver.ex_list_subnets(subnet_ids=[self.config.subnet_id])[0].extra.get("vpc_id")
        existing = driver.ex_get_security_groups(filters={"group-name": HEAD_ACCESS_NAME})
        if existing:
            group_id = existing[0].id
        else:
            group_id = driver.ex_create_security_group(HEAD_ACCESS_NAME, "burla head: https for clients and nodes",
                                                       vpc_id=vpc_id)["group_id"]
        for opened in (port, 22):  # https for clients and nodes; SSH for `burla deploy` to set it up
            try:
                driver.ex_authorize_security_group_ingress(group_id, opened, opened, cidr_ips=["0.0.0.0/0"],
                                                           protocol="tcp")
            except Exception as e:  # noqa: BLE001 - libcloud raises a plain error for an existing rule
                if "Duplicate" not in str(e):
                    raise
        return group_id

    def _boot_head(self, driver, head: HeadMachine) -> None:

        from libcloud.compute.base import NodeSize

        machine_type = head.machine_type or "m7i.large"
        kwargs: dict[str, Any] = {
            "ex_metadata": {CLUSTER_TAG: self.config.cluster_id, ROLE_TAG: "head"},
            "ex_iamprofile": self._head_profile(),
            "ex_keyname": self._key_pair(driver, head.ssh_public_key),  # set up over SSH by `burla deploy`
        }
        group_ids = [self._head_security_group(driver, head.port), *self.config.security_group_ids]
        kwargs.update(ex_subnet=self.subnets_offering(driver, machine_type)[0], ex_security_group_ids=group_ids,
                      ex_assign_public_ip=True)
        if head.disk_gb:
            kwargs["ex_blockdevicemappings"] = [{"DeviceName": "/dev/xvda", "Ebs": {
                "VolumeSize": head.disk_gb, "VolumeType": "gp3", "DeleteOnTermination": "true"}}]
        size = NodeSize(machine_type, machine_type, 0, 0, 0, 0, driver)
        image, _ = self.image_for(driver, instance_type(driver, self.config.region, machine_type), gpu=False)
        for attempt in range(12):  # a new instance profile takes a few seconds to be usable
            try:
                driver.create_node(name=head.name, size=size, image=image, **kwargs)
                return
            except Exception as e:  # noqa: BLE001 - libcloud's error for this is untyped
                if "Invalid IAM Instance Profile" not in str(e) or attempt == 11:
                    raise
                time.sleep(5)

    def _heads(self, driver, name: str) -> list:
        return [n for n in self._cluster_nodes(driver)
                if n.extra.get("tags", {}).get(ROLE_TAG) == "head" and n.name == name]

    def _head_console(self, driver, name: str) -> str:
        heads = self._heads(driver, name)
        return console_output(driver, heads[0].id) if heads else ""

    def _head_address(self, driver, name: str) -> str | None:
        addresses = [ip for node in self._heads(driver, name) for ip in node.public_ips if ip]
        return addresses[0] if addresses else None

    def _delete_head(self, driver, name: str) -> bool:
        heads = self._heads(driver, name)
        for node in heads:
            driver.destroy_node(node)
        return bool(heads)


# EC2's own instance states (libcloud's `extra["status"]`; its NodeState has no "stopping"), for
# the filtered ones above, as a driver reports them.
_STATES = {"pending": MachineState.BOOTING, "running": MachineState.RUNNING, "stopping": MachineState.STOPPED,
           "stopped": MachineState.STOPPED}


CONFIG = Ec2Config  # for burla.drivers.registry
DRIVER = Ec2Driver


def console_output(driver: Any, instance_id: str) -> str:
    """The instance's serial console output, the latest EC2 has (`Latest`: on Nitro instances the
    output as of now, not a buffer minutes old; docs.aws.amazon.com/AWSEC2/latest/APIReference/
    API_GetConsoleOutput.html). cloud-init's host keys are read from it (burla.drivers.ssh.host_keys)."""
    import base64

    from libcloud.compute.drivers.ec2 import NAMESPACE
    from libcloud.utils.xml import findtext

    body = driver.connection.request(driver.path, params={"Action": "GetConsoleOutput", "InstanceId": instance_id,
                                                          "Latest": "true"}).object
    encoded = findtext(body, "output", NAMESPACE) or ""
    return base64.b64decode(encoded).decode(errors="replace") if encoded else ""
