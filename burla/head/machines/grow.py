"""Planning what `grow=True` boots: enough machines for the calls a job can't place, packed
largest first, within the cluster's caps (max vCPUs, max GPUs per model). Pure: no I/O."""

from __future__ import annotations

import math
from collections.abc import Callable

from burla.drivers.catalog import DEFAULT_MACHINE, MachineType, gpu_model
from burla.drivers.machine_catalog import RegionCatalog
from burla.errors import NoCompatibleNodes
from burla.protocol import wire

DEFAULT_MAX_GPUS = 8


Units = Callable[[MachineType], int]  # what a plan counts on a machine: GPUs, or vCPUs


def growth_sizes(spec: wire.OpenJob, catalog: RegionCatalog, machine_type: str | None
                 ) -> tuple[list[MachineType], Units]:
    """The machines a job's growth picks from (the region's, as its cloud lists them), and what
    it counts on them."""
    cloud, where = catalog.cloud, catalog.region or "its default region"
    if spec.func_gpu is not None:
        model = gpu_model(spec.func_gpu)
        choices = [m for m in catalog.machines if m.gpu == model]
        if not choices:
            offered = sorted({m.gpu for m in catalog.machines if m.gpu and m.gpu != "UNKNOWN"})
            raise NoCompatibleNodes(f"{cloud} offers no machine with a {spec.func_gpu} GPU in {where}; pick one of "
                                    f"{', '.join(offered) or '(none offered there)'}, or another region "
                                    "(`burla cloud machines --gpu` lists them).")
        return choices, _gpus
    cpus_per_call = spec.func_cpu or 1
    name = machine_type or DEFAULT_MACHINE[cloud]
    chosen = catalog.lookup(name)
    if chosen is None:
        raise NoCompatibleNodes(f"{cloud} does not offer {name} in {where} (per {catalog.describe()}); pick a "
                                "machine type `burla cloud machines` lists (`burla settings update "
                                "--machine-type`).")
    family = chosen.family
    choices = [m for m in catalog.machines if m.family == family and not m.gpu and m.vcpus >= cpus_per_call]
    if spec.func_ram is not None:
        choices = [m for m in choices if m.memory_gb >= spec.func_ram]
    if not choices:
        raise NoCompatibleNodes(f"no {family} machine on {cloud} fits one call (func_cpu={spec.func_cpu}, "
                                f"func_ram={spec.func_ram}); lower them or pick another machine type.")
    return choices, _vcpus


def _gpus(machine: MachineType) -> int:
    return machine.gpu_count


def _vcpus(machine: MachineType) -> int:
    return machine.vcpus


def plan_growth(spec: wire.OpenJob, have_slots: int, have_vcpus: int, have_gpus: dict[str, int],
                catalog: RegionCatalog, machine_type: str | None, max_vcpus: int, max_gpus: dict[str, int]
                ) -> list[MachineType]:
    """The machines to boot so the job can run `min(n_inputs, max_parallelism)` calls at once."""
    want = spec.n_inputs if spec.max_parallelism is None else min(spec.n_inputs, spec.max_parallelism)
    missing = want - have_slots
    if missing <= 0:
        return []
    choices, units = growth_sizes(spec, catalog, machine_type)
    if spec.func_gpu is not None:
        model = gpu_model(spec.func_gpu)
        budget = max_gpus.get(model, max_gpus.get(spec.func_gpu.upper(), DEFAULT_MAX_GPUS)) - have_gpus.get(model, 0)
        return _pack(choices, min(missing, budget), units)
    return _pack(choices, min(missing * (spec.func_cpu or 1), max_vcpus - have_vcpus), units)


def within_room(plan: list[MachineType], sizes: list[MachineType], units: Units, room_vcpus: int) -> list[MachineType]:
    """The plan cut to a quota's free vCPUs: planned machines are kept while they fit, and what the
    others would have brought is made up with the sizes that still fit (the smallest that covers
    it, else the largest that fits), until nothing more fits."""
    kept: list[MachineType] = []
    free = room_vcpus
    short = 0
    for machine in plan:
        if machine.vcpus <= free:
            kept.append(machine)
            free -= machine.vcpus
        else:
            short += units(machine)
    while short > 0:
        fitting = [m for m in sizes if m.vcpus <= free and units(m) > 0]
        if not fitting:
            break
        covering = [m for m in fitting if units(m) >= short]
        pick = min(covering, key=units) if covering else max(fitting, key=units)
        kept.append(pick)
        free -= pick.vcpus
        short -= units(pick)
    return kept


def smaller_size(sizes: list[MachineType], machine: MachineType, units: Units) -> MachineType | None:
    """The next size down from `machine` (what to try when the cloud refuses it)."""
    smaller = [m for m in sizes if 0 < units(m) < units(machine)]
    return max(smaller, key=units) if smaller else None


def _pack(choices: list[MachineType], need: int, units: Units) -> list[MachineType]:
    """Machines for `need` units, sized to it: the largest that fits in what is still needed, until
    one machine covers the rest with less to spare than the smallest size (so what boots exceeds
    the need by less than one smallest machine: 100 one-CPU calls boot 100 vCPUs, not 192)."""
    sizes = sorted((m for m in choices if units(m) > 0), key=lambda m: (units(m), m.vcpus, m.memory_gb))
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
        pick = max(fitting, key=lambda m: (units(m), -m.vcpus)) if fitting else sizes[0]  # GPUs: fewest vCPUs
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
