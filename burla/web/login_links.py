"""Dashboard links that sign a browser in, and the session cookies they open, signed with the
cluster's token.

A client that prints a job's link holds the token, so it signs the link itself: no request to
the head (a warm job would pay a round trip for it). The head checks the signature, the path
and the expiry, and takes each link once. Sessions are signed the same way (with a key derived
from the token), so they survive a head restart and need no store. Nothing here imports the
web stack: the client uses it on every job.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time

LINK_PARAM = "login"  # the query parameter that carries a link's code
LINK_TTL_S = 24 * 3600.0  # a job's link is often opened long after it was printed
SESSION_TTL_S = 7 * 86400.0


def _sign(key: bytes, message: str) -> str:
    digest = hmac.new(key, message.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest[:18]).decode()


def _key(token: str, purpose: str) -> bytes:
    return hmac.new(token.encode(), f"burla dashboard {purpose}".encode(), hashlib.sha256).digest()


def link_code(token: str, path: str, now: float | None = None) -> str:
    """The code that signs a browser in to `path` (e.g. /jobs/JOB) until LINK_TTL_S from now."""
    expires = int((time.time() if now is None else now) + LINK_TTL_S)
    return f"{expires}.{_sign(_key(token, 'links'), f'{path}|{expires}')}"


def check_link_code(token: str, path: str, code: str, now: float | None = None) -> float | None:
    """The code's expiry if it is a valid, unexpired code for `path`; else None."""
    expires_text, _, signature = code.partition(".")
    if not expires_text.isdigit() or len(expires_text) > 12:
        return None
    expires = int(expires_text)
    if expires < (time.time() if now is None else now):
        return None
    expected = _sign(_key(token, "links"), f"{path}|{expires}")
    if not hmac.compare_digest(expected.encode(), signature.encode("utf-8", "surrogatepass")):
        return None
    return float(expires)


class SignedSessions:
    """Browser sessions as signed cookie values: `expiry.nonce.signature`."""

    def __init__(self, token: str) -> None:
        self._key = _key(token, "sessions")

    def new(self, now: float | None = None) -> str:
        expires = int((time.time() if now is None else now) + SESSION_TTL_S)
        nonce = secrets.token_urlsafe(12)
        return f"{expires}.{nonce}.{_sign(self._key, f'{expires}.{nonce}')}"

    def valid(self, value: str | None, now: float | None = None) -> bool:
        if not value or len(value) > 200:
            return False
        expires_text, _, rest = value.partition(".")
        nonce, _, signature = rest.partition(".")
        if not expires_text.isdigit() or len(expires_text) > 12 or not nonce:
            return False
        if int(expires_text) < (time.time() if now is None else now):
            return False
        expected = _sign(self._key, f"{expires_text}.{nonce}")
        return hmac.compare_digest(expected.encode(), signature.encode("utf-8", "surrogatepass"))
