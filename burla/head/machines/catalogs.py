"""The machine list a cloud head grows from: its region's, as the cloud lists them (kept in the
config directory, see burla.drivers.machine_catalog), made ready before a job that grows is
admitted so that planning itself needs no I/O."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from burla.drivers.base import Driver
from burla.drivers.machine_catalog import MAX_AGE_S, OFFLINE_TABLE, RegionCatalog, offline_catalog, region_catalog

log = logging.getLogger(__name__)

RETRY_OFFLINE_S = 300.0  # a cloud that could not list its machines is asked again after this long


class HeadCatalog:
    def __init__(self, driver: Driver, cloud: str | None, directory: Path) -> None:
        self._driver = driver
        self._cloud = cloud
        self._directory = directory
        self._catalog: RegionCatalog | None = None
        self._asked_at = 0.0  # monotonic: when the cloud (or the saved list) was last read
        self._lock = asyncio.Lock()

    async def ready(self, refresh: bool = False) -> RegionCatalog | None:
        """The region's list, read when first needed and again once it is old (None: no cloud)."""
        if self._cloud is None:
            return None
        async with self._lock:
            if refresh or self._stale():
                self._catalog = await region_catalog(self._driver, self._cloud, self._directory, refresh=refresh)
                self._asked_at = time.monotonic()
                log.info("machine types: %s", self._catalog.describe())
        return self._catalog

    def _stale(self) -> bool:
        catalog = self._catalog
        if catalog is None:
            return True
        if catalog.source == OFFLINE_TABLE or catalog.problem:
            return time.monotonic() - self._asked_at > RETRY_OFFLINE_S
        return time.time() - catalog.read_at > MAX_AGE_S

    def current(self) -> RegionCatalog:
        """What grow plans from now (the offline table until the cloud's list was read)."""
        if self._catalog is not None:
            return self._catalog
        return offline_catalog(self._cloud or "aws", self._driver.region, "the cloud's list was not read yet")
