"""The client's Python environment, described for nodes to replicate: every installed
distribution at its exact version (local modules travel separately, see local_code.py)."""

from __future__ import annotations

import concurrent.futures
import functools
import os
import re
import sys
import threading
from pathlib import Path

from burla.validation import replicable_package

# Never installed by a node: burla itself (the node runs its own), and packaging tools.
NOT_REPLICATED = frozenset({"burla", "pip", "setuptools", "wheel", "uv"})


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


_DIST_DIR = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+?)(?:-py\d[^-]*)?\.(?:dist-info|egg-info)$")


@functools.lru_cache(maxsize=1)
def installed_distributions() -> tuple[tuple[str, str], ...]:
    """(canonical name, version) of every distribution importable here, read once per process.

    Names and versions come from the `*.dist-info` / `*.egg-info` directory names on sys.path
    (what installers write), which takes milliseconds; reading every METADATA file the way
    importlib.metadata does takes hundreds. A name that doesn't parse falls back to the metadata.
    """
    found: dict[str, str] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for dirname in names:
            if not dirname.endswith(("dist-info", "egg-info")):
                continue
            match = _DIST_DIR.match(dirname)
            if match is not None:
                name, version = match["name"], match["version"]
            else:
                try:
                    import importlib.metadata  # rarely needed: here, not in every client's import

                    dist = importlib.metadata.PathDistribution(Path(entry or ".") / dirname)
                    name, version = dist.metadata["Name"], dist.version
                except Exception:
                    continue
            # A name or version pip couldn't be asked for (a broken install's leftovers) is skipped.
            if name and canonical(name) not in NOT_REPLICATED and replicable_package(canonical(name), version):
                found.setdefault(canonical(name), version)  # the first on sys.path is what imports
    return tuple(sorted(found.items()))


_prefetch: concurrent.futures.Future | None = None


def prefetch() -> None:
    """Start reading the installed distributions in the background (they take a while to list)."""
    global _prefetch
    if _prefetch is None:
        _prefetch = concurrent.futures.Future()
        future = _prefetch

        def read() -> None:
            try:
                future.set_result(installed_distributions())
            except BaseException as e:  # surfaces when the result is asked for
                future.set_exception(e)

        threading.Thread(target=read, name="burla-environment", daemon=True).start()


def client_packages() -> dict[str, str]:
    prefetch()
    assert _prefetch is not None
    return dict(_prefetch.result())
