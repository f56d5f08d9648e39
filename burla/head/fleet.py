"""The head's fleet: the cluster settings (how many nodes of what kind) and the driver that boots
and deletes them. `burla cluster start | stop | restart` and `burla settings` land here."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from burla import wire
from burla.drivers.base import BootRequest, Driver
from burla.head.cluster import Cluster
from burla.head.history import History
from burla.head.scheduler import RUNNING

log = logging.getLogger("burla.head")


class SettingsError(ValueError):
    """A settings update that can't be applied; the message says what to fix."""


@dataclass(frozen=True)
class ClusterSettings:
    quantity: int = 1  # nodes `cluster start` boots
    workers_per_node: int | None = None  # None: one per CPU
    machine_type: str | None = None
    region: str | None = None
    disk_gb: int | None = None
    image: str | None = None
    inactivity_timeout_s: float | None = None
    spot: bool = False
    max_vcpus: int = 2560
    max_gpus: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def updated(self, changes: dict[str, Any]) -> ClusterSettings:
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise SettingsError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        merged = {**self.to_dict(), **changes}
        _check_int(merged, "quantity", low=0, high=10_000)
        _check_int(merged, "workers_per_node", low=1, high=4096, optional=True)
        _check_int(merged, "disk_gb", low=10, high=65_536, optional=True)
        _check_int(merged, "max_vcpus", low=1, high=1_000_000)
        for name in ("machine_type", "region", "image"):
            value = merged[name]
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise SettingsError(f"{name} must be a non-empty string or null")
        timeout = merged["inactivity_timeout_s"]
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 1):
            raise SettingsError("inactivity_timeout_s must be a number of seconds >= 1, or null")
        if not isinstance(merged["spot"], bool):
            raise SettingsError("spot must be true or false")
        gpus = merged["max_gpus"]
        if not isinstance(gpus, dict) or any(
            not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int) or v < 0 for k, v in gpus.items()
        ):
            raise SettingsError("max_gpus must map GPU models to counts >= 0, e.g. {\"A100\": 8}")
        return ClusterSettings(**merged)


def _check_int(values: dict, name: str, low: int, high: int, optional: bool = False) -> None:
    value = values[name]
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SettingsError(f"{name} must be an integer from {low} to {high}{' or null' if optional else ''}")


class Fleet:
    def __init__(self, cluster: Cluster, driver: Driver, history: History | None, head_url: str, token: str,
                 settings: ClusterSettings) -> None:
        self.cluster = cluster
        self.driver = driver
        self.history = history
        self.head_url = head_url
        self.token = token
        self.settings = settings
        self.stopped = False  # `cluster stop` was asked: jobs don't boot nodes until `cluster start`

    @classmethod
    async def load(cls, cluster: Cluster, driver: Driver, history: History | None, head_url: str, token: str,
                   defaults: ClusterSettings) -> Fleet:
        saved = await history.load_settings() if history is not None else None
        settings = defaults
        if saved:
            try:
                settings = defaults.updated(saved)
            except SettingsError as e:
                log.warning("ignoring saved settings (%s)", e)
        return cls(cluster, driver, history, head_url, token, settings)

    def _request(self, count: int) -> BootRequest:
        s = self.settings
        return BootRequest(count, self.head_url, self.token, s.workers_per_node, s.machine_type, s.region, s.disk_gb,
                           s.image, s.spot)

    def boot_for_job(self) -> list[str]:
        """A job arrived and no node is up or booting: boot the configured quantity (unless stopped)."""
        if self.stopped or self.settings.quantity < 1 or not hasattr(self.driver, "boot_now"):
            return []
        return self.driver.boot_now(self._request(self.settings.quantity))  # type: ignore[attr-defined]

    async def start(self) -> dict[str, Any]:
        self.stopped = False
        have = len(self.cluster.scheduler.nodes) + len(self.cluster.booting_ids)
        missing = max(0, self.settings.quantity - have)
        booted = await self.driver.boot(self._request(missing)) if missing else []
        self.cluster.expect_nodes(booted)
        if self.history is not None:
            for node_id in booted:
                self.history.node_event(node_id, "booting", f"cluster start via the {self.driver.name} driver")
        return {"booted": booted, "already_running": have, "quantity": self.settings.quantity}

    async def stop(self) -> dict[str, Any]:
        self.stopped = True
        for job in list(self.cluster.scheduler.jobs.values()):
            if job.status == RUNNING:
                self.cluster.end_job(job, "CANCELED", "JobCanceled", "the cluster was stopped")
        stopped = []
        for node_id in list(self.cluster.scheduler.nodes):
            link = self.cluster.node_links.get(node_id)
            self.cluster.node_lost(node_id)
            if not await self.driver.delete(node_id) and link is not None:
                link.send(wire.ShutdownNode("the cluster was stopped"))
            stopped.append(node_id)
        for node_id in list(self.cluster.booting_ids):
            await self.driver.delete(node_id)
            self.cluster.booting_ids.discard(node_id)
            stopped.append(node_id)
        self.cluster.scheduler.booting = 0
        return {"stopped": stopped}

    async def delete_node(self, node_id: str) -> bool:
        """Delete a node through whichever driver started it; False if none did."""
        return await self.driver.delete(node_id)

    async def update_settings(self, changes: dict[str, Any]) -> ClusterSettings:
        self.settings = self.settings.updated(changes)
        if self.history is not None:
            await self.history.save_settings(self.settings.to_dict())
        return self.settings
