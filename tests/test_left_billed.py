"""Nothing left billed: a VM nobody sets up powers itself off (its user data's timer, cancelled
by the bootstrap), whatever happened to its head."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import start_head
from tests.helpers import wait_until
from tests.vm_standin import MotoVmFarm


def _instances(ec2, state: str | None = None) -> list[dict]:
    filters = [{"Name": "tag-key", "Values": ["burla-node-id"]}]
    if state:
        filters.append({"Name": "instance-state-name", "Values": [state]})
    return [i for r in ec2.describe_instances(Filters=filters)["Reservations"] for i in r["Instances"]]


def test_a_vm_whose_head_died_before_setting_it_up_powers_itself_off(moto, tmp_path):
    farm = MotoVmFarm(moto, tmp_path / "vms", answer=False)  # its SSH never answers: no head sets it up
    head = start_head(tmp_path / "config", local_nodes=0, token="secret-token-1",
                      extra=["--driver", "ec2", "--boot-deadline", "3", "--ssh-address-map", str(farm.map_path)])
    try:
        env = dict(os.environ, **head.env())
        subprocess.run([sys.executable, "-m", "burla", "settings", "update", "--quantity", "1"], check=True, env=env,
                       capture_output=True)
        subprocess.run([sys.executable, "-m", "burla", "cluster", "start"], check=True, env=env, capture_output=True)
        head.process.kill()  # the head is gone before it could set the VM up or delete it
        head.process.wait(30)
        [instance] = _instances(moto)
        given = moto.describe_instance_attribute(InstanceId=instance["InstanceId"], Attribute="userData")
        import base64

        user_data = base64.b64decode(given["UserData"]["Value"]).decode()
        assert "systemd-run --unit=burla-dead-man --on-active=6s" in user_data  # two boot deadlines
        assert "secret-token-1" not in user_data
        # The timer fires, the VM shuts down, and EC2 terminates it (it was started to terminate on shutdown).
        wait_until(lambda: _instances(moto, "terminated"), timeout=90, what="the VM powered itself off")
        assert farm.powered_off == [instance["InstanceId"]]
    finally:
        head.stop()
        farm.close()
