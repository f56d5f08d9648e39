"""A directory of wheels for burla's dependencies, made offline from this test environment's own
installed distributions (the stand-in VMs install from it with no index, as a VM without internet
would from a wheelhouse its head uploads)."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import re
import zipfile
from pathlib import Path

from packaging.requirements import Requirement  # noqa: I001 - ships with pip's vendored tree too

from burla.drivers.ssh.wheels import VM_TOOLS


def _dependencies(name: str, extras: frozenset[str] = frozenset()) -> list[importlib.metadata.Distribution]:
    """The distribution and everything it needs here, recursively."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    pending = [(name, extras)]
    while pending:
        current, current_extras = pending.pop()
        key = re.sub(r"[-_.]+", "-", current).lower()
        if key in seen:
            continue
        distribution = importlib.metadata.distribution(current)
        seen[key] = distribution
        for text in distribution.requires or []:
            requirement = Requirement(text)
            environments = [{"extra": e} for e in current_extras] or [{"extra": ""}]
            if requirement.marker is None or any(requirement.marker.evaluate(env) for env in environments):
                pending.append((requirement.name, frozenset(requirement.extras)))
    return list(seen.values())


def _repack(distribution: importlib.metadata.Distribution, target: Path) -> Path:
    """The installed distribution as a wheel again (its files, its tag, a fresh RECORD)."""
    dist_info = next(str(f).split("/")[0] for f in distribution.files or [] if str(f).endswith(".dist-info/METADATA"))
    tags = [line.split(":", 1)[1].strip() for line in (distribution.read_text("WHEEL") or "").splitlines()
            if line.startswith("Tag:")]
    name = re.sub(r"[-_.]+", "_", distribution.metadata["Name"])
    parts = [tag.split("-") for tag in tags] or [["py3", "none", "any"]]
    # The compressed tag set of every tag the wheel had (e.g. py2.py3-none-any).
    compressed = "-".join(".".join(dict.fromkeys(part[i] for part in parts)) for i in range(3))
    wheel = target / f"{name}-{distribution.version}-{compressed}.whl"
    records = []
    entry_scripts = {e.name for e in distribution.entry_points if e.group in ("console_scripts", "gui_scripts")}
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for file in distribution.files or []:
            path = str(file)
            if path.startswith(".."):
                # Installed scripts: the installer writes entry points again, but other programs
                # (uv's binary) travel in the wheel's data directory.
                script = path.rsplit("/", 1)[-1]
                if "/bin/" not in f"/{path}" or script in entry_scripts:
                    continue
                data = Path(distribution.locate_file(file)).read_bytes()
                path = f"{name}-{distribution.version}.data/scripts/{script}"
            elif "__pycache__" in path or path.endswith((".pyc", "/RECORD", "/INSTALLER", "/direct_url.json",
                                                          "/REQUESTED")):
                continue
            else:
                data = Path(distribution.locate_file(file)).read_bytes()
            entry = zipfile.ZipInfo(path)
            entry.compress_type = zipfile.ZIP_DEFLATED
            # Modes travel with the files: pip makes a script executable only if its entry says so.
            entry.external_attr = (Path(distribution.locate_file(file)).stat().st_mode & 0xFFFF) << 16
            archive.writestr(entry, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            records.append(f"{path},sha256={digest},{len(data)}")
        records.append(f"{dist_info}/RECORD,,")
        archive.writestr(f"{dist_info}/RECORD", "\n".join(records) + "\n")
    return wheel


def build_wheelhouse(target: Path) -> Path:
    """Wheels of burla's runtime dependencies with every cloud extra (a deployed head installs
    one), and the VM tools uv and pip; not burla itself: the head ships its own build."""
    target.mkdir(parents=True, exist_ok=True)
    for distribution in _dependencies("burla", frozenset({"aws", "gcp", "azure"})):
        if distribution.metadata["Name"].lower() != "burla":
            _repack(distribution, target)
    # What a VM whose Python is not the client's needs: uv, which makes a venv of the client's
    # version, and pip to seed it with.
    for tool in VM_TOOLS:
        _repack(importlib.metadata.distribution(tool), target)
    return target
