"""Typed wire messages: slotted classes with one msgpack encode/decode pair.

A frame is the msgpack array `[TAG, field1, field2, ...]`. Decoding checks the tag, the field
count and every field's type, and raises `ProtocolError` with a message naming what was wrong;
nothing malformed reaches the code past this module. User objects travel inside as opaque
cloudpickle bytes. Results travel packed (`packed_results.PackedResults`): a head passes them on to its client
without decoding them, trusting the indices and failures a node lists beside them as it trusts
its payloads (a node is an authenticated member running the head's exact build, and a worker
makes all three from one list); where a head decodes them, it checks they match, and the client
checks every result it takes.

Channels (the Channel objects at the end list exactly what each direction accepts):
  client <-> head   OpenJob, ResumeJob, JobAccepted, JobResumed, InputBatch, InputsKept,
                    ResultBatch, ResultAck, OutputBatch, Progress, CancelJob, JobEnded, ErrorReply,
                    UploadDirect, DirectFallback, DirectOffer
  node   <-> head   RegisterNode, NodeRegistered, AssignJob, InputBatch, Credit, NodeResults,
                    OutputBatch, NodeState, Stolen, NodeLeaving, StealHint, CancelJob, ReleaseJob,
                    ShutdownNode, ErrorReply, DirectFill
  node   <-> node   StealRequest, StealGrant, StealAck
  client <-> node   DirectInputs, DirectReceived, DirectResults, DirectResultsReceived, ErrorReply
                    (large inputs straight to their node, large results straight from it)
  worker <-> node   in `worker_wire`

Frame sizes are bounded by `burla.protocol.limits`; runs of inputs and results travel packed
(`packed_inputs`, `packed_results`).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import msgpack

from burla.errors import ProtocolError
from burla.protocol.direct_wire import DirectFallback as DirectFallback
from burla.protocol.direct_wire import DirectFill as DirectFill
from burla.protocol.direct_wire import DirectInputs as DirectInputs
from burla.protocol.direct_wire import DirectOffer as DirectOffer
from burla.protocol.direct_wire import DirectReceived as DirectReceived
from burla.protocol.direct_wire import DirectResults as DirectResults
from burla.protocol.direct_wire import DirectResultsReceived as DirectResultsReceived
from burla.protocol.direct_wire import UploadDirect as UploadDirect
from burla.protocol.error_record import ERROR_RECORD as ERROR_RECORD
from burla.protocol.error_record import ErrorRecord as ErrorRecord
from burla.protocol.error_record import describe_error as describe_error
from burla.protocol.error_record import read_error as read_error
from burla.protocol.framing import REGISTRY as REGISTRY  # every message class by tag (the wire's API)
from burla.protocol.framing import Channel as Channel
from burla.protocol.framing import Limits as Limits
from burla.protocol.framing import Message as Message
from burla.protocol.framing import Payload as Payload  # a bulk field's value (the wire's API)
from burla.protocol.framing import check_items, message
from burla.protocol.framing import decode as decode
from burla.protocol.job_options import OPTION_FIELDS, JobOptions
from burla.protocol.limits import (
    CLIENT_FRAME_RESULTS,
    MAX_COUNT,
    MAX_FRAME_BYTES,
    MAX_INPUTS,
    NODE_LINK,
    NODE_REPORTS,
    TEXT_BYTES,
)
from burla.protocol.states import NodeStatus
from burla.protocol.steal_wire import StealAck as StealAck
from burla.protocol.steal_wire import StealGrant as StealGrant
from burla.protocol.steal_wire import StealHint as StealHint
from burla.protocol.steal_wire import StealRequest as StealRequest
from burla.protocol.steal_wire import Stolen as Stolen
from burla.protocol.values.inline_values import value_columns
from burla.protocol.values.packed_inputs import CarriesInputs
from burla.protocol.values.packed_results import (
    INDEX,
    PackedResults,
    array_header,
    check_packed,
    items_as_views,
    read_array_header,
    read_int,
    read_str,
)

_NODE_STATUSES = tuple(NodeStatus)  # in their order: the refusal names them so

# An output chunk is [input_index, stream, text]: the stream is one of these, and the index is
# NOT_A_CALL for what the node itself says of a job (package installs, dropped output).
STDOUT = 1
STDERR = 2
NOT_A_CALL = -1

# --- client <-> head -----------------------------------------------------------------------


@message(1)
class OpenJob(Message):
    job_id: str
    function_name: str
    function_bytes: bytes
    n_inputs: int
    # The job's options: JobOptions' fields, by name and type (burla/protocol/job_options.py).
    func_cpu: int | None
    func_ram: float | None
    func_gpu: str | None
    image: str | None
    grow: bool
    max_parallelism: int | None
    detach: bool
    raise_errors: bool
    region: str | None
    disk_gb: int | None
    parent_job_id: str | None
    retries: int
    timeout: float | None  # seconds per call
    client_version: str
    python_version: str
    local_code: bytes  # a zip of the user's local modules the function needs (b"" if none)
    packages: dict  # the client's installed distributions: {canonical name: version}
    # The client's input_files.host_id() when it may pass large inputs by file ("" if not). The head
    # keeps it only if every node for the job shares that host, and the job then runs only there.
    client_host: str = ""
    direct_inputs: bool = False  # it may send large inputs straight to their nodes (direct_inputs)
    direct_results: bool = False  # it may take large results straight from their nodes (direct_results)
    # The first inputs, [[input_index, pickled_args], ...], in the opening's frame: a small job is
    # one frame. The head takes them as an InputBatch right after admitting the job.
    first_inputs: list = []  # (shared: messages are never changed in place)
    # Which earlier jobs' worker processes this one may run in (REUSE_KEY_BYTES, from a secret of
    # the client's process: that process's own earlier jobs); b"": none.
    reuse_key: bytes = b""

    @property
    def options(self) -> JobOptions:
        return JobOptions(**{name: getattr(self, name) for name in OPTION_FIELDS})

    def validate(self) -> None:
        if self.first_inputs:
            check_items("OpenJob.first_inputs", self.first_inputs, (int, bytes))
        _check_reuse_key("OpenJob", self.reuse_key)


@message(2)
class JobAccepted(Message):
    job_id: str
    window_inputs: int
    window_bytes: int
    n_nodes: int
    n_slots: int
    inputs_by_file: bool = False  # large inputs may go as references to files on the client's machine
    job_secret: str = ""  # what attaching to or resuming this job takes (ResumeJob.secret)
    direct_inputs: bool = False  # large inputs go as placeholders, their bytes straight to their nodes


@message(3)
class ErrorReply(Message):
    kind: str  # an exception class name from burla.errors
    message: str
    status: int  # the matching HTTP status, e.g. 400, 404, 409


@message(4)
class InputBatch(CarriesInputs):
    """A job's inputs, packed, from the client to the head and from the head to a node: neither
    takes them apart into an object per input (a node's worker does)."""

    job_id: str
    indices: bytes
    sizes: bytes
    data: bytes | memoryview  # bulk: the inputs' pickles (framing.BULK_MARK)


@message(5)
class Credit(Message):
    """A node asks for this many more of a job's inputs (node to head only)."""

    job_id: str
    inputs: int


@message(6)
class ResultBatch(Message):
    job_id: str
    seq: int
    items: list  # [[input_index, ok, payload], ...]; ok: True (a pickle), False (an error), VALUE (inline_values)

    @classmethod
    def decode_views(cls, view: memoryview, limits: Limits) -> ResultBatch | None:
        """The frame with each payload a view of it, where its results are large (None: decode it
        as any other frame). A frame of many small results is quicker to decode with msgpack."""
        try:
            at, job_id = read_str(view, 2)
            seq, at = read_int(view, at)
            at, count = read_array_header(view, at)
        except (IndexError, ValueError, UnicodeDecodeError, struct.error):
            return None
        if count > limits.max_array_len or len(view) - at < count * VIEWS_FROM_BYTES_PER_RESULT:
            return None
        items = items_as_views(view, at, count)
        return None if items is None else cls(job_id, seq, items)

    CACHED = ("_values",)

    def validate(self) -> None:
        self._values = value_columns("ResultBatch", self.items)

    def values(self) -> tuple[tuple, tuple] | None:
        """Where every result is a value that travelled as itself: their indices and values
        (`value_columns`, found as the frame was checked)."""
        try:
            return self._values
        except AttributeError:  # made here, or read as views (decode_views): not checked yet
            self.validate()
            return self._values


VIEWS_FROM_BYTES_PER_RESULT = 16 * 1024  # results at least this large on average are read as views


def result_batch_parts(job_id: str, seq: int, count: int, parts: Sequence[Payload]) -> list[Payload]:
    """The frame ResultBatch(job_id, seq, items).encode() would make, for `count` items packed in
    `parts` by pack_items, in parts: its start, then `parts` as they are."""
    head = msgpack.packb([ResultBatch.TAG, job_id, seq], use_bin_type=True)
    # [TAG, job_id, seq] is a 3-array (header 0x93); the frame is a 4-array (0x94) with items last.
    return [b"\x94" + head[1:] + array_header(count), *parts]



@message(39)
class NodeResults(Message):
    """A node's results for one job, with the credit it asks for right after them (0: none):
    one frame where a result batch and a credit were two (at 1,000 nodes the head's loop runs a
    step per frame). The results are packed (PackedResults): when every one is new, none failed
    and the job is not detached, the head passes them on to the client without decoding them."""

    job_id: str
    indices: bytes  # PackedResults' three parts
    failed: bytes
    packed: bytes | memoryview  # bulk: the results' payloads
    credit: int  # inputs the node can take now, as in Credit
    timings: bytes  # per result, when its call started, how long it ran, the worker's pid (packed_results)
    runs: bytes = b""  # how many results each part the node joined holds (PackedResults.runs)

    @classmethod
    def of(cls, job_id: str, part: PackedResults, credit: int) -> NodeResults:
        return cls(job_id, part.indices, part.failed, part.packed, credit, part.timings, part.runs)

    def part(self) -> PackedResults:
        return PackedResults(self.indices, self.failed, self.packed, self.timings, self.runs)

    def validate(self) -> None:
        check_packed("NodeResults", self.indices, self.failed, self.timings, self.runs)
        if self.credit < 0:
            raise ProtocolError("NodeResults.credit must not be negative")


@message(7)
class ResultAck(Message):
    job_id: str
    seq: int


@message(8)
class OutputBatch(Message):
    job_id: str
    items: list  # [[input_index, stream, text], ...]

    def validate(self) -> None:
        check_items("OutputBatch", self.items, (int, int, str))
        # Bounded like what history stores of them (-1: the node's own, such as installing).
        if self.items and not (-1 <= min(item[0] for item in self.items)
                               and max(item[0] for item in self.items) < MAX_INPUTS
                               and {item[1] for item in self.items} <= {STDOUT, STDERR}):
            raise ProtocolError(f"OutputBatch items need an input index from -1 to {MAX_INPUTS - 1} and a stream "
                                f"of {STDOUT} (stdout) or {STDERR} (stderr)")


@message(9)
class Progress(Message):
    job_id: str
    done: int
    failed: int
    running: int
    queued: int
    booting: int = 0  # nodes still booting that the job waits for (it has none yet)
    stages: dict = {}  # of those: {boot stage: how many}  # noqa: RUF012 - never mutated
    held_back: str = ""  # why its nodes run fewer of its calls than they could ("": they do not)

    def validate(self) -> None:
        if any(type(k) is not str or len(k) > 20 or type(v) is not int or not 0 <= v <= MAX_INPUTS
               for k, v in self.stages.items()) or len(self.stages) > 10:
            raise ProtocolError("Progress.stages must map at most 10 stage names to counts")


@message(10)
class CancelJob(Message):
    job_id: str
    reason: str


@message(11)
class JobEnded(Message):
    job_id: str
    status: str  # a states.JobStatus other than RUNNING
    kind: str  # a states.EndKind: the exception class name when not COMPLETED
    reason: str


@message(12)
class ResumeJob(Message):
    job_id: str
    acked_seq: int  # the last result batch the client has
    held: bytes  # zlib of one byte per input: 0 no result yet, 1 a result, 2 a failure (b"": collecting)
    secret: str = ""  # the job's secret (JobAccepted.job_secret, or derived from the cluster token)


@message(13)
class JobResumed(Message):
    job_id: str
    n_inputs: int
    inputs_received: int  # every input index below this reached the head; send the rest
    window_inputs: int
    window_bytes: int


@message(14)
class InputsKept(Message):
    """Head to a detaching client: the first `count` inputs it uploaded are safe from a head
    crash (written to history, or the head keeps none and says so at once)."""

    job_id: str
    count: int


# --- node <-> head -------------------------------------------------------------------------


@message(20)
class RegisterNode(Message):
    node_id: str
    url: str
    slots: int
    cpus: int
    ram_gb: float
    gpu: str | None
    gpu_count: int
    image: str | None
    region: str
    python_version: str
    version: str
    build: str  # burla.process.build.build_hash(): the head refuses a node whose build differs from its own
    cert_sha256: bytes  # the node's TLS certificate digest, which thieves pin (b"": it serves http)
    # What the node kept running while it had no head (a restart, a cut): [[job_id, pack_indices(...)], ...]
    # for every input it holds queued, running or with a result not yet sent.
    held: list
    host_id: str = ""  # input_files.host_id(): nodes with the client's host id can open its input files
    # grants.session_proof under its last session's key (b"": a new process, no session yet): a
    # node connected still may register again only with it.
    session_proof: bytes = b""

    def validate(self) -> None:
        check_items("RegisterNode.held", self.held, (str, bytes))
        for _, packed in self.held:
            if len(packed) % INDEX.size:
                raise ProtocolError(f"RegisterNode.held indices must be packed {INDEX.size}-byte integers")


@message(21)
class NodeRegistered(Message):
    node_id: str
    head_version: str
    grant_key: bytes  # the secret the head signs this node's transfer grants with (burla.protocol.grants)
    node_token: str = ""  # what this node registers with from now on: its own credential, not the cluster's


@message(22)
class AssignJob(Message):
    job_id: str
    function_name: str
    function_bytes: bytes
    parallelism: int
    # The job's options that shape its calls on a node, as JobOptions names them.
    func_ram: float | None  # enforced per call when set
    func_cpu: int | None  # None: dynamic (the node may lower parallelism for CPU)
    local_code: bytes
    packages: dict  # what the node installs before running the job, if it lacks them
    credit: int  # inputs the head may push before the node asks (a node's first window, no round trip)
    func_gpu: str | None = None  # set: each call runs on a worker that has a GPU of its own
    n_inputs: int = 0  # the job's size (0: unknown): no node holds credit for more inputs than that
    job_token: str = ""  # what the job's calls hold instead of the cluster token (burla.web.scoped_tokens)
    timeout: float | None = None  # seconds a call may run (JobOptions.timeout)
    direct_inputs: bool = False  # its pushes may hold placeholders, whose bytes come apart (direct_inputs)
    direct_results: bool = False  # large results may go straight to its client (direct_results)
    reuse_key: bytes = b""  # OpenJob.reuse_key: workers of earlier jobs with this key may run its calls

    def validate(self) -> None:
        _check_reuse_key("AssignJob", self.reuse_key)


REUSE_KEY_BYTES = 16


def _check_reuse_key(where: str, key: bytes) -> None:
    if key and len(key) != REUSE_KEY_BYTES:
        raise ProtocolError(f"{where}.reuse_key must be empty or {REUSE_KEY_BYTES} bytes")


@message(23)
class ReleaseJob(Message):
    job_id: str


@message(24)
class NodeState(Message):
    node_id: str
    status: str  # a states.NodeStatus: READY (idle) or RUNNING
    workers_alive: int
    jobs: list  # [[job_id, running, queued, done], ...]
    cpu_percent: float
    mem_percent: float
    net_sent_bps: float  # bytes per second over the last interval
    net_recv_bps: float
    gpu_percent: float = 0.0  # mean utilisation of its GPUs (0 without GPUs)
    gpu_mem_percent: float = 0.0  # GPU memory in use, over all its GPUs
    held_back: str = ""  # why it runs fewer calls than its jobs could use now ("": it does not)

    def validate(self) -> None:
        if len(self.held_back) > 300:
            raise ProtocolError("NodeState.held_back must be at most 300 characters")
        if self.status not in _NODE_STATUSES:
            raise ProtocolError(f"NodeState.status must be one of {', '.join(_NODE_STATUSES)}")
        check_items("NodeState.jobs", self.jobs, (str, int, int, int))
        # Counts, summed over its jobs (at most 200,000 in a frame) and stored: bounded so that no
        # sum leaves 64 bits, and far above any job's size (calls run again count twice).
        counts = [count for _, running, queued, done in self.jobs for count in (running, queued, done)]
        if not 0 <= self.workers_alive <= MAX_COUNT or not all(0 <= count <= MAX_COUNT for count in counts):
            raise ProtocolError(f"NodeState counts must be from 0 to {MAX_COUNT:,}")


@message(25)
class ShutdownNode(Message):
    reason: str


@message(36)
class NodeLeaving(Message):
    """Node to head: this node is stopping (signal, lost lifeline); requeue its inputs now and
    delete its machine (the head owns every cloud call)."""

    reason: str


@message(38)
class CreditWithdrawn(Message):
    """Head to node: of the credit this node granted for the job, the head keeps back `inputs`
    (it spreads what is still queued over the other nodes). The node may ask again."""

    job_id: str
    inputs: int


@message(43)
class InputsPushed(Message):
    """Head to node: every input of the job is on its nodes now (inputs of a node lost later may
    come again). What this node's credit would still bring is not coming: it cuts its last
    batches to even shares of what it holds."""

    job_id: str


# A call's output text per chunk, and the longest traceback or message worth carrying.
CLIENT_TO_HEAD = Channel("client to head", (OpenJob, ResumeJob, InputBatch, ResultAck, CancelJob, DirectFallback),
                         Limits(200_000, 100_000, 1 << 20, MAX_FRAME_BYTES, 600_000))
NODE_TO_HEAD = Channel("node to head", (RegisterNode, Credit, NodeResults, OutputBatch, NodeState, Stolen, NodeLeaving),
                       NODE_REPORTS)
HEAD_TO_NODE = Channel("head to node", (NodeRegistered, AssignJob, InputBatch, CreditWithdrawn, InputsPushed,
                                        CancelJob, ReleaseJob, ShutdownNode, ErrorReply, StealHint, DirectFill),
                       NODE_LINK)
HEAD_TO_CLIENT = Channel("head to client", (JobAccepted, JobResumed, ErrorReply, ResultBatch, OutputBatch,
                                            Progress, JobEnded, InputsKept, UploadDirect, DirectOffer),
                         Limits(CLIENT_FRAME_RESULTS, 10_000, TEXT_BYTES, MAX_FRAME_BYTES, 4 * CLIENT_FRAME_RESULTS))
# The first frame of each link, with the limits of the link it opens.
JOB_OPENING = Channel("job opening", (OpenJob, ResumeJob), CLIENT_TO_HEAD.limits)
NODE_OPENING = Channel("node registration", (RegisterNode,), NODE_TO_HEAD.limits)
# Transfers between nodes: small requests, grants as big as the inputs they carry.
NODE_TO_NODE = Channel("node to node", (StealRequest, StealGrant, StealAck), NODE_LINK)
# A client's large inputs straight to their node (burla.protocol.direct_inputs), and the node's answers.
CLIENT_TO_NODE = Channel("client to node", (DirectInputs, DirectResultsReceived), NODE_LINK)
NODE_TO_CLIENT = Channel("node to client", (DirectReceived, DirectResults, ErrorReply), NODE_LINK)
