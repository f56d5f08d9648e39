"""Packages an extra index of the client's offers, pinned to that index's files.

Installers record nothing of the index a package came from. So, for every package a node would
install by name, the client asks each extra index's simple API (PEP 691 JSON, else PEP 503 links)
for the files of that exact version and, if it lists any, sends the version with their sha256
digests ("VERSION#sha256=D1,D2", validation.HASHED_PIN). A node installs it by name only in
hash-checking mode: a same-named package that someone published on the node's own index, with
other files, fails the check instead of running on every node (dependency confusion).

Answers are cached in the config directory for a day (a package's files at a version don't change);
an index that does not answer leaves its packages by name, as before.
"""

from __future__ import annotations

import base64
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser
from pathlib import Path

from burla.protocol.validation import PACKAGE_VERSION, matches

CACHE_FILE = "index-pins.json"
CACHE_S = 86400.0
TIMEOUT_S = 10.0
MAX_DIGESTS = 200
_ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def file_version(filename: str, name: str) -> str | None:
    """The version a distribution file of `name` is of (a wheel or an sdist), or None."""
    if filename.endswith(".whl"):
        parts = filename[:-4].split("-")
        return parts[1] if len(parts) >= 5 and _normalized(parts[0]) == name else None
    for suffix in (".tar.gz", ".zip", ".tar.bz2"):
        if filename.endswith(suffix):
            base, _, version = filename[: -len(suffix)].rpartition("-")
            return version if _normalized(base) == name else None
    return None


class _Links(HTMLParser):
    """A PEP 503 page's links: (filename, href)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href") or ""

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self.links.append((data.strip(), self._href))
            self._href = None


def _request(url: str) -> urllib.request.Request:
    """A GET of `url` with its credentials, if it has any, as basic auth (urllib won't send them)."""
    parts = urllib.parse.urlsplit(url)
    headers = {"Accept": _ACCEPT}
    if parts.username is not None:
        secret = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(secret.encode()).decode()
        parts = parts._replace(netloc=(parts.hostname or "") + (f":{parts.port}" if parts.port else ""))
    return urllib.request.Request(urllib.parse.urlunsplit(parts), headers=headers)


def index_digests(index_url: str, name: str, version: str) -> list[str]:
    """The sha256 digests of the files of `name` at `version` that this index lists ([] if none,
    or if it does not answer)."""
    page = f"{index_url.rstrip('/')}/{name}/"
    try:
        with urllib.request.urlopen(_request(page), timeout=TIMEOUT_S) as response:
            body = response.read(20 * 2**20)
            kind = response.headers.get("Content-Type", "")
    except (urllib.error.URLError, OSError, ValueError):
        return []
    files: list[tuple[str, str]] = []
    if "json" in kind:
        try:
            for entry in json.loads(body).get("files", []):
                files.append((str(entry.get("filename", "")), str((entry.get("hashes") or {}).get("sha256", ""))))
        except (ValueError, AttributeError):
            return []
    else:
        links = _Links()
        links.feed(body.decode(errors="replace"))
        files = [(filename, href.partition("#sha256=")[2][:64]) for filename, href in links.links]
    return sorted({digest for filename, digest in files
                   if _SHA256.fullmatch(digest) and file_version(filename, name) == version})


def pin_to_indexes(packages: dict[str, str], index_urls: tuple[str, ...], cache_dir: Path | None) -> dict[str, str]:
    """`packages` with each plain version an extra index offers pinned to that index's digests."""
    if not index_urls:
        return packages
    cache = _read_cache(cache_dir)
    now = time.time()
    wanted = [(name, version) for name, version in packages.items() if matches(PACKAGE_VERSION, version)]
    asked = [(name, version, url) for name, version in wanted for url in index_urls
             if not _fresh(cache.get(_key(url, name, version)), now)]
    if asked:
        with ThreadPoolExecutor(max_workers=16) as pool:
            answers = list(pool.map(lambda job: index_digests(job[2], job[0], job[1]), asked))
        for (name, version, url), digests in zip(asked, answers):
            cache[_key(url, name, version)] = {"at": now, "sha256": digests}
        _write_cache(cache_dir, cache, now)
    pinned = dict(packages)
    for name, version in wanted:
        digests = sorted({digest for url in index_urls for digest in cache[_key(url, name, version)]["sha256"]})
        if digests:
            pinned[name] = f"{version}#sha256={','.join(digests[:MAX_DIGESTS])}"
    return pinned


def _key(url: str, name: str, version: str) -> str:
    host = urllib.parse.urlsplit(url)
    return f"{host.hostname}:{host.port or ''}{host.path} {name} {version}"  # no credential in the file


def _fresh(entry: dict | None, now: float) -> bool:
    return (isinstance(entry, dict) and now - float(entry.get("at", 0)) < CACHE_S
            and isinstance(entry.get("sha256"), list))


def _read_cache(cache_dir: Path | None) -> dict:
    if cache_dir is None:
        return {}
    try:
        data = json.loads((cache_dir / CACHE_FILE).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_cache(cache_dir: Path | None, cache: dict, now: float) -> None:
    if cache_dir is None:
        return
    from burla.config import write_private_file  # here: this module is imported by the client on its cold path

    kept = {key: entry for key, entry in cache.items() if _fresh(entry, now)}
    try:
        write_private_file(cache_dir / CACHE_FILE, json.dumps(kept))
    except OSError:
        pass
