"""The EC2 driver: nodes are VMs in the user's AWS account, through apache-libcloud.

- Credentials come from botocore's chain (environment, shared config and credentials files,
  profiles, SSO); an expired SSO session or missing credentials raise `CloudSetupError` naming
  the command that fixes it.
- `AWS_ENDPOINT_URL_EC2` / `AWS_ENDPOINT_URL` are honoured, as AWS SDK users expect (this is also
  how the tests reach a moto server on 127.0.0.1).
- Each VM's user data installs this burla version and runs `burla node join` against the head;
  the node then registers by itself. VMs are tagged with the cluster and node id, listed and
  deleted by those tags.
- Every libcloud call runs in the driver's own thread pool (`burla.drivers.cloud`).
"""

from __future__ import annotations

import asyncio
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from burla.drivers.base import BootRequest, NodeHandle
from burla.drivers.cloud import CLUSTER_TAG, NODE_TAG, CloudSetupError, ThreadedCloudDriver, startup_script

__all__ = ["CloudSetupError", "Ec2Config", "Ec2Driver", "resolve_credentials", "startup_script"]

DEFAULT_MACHINE_TYPE = "m7i.2xlarge"
DEFAULT_AMI_NAME = "al2023-ami-2023*-x86_64"
FALLBACK_AMI_NAME = "amzn2-ami-hvm-*"
_EC2_NAMESPACE = re.compile(r'\s?xmlns="http://ec2\.amazonaws\.com/doc/[^"]*"')


@dataclass(frozen=True)
class Ec2Config:
    region: str
    endpoint: str | None = None  # AWS_ENDPOINT_URL_EC2 or AWS_ENDPOINT_URL
    profile: str | None = None
    ami: str | None = None  # an AMI id; default: the newest Amazon Linux image
    subnet_id: str | None = None
    security_group_ids: tuple[str, ...] = ()
    cluster_id: str = "default"

    @classmethod
    def from_environment(cls, environ: dict[str, str], region: str | None, cluster_id: str) -> Ec2Config:
        endpoint = environ.get("AWS_ENDPOINT_URL_EC2") or environ.get("AWS_ENDPOINT_URL") or None
        groups = tuple(g for g in environ.get("BURLA_AWS_SECURITY_GROUP_IDS", "").split(",") if g)
        return cls(
            region=region or environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or "us-east-1",
            endpoint=endpoint, profile=environ.get("AWS_PROFILE") or None, ami=environ.get("BURLA_AWS_AMI") or None,
            subnet_id=environ.get("BURLA_AWS_SUBNET_ID") or None, security_group_ids=groups, cluster_id=cluster_id,
        )


def resolve_credentials(config: Ec2Config) -> tuple[str, str, str | None]:
    """(access key, secret key, session token) from botocore's credential chain."""
    import botocore.exceptions
    import botocore.session

    session = botocore.session.Session(profile=config.profile)
    try:
        credentials = session.get_credentials()
    except botocore.exceptions.ProfileNotFound as e:
        raise CloudSetupError(f"{e}. List profiles with `aws configure list-profiles`, or unset AWS_PROFILE.") from None
    except botocore.exceptions.SSOTokenLoadError:
        raise CloudSetupError("The AWS SSO session has expired. Run `aws sso login` and try again.") from None
    if credentials is None:
        raise CloudSetupError(
            "No AWS credentials found. Run `aws configure` (access keys) or `aws sso login` (SSO), or set "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY."
        )
    try:
        frozen = credentials.get_frozen_credentials()
    except (botocore.exceptions.SSOTokenLoadError, botocore.exceptions.UnauthorizedSSOTokenError):
        raise CloudSetupError("The AWS SSO session has expired. Run `aws sso login` and try again.") from None
    return frozen.access_key, frozen.secret_key, frozen.token


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
        self._credentials = credentials
        super().__init__()

    def _new_libcloud_driver(self) -> Any:
        key, secret, token = self._credentials(self.config)
        kwargs: dict[str, Any] = {"region": self.config.region, "signature_version": "4", "token": token,
                                  "timeout": 60}
        if self.config.endpoint:
            parsed = urllib.parse.urlsplit(self.config.endpoint)
            kwargs.update(host=parsed.hostname, port=parsed.port or (443 if parsed.scheme == "https" else 80),
                          secure=parsed.scheme == "https")
        return _libcloud_driver_class()(key, secret, **kwargs)

    # --- the driver interface --------------------------------------------------------------

    def _image(self, driver):
        if self.config.ami:
            images = driver.list_images(ex_image_ids=[self.config.ami])
        else:
            images = driver.list_images(ex_filters={"name": DEFAULT_AMI_NAME}) or driver.list_images(
                ex_filters={"name": FALLBACK_AMI_NAME})
        if not images:
            raise CloudSetupError(
                f"No machine image found in {self.config.region}. Set BURLA_AWS_AMI to an AMI id with Python 3.11+."
            )
        return sorted(images, key=lambda image: image.extra.get("creation_date") or "")[-1]

    def _boot_one(self, driver, request: BootRequest, node_id: str) -> str:
        from libcloud.compute.base import NodeSize

        machine_type = request.machine_type or DEFAULT_MACHINE_TYPE
        size = NodeSize(machine_type, machine_type, 0, 0, 0, 0, driver)
        tags = {CLUSTER_TAG: self.config.cluster_id, NODE_TAG: node_id}
        kwargs: dict[str, Any] = {
            "ex_userdata": startup_script(request, node_id, request.region or self.config.region),
            "ex_metadata": tags,
            "ex_terminate_on_shutdown": True,
            "ex_spot": request.spot,
        }
        if request.disk_gb:
            kwargs["ex_blockdevicemappings"] = [
                {"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": request.disk_gb, "VolumeType": "gp3",
                                                    "DeleteOnTermination": "true"}}
            ]
        if self.config.subnet_id:
            kwargs["ex_subnet"] = driver.ex_list_subnets(subnet_ids=[self.config.subnet_id])[0]
        if self.config.security_group_ids:
            kwargs["ex_security_group_ids"] = list(self.config.security_group_ids)
        driver.create_node(name=node_id, size=size, image=self._image(driver), **kwargs)
        return node_id

    async def boot(self, request: BootRequest) -> list[str]:
        node_ids = request.ids("burla-node")
        await asyncio.gather(*(self._call(self._boot_one, request, node_id) for node_id in node_ids))
        return node_ids

    def _cluster_nodes(self, driver) -> list:
        filters = {f"tag:{CLUSTER_TAG}": self.config.cluster_id,
                   "instance-state-name": ["pending", "running", "stopping", "stopped"]}
        return driver.list_nodes(ex_filters=filters)

    async def list_nodes(self) -> list[NodeHandle]:
        nodes = await self._call(self._cluster_nodes)
        return [NodeHandle(node.extra.get("tags", {}).get(NODE_TAG, node.id), self.name, str(node.state).upper(),
                           node.id) for node in nodes]

    def _delete(self, driver, node_id: str) -> bool:
        matches = [n for n in self._cluster_nodes(driver) if n.extra.get("tags", {}).get(NODE_TAG) == node_id]
        for node in matches:
            driver.destroy_node(node)
        return bool(matches)

    async def delete(self, node_id: str) -> bool:
        return await self._call(self._delete, node_id)

    def _console(self, driver, node_id: str) -> str:
        matches = [n for n in self._cluster_nodes(driver) if n.extra.get("tags", {}).get(NODE_TAG) == node_id]
        if not matches:
            return ""
        return driver.ex_get_console_output(matches[0]).get("output") or ""

    async def boot_log(self, node_id: str) -> str:
        return await self._call(self._console, node_id)
