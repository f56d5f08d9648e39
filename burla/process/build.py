"""The exact burla build this process runs, as a content hash and as a wheel that carries it.

A head ships its own build to every VM it boots (never `burla` by name from a package index:
that name belongs to another project, and an editable checkout is on no index at all). The
wheel is made here from the files of the imported package, so an editable checkout, a wheel
install and the copy on a VM all hash the same when, and only when, their files are the same.
Nodes send the hash when they register; the head refuses a node whose hash differs from its own.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
import zipfile
from pathlib import Path

from burla._version import __version__
from burla.errors import BuildUnavailable

PACKAGE = "burla"
_SKIPPED_DIRS = {"__pycache__"}
_SKIPPED_SUFFIXES = (".pyc", ".pyo")
BUILD_DIR = "build"  # where a VM keeps the wheels of this build, under its burla home (~/.burla)
# A fixed timestamp, so the same files always make the same wheel bytes.
_ZIP_TIME = (2020, 1, 1, 0, 0, 0)


def _package_root() -> Path:
    return Path(__file__).resolve().parent.parent  # burla/, from burla/process/


def package_files(root: Path | None = None) -> list[tuple[str, Path]]:
    """(name inside the wheel, file) for every file of the package, sorted by name."""
    root = root or _package_root()
    found: list[tuple[str, Path]] = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in _SKIPPED_DIRS and not d.startswith("."))
        for name in files:
            if name.endswith(_SKIPPED_SUFFIXES) or name.startswith("."):
                continue
            path = Path(directory) / name
            found.append((f"{PACKAGE}/{path.relative_to(root).as_posix()}", path))
    return sorted(found)


def hash_files(files: list[tuple[str, Path]]) -> str:
    digest = hashlib.sha256()
    for name, path in files:
        data = path.read_bytes()
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def build_hash() -> str:
    """The content hash of the running burla (version plus every file of the package)."""
    return f"{__version__}+{hash_files(package_files())[:16]}"


def _metadata() -> str:
    """METADATA for the wheel: name, version and the installed distribution's requirements."""
    import importlib.metadata

    try:
        distribution = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise BuildUnavailable(
            "burla's own distribution metadata is missing, so the build nodes need can't be made. Install "
            "burla (from a checkout: `python3 -m pip install -e .`) and run it from that environment."
        ) from None
    lines = ["Metadata-Version: 2.1", f"Name: {PACKAGE}", f"Version: {__version__}"]
    requires_python = distribution.metadata["Requires-Python"]
    if requires_python:
        lines.append(f"Requires-Python: {requires_python}")
    lines += [f"Provides-Extra: {extra}" for extra in distribution.metadata.get_all("Provides-Extra") or []]
    lines += [f"Requires-Dist: {requirement}" for requirement in distribution.requires or []]
    return "\n".join(lines) + "\n"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def wheel_name() -> str:
    return f"{PACKAGE}-{__version__}-py3-none-any.whl"


def build_wheel(cache_dir: Path) -> Path:
    """The running build as a wheel in `cache_dir/<hash>/`, made once per content hash."""
    files = package_files()
    content = hash_files(files)[:16]
    target = cache_dir / content / wheel_name()
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    dist_info = f"{PACKAGE}-{__version__}.dist-info"
    generated = {
        f"{dist_info}/METADATA": _metadata().encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: burla\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist_info}/entry_points.txt": b"[console_scripts]\nburla = burla.cli:main\n",
    }
    records: list[str] = []
    partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        entries = [(name, path.read_bytes()) for name, path in files] + list(generated.items())
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
            records.append(_record_line(name, data))
        records.append(f"{dist_info}/RECORD,,")
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=_ZIP_TIME)
        info.external_attr = 0o644 << 16
        wheel.writestr(info, "\n".join(records) + "\n")
    os.replace(partial, target)
    return target
