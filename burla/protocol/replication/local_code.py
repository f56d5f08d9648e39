"""Shipping the user's local modules with a job.

A function from a module in the user's working tree (importable there, not installed) is
pickled by reference, so a worker on another machine could not import it. The client zips the
source of such modules (the function's own module and the local modules its globals use);
each worker unpacks the zip once per job and puts it first on sys.path before loading the
function.
"""

from __future__ import annotations

import functools
import io
import os
import sys
import sysconfig
import types
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

MAX_LOCAL_CODE_BYTES = 50 * 1024 * 1024
_CACHE: dict[tuple, bytes] = {}  # the last zip, by its files' names, paths, mtimes and sizes
_LOCATED: dict[tuple[str, str], Path | None] = {}  # (module name, __file__) -> _is_local's answer


@functools.lru_cache(maxsize=1)
def _installed_roots() -> list[Path]:
    paths = sysconfig.get_paths()
    roots = {paths.get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= {sys.prefix, sys.base_prefix, sys.exec_prefix}
    return [Path(root).resolve() for root in roots if root]


def _is_local(module: types.ModuleType, roots: list[Path]) -> Path | None:
    """The file or package directory of a module that lives outside every install location
    (remembered per module file: resolving paths was most of a warm job's client time)."""
    file = getattr(module, "__file__", None)
    name = module.__name__
    if not file or name == "__main__" or name == "burla" or name.startswith("burla."):  # burla ships itself
        return None
    key = (module.__name__, file)
    if key not in _LOCATED:
        path = Path(file).resolve()
        outside = not any(path.is_relative_to(root) for root in roots) and path.suffix == ".py"
        _LOCATED[key] = path if outside else None
    return _LOCATED[key]


def _modules_used(function: Callable[..., Any]) -> set[str]:
    names = {getattr(function, "__module__", None) or ""}
    for value in getattr(function, "__globals__", {}).values():
        if isinstance(value, types.ModuleType):
            names.add(value.__name__)
        elif hasattr(value, "__module__") and isinstance(getattr(value, "__module__", None), str):
            names.add(value.__module__)
    return {name for name in names if name and name in sys.modules}


def collect(function: Callable[..., Any]) -> bytes:
    """A zip of the local modules `function` needs (b"" if none)."""
    roots = _installed_roots()
    files: dict[str, Path] = {}
    for name in sorted(_modules_used(function)):
        top = sys.modules.get(name.split(".")[0])
        module = sys.modules[name]
        path = _is_local(module, roots)
        if path is None:
            continue
        if top is not None and hasattr(top, "__path__") and _is_local(top, roots) is not None:
            package_dir = Path(top.__file__ or "").resolve().parent  # ship the whole local package
            for source in package_dir.rglob("*.py"):
                files[str(Path(top.__name__) / source.relative_to(package_dir))] = source
        elif "." not in name:
            files[f"{name}.py"] = path
    if not files:
        return b""
    key = tuple((arcname, str(path), *_stamp(path)) for arcname, path in sorted(files.items()))
    cached = _CACHE.get(key)
    if cached is not None:
        return cached  # same files, unchanged since the last job: no need to zip them again
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for arcname, source in sorted(files.items()):
            archive.write(source, arcname)
    data = buffer.getvalue()
    if len(data) > MAX_LOCAL_CODE_BYTES:
        from burla.errors import FunctionTooBig

        raise FunctionTooBig(
            f"the local modules this function uses are {len(data) / 2**20:.0f} MB zipped (limit "
            f"{MAX_LOCAL_CODE_BYTES // 2**20} MB); install big local packages (`pip install -e .`) instead."
        )
    _CACHE.clear()
    _CACHE[key] = data
    return data


def _stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


def install(code: bytes, directory: str) -> None:
    """Unpack shipped modules into `directory` and import from there first (in a worker)."""
    with zipfile.ZipFile(io.BytesIO(code)) as archive:
        for member in archive.namelist():
            target = os.path.realpath(os.path.join(directory, member))
            if not target.startswith(os.path.realpath(directory) + os.sep):
                raise ValueError(f"refusing to unpack {member!r} outside the job's directory")
        archive.extractall(directory)
    if directory not in sys.path:
        sys.path.insert(0, directory)
