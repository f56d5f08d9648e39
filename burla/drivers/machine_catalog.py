"""Each cloud's machine types in one region, as the cloud's own API lists them, kept in the config
directory with the time they were read.

Grow plans from this list (what the region offers this account, with vCPUs, memory, GPUs and
architecture as the cloud states them). A list younger than `MAX_AGE_S` is used as it is; an
older one is read again. When the cloud can't be asked (no network, a permission missing), an
older list still serves, and with none at all the small offline table in `burla.drivers.catalog`
does: the catalog says which it is (`source`), so `burla cloud machines` and the head's log can.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from burla.drivers.base import Driver
from burla.drivers.catalog import OFFLINE, MachineType, offline_lookup

log = logging.getLogger(__name__)

MAX_AGE_S = 7 * 24 * 3600.0  # clouds add machine types every few months; a week-old list is fresh enough
LIST_TIMEOUT_S = 120.0  # a job waits on the first listing: past this, the older list or the offline table
CACHE_FOLDER = "machines"
FORMAT = 1  # of the cached file; another number is read as no cache

FROM_CLOUD = "cloud"  # read from the cloud just now
FROM_CACHE = "cache"  # read from the cloud earlier (`read_at` says when)
OFFLINE_TABLE = "offline"  # the hand-written fallback: approximate, and not this account's


@dataclass(frozen=True)
class RegionCatalog:
    cloud: str
    region: str
    machines: tuple[MachineType, ...]
    read_at: float  # when the cloud listed them (0 for the offline table)
    source: str
    problem: str = ""  # why the cloud could not be asked, when it could not

    def lookup(self, name: str) -> MachineType | None:
        return next((m for m in self.machines if m.name == name), None)

    def describe(self, now: float | None = None) -> str:
        if self.source == OFFLINE_TABLE:
            return (f"burla's offline table of {self.cloud} machine types (approximate, not read from the cloud"
                    + (f": {self.problem}" if self.problem else "") + ")")
        age_h = max(0.0, (time.time() if now is None else now) - self.read_at) / 3600
        told = f"{self.cloud} {self.region or '(default region)'}, listed by the cloud {age_h:.1f} h ago"
        return told + (f" (could not list again: {self.problem})" if self.problem else "")


def cache_path(directory: Path, cloud: str, region: str) -> Path:
    return directory / CACHE_FOLDER / f"{cloud}-{region or 'default'}.json"


def offline_catalog(cloud: str, region: str, problem: str = "") -> RegionCatalog:
    return RegionCatalog(cloud, region, tuple(OFFLINE.get(cloud, [])), 0.0, OFFLINE_TABLE, problem)


def read_cache(path: Path) -> RegionCatalog | None:
    """A list saved earlier; None when there is none or it can't be read (it is then listed again)."""
    try:
        saved = json.loads(path.read_text())
        if saved.get("format") != FORMAT:
            return None
        return RegionCatalog(saved["cloud"], saved["region"], tuple(MachineType(**m) for m in saved["machines"]),
                             float(saved["read_at"]), FROM_CACHE)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as e:
        log.warning("ignoring the saved machine list %s (%s); listing again", path, e)
        return None


def write_cache(path: Path, catalog: RegionCatalog) -> None:
    """Saved whole or not at all (another head or CLI may read it meanwhile)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps({"format": FORMAT, "cloud": catalog.cloud, "region": catalog.region,
                                   "read_at": catalog.read_at,
                                   "machines": [dataclasses.asdict(m) for m in catalog.machines]}))
    os.replace(partial, path)


async def region_catalog(driver: Driver, cloud: str, directory: Path, refresh: bool = False,
                         now: float | None = None, max_age_s: float = MAX_AGE_S) -> RegionCatalog:
    """The machine types of the driver's region: saved, else listed by the cloud (and saved), else
    an older saved list, else the offline table. Never raises for a cloud that can't be asked."""
    now = time.time() if now is None else now
    path = cache_path(directory, cloud, driver.region)
    saved = read_cache(path)
    if saved is not None and not refresh and 0 <= now - saved.read_at < max_age_s:
        return saved
    try:
        machines = await asyncio.wait_for(driver.machine_types(), LIST_TIMEOUT_S)
        if not machines:
            raise LookupError(f"the cloud listed no machine types in {driver.region or 'its default region'}")
    except Exception as e:  # noqa: BLE001 - the list is read again next time; grow still plans
        problem = f"{type(e).__name__}: {e}"
        log.warning("could not list %s machine types in %s: %s", cloud, driver.region, problem)
        if saved is not None:
            return dataclasses.replace(saved, problem=problem)
        return offline_catalog(cloud, driver.region, problem)
    catalog = RegionCatalog(cloud, driver.region, tuple(sorted(machines, key=_order)), now, FROM_CLOUD)
    try:
        write_cache(path, catalog)
    except OSError as e:
        log.warning("could not save the machine list to %s: %s", path, e)
    return catalog


def _order(machine: MachineType) -> tuple[str, int, str]:
    return machine.family, machine.vcpus, machine.name


def priced(machines: Iterable[MachineType], cloud: str) -> list[MachineType]:
    """Machines whose price the cloud's list lacks get the offline table's estimate, if it has one."""
    out = []
    for machine in machines:
        if machine.usd_per_hour is None:
            known = offline_lookup(cloud, machine.name)
            if known is not None:
                machine = dataclasses.replace(machine, usd_per_hour=known.usd_per_hour)
        out.append(machine)
    return out


def libcloud_prices(table: str) -> dict[str, Any]:
    """libcloud's bundled on-demand price table (e.g. "ec2_linux", "gce_instances"); {} if absent."""
    from libcloud.pricing import get_pricing

    try:
        return get_pricing(driver_type="compute", driver_name=table) or {}
    except (KeyError, OSError, ValueError):
        return {}
