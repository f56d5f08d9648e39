"""Dashboard links that open a job's pages in a browser, and the session cookies they and
`burla dashboard` open, signed with the cluster's token.

A client that prints a job's link holds the token, so it signs the link itself: no request to
the head (a warm job would pay a round trip for it). The head checks the signature, the path and
the expiry. A job's link opens a session that may only read that job and its nested jobs, for as
long as the link lasts, as often as it is opened; a full session (every page, and the dashboard's
buttons) comes only from `burla dashboard`'s one-time code. Sessions are signed the same way
(with a key derived from the token), so they survive a head restart and need no store. Expiries
are canonical ASCII integers: any other spelling of one (`0`-padded, non-ASCII digits) is not a
valid code. Nothing here imports the web stack: the client uses it on every job.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass

LINK_PARAM = "login"  # the query parameter that carries a link's code
LINK_TTL_S = 24 * 3600.0  # a job's link is often opened long after it was printed
SESSION_TTL_S = 7 * 86400.0
_EXPIRY = re.compile(r"[1-9][0-9]{0,11}")  # seconds since the epoch, as `str(int)` writes them: ASCII only
_SCOPE = re.compile(r"[A-Za-z0-9_-]{1,400}")  # a job id in unpadded base64url


def _sign(key: bytes, message: str) -> str:
    digest = hmac.new(key, message.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest[:18]).decode()


def _key(token: str, purpose: str) -> bytes:
    return hmac.new(token.encode(), f"burla dashboard {purpose}".encode(), hashlib.sha256).digest()


def link_code(token: str, path: str, now: float | None = None) -> str:
    """The code that signs a browser in to `path` (e.g. /jobs/JOB) until LINK_TTL_S from now."""
    expires = int((time.time() if now is None else now) + LINK_TTL_S)
    return f"{expires}.{_sign(_key(token, 'links'), f'{path}|{expires}')}"


def _expiry(text: str) -> int | None:
    return int(text) if _EXPIRY.fullmatch(text) else None


def _same(expected: str, given: str) -> bool:
    # Header and query bytes that aren't UTF-8 arrive as surrogate escapes, which plain encode() refuses.
    return hmac.compare_digest(expected.encode(), given.encode("utf-8", "surrogatepass"))


def check_link_code(token: str, path: str, code: str, now: float | None = None) -> float | None:
    """The code's expiry if it is a valid, unexpired code for `path`; else None."""
    expires_text, _, signature = code.partition(".")
    expires = _expiry(expires_text)
    if expires is None or expires < (time.time() if now is None else now):
        return None
    if not _same(_sign(_key(token, "links"), f"{path}|{expires}"), signature):
        return None
    return float(expires)


@dataclass(frozen=True)
class Session:
    """What a browser's session cookie lets it do: everything a cookie may (job_id None), or read
    job `job_id` and its nested jobs."""

    job_id: str | None
    expires: float


class SignedSessions:
    """Browser sessions as signed cookie values: `expiry.nonce.signature` for a full session,
    `expiry.nonce.job.signature` (job id in base64url) for one job's pages."""

    def __init__(self, token: str) -> None:
        self._key = _key(token, "sessions")

    def new(self, now: float | None = None, job_id: str | None = None, expires: float | None = None) -> str:
        until = int(expires if expires is not None else (time.time() if now is None else now) + SESSION_TTL_S)
        signed = f"{until}.{secrets.token_urlsafe(12)}"
        if job_id is not None:
            signed += "." + base64.urlsafe_b64encode(job_id.encode()).decode().rstrip("=")
        return f"{signed}.{_sign(self._key, signed)}"

    def session(self, value: str | None, now: float | None = None) -> Session | None:
        """The session a cookie value opens, if it is valid and unexpired; else None."""
        if not value or len(value) > 600:
            return None
        signed, _, signature = value.rpartition(".")
        parts = signed.split(".")
        if len(parts) not in (2, 3) or not parts[1]:
            return None
        expires = _expiry(parts[0])
        if expires is None or expires < (time.time() if now is None else now):
            return None
        if not _same(_sign(self._key, signed), signature):
            return None
        if len(parts) == 2:
            return Session(None, float(expires))
        if not _SCOPE.fullmatch(parts[2]):
            return None
        return Session(base64.urlsafe_b64decode(parts[2] + "=" * (-len(parts[2]) % 4)).decode(), float(expires))

    def valid(self, value: str | None, now: float | None = None) -> bool:
        return self.session(value, now) is not None
