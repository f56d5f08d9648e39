"""The build a head ships to its VMs: made from the running package, installable, hashing the same
once installed elsewhere, and different whenever a file differs."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from burla._version import __version__
from burla.process.build import build_hash, build_wheel, hash_files, package_files


def test_the_wheel_holds_every_package_file_and_is_made_once_per_content(tmp_path):
    wheel = build_wheel(tmp_path)
    assert wheel.name == f"burla-{__version__}-py3-none-any.whl"
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {name for name, _ in package_files()} <= names
    static = "burla/head/routes/static/"
    assert f"{static}dashboard.js" in names or any(n.startswith(static) for n in names)
    metadata = zipfile.ZipFile(wheel).read(f"burla-{__version__}.dist-info/METADATA").decode()
    assert "Requires-Dist: aiohttp" in metadata and "Name: burla" in metadata
    before = wheel.stat().st_mtime_ns
    assert build_wheel(tmp_path) == wheel and wheel.stat().st_mtime_ns == before  # cached by content hash
    assert wheel.parent.name == build_hash().split("+")[1]


def test_an_installed_copy_hashes_the_same_and_an_edited_one_does_not(tmp_path):
    wheel = build_wheel(tmp_path / "wheels")
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target",
                    str(target), str(wheel)], check=True)
    installed = target / "burla"
    assert hash_files(package_files(installed))[:16] == build_hash().split("+")[1]
    (installed / "node" / "service.py").write_text("# edited\n", encoding="utf-8")
    assert hash_files(package_files(installed))[:16] != build_hash().split("+")[1]
