"""Planning what `grow=True` boots: enough machines for the calls a job can't place, packed
largest first, within the cluster's caps (max vCPUs, max GPUs per model). Pure: no I/O."""

from __future__ import annotations

import math

from burla.drivers.catalog import CATALOGS, DEFAULT_MACHINE, MachineType, gpu_model, lookup
from burla.errors import NoCompatibleNodes
from burla.protocol import wire

DEFAULT_MAX_GPUS = 8


def plan_growth(spec: wire.OpenJob, have_slots: int, have_vcpus: int, have_gpus: dict[str, int], cloud: str,
                machine_type: str | None, max_vcpus: int, max_gpus: dict[str, int]) -> list[MachineType]:
    """The machines to boot so the job can run `min(n_inputs, max_parallelism)` calls at once."""
    want = spec.n_inputs if spec.max_parallelism is None else min(spec.n_inputs, spec.max_parallelism)
    missing = want - have_slots
    if missing <= 0:
        return []
    catalog = CATALOGS[cloud]
    if spec.func_gpu is not None:
        model = gpu_model(spec.func_gpu)
        choices = [m for m in catalog if m.gpu == model]
        if not choices:
            raise NoCompatibleNodes(f"{cloud} has no machine with a {spec.func_gpu} GPU; pick one of "
                                    f"{', '.join(sorted({m.gpu for m in catalog if m.gpu}))}.")
        budget = max_gpus.get(model, max_gpus.get(spec.func_gpu.upper(), DEFAULT_MAX_GPUS)) - have_gpus.get(model, 0)
        return _pack(choices, min(missing, budget), lambda m: m.gpu_count)
    cpus_per_call = spec.func_cpu or 1
    chosen = lookup(cloud, machine_type or DEFAULT_MACHINE[cloud]) or lookup(cloud, DEFAULT_MACHINE[cloud])
    assert chosen is not None, f"{cloud}'s default machine type is missing from its catalog"
    family = chosen.family
    choices = [m for m in catalog if m.family == family and not m.gpu and m.vcpus >= cpus_per_call]
    if spec.func_ram is not None:
        choices = [m for m in choices if m.memory_gb >= spec.func_ram]
    if not choices:
        raise NoCompatibleNodes(f"no {family} machine on {cloud} fits one call (func_cpu={spec.func_cpu}, "
                                f"func_ram={spec.func_ram}); lower them or pick another machine type.")
    return _pack(choices, min(missing * cpus_per_call, max_vcpus - have_vcpus), lambda m: m.vcpus)


def _pack(choices: list[MachineType], need: int, units) -> list[MachineType]:
    """Machines for `need` units, sized to it: the largest that fits in what is still needed, until
    one machine covers the rest with less to spare than the smallest size (so what boots exceeds
    the need by less than one smallest machine: 100 one-CPU calls boot 100 vCPUs, not 192)."""
    sizes = sorted((m for m in choices if units(m) > 0), key=units)
    if not sizes:
        return []
    smallest = units(sizes[0])
    picks: list[MachineType] = []
    while need > 0:
        covering = next((m for m in sizes if units(m) >= need), None)
        if covering is not None and units(covering) - need < smallest:
            picks.append(covering)
            break
        fitting = [m for m in sizes if units(m) <= need]
        pick = fitting[-1] if fitting else sizes[0]
        picks.append(pick)
        need -= units(pick)
    return picks


def slots_of(machine: MachineType, spec: wire.OpenJob) -> int:
    if spec.func_gpu is not None:
        return machine.gpu_count
    slots = machine.vcpus // (spec.func_cpu or 1)
    if spec.func_ram is not None:
        slots = min(slots, math.floor(machine.memory_gb / spec.func_ram))
    return slots
