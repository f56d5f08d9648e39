"""The client's Python environment, described for nodes to replicate: every installed
distribution at its exact version (local modules travel separately, see local_code.py).

Only what came from an index is asked of an index by name: a distribution installed from a
direct URL travels as that URL with the digest its installer recorded (nodes fetch it from there,
checked), and one installed from a VCS, a local path or an editable checkout, or from a URL with
no recorded digest, is not replicated at all (the client says so). Otherwise a name published on
the nodes' index by someone else (dependency confusion) would run their code on every node."""

from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import re
import sys
import threading
from pathlib import Path

from burla.protocol.replication.package_indexes import extra_index_hosts, extra_index_urls, extra_index_warning
from burla.protocol.validation import DIRECT_REFERENCE, matches, replicable_package

# Never installed by a node: burla itself (the node runs its own), and packaging tools.
NOT_REPLICATED = frozenset({"burla", "pip", "setuptools", "wheel", "uv"})


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


_DIST_DIR = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+?)(?:-py\d[^-]*)?\.(?:dist-info|egg-info)$")


def installed_distributions() -> tuple[tuple[str, str], ...]:
    """(canonical name, version) of every distribution importable here, read once per process.

    Names and versions come from the `*.dist-info` / `*.egg-info` directory names on sys.path
    (what installers write), which takes milliseconds; reading every METADATA file the way
    importlib.metadata does takes hundreds. A name that doesn't parse falls back to the metadata.
    """
    return tuple(sorted(_scan()[0].items()))


def environment_changed() -> None:
    """Read the environment again next time it is asked for (after an installation)."""
    _scan.cache_clear()


def not_installable_by_name() -> dict[str, str]:
    """Distributions here that a node can't install as name==version, with how they were
    installed: editable (their modules travel as local code), from a VCS, from a local path, or
    from a URL without a recorded digest."""
    return _scan()[1]


def direct_references() -> dict[str, str]:
    """Distributions here installed from a direct URL with a recorded sha256: name -> the
    "VERSION @ URL#sha256=DIGEST" nodes install them by (validation.DIRECT_REFERENCE)."""
    return _scan()[2]


@functools.lru_cache(maxsize=1)
def _scan() -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    found: dict[str, str] = {}
    direct: dict[str, str] = {}
    references: dict[str, str] = {}
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
                if canonical(name) in found:
                    continue  # the first on sys.path is what imports
                found[canonical(name)] = version
                how, reference = _installed_how(os.path.join(entry or ".", dirname), version)
                if reference is not None:
                    references[canonical(name)] = reference
                elif how is not None:
                    direct[canonical(name)] = how
    return found, direct, references


def _installed_how(dist_dir: str, version: str) -> tuple[str | None, str | None]:
    """How a distribution was installed if not from an index by name (PEP 610's direct_url.json,
    which installers write only for direct installs), or the direct reference nodes install it
    by; (None, None) for an index install."""
    path = os.path.join(dist_dir, "direct_url.json")
    if not os.path.exists(path):
        return None, None
    try:
        with open(path) as file:
            info = json.load(file)
    except (OSError, ValueError):
        return "from a direct URL whose record can't be read", None
    url = str(info.get("url", ""))
    if (info.get("dir_info") or {}).get("editable"):
        return f"editable from {url.removeprefix('file://')}", None
    if "vcs_info" in info:
        return f"from {info['vcs_info'].get('vcs', 'a VCS')} at {url}", None
    if url.startswith("file://"):
        return f"from the local path {url.removeprefix('file://')}", None
    archive = info.get("archive_info") or {}
    digest = (archive.get("hashes") or {}).get("sha256") or ""
    if not digest and str(archive.get("hash", "")).startswith("sha256="):
        digest = str(archive["hash"]).removeprefix("sha256=")
    reference = f"{version} @ {url.split('#', 1)[0]}#sha256={digest}"
    if digest and matches(DIRECT_REFERENCE, reference):
        return None, reference
    return f"from the URL {url} with no sha256 its installer recorded", None


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


_packages: dict[str, str] | None = None


def client_packages() -> dict[str, str]:
    """What nodes should install: every distribution here a node can install by name (read once
    per process, like the distributions themselves; not to be changed by the caller)."""
    global _packages
    if _packages is None:
        prefetch()
        assert _prefetch is not None
        skipped, references = not_installable_by_name(), direct_references()
        by_name = {name: references.get(name, version) for name, version in _prefetch.result()
                   if name not in skipped}
        urls = extra_index_urls()
        if urls:  # what those indexes offer travels pinned to their files (index_pins)
            from burla.config import config_dir
            from burla.protocol.replication.index_pins import pin_to_indexes

            by_name = pin_to_indexes(by_name, urls, config_dir())
        _packages = by_name
    return _packages


_warned = False


def not_replicated_warning() -> str | None:
    """Once per process: the distributions nodes won't install, the indexes they can't tell
    apart, and what to do (None after, or when there is nothing to say)."""
    global _warned
    if _warned:
        return None
    _warned = True
    skipped = not_installable_by_name()
    words = [extra_index_warning(extra_index_hosts())]
    if skipped:
        listed = "; ".join(f"{name} ({how})" for name, how in sorted(skipped.items()))
        words.insert(0, f"nodes won't install {len(skipped)} package(s) they can't get by name: {listed}. Editable "
                        "projects travel as local code when the function uses them; for the others, install them on "
                        "the nodes or publish them to an index the nodes reach. A call that then can't import one "
                        "fails naming it.")
    said = [w for w in words if w]
    return "\n".join(said) if said else None


def missing_package_note(module: str, sent: dict[str, str]) -> str | None:
    """For a call that could not import `module`: which package provides it here, and why the
    node may lack it (None if no package here provides it)."""
    top = module.split(".")[0]
    providers = sorted({canonical(name) for name in _module_providers().get(top, [])})
    if not providers:
        return None
    name = providers[0]
    skipped = not_installable_by_name()
    if name in skipped:
        why = f"installed here {skipped[name]}, which nodes can't install by name"
    elif name in sent:
        why = "the node was asked to install it and could not (see its installation messages above)"
    else:
        why = "nodes were not asked to install it"
    return f"[burla] {module} comes from the package {name} here; {why}."


@functools.lru_cache(maxsize=1)
def _module_providers() -> dict[str, list[str]]:
    """Top-level module -> distributions providing it, read once (it reads every distribution's
    files: only on the path of a call that failed to import)."""
    import importlib.metadata

    return dict(importlib.metadata.packages_distributions())
