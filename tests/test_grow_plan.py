"""What grow=True boots, on pure state."""

from __future__ import annotations

import pytest

from burla.errors import NoCompatibleNodes
from burla.head.grow import plan_growth
from burla.protocol import wire


def spec(n=100, **kw):
    values = dict(func_cpu=None, func_ram=None, func_gpu=None, image=None, grow=True, max_parallelism=None,
                  detach=False, raise_errors=True, region=None, disk_gb=None, parent_job_id=None,
                  client_version="0.1.0", python_version="3.11.7", local_code=b"", packages={})
    values.update(kw)
    return wire.OpenJob("j", "f", b"fn", n, **values)


def names(machines):
    return [m.name for m in machines]


def test_largest_machines_first_then_the_smallest_that_covers_the_rest():
    plan = plan_growth(spec(200), 0, 0, {}, "aws", "m7i.2xlarge", 2560, {})
    assert names(plan) == ["m7i.48xlarge", "m7i.2xlarge"]  # 192 + 8 = 200
    assert names(plan_growth(spec(203), 0, 0, {}, "aws", None, 2560, {})) == ["m7i.48xlarge", "m7i.4xlarge"]
    assert names(plan_growth(spec(3), 0, 0, {}, "aws", None, 2560, {})) == ["m7i.xlarge"]


def test_existing_slots_and_the_vcpu_cap_count():
    assert plan_growth(spec(10), 10, 0, {}, "aws", None, 2560, {}) == []
    plan = plan_growth(spec(1000), 0, 2500, {}, "aws", None, 2560, {})
    assert sum(m.vcpus for m in plan) >= 60 and sum(m.vcpus for m in plan) <= 64


def test_cpu_per_call_and_max_parallelism():
    assert names(plan_growth(spec(10, func_cpu=4), 0, 0, {}, "gcp", None, 2560, {})) == ["n4-standard-48"]
    assert names(plan_growth(spec(100, max_parallelism=8), 0, 0, {}, "gcp", None, 2560, {})) == ["n4-standard-8"]


def test_gpus_by_model_within_their_cap():
    plan = plan_growth(spec(20, func_gpu="A100"), 0, 0, {}, "gcp", None, 2560, {"A100_40G": 12})
    assert sum(m.gpu_count for m in plan) == 12 and {m.gpu for m in plan} == {"A100_40G"}
    with pytest.raises(NoCompatibleNodes, match="no machine with a B200 GPU; pick one of A100_40G, A100_80G"):
        plan_growth(spec(1, func_gpu="B200"), 0, 0, {}, "azure", None, 2560, {})
    [t4] = plan_growth(spec(1, func_gpu="T4"), 0, 0, {}, "azure", None, 2560, {})
    assert (t4.name, t4.gpu_count) == ("Standard_NC4as_T4_v3", 1)
