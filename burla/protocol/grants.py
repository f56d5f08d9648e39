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

Upload grants work alike for a client's large inputs (`burla.protocol.direct_inputs`): the head
signs (job, node, expiry) with the node's key, and the node opens a connection for that job's
inputs only to whoever shows one before it expires (its job's client: the head sends the grant
nowhere else), before it reads a byte of them. It takes from it only inputs the head pushed
there as placeholders.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import msgpack

GRANT_TTL_S = 60.0  # a hint's grant must be used this soon
CLOCK_SKEW_S = 120.0  # tolerated between the head's clock and the donor's


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


def sign_upload(key: bytes, job_id: str, node_id: str, expires_at: float) -> bytes:
    """The head's permission for a job's client to send that job's inputs to a node."""
    message = msgpack.packb(["upload", job_id, node_id, expires_at], use_bin_type=True)
    return hmac.new(key, message, hashlib.sha256).digest()


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
    if not hmac.compare_digest(sign_upload(key, job_id, node_id, expires_at), grant):
        return "the upload grant is not the head's for this node and job"
    return _expired("upload", expires_at, now)


_NO_KEY = "this node has no grant key yet (not registered with a head)"


def _expired(kind: str, expires_at: float, now: float) -> str | None:
    return f"the {kind} grant has expired" if now > expires_at + CLOCK_SKEW_S else None
