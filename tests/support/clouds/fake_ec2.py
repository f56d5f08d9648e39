"""What EC2 refuses, taught to moto (which accepts any launch): the tests' moto server runs in this
process, so these rules patch its backend and every request the head sends meets them.

- An image's architecture must match the instance type's (RunInstances answers
  InvalidParameterValue). https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-launch-parameters.html
- On-demand vCPUs are capped per instance bucket (VcpuLimitExceeded); Service Quotas reports the cap.
  https://docs.aws.amazon.com/ec2/latest/instancetypes/ec2-instance-quotas.html
- A zone can be out of a machine type (InsufficientInstanceCapacity).
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/troubleshooting-launch.html#troubleshooting-launch-capacity
- DescribeInstanceTypes lists the types of the caller's region, at most MaxResults (5 to 100) per
  page with a NextToken for the rest (moto answers all at once); `withdrawn` types are ones the
  region does not offer. https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeInstanceTypes.html
- An AMI made by CreateImage needs a name of 3 to 128 letters, digits and ( ) [ ] space . / - ' @ _,
  and stays pending until its snapshot completes.
  https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateImage.html
- Images are published by accounts: Amazon's (owner alias "amazon"), Debian's, Canonical's, and
  anyone's (a public image of another account with an Amazon-like name, as in the "whoAMI" attack).
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/finding-an-ami.html
"""

from __future__ import annotations

import datetime
import re
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

ACCOUNT = "123456789012"  # moto's default account: the user's
REGION = "us-east-1"
DEBIAN = "136693071363"
CANONICAL = "099720109477"
DLAMI_OWNER = "898082745236"  # Amazon's Deep Learning AMI account (owner alias "amazon")
STRANGER = "666666666666"  # another account, publishing public images

# The buckets of the on-demand vCPU quotas (letters a type's name starts with), from the quota page.
BUCKETS = {
    "L-1216C47A": ("Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances", "acdhimrtz"),
    "L-DB2E81BA": ("Running On-Demand G and VT instances", "g"),
    "L-417A185B": ("Running On-Demand P instances", "p"),
}


def bucket_of(instance_type: str) -> str | None:
    letters = re.match(r"[a-z]+", instance_type).group(0)
    if letters == "vt":
        return "L-DB2E81BA"
    return next((code for code, (_, first) in BUCKETS.items() if letters[0] in first and len(letters) <= 2), None)


@dataclass
class Ec2Rules:
    """The account's limits and the region's shortages; tests change them as they need."""

    vcpu_quotas: dict[str, int] = field(default_factory=lambda: {"L-1216C47A": 32, "L-DB2E81BA": 8,
                                                                 "L-417A185B": 0})
    exhausted: set[tuple[str, str]] = field(default_factory=set)  # (instance type, zone) with no capacity
    refused: list[str] = field(default_factory=list)  # what was refused, in order (code: message)
    denied: set[str] = field(default_factory=set)  # IAM actions the caller's policies don't allow
    slow_cluster_listing_s: float = 0.0  # DescribeInstances by cluster tag takes this long (a slow API)
    expired_keys: set[str] = field(default_factory=set)  # access keys whose session has expired
    consoles: dict[str, str] = field(default_factory=dict)  # instance id -> what its guest printed to the console
    withdrawn: set[str] = field(default_factory=set)  # instance types the region does not offer
    # Told (instance id, new AMI id) as CreateImage makes an image of an instance's disk: the
    # stand-in VM farm copies that VM's disk then, as EC2 snapshots the volume.
    image_made: list[Any] = field(default_factory=list)
    type_pages: list[int] = field(default_factory=list)  # DescribeInstanceTypes pages served (their sizes)
    slow_type_pages_s: float = 0.0  # each DescribeInstanceTypes page takes this long (a slow API)

    current: ClassVar[Ec2Rules]  # the rules installed now (the stand-in VMs print to its consoles)

    def install(self, monkeypatch: Any) -> None:
        from moto.ec2.models.instances import InstanceBackend
        from moto.servicequotas.models import ServiceQuotasBackend

        rules = self
        monkeypatch.setattr(Ec2Rules, "current", self, raising=False)
        run_instances = InstanceBackend.run_instances
        get_service_quota = ServiceQuotasBackend.get_service_quota

        def checked_run_instances(backend: Any, image_id: str, count: int, *args: Any, **kwargs: Any) -> Any:
            rules.check_launch(backend, image_id, count, kwargs)
            return run_instances(backend, image_id, count, *args, **kwargs)

        def ec2_quotas(backend: Any, service_code: str, quota_code: str) -> dict[str, Any]:
            if service_code == "ec2" and quota_code in rules.vcpu_quotas:
                return {"ServiceCode": "ec2", "QuotaCode": quota_code, "QuotaName": BUCKETS[quota_code][0],
                        "Value": float(rules.vcpu_quotas[quota_code]), "Unit": "None", "Adjustable": True,
                        "GlobalQuota": False}
            return get_service_quota(backend, service_code, quota_code)

        def quotas_if_allowed(backend: Any, service_code: str, quota_code: str) -> dict[str, Any]:
            from moto.core.exceptions import ServiceException

            if "servicequotas:GetServiceQuota" in rules.denied:
                raise ServiceException("AccessDeniedException", _not_authorized("servicequotas:GetServiceQuota"))
            return ec2_quotas(backend, service_code, quota_code)

        from moto.ec2.models.amis import AmiBackend

        create_image = AmiBackend.create_image

        def imaged(backend: Any, instance_id: str, name: str, *args: Any, **kwargs: Any) -> Any:
            from moto.ec2.exceptions import EC2ClientError

            # An AMI's name: 3 to 128 of letters, digits, ( ) [ ] space . / - ' @ _ (CreateImage's "Name").
            if not re.fullmatch(r"[A-Za-z0-9()\[\] ./\-'@_]{3,128}", name):
                raise EC2ClientError("InvalidAMIName.Malformed", f"AMI names must be between 3 and 128 characters "
                                     f"long, and may contain letters, numbers, '(', ')', '.', '-', '/' and '_': {name}")
            # Pending while the disk is copied, as EC2 keeps an image until its snapshot completes.
            ami = create_image(backend, instance_id, name, *args, **kwargs)
            ami.state = "pending"
            try:
                for told in list(rules.image_made):
                    told(instance_id, ami.id)
            finally:
                ami.state = "available"
            return ami

        from moto.core.responses import ActionResult
        from moto.core.utils import utcnow
        from moto.ec2.responses.general import SAMPLE_CONSOLE_OUTPUT, General
        from moto.ec2.utils import Base64EncodedString

        def console_output(response: Any) -> Any:
            """GetConsoleOutput: the kernel's lines, then what the instance's guest printed (cloud-init's
            host keys); base64, as EC2 answers it."""
            instance = response.ec2_backend.get_instance(response._get_param("InstanceId"))
            printed = SAMPLE_CONSOLE_OUTPUT + rules.consoles.get(instance.id, "")
            return ActionResult({"InstanceId": instance.id, "Timestamp": utcnow(),
                                 "Output": Base64EncodedString.from_raw_string(printed)})

        monkeypatch.setattr(General, "get_console_output", console_output)
        monkeypatch.setattr(AmiBackend, "create_image", imaged)
        monkeypatch.setattr(InstanceBackend, "run_instances", checked_run_instances)
        monkeypatch.setattr(ServiceQuotasBackend, "get_service_quota", quotas_if_allowed)
        self._deny_actions(monkeypatch)

    def _deny_actions(self, monkeypatch: Any) -> None:
        """IAM: a call whose action no policy allows is refused, dry run or not (a dry run answers
        UnauthorizedOperation instead of DryRunOperation)."""
        from moto.ec2.exceptions import EC2ClientError
        from moto.ec2.responses.instances import InstanceResponse

        rules = self
        for method, action in (("run_instances", "ec2:RunInstances"),
                               ("terminate_instances", "ec2:TerminateInstances")):
            original = getattr(InstanceResponse, method)

            def guarded(response: Any, _original: Any = original, _action: str = action) -> Any:
                if _action in rules.denied:
                    raise EC2ClientError("UnauthorizedOperation", _not_authorized(_action))
                return _original(response)

            monkeypatch.setattr(InstanceResponse, method, guarded)
        describe = InstanceResponse.describe_instances

        def slow_describe(response: Any) -> Any:
            import time

            from moto.ec2.exceptions import EC2ClientError

            signed = re.search(r"Credential=([A-Z0-9]+)/", response.headers.get("Authorization", ""))
            if signed and signed.group(1) in rules.expired_keys:
                raise EC2ClientError("ExpiredToken", "The security token included in the request is expired")
            if rules.slow_cluster_listing_s and "tag:burla-cluster" in str(response.querystring):
                time.sleep(rules.slow_cluster_listing_s)
            return describe(response)

        monkeypatch.setattr(InstanceResponse, "describe_instances", slow_describe)
        self._page_instance_types(monkeypatch)

    def _page_instance_types(self, monkeypatch: Any) -> None:
        from moto.core.responses import ActionResult
        from moto.ec2.exceptions import EC2ClientError
        from moto.ec2.responses.instances import InstanceResponse

        rules = self

        def paged(response: Any) -> Any:
            time.sleep(rules.slow_type_pages_s)
            named = response._get_param("InstanceTypes", [])
            listed = [t for t in response.ec2_backend.describe_instance_types(
                named, response._filters_from_querystring()) if t.get("InstanceType") not in rules.withdrawn]
            if named:  # asked by name: one page, as EC2 answers
                rules.type_pages.append(len(listed))
                return ActionResult({"InstanceTypes": listed})
            size = int(response._get_param("MaxResults") or 100)
            if not 5 <= size <= 100:
                raise EC2ClientError("InvalidParameterValue", f"Invalid value '{size}' for MaxResults: 5 to 100.")
            start = int(response._get_param("NextToken") or 0)
            page = listed[start:start + size]
            rules.type_pages.append(len(page))
            result: dict[str, Any] = {"InstanceTypes": page}
            if start + size < len(listed):
                result["NextToken"] = str(start + size)
            return ActionResult(result)

        monkeypatch.setattr(InstanceResponse, "describe_instance_types", paged)

    def check_launch(self, backend: Any, image_id: str, count: int, kwargs: dict[str, Any]) -> None:
        from moto.ec2.exceptions import EC2ClientError
        from moto.ec2.models.instance_types import INSTANCE_TYPES

        instance_type = kwargs.get("instance_type") or "m1.small"
        described = INSTANCE_TYPES.get(instance_type)
        if described is None:
            self._refuse(EC2ClientError, "InvalidParameterValue",
                         f"Invalid value '{instance_type}' for InstanceType.")
        image = backend.amis.get(image_id)
        type_architectures = described["ProcessorInfo"]["SupportedArchitectures"]
        if image is not None and image.architecture not in type_architectures:
            self._refuse(EC2ClientError, "InvalidParameterValue",
                         f"The architecture '{type_architectures[0]}' of the specified instance type does not match "
                         f"the architecture '{image.architecture}' of the specified AMI. Specify an instance type and "
                         "an AMI that have matching architectures, and try again. You can use 'describe-instance-"
                         "types' or 'describe-images' to discover the architecture of the instance type or AMI.")
        zone = kwargs.get("placement")
        subnet_id = kwargs.get("subnet_id") or next(
            (nic.get("SubnetId") for nic in kwargs.get("nics") or [] if nic.get("SubnetId")), None)
        if subnet_id:
            zone = backend.get_subnet(subnet_id).availability_zone
        if (instance_type, zone) in self.exhausted:
            others = sorted(z.name for z in backend.describe_availability_zones()
                            if (instance_type, z.name) not in self.exhausted and z.name != zone)
            self._refuse(EC2ClientError, "InsufficientInstanceCapacity",
                         f"We currently do not have sufficient {instance_type} capacity in the Availability Zone you "
                         f"requested ({zone}). Our system will be working on provisioning additional capacity. You "
                         "can currently get " f"{instance_type} capacity by not specifying an Availability Zone in "
                         f"your request or choosing {', '.join(others)}.")
        bucket = bucket_of(instance_type)
        if bucket is not None and not kwargs.get("instance_market_options"):
            limit = self.vcpu_quotas.get(bucket, 0)
            wanted = described["VCpuInfo"]["DefaultVCpus"] * count
            if self.vcpus_running(backend, bucket) + wanted > limit:
                self._refuse(EC2ClientError, "VcpuLimitExceeded",
                             f"You have requested more vCPU capacity than your current vCPU limit of {limit} allows "
                             "for the instance bucket that the specified instance type belongs to. Please visit "
                             "http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit.")

    def vcpus_running(self, backend: Any, bucket: str) -> int:
        from moto.ec2.models.instance_types import INSTANCE_TYPES

        # A snapshot: the moto server serves each request in a thread of its own, and another's
        # RunInstances may add a reservation meanwhile.
        return sum(INSTANCE_TYPES[i.instance_type]["VCpuInfo"]["DefaultVCpus"]
                   for reservation in list(backend.reservations.values()) for i in list(reservation.instances)
                   if i.state in ("pending", "running") and bucket_of(i.instance_type) == bucket
                   and not i.lifecycle == "spot")

    def _refuse(self, error: type, code: str, message: str) -> None:
        self.refused.append(f"{code}: {message}")
        raise error(code, message)

    def publish_images(self) -> None:
        """Images real regions hold and moto's list lacks: Debian's, Canonical's, Amazon's GPU
        images, and a stranger's public look-alike of Amazon Linux that is newer than Amazon's."""
        from moto.ec2.models import ec2_backends
        from moto.ec2.models.amis import Ami

        backend = ec2_backends[ACCOUNT][REGION]
        newest = datetime.datetime(2099, 1, 1, tzinfo=datetime.UTC)
        released = datetime.datetime(2026, 11, 1, tzinfo=datetime.UTC)
        images = [
            ("ami-0debian12amd64", DEBIAN, None, "x86_64", "debian-12-amd64-20261101-2000", released),
            ("ami-0debian12arm64", DEBIAN, None, "arm64", "debian-12-arm64-20261101-2000", released),
            ("ami-0ubuntu2404amd64", CANONICAL, None, "x86_64",
             "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20261101", released),
            ("ami-0dlamibasex86", DLAMI_OWNER, "amazon", "x86_64",
             "Deep Learning Base OSS Nvidia Driver GPU AMI (Amazon Linux 2023) 20261101", released),
            ("ami-0whoami00000000", STRANGER, None, "x86_64", "al2023-ami-2023.99.20991231.0-kernel-6.1-x86_64",
             newest),
        ]
        for ami_id, owner, alias, architecture, name, created in images:
            backend.amis[ami_id] = Ami(backend, ami_id, name=name, owner_id=owner, owner_alias=alias, public=True,
                                       architecture=architecture, virtualization_type="hvm", hypervisor="xen",
                                       root_device_type="ebs", root_device_name="/dev/xvda", creation_date=created,
                                       region_name=REGION)


def _not_authorized(action: str) -> str:
    return (f"You are not authorized to perform this operation. User: arn:aws:iam::{ACCOUNT}:user/moto is not "
            f"authorized to perform: {action} because no identity-based policy allows the {action} action.")


def machine_gpus(instance_type: str) -> tuple[str, ...]:
    """The instance type's GPUs as nvidia-smi names them ("Tesla T4", "NVIDIA A100-SXM4-40GB")."""
    from moto.ec2.models.instance_types import INSTANCE_TYPES

    gpus = INSTANCE_TYPES.get(instance_type, {}).get("GpuInfo", {}).get("Gpus", [])
    return tuple(("Tesla T4" if gpu["Name"] == "T4" else f"NVIDIA {gpu['Name']}") for gpu in gpus
                 for _ in range(gpu["Count"]))


LOGIN_USERS = {DEBIAN: "admin", CANONICAL: "ubuntu"}  # every other publisher here: ec2-user


def login_user_of(ec2: Any, image_id: str) -> str:
    """The user an image's cloud-init creates (what a stand-in VM of that image accepts)."""
    images = ec2.describe_images(ImageIds=[image_id])["Images"]
    return LOGIN_USERS.get(images[0]["OwnerId"], "ec2-user") if images else "ec2-user"
