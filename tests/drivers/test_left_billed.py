"""Nothing left billed: a VM nobody sets up powers itself off (its user data's timer, cancelled
by the bootstrap), whatever happened to its head."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import start_head
from tests.support.clouds.vm_farms import MotoVmFarm
from tests.support.helpers import wait_until


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


@pytest.mark.timeout(420)
def test_a_scripts_embedded_head_deletes_its_vms_after_the_script_ends_however_long_it_takes(
        moto, ec2_rules, tmp_path, wheelhouse, aws_client_venv, monkeypatch):
    """Listing and deleting take 6 s per cluster listing here: more than the client used to wait
    for its embedded head before killing it."""
    import json
    import textwrap

    config = tmp_path / "config"
    config.mkdir()
    (config / "config.json").write_text(json.dumps({"cloud": "aws"}))
    farm = MotoVmFarm(moto, tmp_path / "vms")
    monkeypatch.setenv("BURLA_NODE_WHEELHOUSE", str(wheelhouse))
    monkeypatch.setenv("BURLA_SSH_ADDRESS_MAP", str(farm.map_path))
    ec2_rules.slow_cluster_listing_s = 6.0

    env = {k: v for k, v in os.environ.items() if k not in ("BURLA_CLUSTER_DASHBOARD_URL", "BURLA_CLUSTER_TOKEN")}
    env["BURLA_CONFIG_DIR"] = str(config)  # no head runs: the script starts its own, booting on AWS
    script = textwrap.dedent("""
        import json
        from burla import remote_parallel_map
        print(json.dumps(remote_parallel_map(abs, [-5], grow=True, spinner=False)))
    """)
    try:
        done = subprocess.run([str(aws_client_venv), "-c", script], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "[5]"
        # The script has exited; its head goes on deleting the VM it booted, then exits.
        wait_until(lambda: _instances(moto, "terminated"), timeout=120, what="the VM deleted after the script")
        assert not _instances(moto, "running")
    finally:
        farm.close()
