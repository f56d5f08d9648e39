"""Transfer grants: the head's permission for one node to take queued inputs from another.

At registration the head gives each node a secret grant key. To let `thief` steal from
`donor`, the head signs (job, donor, thief, transfer id, expiry) with the donor's key; the thief
presents that grant to the donor, which checks it with its own key. A token holder who is not
the head can't make one, a grant opens one transfer of one job to one thief, and it expires.
Thieves send no bearer token to donors: a grant is all a transfer needs.

The donor answers with the inputs it gives and a receipt: its signature, with the same key, over
the transfer and exactly those input indices. The thief shows the receipt in its `Stolen` report,
so the head moves to the thief only what the donor gave, never more inputs of the donor's than
that.

Upload grants work alike for a client's large inputs and results (`burla.protocol.direct_inputs`):
the head signs (job, node, expiry, a fresh nonce) with the node's key, and the node opens a
connection for that job only to whoever shows one before it expires (its job's client: the head
sends the grant nowhere else), before it reads a byte. Each grant opens one connection: the node
keeps the nonces it has let in until they would have expired anyway (`SpentGrants`), so a grant
seen on the way can't open a second one. The connection then lives as long as its upload needs.
The node takes from it only inputs the head pushed there as placeholders.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import msgpack

GRANT_TTL_S = 60.0  # a hint's grant, and an upload grant, must be used this soon
CLOCK_SKEW_S = 120.0  # tolerated between the head's clock and the donor's
NONCE_BYTES = 16  # an upload grant is its nonce, then the head's signature


def new_key() -> bytes:
    return secrets.token_bytes(32)


def new_transfer_id(thief_id: str) -> str:
    return f"{thief_id}-{secrets.token_hex(8)}"


def sign(key: bytes, job_id: str, donor_id: str, thief_id: str, transfer_id: str, expires_at: float) -> bytes:
    message = msgpack.packb(["steal", job_id, donor_id, thief_id, transfer_id, expires_at], use_bin_type=True)
    return hmac.new(key, message, hashlib.sha256).digest()


def receipt(key: bytes, job_id: str, donor_id: str, thief_id: str, transfer_id: str, indices: list[int]) -> bytes:
    """The donor's signature over the inputs it gave in one transfer."""
    message = msgpack.packb(["given", job_id, donor_id, thief_id, transfer_id, indices], use_bin_type=True)
    return hmac.new(key, message, hashlib.sha256).digest()


def sign_upload(key: bytes, job_id: str, node_id: str, expires_at: float, nonce: bytes | None = None) -> bytes:
    """The head's permission for a job's client to open one connection to a node for that job:
    a fresh nonce (unless given) and the signature over it."""
    nonce = secrets.token_bytes(NONCE_BYTES) if nonce is None else nonce
    message = msgpack.packb(["upload", job_id, node_id, expires_at, nonce], use_bin_type=True)
    return nonce + hmac.new(key, message, hashlib.sha256).digest()


def session_proof(key: bytes, node_id: str) -> bytes:
    """What a node shows when it registers again while the head may still count its session live:
    the key is the one the head gave that session (NodeRegistered.grant_key), which only the node's
    memory holds, so a node token read elsewhere can't take the session over."""
    return hmac.new(key, msgpack.packb(["session", node_id], use_bin_type=True), hashlib.sha256).digest()


def refusal(key: bytes, grant: bytes, job_id: str, donor_id: str, thief_id: str, transfer_id: str,
            expires_at: float, now: float) -> str | None:
    """Why this grant does not open this transfer (None: it does)."""
    if not key:
        return _NO_KEY
    if not hmac.compare_digest(sign(key, job_id, donor_id, thief_id, transfer_id, expires_at), grant):
        return "the transfer grant is not the head's for this donor, thief, job and transfer"
    return _expired("transfer", expires_at, now)


def upload_refusal(key: bytes, grant: bytes, job_id: str, node_id: str, expires_at: float, now: float) -> str | None:
    """Why this grant does not let a client send a job's inputs here (None: it does)."""
    if not key:
        return _NO_KEY
    nonce = grant[:NONCE_BYTES]
    if len(grant) <= NONCE_BYTES or not hmac.compare_digest(sign_upload(key, job_id, node_id, expires_at, nonce),
                                                            grant):
        return "the upload grant is not the head's for this node and job"
    return _expired("upload", expires_at, now)


class SpentGrants:
    """The upload grants a node has let in, each kept until it would be refused as expired anyway
    (so the set stays as small as the grants in flight)."""

    def __init__(self) -> None:
        self._spent: dict[bytes, float] = {}  # nonce -> when it expires here, skew included

    def spend(self, grant: bytes, expires_at: float, now: float) -> str | None:
        """Let this (checked) grant in once: None the first time, why not after."""
        for nonce, until in list(self._spent.items()):
            if now > until:
                del self._spent[nonce]
        nonce = grant[:NONCE_BYTES]
        if nonce in self._spent:
            return ("the upload grant opened a connection already; each opens one (the head gives the job's "
                    "client a new one with each offer)")
        self._spent[nonce] = expires_at + CLOCK_SKEW_S
        return None


_NO_KEY = "this node has no grant key yet (not registered with a head)"


def _expired(kind: str, expires_at: float, now: float) -> str | None:
    return f"the {kind} grant has expired" if now > expires_at + CLOCK_SKEW_S else None
