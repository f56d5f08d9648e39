"""The cloud drivers are named once: each entry loads its module, whose settings and driver
agree with the entry's name, and unknown names are refused with the names there are."""

from __future__ import annotations

import subprocess
import sys

import pytest

from burla.drivers import registry
from burla.drivers.cloud import ThreadedCloudDriver
from burla.errors import CloudSetupError


@pytest.mark.parametrize("entry", registry.CLOUD_DRIVERS, ids=lambda e: e.name)
def test_each_entry_loads_a_driver_of_its_name(entry):
    module = entry.load()
    assert module.CONFIG.driver_name == entry.name
    assert issubclass(module.DRIVER, ThreadedCloudDriver) and module.DRIVER.name == entry.name
    assert registry.for_cloud(entry.cloud) is entry


def test_unknown_names_are_refused_with_the_known_ones():
    with pytest.raises(CloudSetupError, match="no cloud driver named 'oracle'; there are ec2, gce, azure"):
        registry.cloud_config("oracle", {}, None, "c")
    with pytest.raises(CloudSetupError, match="cloud 'oracle' is not one of aws, gcp, azure"):
        registry.for_cloud("oracle")


def test_the_registry_loads_no_driver_until_one_is_used():
    check = ("import sys, burla.drivers.registry; "
             "print(sorted(m for m in sys.modules if m.startswith(('burla.drivers.', 'libcloud'))))")
    loaded = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "['burla.drivers.registry']"
