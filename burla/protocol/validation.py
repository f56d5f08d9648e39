"""Strict shapes for values that reach a command line, a cloud API path or a URL.

The client checks them before a job leaves (InvalidArgument) and the head again when a job
arrives (ProtocolError, a 4xx on the channel): nothing shaped like an option (`-x`), a path
(`a/../b`) or a shell word gets through to `docker run`, `pip install` or a cloud API.
"""

from __future__ import annotations

import re

# A container image reference: [registry[:port]/]name[:tag][@digest]; never starts with "-".
IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}")
# A cloud region: AWS us-east-1, GCE us-central1, Azure eastus, or "local".
REGION = re.compile(r"[a-z][a-z0-9-]{0,62}")
# A job id: what the client makes from the function's name (word characters) and a token.
JOB_ID = re.compile(r"[\w.-]{1,200}")
# An installed distribution's canonical name and version, as `pip install NAME==VERSION` takes.
PACKAGE_NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,198}[a-z0-9])?")
PACKAGE_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]{0,99}")
# A package installed from a direct URL travels as "VERSION @ URL#sha256=DIGEST": nodes fetch it from
# that URL, checked against the digest its installer recorded, never by name from an index.
DIRECT_REFERENCE = re.compile(r"(?P<version>[A-Za-z0-9][A-Za-z0-9.+!_-]{0,99}) @ "
                              r"(?P<url>https?://[A-Za-z0-9._~:/?&=%+@!$'()*,;\[\]-]{1,2000}#sha256=[0-9a-f]{64})")
# A package an extra index of the client's also offers travels as "VERSION#sha256=H1,H2,...": the
# digests of that index's files of that version. Nodes install it by name only if what their own
# index serves has one of those digests (an impostor of the same name there fails the check).
HASHED_PIN = re.compile(r"(?P<version>[A-Za-z0-9][A-Za-z0-9.+!_-]{0,99})#sha256="
                        r"(?P<hashes>[0-9a-f]{64}(?:,[0-9a-f]{64}){0,199})")
MAX_PACKAGES = 100_000
GPU_CHOICES = ("T4", "A100", "A100_40G", "A100_80G", "H100", "H100_80G")


def matches(pattern: re.Pattern[str], value: object) -> bool:
    return isinstance(value, str) and pattern.fullmatch(value) is not None


def replicable_package(name: str, version: str) -> bool:
    return matches(PACKAGE_NAME, name) and (matches(PACKAGE_VERSION, version) or matches(DIRECT_REFERENCE, version)
                                            or matches(HASHED_PIN, version))


_last_valid_packages: dict = {}  # a client sends the same map with every job: checked once


def packages_problem(packages: object) -> str | None:
    """What is wrong with a job's {name: version} map, or None."""
    global _last_valid_packages
    if not isinstance(packages, dict):
        return "packages must be a map of distribution names to versions"
    if packages == _last_valid_packages:
        return None
    if len(packages) > MAX_PACKAGES:
        return f"packages must list at most {MAX_PACKAGES} distributions"
    for name, version in packages.items():
        if not replicable_package(name, version):
            return (f"packages entry {str(name)[:100]!r}: {str(version)[:100]!r} is not a canonical distribution "
                    "name and a version (or 'VERSION @ URL#sha256=DIGEST', or 'VERSION#sha256=DIGEST,...')")
    _last_valid_packages = packages
    return None
