"""The cluster settings (how many nodes of what kind `burla cluster start` and grow boot), checked
strictly: their values reach cloud API paths and command lines. `burla settings` lands here."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from burla.errors import SettingsError
from burla.protocol.validation import IMAGE, REGION, matches


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
        """These settings with `changes`; `"reset": [names]` puts those back to their defaults."""
        changes = dict(changes)
        reset = changes.pop("reset", [])
        names = {f.name for f in dataclasses.fields(self)}
        if not isinstance(reset, list) or not all(isinstance(name, str) for name in reset):
            raise SettingsError("reset must be a list of setting names")
        unknown = (set(changes) | set(reset)) - names
        if unknown:
            raise SettingsError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        defaults = ClusterSettings().to_dict()
        merged = {**self.to_dict(), **{name: defaults[name] for name in reset}, **changes}
        _check_int(merged, "quantity", low=0, high=10_000)
        _check_int(merged, "workers_per_node", low=1, high=4096, optional=True)
        _check_int(merged, "disk_gb", low=10, high=65_536, optional=True)
        _check_int(merged, "max_vcpus", low=1, high=1_000_000)
        # These reach cloud API paths and command lines: strict shapes only.
        for name, pattern, example in (("machine_type", MACHINE_TYPE, "n4-standard-8"), ("region", REGION, "us-east-1"),
                                       ("image", IMAGE, "python:3.12-slim")):
            value = merged[name]
            if value is not None and not matches(pattern, value):
                raise SettingsError(f"{name} must be null or a name like {example} (letters, digits and "
                                    f"{'._/:@+-' if name == 'image' else '._-'})")
        timeout = merged["inactivity_timeout_s"]
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not 1 <= timeout <= MAX_INACTIVITY_S):
            raise SettingsError(f"inactivity_timeout_s must be a number of seconds from 1 to {MAX_INACTIVITY_S:g}, "
                                "or null")
        if not isinstance(merged["spot"], bool):
            raise SettingsError("spot must be true or false")
        gpus = merged["max_gpus"]
        if not isinstance(gpus, dict) or any(
            not matches(MACHINE_TYPE, k) or isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 1_000_000
            for k, v in gpus.items()
        ) or len(gpus) > 100:
            raise SettingsError("max_gpus must map GPU models to counts >= 0, e.g. {\"A100\": 8}")
        return ClusterSettings(**merged)


MACHINE_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
MAX_INACTIVITY_S = 10 * 365 * 86400.0


def _check_int(values: dict, name: str, low: int, high: int, optional: bool = False) -> None:
    value = values[name]
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SettingsError(f"{name} must be an integer from {low} to {high}{' or null' if optional else ''}")
