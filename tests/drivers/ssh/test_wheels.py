"""Which of a wheelhouse's files a VM gets (burla.drivers.ssh.wheels): what the build's
requirements reach with the extra it installs, uv and pip only when asked, every version and
platform of a needed name, and the whole wheelhouse once a source archive is in it."""

from __future__ import annotations

import zipfile
from pathlib import Path

from burla.drivers.ssh.wheels import needed_files, requirements


def _wheel(directory: Path, filename: str, *requires: str) -> Path:
    name, version = filename.split("-")[:2]
    path = directory / filename
    with zipfile.ZipFile(path, "w") as archive:
        headers = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
                   *(f"Requires-Dist: {r}" for r in requires)]
        # The body (a long description) may say anything, Requires-Dist lines included.
        body = "Requires-Dist: not-a-requirement\n"
        archive.writestr(f"{name}-{version}.dist-info/METADATA", "\n".join(headers) + "\n\n" + body)
    return path


def _names(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


def _house(tmp_path: Path) -> tuple[Path, Path]:
    house = tmp_path / "wheelhouse"
    house.mkdir()
    build = _wheel(tmp_path, "burla-1.0-py3-none-any.whl", "aiohttp>=3", "Click (>=8)",
                   "botocore; extra == 'aws'", "google-auth ; extra == \"gcp\"",
                   "tomli; python_version < '3.11'")
    _wheel(house, "aiohttp-3.9-cp311-cp311-manylinux_2_17_x86_64.whl", "yarl>=1", "aiodns; extra == 'speedups'")
    _wheel(house, "aiohttp-3.9-cp312-cp312-manylinux_2_17_x86_64.whl", "yarl>=1")
    _wheel(house, "yarl-1.9-py3-none-any.whl", "idna")
    _wheel(house, "idna-3.4-py3-none-any.whl")
    _wheel(house, "click-8.1-py3-none-any.whl")
    _wheel(house, "botocore-1.3-py3-none-any.whl", "urllib3[socks]")
    _wheel(house, "urllib3-2.0-py3-none-any.whl", "pysocks; extra == 'socks'")
    _wheel(house, "PySocks-1.7-py3-none-any.whl")
    _wheel(house, "google_auth-2.0-py3-none-any.whl", "rsa")
    _wheel(house, "rsa-4.9-py3-none-any.whl")
    _wheel(house, "aiodns-3.0-py3-none-any.whl")
    _wheel(house, "tomli-2.0-py3-none-any.whl")
    _wheel(house, "uv-0.4-py3-none-manylinux_2_17_x86_64.whl")
    _wheel(house, "pip-24.0-py3-none-any.whl")
    return house, build


def test_a_node_gets_what_its_requirements_reach_and_no_extra_it_does_not_install(tmp_path):
    house, build = _house(tmp_path)
    assert _names(needed_files(house, build, None, tools=False)) == [
        "aiohttp-3.9-cp311-cp311-manylinux_2_17_x86_64.whl", "aiohttp-3.9-cp312-cp312-manylinux_2_17_x86_64.whl",
        "click-8.1-py3-none-any.whl", "idna-3.4-py3-none-any.whl",
        "tomli-2.0-py3-none-any.whl",  # a Python-version marker counts as met: the VM's Python may be older
        "yarl-1.9-py3-none-any.whl"]


def test_an_extra_brings_its_wheels_and_theirs_with_the_extras_they_ask_for(tmp_path):
    house, build = _house(tmp_path)
    names = _names(needed_files(house, build, "aws", tools=False))
    assert {"botocore-1.3-py3-none-any.whl", "urllib3-2.0-py3-none-any.whl",
            "PySocks-1.7-py3-none-any.whl"} <= set(names)
    assert "google_auth-2.0-py3-none-any.whl" not in names and "rsa-4.9-py3-none-any.whl" not in names
    assert "aiodns-3.0-py3-none-any.whl" not in names  # aiohttp's own extra, not asked for


def test_uv_and_pip_go_only_to_a_vm_whose_python_is_not_the_clients(tmp_path):
    house, build = _house(tmp_path)
    assert not {"uv-0.4-py3-none-manylinux_2_17_x86_64.whl", "pip-24.0-py3-none-any.whl"} & set(
        _names(needed_files(house, build, None, tools=False)))
    assert {"uv-0.4-py3-none-manylinux_2_17_x86_64.whl", "pip-24.0-py3-none-any.whl"} <= set(
        _names(needed_files(house, build, None, tools=True)))


def test_a_wheelhouse_with_a_source_archive_goes_whole(tmp_path):
    house, build = _house(tmp_path)
    (house / "somepkg-1.0.tar.gz").write_bytes(b"")
    (house / "notes.txt").write_text("not a distribution")
    assert len(needed_files(house, build, None, tools=False)) == 15  # 14 wheels and the archive, not the note


def test_requirements_are_read_from_the_metadata_headers_only(tmp_path):
    wheel = _wheel(tmp_path, "x-1.0-py3-none-any.whl", "a", "b; extra == 'c'")
    assert requirements(wheel) == ["a", "b; extra == 'c'"]
