"""The messages of stealing (the wire's API re-exports them: `wire.StealHint`...): the head's hint
and a thief's report of what moved, and between nodes the request, the grant with its inputs and
the acknowledgement, all under the head's transfer grant (`burla.protocol.grants`)."""

from __future__ import annotations

from burla.errors import ProtocolError
from burla.protocol.framing import Message, check_items, message
from burla.protocol.limits import MAX_INPUTS

# --- head <-> node ------------------------------------------------------------------------------


@message(26)
class StealHint(Message):
    """Head to an idle node: `donor` still holds queued inputs of this job; the grant lets this
    node take some under `transfer_id` until `expires_at` (the head's wall clock)."""

    job_id: str
    donor_id: str
    donor_url: str
    donor_cert_sha256: bytes  # pin the donor's TLS certificate to this (b"": plain http)
    transfer_id: str
    expires_at: float
    grant: bytes


@message(27)
class Stolen(Message):
    """Thief to head: these inputs moved from `donor_id` to me (sent before the thief acks), under
    the grant of the StealHint that allowed it, which the head checks."""

    job_id: str
    donor_id: str
    indices: list
    transfer_id: str
    expires_at: float
    grant: bytes
    receipt: bytes  # the donor's signature over exactly these indices (StealGrant.receipt)

    def validate(self) -> None:
        if any(type(i) is not int for i in self.indices):
            raise ProtocolError("Stolen.indices must be integers")


# --- node <-> node (HTTP bodies, authenticated by the head's transfer grant) ---------------------------------------


@message(40)
class StealRequest(Message):
    job_id: str
    transfer_id: str  # the same id always gets the same inputs back
    thief_id: str
    max_items: int
    expires_at: float
    grant: bytes  # the head's signature over job, donor, thief, transfer and expiry


@message(41)
class StealGrant(Message):
    job_id: str
    transfer_id: str
    items: list  # [[input_index, pickled_args], ...]; empty if nothing to give
    receipt: bytes  # the donor's signature over the items' indices, in order (grants.receipt)

    def validate(self) -> None:
        check_items("StealGrant", self.items, (int, bytes))
        if self.items and not (0 <= min(item[0] for item in self.items)
                               and max(item[0] for item in self.items) < MAX_INPUTS):
            raise ProtocolError(f"StealGrant input indices must be in 0..{MAX_INPUTS - 1}")


@message(42)
class StealAck(Message):
    job_id: str
    transfer_id: str
    grant: bytes  # the grant the transfer was opened with
