"""Credentials narrower than the cluster token, all derived from it by the head (and by anyone
holding it): nothing to store, and they stay valid across head restarts.

- A **job token** (`bjt1.<job>.<mac>`) is what a job's calls get instead of the cluster token
  (BURLA_JOB_TOKEN in the worker): it opens jobs nested in that job and reads that job's tree.
- A **node token** (`bnt1.<node>.<mac>`) is what a node the head starts holds: it registers that
  node, under that id, and nothing else.
- A **job secret** is what attaching to or resuming a job takes: the client that opened the job
  hears it in JobAccepted; a holder of the cluster token can derive it (`burla jobs results`).

Each kind has its own key (an HMAC of the cluster token with the kind's name), so no value of
one kind is a valid value of another. Nothing here imports the web stack: the client uses it.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import Literal

JOB_TOKEN_PREFIX = "bjt1"
NODE_TOKEN_PREFIX = "bnt1"
_MAC_BYTES = 24
_SUBJECT = re.compile(r"[A-Za-z0-9_-]{1,400}")  # an id in unpadded base64url
_PREFIXES: dict[str, Literal["job", "node"]] = {JOB_TOKEN_PREFIX: "job", NODE_TOKEN_PREFIX: "node"}


@functools.lru_cache(maxsize=16)
def _key(cluster_token: str, kind: str) -> bytes:
    return hmac.new(cluster_token.encode(), f"burla scoped {kind}".encode(), hashlib.sha256).digest()


def _mac(cluster_token: str, kind: str, subject: str) -> bytes:
    return hmac.new(_key(cluster_token, kind), subject.encode(), hashlib.sha256).digest()[:_MAC_BYTES]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes | None:
    if not _SUBJECT.fullmatch(text):
        return None
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None


def _token(cluster_token: str, kind: Literal["job", "node"], prefix: str, subject: str) -> str:
    return f"{prefix}.{_b64(subject.encode())}.{_b64(_mac(cluster_token, kind, subject))}"


def job_token(cluster_token: str, job_id: str) -> str:
    """The token a job's calls get: nested jobs and reads of this job's tree."""
    return _token(cluster_token, "job", JOB_TOKEN_PREFIX, job_id)


def node_token(cluster_token: str, node_id: str) -> str:
    """The token a node started by the head registers with: that node, and nothing else."""
    return _token(cluster_token, "node", NODE_TOKEN_PREFIX, node_id)


def job_secret(cluster_token: str, job_id: str) -> str:
    """What attaching to or resuming job `job_id` takes."""
    return _b64(_mac(cluster_token, "secret", job_id))


def secret_matches(cluster_token: str, job_id: str, given: str) -> bool:
    return hmac.compare_digest(job_secret(cluster_token, job_id).encode(), given.encode("utf-8", "surrogatepass"))


def is_scoped(bearer: str) -> bool:
    """Whether a bearer value is shaped as a scoped token (a cluster token can't be: no dots)."""
    return bearer.partition(".")[0] in _PREFIXES


@dataclass(frozen=True)
class Scope:
    """Whom a scoped token speaks for: one job's tree, or one node."""

    kind: Literal["job", "node"]
    subject: str  # the job's or the node's id


def scope_of(cluster_token: str, bearer: str) -> Scope | None:
    """The scope of a valid scoped token of this cluster; None for anything else (malformed,
    forged, or of another cluster)."""
    parts = bearer.split(".")
    if len(parts) != 3 or parts[0] not in _PREFIXES:
        return None
    kind = _PREFIXES[parts[0]]
    raw_subject, mac = _unb64(parts[1]), _unb64(parts[2])
    if raw_subject is None or mac is None:
        return None
    try:
        subject = raw_subject.decode("utf-8")
    except UnicodeDecodeError:
        return None
    # Re-encoded and compared whole: only the canonical spelling of a token is valid.
    if not hmac.compare_digest(_token(cluster_token, kind, parts[0], subject).encode(),
                               bearer.encode("utf-8", "surrogatepass")):
        return None
    return Scope(kind, subject)


def public_part(bearer: str) -> str | None:
    """The part of a scoped token that names it without being it (`<prefix>.<subject>`): what a
    holder shows a head that is to prove it could make the token (burla.web.head_proof)."""
    prefix, _, rest = bearer.partition(".")
    subject = rest.partition(".")[0]
    return f"{prefix}.{subject}" if prefix in _PREFIXES and _unb64(subject) is not None else None


def rebuilt(cluster_token: str, public: str) -> str | None:
    """The scoped token of this cluster that `public` names (None if it names none)."""
    prefix, _, encoded = public.partition(".")
    raw_subject = _unb64(encoded)
    if prefix not in _PREFIXES or raw_subject is None:
        return None
    try:
        return _token(cluster_token, _PREFIXES[prefix], prefix, raw_subject.decode("utf-8"))
    except UnicodeDecodeError:
        return None
