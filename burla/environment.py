"""The client's Python environment, described for nodes to replicate: every installed
distribution at its exact version (local modules travel separately, see local_code.py)."""

from __future__ import annotations

import functools
import importlib.metadata
import re

# Never installed by a node: burla itself (the node runs its own), and packaging tools.
NOT_REPLICATED = frozenset({"burla", "pip", "setuptools", "wheel", "uv"})


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.lru_cache(maxsize=1)
def installed_distributions() -> tuple[tuple[str, str], ...]:
    """(canonical name, version) of every distribution importable here, read once per process."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] if dist.metadata else None
        if name and canonical(name) not in NOT_REPLICATED:
            found.setdefault(canonical(name), dist.version)
    return tuple(sorted(found.items()))


def client_packages() -> dict[str, str]:
    return dict(installed_distributions())
