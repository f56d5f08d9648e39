"""The package indexes this client's installers use besides the default one.

Installers record nothing of the index a package came from, so a package from a private index
looks like any other to the nodes, which ask their own index for it by name: where that is the
public one, whoever publishes the name there runs code on every node (dependency confusion). So
the client asks these indexes which of its packages they offer and pins those to their files'
digests (`index_pins`), and names the indexes once. Read from pip's and uv's environment variables
and pip's configuration files (pip.pypa.io/en/stable/topics/configuration/,
docs.astral.sh/uv/reference/environment/); messages name the hosts only, never credentials.
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


def _urls(value: str) -> set[str]:
    """The index URLs in a setting's value (space-separated; uv's UV_INDEX entries may be NAME=URL)."""
    urls = set()
    for url in value.split():
        if "=" in url and "://" not in url.partition("=")[0]:
            url = url.partition("=")[2]
        if urllib.parse.urlsplit(url).hostname:
            urls.add(url)
    return urls


@functools.lru_cache(maxsize=1)
def extra_index_urls() -> tuple[str, ...]:
    """The indexes this client's pip or uv may install from besides the default one, as configured
    (with any credentials: the client queries them itself and never sends them anywhere)."""
    found: set[str] = set()
    for name in _VARIABLES:
        found |= _urls(os.environ.get(name, ""))
    for path in _config_files(os.environ):
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(path, encoding="utf-8")
        except (OSError, configparser.Error, UnicodeDecodeError):
            continue
        for section in parser.sections():
            for key in _KEYS:
                found |= _urls(parser.get(section, key, fallback=""))
    return tuple(sorted(url for url in found if urllib.parse.urlsplit(url).hostname not in DEFAULT_HOSTS))


def extra_index_hosts() -> tuple[str, ...]:
    """Their hosts only (what messages name: never a credential in a URL)."""
    return tuple(sorted({urllib.parse.urlsplit(url).hostname or "" for url in extra_index_urls()}))


def extra_index_warning(hosts: tuple[str, ...]) -> str | None:
    if not hosts:
        return None
    return (f"this machine's installers also use the package index(es) at {', '.join(hosts)}. Packages those "
            "indexes offer travel pinned to their files' digests: a node installs one only if its own index serves "
            "the very same file, so a package of the same name published elsewhere is never installed instead. Give "
            "the nodes the same index settings (PIP_INDEX_URL or uv's on the nodes) for them to find those files.")
