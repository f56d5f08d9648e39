"""The machine types grow picks from, as each cloud's API lists them for a region: read through the
real drivers against the stand-in clouds, kept in the config directory with their age, and the
offline table only when the cloud can't be asked. (GCE and Azure listings: test_gce_driver.py,
test_azure_driver.py.)"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

from burla.drivers.machine_catalog import FROM_CACHE, FROM_CLOUD, MAX_AGE_S, OFFLINE_TABLE, cache_path, region_catalog
from tests.conftest import REPO


def _ec2_driver(environ: dict[str, str] | None = None):
    from burla.drivers.registry import cloud_config, cloud_driver

    return cloud_driver(cloud_config("ec2", environ or dict(os.environ), None, "cluster-1"))


def _catalog(driver, directory, **kw):
    async def read():
        try:
            return await region_catalog(driver, "aws", directory, **kw)
        finally:
            await driver.close()

    return asyncio.run(read())


def test_ec2_types_come_from_describe_instance_types_page_by_page(moto, ec2_rules, tmp_path):
    ec2_rules.withdrawn |= {"m7i.48xlarge"}  # not offered in this region
    catalog = _catalog(_ec2_driver(), tmp_path)
    assert catalog.source == FROM_CLOUD and catalog.region == "us-east-1"
    assert len(ec2_rules.type_pages) > 1 and max(ec2_rules.type_pages) == 100  # every page was read
    by_name = {m.name: m for m in catalog.machines}
    assert len(by_name) == sum(ec2_rules.type_pages)
    assert "m7i.48xlarge" not in by_name and "m7i.24xlarge" in by_name
    m7i = by_name["m7i.2xlarge"]
    assert (m7i.vcpus, m7i.memory_gb, m7i.gpu, m7i.arch) == (8, 32.0, None, "x86_64")
    assert m7i.usd_per_hour == 0.4032  # libcloud's on-demand Linux price for us-east-1
    p4d = by_name["p4d.24xlarge"]
    assert (p4d.vcpus, p4d.gpu, p4d.gpu_count) == (96, "A100_40G", 8)
    assert by_name["g5.xlarge"].gpu == "A10G" and by_name["m7g.large"].arch == "arm64"
    assert not any(name.endswith(".metal") for name in by_name)  # bare metal boots too slowly for grow
    saved = json.loads(cache_path(tmp_path, "aws", "us-east-1").read_text())
    assert saved["read_at"] == catalog.read_at and len(saved["machines"]) == len(by_name)


def test_a_saved_list_serves_for_a_week_then_is_read_again(moto, ec2_rules, tmp_path):
    first = _catalog(_ec2_driver(), tmp_path)
    pages = len(ec2_rules.type_pages)
    again = _catalog(_ec2_driver(), tmp_path)
    assert again.source == FROM_CACHE and again.machines == first.machines
    assert len(ec2_rules.type_pages) == pages  # the cloud was not asked
    week_later = _catalog(_ec2_driver(), tmp_path, now=time.time() + MAX_AGE_S + 60)
    assert week_later.source == FROM_CLOUD and len(ec2_rules.type_pages) > pages
    refreshed = _catalog(_ec2_driver(), tmp_path, refresh=True)
    assert refreshed.source == FROM_CLOUD


def test_a_cloud_that_cannot_be_asked_leaves_the_old_list_or_the_offline_table(moto, tmp_path):
    _catalog(_ec2_driver(), tmp_path / "had-one")
    unreachable = dict(os.environ, AWS_ENDPOINT_URL_EC2="http://127.0.0.1:9", AWS_ENDPOINT_URL="http://127.0.0.1:9")
    stale = _catalog(_ec2_driver(unreachable), tmp_path / "had-one", now=time.time() + 2 * MAX_AGE_S)
    assert stale.source == FROM_CACHE and stale.lookup("m7i.2xlarge") is not None
    assert stale.problem and "could not list again" in stale.describe()
    none_saved = _catalog(_ec2_driver(unreachable), tmp_path / "none")
    assert none_saved.source == OFFLINE_TABLE and none_saved.lookup("m7i.2xlarge") is not None
    assert "offline table" in none_saved.describe() and none_saved.problem


def test_a_damaged_saved_list_is_read_again_from_the_cloud(moto, tmp_path):
    path = cache_path(tmp_path, "aws", "us-east-1")
    path.parent.mkdir(parents=True)
    path.write_text('{"format": 1, "machines": [')
    assert _catalog(_ec2_driver(), tmp_path).source == FROM_CLOUD
    assert json.loads(path.read_text())["format"] == 1


def _machines_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "burla", "cloud", "machines", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=180, env=env)


def test_burla_cloud_machines_lists_the_region_with_its_age(moto, tmp_path):
    env = dict(os.environ, BURLA_CONFIG_DIR=str(tmp_path))
    done = _machines_cli("--cloud", "aws", "--gpu", "--json", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(done.stdout)["data"]
    assert data["source"] == FROM_CLOUD and data["region"] == "us-east-1"
    assert data["machines"] and all(m["gpu_count"] > 0 for m in data["machines"])
    table = _machines_cli("--cloud", "aws", env=env)  # the saved list, as a table a person reads
    lines = table.stdout.splitlines()
    assert table.returncode == 0 and lines[0].startswith("burla cloud machines: aws us-east-1, listed by the cloud")
    [m7i] = [line.split() for line in lines if line.startswith("m7i.2xlarge ")]
    assert m7i == ["m7i.2xlarge", "8", "32.0", "x86_64", "0.4032"]
    no_cloud = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_", "AZURE_", "CLOUDSDK_"))}
    refused = _machines_cli(env=dict(no_cloud, HOME=str(tmp_path), BURLA_CONFIG_DIR=str(tmp_path)))
    assert refused.returncode == 2 and "burla config set cloud" in refused.stdout
