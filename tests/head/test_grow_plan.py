"""What grow=True boots, on pure state."""

from __future__ import annotations

import pytest

from burla.drivers.catalog import MachineType, offline_lookup
from burla.drivers.machine_catalog import RegionCatalog, offline_catalog
from burla.errors import NoCompatibleNodes
from burla.head.machines.grow import plan_growth
from burla.protocol import wire


def spec(n=100, **kw):
    values = dict(func_cpu=None, func_ram=None, func_gpu=None, image=None, grow=True, max_parallelism=None,
                  detach=False, raise_errors=True, region=None, disk_gb=None, parent_job_id=None,
                  retries=0, timeout=None,
                  client_version="0.1.0", python_version="3.11.7", local_code=b"", packages={})
    values.update(kw)
    return wire.OpenJob("j", "f", b"fn", n, **values)


def names(machines):
    return [m.name for m in machines]


def table(cloud: str) -> RegionCatalog:
    """Planning is pure: the offline table is as good an input as a region's listed machines."""
    return offline_catalog(cloud, "")


def listed(cloud: str, region: str, *machines: MachineType) -> RegionCatalog:
    return RegionCatalog(cloud, region, machines, 1.0, "cloud")


def test_grow_plans_only_from_what_the_region_lists():
    region = listed("aws", "eu-south-9", MachineType("m7i.large", 2, 8), MachineType("m7i.xlarge", 4, 16),
                    MachineType("m7i.2xlarge", 8, 32), MachineType("g5.xlarge", 4, 16, "A10G", 1))
    # m7i.48xlarge is not offered there: 100 calls take the largest it has
    assert names(plan_growth(spec(20), 0, 0, {}, region, None, 2560, {})) == ["m7i.2xlarge", "m7i.2xlarge",
                                                                               "m7i.xlarge"]
    with pytest.raises(NoCompatibleNodes, match=r"does not offer m7i.48xlarge in eu-south-9.*burla cloud machines"):
        plan_growth(spec(5), 0, 0, {}, region, "m7i.48xlarge", 2560, {})
    with pytest.raises(NoCompatibleNodes, match=r"no machine with a A100 GPU in eu-south-9; pick one of A10G"):
        plan_growth(spec(1, func_gpu="A100"), 0, 0, {}, region, None, 2560, {})
    assert names(plan_growth(spec(1, func_gpu="A10G"), 0, 0, {}, region, None, 2560, {})) == ["g5.xlarge"]


def test_largest_machines_first_then_the_smallest_that_covers_the_rest():
    plan = plan_growth(spec(200), 0, 0, {}, table("aws"), "m7i.2xlarge", 2560, {})
    assert names(plan) == ["m7i.48xlarge", "m7i.2xlarge"]  # 192 + 8 = 200
    # 11 left after 192: an 8 and then a 4 (204 in all), not a 16 (208).
    assert names(plan_growth(spec(203), 0, 0, {}, table("aws"), None, 2560, {})) == ["m7i.48xlarge", "m7i.2xlarge",
                                                                             "m7i.xlarge"]
    assert names(plan_growth(spec(3), 0, 0, {}, table("aws"), None, 2560, {})) == ["m7i.xlarge"]


def test_existing_slots_and_the_vcpu_cap_count():
    assert plan_growth(spec(10), 10, 0, {}, table("aws"), None, 2560, {}) == []
    plan = plan_growth(spec(1000), 0, 2500, {}, table("aws"), None, 2560, {})
    assert sum(m.vcpus for m in plan) >= 60 and sum(m.vcpus for m in plan) <= 64


def test_cpu_per_call_and_max_parallelism():
    assert names(plan_growth(spec(10, func_cpu=4), 0, 0, {}, table("gcp"), None, 2560, {})) == ["n4-standard-32",
                                                                                         "n4-standard-8"]
    assert names(plan_growth(spec(100, max_parallelism=8), 0, 0, {}, table("gcp"), None, 2560, {})) == ["n4-standard-8"]


def test_gpus_by_model_within_their_cap():
    plan = plan_growth(spec(20, func_gpu="A100"), 0, 0, {}, table("gcp"), None, 2560, {"A100_40G": 12})
    assert sum(m.gpu_count for m in plan) == 12 and {m.gpu for m in plan} == {"A100_40G"}
    with pytest.raises(NoCompatibleNodes, match="no machine with a B200 GPU in its default region; pick one of A100"):
        plan_growth(spec(1, func_gpu="B200"), 0, 0, {}, table("azure"), None, 2560, {})
    [t4] = plan_growth(spec(1, func_gpu="T4"), 0, 0, {}, table("azure"), None, 2560, {})
    assert (t4.name, t4.gpu_count) == ("Standard_NC4as_T4_v3", 1)


def test_what_boots_is_sized_to_the_job_not_to_the_largest_machine():
    # 100 one-CPU calls: 100 vCPUs (before: one 192-vCPU m7i.48xlarge).
    plan = plan_growth(spec(100), 0, 0, {}, table("aws"), None, 2560, {})
    assert names(plan) == ["m7i.16xlarge", "m7i.8xlarge", "m7i.xlarge"] and sum(m.vcpus for m in plan) == 100
    for cloud in ("aws", "gcp", "azure"):
        for n in (1, 3, 7, 50, 100, 333, 1000):
            booted = sum(m.vcpus for m in plan_growth(spec(n), 0, 0, {}, table(cloud), None, 100_000, {}))
            smallest = min(m.vcpus for m in plan_growth(spec(1), 0, 0, {}, table(cloud), None, 100_000, {}))
            assert n <= booted < n + smallest, (cloud, n, booted)


def test_azure_sizes_of_one_family_are_packed_together():
    # Standard_D8as_v5's family is Standard_Das_v5 (D2 to D96), not D8 alone: 100 calls boot two
    # VMs (before: thirteen D8s; 10,000 calls booted 320).
    assert names(plan_growth(spec(100), 0, 0, {}, table("azure"), None, 2560, {})) == ["Standard_D96as_v5",
                                                                               "Standard_D4as_v5"]
    assert len(plan_growth(spec(10_000), 0, 0, {}, table("azure"), None, 100_000, {})) == 105  # 104 x D96 + a D16


def test_a_plan_is_cut_to_the_quota_with_smaller_sizes_making_up_what_they_can():
    from burla.head.machines.grow import growth_sizes, within_room

    sizes, units = growth_sizes(spec(20), table("aws"), None)
    plan = plan_growth(spec(20), 0, 0, {}, table("aws"), None, 2560, {})
    assert [m.name for m in plan] == ["m7i.4xlarge", "m7i.xlarge"]
    assert [m.name for m in within_room(plan, sizes, units, 8)] == ["m7i.xlarge", "m7i.xlarge"]
    assert [m.name for m in within_room(plan, sizes, units, 20)] == ["m7i.4xlarge", "m7i.xlarge"]
    assert within_room(plan, sizes, units, 1) == []  # not even the smallest size fits
    assert [m.name for m in within_room([offline_lookup("aws", "m7i.48xlarge")], sizes, units, 100)] == [
        "m7i.16xlarge", "m7i.8xlarge", "m7i.xlarge"]  # 100 vCPUs: all the quota leaves


def test_the_next_size_down_follows_a_refusal():
    from burla.head.machines.grow import growth_sizes, smaller_size

    sizes, units = growth_sizes(spec(4), table("aws"), None)
    assert smaller_size(sizes, offline_lookup("aws", "m7i.xlarge"), units).name == "m7i.large"
    assert smaller_size(sizes, offline_lookup("aws", "m7i.large"), units) is None


def test_gpu_machines_of_one_gpu_count_are_picked_with_the_fewest_vcpus():
    region = listed("aws", "us-east-1", *(MachineType(f"g4dn.{size}", vcpus, vcpus * 4, "T4", 1)
                                          for size, vcpus in (("16xlarge", 64), ("xlarge", 4), ("8xlarge", 32))),
                    MachineType("g4dn.12xlarge", 48, 192, "T4", 4))
    assert names(plan_growth(spec(3, func_gpu="T4"), 0, 0, {}, region, None, 2560, {})) == ["g4dn.xlarge"] * 3
    assert names(plan_growth(spec(5, func_gpu="T4"), 0, 0, {}, region, None, 2560, {})) == ["g4dn.12xlarge",
                                                                                            "g4dn.xlarge"]
