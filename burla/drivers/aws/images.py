"""What an EC2 node boots from: machine types as EC2 describes them (architecture, vCPUs, memory,
GPUs, the zones that offer them), and images pinned to their publishers.

An image is looked up by name *and owner*: a name pattern alone matches images any account can
publish (the "whoAMI" confusion), so each family names the account that publishes it. The image's
architecture follows the machine type's (Graviton types boot arm64 images), and a GPU machine boots
Amazon's Deep Learning Base image, which carries the NVIDIA driver the stock images lack.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from burla.errors import CloudSetupError

AMAZON = "amazon"  # the alias DescribeImages accepts for every AWS-owned publishing account
DEBIAN = "136693071363"  # https://wiki.debian.org/Cloud/AmazonEC2Image
CANONICAL = "099720109477"  # https://documentation.ubuntu.com/aws/aws-how-to/instances/find-ubuntu-images/


@dataclass(frozen=True)
class ImageFamily:
    """Images of one OS release from one publisher, per architecture, and the login user they create."""

    name: str
    owner: str
    patterns: dict[str, str]  # EC2 architecture -> image name pattern
    login_user: str
    gpu_driver: bool = False  # carries the NVIDIA driver


FAMILIES = {family.name: family for family in (
    # https://docs.aws.amazon.com/linux/al2023/ug/naming-and-versioning.html
    ImageFamily("al2023", AMAZON, {"x86_64": "al2023-ami-2023.*-x86_64", "arm64": "al2023-ami-2023.*-arm64"},
                "ec2-user"),
    ImageFamily("debian-12", DEBIAN, {"x86_64": "debian-12-amd64-*", "arm64": "debian-12-arm64-*"}, "admin"),
    ImageFamily("ubuntu-24.04", CANONICAL, {
        "x86_64": "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*",
        "arm64": "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-arm64-server-*"}, "ubuntu"),
    # https://docs.aws.amazon.com/dlami/latest/devguide/aws-deep-learning-base-gpu-ami-amazon-linux-2023.html
    ImageFamily("dlami-base-al2023", AMAZON, {
        "x86_64": "Deep Learning Base OSS Nvidia Driver GPU AMI (Amazon Linux 2023) *",
        "arm64": "Deep Learning ARM64 Base OSS Nvidia Driver GPU AMI (Amazon Linux 2023) *"}, "ec2-user",
        gpu_driver=True),
)}
DEFAULT_FAMILY = "al2023"
GPU_FAMILY = "dlami-base-al2023"
LOGIN_USER_BY_OWNER = {DEBIAN: "admin", CANONICAL: "ubuntu"}  # an image chosen by id: its publisher's user


@dataclass(frozen=True)
class InstanceType:
    """One EC2 machine type, as DescribeInstanceTypes tells it."""

    name: str
    architectures: tuple[str, ...]
    vcpus: int
    memory_gb: float
    gpu_count: int = 0
    gpu: str | None = None


_types: dict[tuple[str, str], InstanceType] = {}  # (region, name) -> its description; types don't change
_types_lock = threading.Lock()


def instance_type(driver: Any, region: str, name: str) -> InstanceType:
    """The machine type as this region describes it (an unknown type is the cloud's refusal)."""
    with _types_lock:
        known = _types.get((region, name))
    if known is not None:
        return known
    from libcloud.compute.drivers.ec2 import NAMESPACE
    from libcloud.utils.xml import findall, findtext

    body = driver.connection.request(driver.path, params={"Action": "DescribeInstanceTypes",
                                                          "InstanceType.1": name}).object
    items = findall(body, "instanceTypeSet/item", NAMESPACE)
    if not items:
        raise CloudSetupError(f"EC2 in {region} has no machine type {name!r}.")
    item = items[0]
    gpus = findall(item, "gpuInfo/gpus/item", NAMESPACE)
    described = InstanceType(
        name=name,
        architectures=tuple(e.text or "" for e in findall(item, "processorInfo/supportedArchitectures/item",
                                                          NAMESPACE)),
        vcpus=int(findtext(item, "vCpuInfo/defaultVCpus", NAMESPACE) or 0),
        memory_gb=int(findtext(item, "memoryInfo/sizeInMiB", NAMESPACE) or 0) / 1024,
        gpu_count=sum(int(findtext(g, "count", NAMESPACE) or 0) for g in gpus),
        gpu=(findtext(gpus[0], "name", NAMESPACE) or None) if gpus else None,
    )
    with _types_lock:
        _types[(region, name)] = described
    return described


def zones_offering(driver: Any, name: str) -> list[str]:
    """The availability zones of the driver's region that offer this machine type."""
    from libcloud.compute.drivers.ec2 import NAMESPACE
    from libcloud.utils.xml import findall, findtext

    body = driver.connection.request(driver.path, params={
        "Action": "DescribeInstanceTypeOfferings", "LocationType": "availability-zone",
        "Filter.1.Name": "instance-type", "Filter.1.Value.1": name}).object
    return sorted(findtext(item, "location", NAMESPACE) or ""
                  for item in findall(body, "instanceTypeOfferingSet/item", NAMESPACE))


def architecture_of(machine: InstanceType) -> str:
    return "arm64" if "arm64" in machine.architectures else "x86_64"


def newest_image(driver: Any, family: ImageFamily, architecture: str, region: str) -> Any:
    """The family's newest available image for this architecture, from its publisher only."""
    pattern = family.patterns[architecture]
    images = driver.list_images(ex_owner=family.owner, ex_filters={
        "name": pattern, "architecture": architecture, "state": "available"})
    if not images:
        raise CloudSetupError(
            f"No {family.name} image ({pattern!r}, {architecture}, published by {family.owner}) in {region}. "
            "Set BURLA_AWS_IMAGE_FAMILY to one of " + ", ".join(FAMILIES) + ", or BURLA_AWS_AMI to an AMI id.")
    return max(images, key=lambda image: image.extra.get("creation_date") or "")


def image_by_id(driver: Any, ami: str, machine: InstanceType, region: str) -> Any:
    """An AMI the user named; its architecture must be one the machine type runs."""
    images = driver.list_images(ex_image_ids=[ami])
    if not images:
        raise CloudSetupError(f"AMI {ami} (BURLA_AWS_AMI) does not exist in {region} or is not shared with "
                              "this account.")
    image = images[0]
    architecture = image.extra.get("architecture")
    if architecture and architecture not in machine.architectures:
        raise CloudSetupError(
            f"AMI {ami} is {architecture}, but {machine.name} runs {', '.join(machine.architectures)}: pick a "
            f"machine type of the AMI's architecture, or an {architecture_of(machine)} AMI.")
    return image
