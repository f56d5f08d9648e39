"""How long a head takes to turn a new cloud VM into a node: EC2 in moto, the VM an SSH server on
127.0.0.1 (the tests' stand-in), the real bootstrap through it (upload of this build and a
wheelhouse made from this environment, venv, install, supervised node, tunnel). Prints one JSON
line: the build's wheel (cold and cached), and from `cluster start` to the node registered, with
when each boot stage was first seen, for a VM of the stock image (the bootstrap installs the
runtime) and then one of the image the head baked after it (the install is skipped). A real VM
adds its boot time and the package index's speed; this measures burla's own part."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import boto3  # noqa: E402
import moto.server as moto_server  # noqa: E402
import pytest  # noqa: E402

from burla.process.build import build_wheel  # noqa: E402
from tests.conftest import start_head  # noqa: E402
from tests.support.clouds.fake_ec2 import Ec2Rules  # noqa: E402
from tests.support.clouds.vm_farms import MotoVmFarm  # noqa: E402
from tests.support.wheelhouse import build_wheelhouse  # noqa: E402


def _stages_until_registered(head, node_count: int) -> dict[str, float]:
    """Seconds from now until each boot stage of the newest booting node was first seen, and until
    `node_count` nodes are registered (polling /v1/cluster every 50 ms)."""
    started = time.perf_counter()
    seen: dict[str, float] = {}
    request = urllib.request.Request(f"{head.url}/v1/cluster", headers={"Authorization": f"Bearer {head.token}"})
    while time.perf_counter() - started < 300:
        cluster = json.load(urllib.request.urlopen(request, timeout=10))
        for stage in cluster.get("booting_stages", {}).values():
            seen.setdefault(stage, round(time.perf_counter() - started, 2))
        if len(cluster.get("nodes", [])) >= node_count:
            seen["registered"] = round(time.perf_counter() - started, 2)
            return seen
        time.sleep(0.05)
    raise TimeoutError("the node did not register within 300 s")


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="burla-vm-setup-"))
    started = time.perf_counter()
    build_wheel(root / "builds")
    wheel_cold = time.perf_counter() - started
    started = time.perf_counter()
    build_wheel(root / "builds")
    wheel_cached = time.perf_counter() - started
    wheelhouse = build_wheelhouse(root / "wheelhouse")

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ENDPOINT_URL_EC2=endpoint, AWS_ACCESS_KEY_ID="testing",
                      AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1", BURLA_BAKE_IMAGES="1")
    os.environ.pop("AWS_PROFILE", None)
    patches = pytest.MonkeyPatch()
    rules = Ec2Rules(vcpu_quotas={"L-1216C47A": 1000, "L-DB2E81BA": 0, "L-417A185B": 0})
    rules.install(patches)
    rules.publish_images()
    ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name="us-east-1")
    farm = MotoVmFarm(ec2, root / "vms", rules=rules)
    head = start_head(root / "config", local_nodes=0, workers=None, extra=[
        "--driver", "ec2", "--node-wheelhouse", str(wheelhouse), "--ssh-address-map", str(farm.map_path)])
    env = dict(os.environ, BURLA_CLUSTER_DASHBOARD_URL=head.url, BURLA_CLUSTER_TOKEN=head.token,
               BURLA_CONFIG_DIR=str(head.config_dir))

    def start_nodes(quantity: int) -> dict[str, float]:
        subprocess.run([sys.executable, "-m", "burla", "settings", "update", "--quantity", str(quantity),
                        "--machine-type", "m7i.large"], env=env, check=True, capture_output=True)
        subprocess.run([sys.executable, "-m", "burla", "cluster", "start"], env=env, check=True, capture_output=True)
        return _stages_until_registered(head, quantity)

    try:
        stock = start_nodes(1)  # the image family's stock image: the bootstrap installs the runtime
        started = time.perf_counter()
        while not ec2.describe_images(Owners=["self"], Filters=[{"Name": "state", "Values": ["available"]}])["Images"]:
            if time.perf_counter() - started > 300:
                raise TimeoutError("no image was baked within 300 s")
            time.sleep(0.2)
        baked_after = time.perf_counter() - started
        [image] = ec2.describe_images(Owners=["self"])["Images"]
        baked = start_nodes(2)  # the second VM boots from the baked image
        reservations = ec2.describe_instances(Filters=[{"Name": "instance-state-name", "Values": ["running"]}])
        booted_from = [i["ImageId"] for r in reservations["Reservations"] for i in r["Instances"]]
    finally:
        head.stop()
        farm.close()
        server.stop()
        patches.undo()
    print(json.dumps({
        "benchmark": "vm_setup", "wheel_build_s": round(wheel_cold, 3), "wheel_cached_s": round(wheel_cached, 4),
        "wheelhouse_wheels": len(list(wheelhouse.iterdir())),
        "stock_image_stage_seen_s": stock, "image_baked_after_first_node_s": round(baked_after, 2),
        "baked_image_stage_seen_s": baked, "vms_running_from_the_baked_image": booted_from.count(image["ImageId"]),
        "registered_ratio_baked_to_stock": round(baked["registered"] / stock["registered"], 3),
    }))


if __name__ == "__main__":
    main()
