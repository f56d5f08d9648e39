"""The messages of large inputs sent straight to their node, and of large results sent straight
from it to the client (the wire's API re-exports them: `wire.UploadDirect`...;
`burla.protocol.direct_inputs` and `burla.protocol.direct_results` say how they go)."""

from __future__ import annotations

from burla.errors import ProtocolError
from burla.protocol.framing import Message, message
from burla.protocol.values.packed_inputs import UINT_BYTES, CarriesInputs

# An upload grant opens one connection if used this soon (the head sends it as the client is to
# use it; the connection then lasts as long as its upload).
UPLOAD_GRANT_TTL_S = 60.0


@message(44)
class UploadDirect(CarriesInputs):
    """Head to client: these inputs (the placeholders the head pushed to `node_id`) go to that node.
    With a `url`, the client sends them there itself, opening its connection with `grant` (a
    nonce and the head's signature with the node's key over job, node, `expires_at` (the head's
    wall clock) and that nonce; it opens one connection)
    and pinning `cert_sha256` if the node serves https; without one (the client can't reach that
    node), and wherever that fails, through the head (DirectFallback). `sizes` are the inputs'
    real sizes, and `data` is empty."""

    job_id: str
    indices: bytes
    sizes: bytes
    data: bytes
    node_id: str
    url: str
    cert_sha256: bytes
    expires_at: float
    grant: bytes

    def validate(self) -> None:
        if len(self.indices) % UINT_BYTES or len(self.sizes) != len(self.indices) or self.data:
            raise ProtocolError("UploadDirect must list a 4-byte index and a 4-byte size per input, and no data")
        if len(self.cert_sha256) not in (0, 32):
            raise ProtocolError("UploadDirect.cert_sha256 must be empty or a 32-byte SHA-256 digest")


@message(45)
class DirectInputs(CarriesInputs):
    """Client to node, on the node's `/v1/jobs/{job_id}/direct` WebSocket (opened with an upload
    grant): inputs the head said went there."""

    job_id: str
    indices: bytes
    sizes: bytes
    data: bytes | memoryview  # bulk: the inputs' pickles


@message(46)
class DirectReceived(CarriesInputs):
    """Node to client, one per DirectInputs frame, in order: which of its inputs the node took
    (`sizes` and `data` empty). It takes only those it awaits: bytes that came before their
    placeholder (the head's push and its word to the client travel apart) the client sends again
    through the head, which passes them on behind the push."""

    job_id: str
    indices: bytes
    sizes: bytes
    data: bytes

    def validate(self) -> None:
        if len(self.indices) % UINT_BYTES or self.sizes or self.data:
            raise ProtocolError("DirectReceived lists 4-byte indices only")


@message(47)
class DirectFallback(CarriesInputs):
    """Client to head: inputs the head had told it to send to `node_id`, which it could not reach;
    the head passes them on to that node if they are still in flight there (DirectFill)."""

    job_id: str
    indices: bytes
    sizes: bytes
    data: bytes | memoryview  # bulk
    node_id: str


@message(48)
class DirectFill(CarriesInputs):
    """Head to node: the bytes of placeholders it pushed there, which the client sent through the
    head. The node takes those it still awaits and no other."""

    job_id: str
    indices: bytes
    sizes: bytes
    data: bytes | memoryview  # bulk


@message(49)
class DirectResults(CarriesInputs):
    """Node to client, on the client's connection for the job: results of DIRECT_MIN_BYTES or more
    (`data`: their pickles end to end), which the node reports to the head as placeholders once
    the client's receipt for them came (DirectResultsReceived)."""

    job_id: str
    indices: bytes
    sizes: bytes
    data: bytes | memoryview  # bulk


@message(50)
class DirectResultsReceived(Message):
    """Client to node, one per DirectResults frame, in order: the client holds these results."""

    job_id: str
    indices: bytes

    def validate(self) -> None:
        if len(self.indices) % UINT_BYTES:
            raise ProtocolError("DirectResultsReceived lists 4-byte indices")


@message(51)
class DirectOffer(Message):
    """Head to client: `node_id` has large results of the job, and the client may take them there
    itself: it opens its connection to `url` with `grant` (as UploadDirect's), unless it has one
    there for the job already, and the node sends such results on its oldest open one from then
    on. No offer where the client can't reach that node."""

    job_id: str
    node_id: str
    url: str
    cert_sha256: bytes
    expires_at: float
    grant: bytes

    def validate(self) -> None:
        if not self.url or not self.grant or len(self.cert_sha256) not in (0, 32):
            raise ProtocolError("DirectOffer needs a url, a grant and an empty or 32-byte certificate digest")
