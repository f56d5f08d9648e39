"""Baked images on EC2: AMIs of the node runtime, made from a builder VM the head set up (this
build installed in a venv of one Python, nothing of any cluster left on it), owned by the user's
account and tagged with the key they serve; later VMs of that key boot from them and skip the
install (each call here is blocking: run it in the driver's pool).

CreateImage reboots the builder so the file system is consistent (NoReboot=false) and answers at
once; the image is usable once DescribeImages says `available`, and `failed` is final
(docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateImage.html). DeregisterImage leaves the
image's EBS snapshots, which stay billed, so deleting also deletes them
(docs.aws.amazon.com/AWSEC2/latest/UserGuide/deregister-ami.html).
"""

from __future__ import annotations

import time
from typing import Any

from burla.drivers.base import BakedImage
from burla.errors import CloudRefused

KEY_TAG = "burla-image-key"
NAME_PREFIX = "burla-node-"


def _baked(image: dict[str, Any]) -> BakedImage:
    tags = {t["Key"]: t["Value"] for t in image.get("Tags", [])}
    return BakedImage(image["ImageId"], image.get("Name", ""), tags.get(KEY_TAG, ""), image.get("CreationDate", ""),
                      image.get("State", ""))


def list_baked(ec2: Any) -> list[BakedImage]:
    images = ec2.describe_images(Owners=["self"], Filters=[{"Name": "tag-key", "Values": [KEY_TAG]}])["Images"]
    return sorted((_baked(image) for image in images), key=lambda b: b.created, reverse=True)


def find_baked(ec2: Any, key: str) -> str | None:
    """The newest available baked image for `key`, if there is one."""
    images = ec2.describe_images(Owners=["self"], Filters=[{"Name": f"tag:{KEY_TAG}", "Values": [key]},
                                                           {"Name": "state", "Values": ["available"]}])["Images"]
    return max(images, key=lambda image: image.get("CreationDate", ""))["ImageId"] if images else None


def start_image(ec2: Any, instance_id: str, key: str) -> str:
    """Ask for an image of the builder; returns its id (pending until `image_state` says otherwise)."""
    tags = [{"Key": KEY_TAG, "Value": key}]
    answer = ec2.create_image(InstanceId=instance_id, Name=f"{NAME_PREFIX}{key}-{int(time.time())}", NoReboot=False,
                              Description="burla node runtime (baked by a burla head; `burla cloud images`)",
                              TagSpecifications=[{"ResourceType": "image", "Tags": tags}])
    return answer["ImageId"]


def image_state(ec2: Any, image_id: str) -> BakedImage:
    images = ec2.describe_images(ImageIds=[image_id])["Images"]
    if not images:
        raise CloudRefused(f"ec2: the image {image_id} being baked is gone")
    return _baked(images[0])


def delete_baked(ec2: Any, image_id: str) -> bool:
    import botocore.exceptions

    try:
        images = ec2.describe_images(Owners=["self"], ImageIds=[image_id])["Images"]
    except botocore.exceptions.ClientError as e:
        if e.response.get("Error", {}).get("Code", "").startswith("InvalidAMIID"):
            return False
        raise
    images = [image for image in images if any(t["Key"] == KEY_TAG for t in image.get("Tags", []))]
    if not images:
        return False
    snapshots = [m["Ebs"]["SnapshotId"] for m in images[0].get("BlockDeviceMappings", [])
                 if m.get("Ebs", {}).get("SnapshotId")]
    ec2.deregister_image(ImageId=image_id)
    for snapshot in snapshots:
        ec2.delete_snapshot(SnapshotId=snapshot)
    return True
