"""Node-hours per machine type and what they cost, from the machines' events in history.

A machine starts with a MACHINE_STARTED node event (its cloud, type, region, whether spot) and
ends at its deletion; a node on the head's own machine ends when its process leaves, or with
the head. Costs are on-demand list prices, an estimate: the price the region's machine list gave
when the machine started (burla.drivers.machine_catalog), else burla's offline table; spot
machines cost less.
"""

from __future__ import annotations

import json
import time
from typing import Any

from burla.drivers.catalog import offline_lookup
from burla.head.history.queries import HEAD_STOPPED

MACHINE_STARTED = "machine started"  # a node event; its detail is JSON (see machine_detail)
_ENDS = {"deleted", "removed"}  # a cloud machine is billed until it is deleted (or removed for idleness)
_LOCAL_ENDS = {"deleted", "left", "removed", "declared dead", HEAD_STOPPED}  # a local node's process ended


def machine_detail(cloud: str, machine_type: str, region: str, spot: bool, usd_per_hour: float | None = None) -> str:
    """What a MACHINE_STARTED event records; the price is the cloud's list price when it started."""
    return json.dumps({"cloud": cloud, "machine_type": machine_type, "region": region, "spot": spot,
                       "usd_per_hour": usd_per_hour})


def usage(events: list[dict[str, Any]], since: float, now: float | None = None) -> dict[str, Any]:
    """`events`: node events (node_id, event, detail, at) in time order. Returns node-hours and an
    estimated cost per (cloud, machine type) between `since` and now."""
    now = time.time() if now is None else now
    open_machines: dict[str, tuple[dict, float]] = {}  # node id -> (its detail, when it started)
    spans: list[tuple[dict, float, float, bool]] = []  # (detail, start, end, still running)
    for row in events:
        node_id, event, at = row["node_id"], row["event"], row["at"]
        if event == MACHINE_STARTED:
            try:
                detail = json.loads(row["detail"])
            except ValueError:
                continue
            if node_id in open_machines:  # started again without an end we saw: the first ended then
                spans.append((*open_machines.pop(node_id), at, False))
            open_machines[node_id] = (detail, at)
        elif node_id in open_machines:
            detail, started = open_machines[node_id]
            if event in (_LOCAL_ENDS if detail.get("cloud") == "local" else _ENDS):
                spans.append((detail, started, at, False))
                del open_machines[node_id]
    spans += [(detail, started, now, True) for detail, started in open_machines.values()]
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for detail, started, ended, running in spans:
        hours = max(0.0, min(ended, now) - max(started, since)) / 3600
        if hours <= 0:
            continue
        cloud, machine_type = str(detail.get("cloud", "")), str(detail.get("machine_type", ""))
        group = groups.setdefault((cloud, machine_type), {
            "cloud": cloud, "machine_type": machine_type or None, "machines": 0, "still_running": 0,
            "spot_machines": 0, "node_hours": 0.0, "usd_per_hour": None,
        })
        if group["usd_per_hour"] is None:
            group["usd_per_hour"] = _price(cloud, machine_type, detail.get("usd_per_hour"))
        group["machines"] += 1
        group["still_running"] += running
        group["spot_machines"] += bool(detail.get("spot"))
        group["node_hours"] += hours
    rows = []
    for group in sorted(groups.values(), key=lambda g: -g["node_hours"]):
        price = group["usd_per_hour"]
        group["estimated_usd"] = None if price is None else round(group["node_hours"] * price, 2)
        group["node_hours"] = round(group["node_hours"], 6)
        rows.append(group)
    known = [g["estimated_usd"] for g in rows if g["estimated_usd"] is not None]
    return {
        "since": since, "until": now, "machine_types": rows,
        "node_hours": round(sum(g["node_hours"] for g in rows), 6),
        "estimated_usd": round(sum(known), 2),
        "note": "on-demand list prices (approximate; spot machines and other regions cost less or more); "
                "machines on the head's own machine cost nothing here",
    }


def _price(cloud: str, machine_type: str, listed: object) -> float | None:
    """The price recorded when the machine started (its cloud's list), else the offline table's."""
    if cloud == "local":
        return 0.0
    if isinstance(listed, (int, float)) and not isinstance(listed, bool) and listed > 0:
        return float(listed)
    found = offline_lookup(cloud, machine_type) if machine_type else None
    return found.usd_per_hour if found is not None and found.usd_per_hour else None
