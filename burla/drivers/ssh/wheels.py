"""Which of a wheelhouse's files a VM needs: the wheels the build's requirements reach (with the
extra it installs), and uv and pip when the VM's Python is not the client's. A node VM of a
cluster whose wheelhouse holds every cloud's SDK gets the dozen wheels it installs, not the SDKs.

Read from the wheels' own METADATA (Requires-Dist). Conservative where it can't know: every
version and platform of a needed name goes, a requirement's environment marker (a Python version,
a platform) counts as met unless it names an extra not installed, and a wheelhouse with a source
archive in it goes whole (what it needs is only known once it is built).
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

# What the bootstrap installs first when the VM's Python is not the client's (bootstrap.install_script).
VM_TOOLS = ("uv", "pip")
_WHEEL = ".whl"
_ARCHIVES = (".whl", ".gz", ".zip")
_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")
_EXTRA_MARKER = re.compile(r"""\bextra\s*==\s*['"]([^'"]+)['"]""")


def normalized(name: str) -> str:
    """A project or extra name as PEP 503 and PEP 685 compare them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheelhouse_files(wheelhouse: Path) -> list[Path]:
    """The wheels and source archives in a wheelhouse directory, sorted."""
    return sorted(p for p in wheelhouse.iterdir() if p.is_file() and p.name.endswith(_ARCHIVES))


def requirements(wheel: Path) -> list[str]:
    """The Requires-Dist lines of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        name = next((n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None)
        if name is None:
            return []
        text = archive.read(name).decode("utf-8", "replace")
    headers = text.split("\n\n", 1)[0]  # the body is the long description
    return [line.split(":", 1)[1].strip() for line in headers.splitlines() if line.startswith("Requires-Dist:")]


def _wanted(requirement: str, extras: frozenset[str]) -> tuple[str, frozenset[str]] | None:
    """(name, its extras) of a requirement that applies with `extras` installed, else None."""
    spec, _, marker = requirement.partition(";")
    match = _REQUIREMENT.match(spec)
    if match is None:
        return None
    named = {normalized(extra) for extra in _EXTRA_MARKER.findall(marker)}
    if named and not named & extras:
        return None
    own = frozenset(normalized(e) for e in (match.group(2) or "").split(",") if e.strip())
    return normalized(match.group(1)), own


def needed_files(wheelhouse: Path, build: Path, extra: str | None, tools: bool) -> list[Path]:
    """The files of `wheelhouse` that installing `build` (with `extra`) needs, and uv and pip's
    if `tools`."""
    files = wheelhouse_files(wheelhouse)
    if any(not f.name.endswith(_WHEEL) for f in files):
        return files
    by_name: dict[str, list[Path]] = {}
    for wheel in files:
        by_name.setdefault(normalized(wheel.name.split("-", 1)[0]), []).append(wheel)
    needed: set[Path] = set()
    done: set[tuple[str, frozenset[str]]] = set()
    pending = [(build, frozenset({normalized(extra)} if extra else ()))]
    pending += [(wheel, frozenset()) for tool in (VM_TOOLS if tools else ()) for wheel in by_name.get(tool, [])]
    while pending:
        wheel, extras = pending.pop()
        needed.add(wheel)
        for requirement in requirements(wheel):
            wanted = _wanted(requirement, extras)
            if wanted is None or wanted in done:
                continue
            done.add(wanted)
            pending += [(found, wanted[1]) for found in by_name.get(wanted[0], [])]
    needed.discard(build)
    return sorted(needed)
