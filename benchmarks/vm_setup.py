"""How long a head takes to turn a new cloud VM into a node: EC2 in moto, the VM an SSH server on
127.0.0.1 (the tests' stand-in), the real bootstrap through it (upload of this build and a
wheelhouse made from this environment, venv, install, supervised node, tunnel). Prints one JSON
line: the build's wheel (cold and cached), and from `cluster start` to the node registered, with
the phases the head's SSH transcript records. A real VM adds its boot time and the package
index's speed; this measures burla's own part."""

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

from burla.process.build import build_wheel  # noqa: E402
from tests.conftest import start_head, wait_for_nodes  # noqa: E402
from tests.vm_standin import MotoVmFarm  # noqa: E402
from tests.wheelhouse import build_wheelhouse  # noqa: E402


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
                      AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    os.environ.pop("AWS_PROFILE", None)
    ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name="us-east-1")
    farm = MotoVmFarm(ec2, root / "vms")
    head = start_head(root / "config", local_nodes=0, workers=None, extra=[
        "--driver", "ec2", "--node-wheelhouse", str(wheelhouse), "--ssh-address-map", str(farm.map_path)])
    env = dict(os.environ, BURLA_CLUSTER_DASHBOARD_URL=head.url, BURLA_CLUSTER_TOKEN=head.token,
               BURLA_CONFIG_DIR=str(head.config_dir))
    try:
        subprocess.run([sys.executable, "-m", "burla", "settings", "update", "--quantity", "1"], env=env, check=True,
                       capture_output=True)
        started = time.perf_counter()
        booted = subprocess.run([sys.executable, "-m", "burla", "cluster", "start"], env=env, check=True,
                                capture_output=True, text=True)
        [node_id] = json.loads(booted.stdout)["data"]["booted"]
        wait_for_nodes(head, 1, timeout=300)
        registered = time.perf_counter() - started
        request = urllib.request.Request(f"{head.url}/v1/nodes/{node_id}/events",
                                         headers={"Authorization": f"Bearer {head.token}"})
        events = json.load(urllib.request.urlopen(request, timeout=10))["events"]
    finally:
        head.stop()
        farm.close()
        server.stop()
    print(json.dumps({
        "benchmark": "vm_setup", "wheel_build_s": round(wheel_cold, 3), "wheel_cached_s": round(wheel_cached, 4),
        "wheelhouse_wheels": len(list(wheelhouse.iterdir())), "cluster_start_to_registered_s": round(registered, 2),
        "events": [e["event"] for e in sorted(events, key=lambda e: e["at"])],
    }))


if __name__ == "__main__":
    main()
