"""The package indexes this client's installers use besides the default one.

Installers record nothing of the index a package came from, so a package from a private index
looks like any other to the nodes, which ask their own index for it by name: where that is the
public one, whoever publishes the name there runs code on every node (dependency confusion). The
client can't tell which packages those are, so it names the extra indexes once and what to do.
Read from pip's and uv's environment variables and pip's configuration files
(pip.pypa.io/en/stable/topics/configuration/, docs.astral.sh/uv/reference/environment/); the
hosts only, never credentials in a URL.
"""

from __future__ import annotations

import configparser
import functools
import os
import sys
import urllib.parse
from pathlib import Path

_VARIABLES = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_INDEX",
              "UV_DEFAULT_INDEX")
_KEYS = ("index-url", "extra-index-url")
DEFAULT_HOSTS = frozenset({"pypi.org", "files.pythonhosted.org"})  # the default index, which nodes use too


def _config_files(environ: dict[str, str] | os._Environ) -> list[Path]:
    """pip's configuration files, in the order pip reads them (later ones win, all count here)."""
    home = Path.home()
    files = [Path("/etc/pip.conf"), Path(environ.get("XDG_CONFIG_HOME", home / ".config")) / "pip" / "pip.conf",
             home / ".pip" / "pip.conf", Path(sys.prefix) / "pip.conf"]
    if environ.get("PIP_CONFIG_FILE"):
        files.append(Path(environ["PIP_CONFIG_FILE"]))
    return files


def _hosts(value: str) -> set[str]:
    hosts = set()
    for url in value.split():
        parts = urllib.parse.urlsplit(url.partition("=")[2] if "=" in url and "://" not in url.partition("=")[0]
                                      else url)
        if parts.hostname:
            hosts.add(parts.hostname)
    return hosts


@functools.lru_cache(maxsize=1)
def extra_index_hosts() -> tuple[str, ...]:
    """Hosts of the indexes this client's pip or uv may install from besides the default one."""
    found: set[str] = set()
    for name in _VARIABLES:
        found |= _hosts(os.environ.get(name, ""))
    for path in _config_files(os.environ):
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(path, encoding="utf-8")
        except (OSError, configparser.Error, UnicodeDecodeError):
            continue
        for section in parser.sections():
            for key in _KEYS:
                found |= _hosts(parser.get(section, key, fallback=""))
    return tuple(sorted(found - DEFAULT_HOSTS))


def extra_index_warning(hosts: tuple[str, ...]) -> str | None:
    if not hosts:
        return None
    return (f"this machine's installers also use the package index(es) at {', '.join(hosts)}; which packages came "
            "from there is not recorded, and nodes ask their own index for every package by name. Give the nodes the "
            "same index settings (PIP_INDEX_URL or uv's on the nodes), or install private packages from a direct "
            "URL (they then travel by that URL and digest), so that a package of the same name on another index is "
            "never installed instead.")
