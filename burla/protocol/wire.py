"""Typed wire messages: slotted classes with one msgpack encode/decode pair.

A frame is the msgpack array `[TAG, field1, field2, ...]`. Decoding checks the tag, the field
count and every field's type, and raises `ProtocolError` with a message naming what was wrong;
nothing malformed reaches the code past this module. User objects travel inside as opaque
cloudpickle bytes. Results travel packed (`PackedResults`): a head passes them on to its client
without decoding them, trusting the indices and failures a node lists beside them as it trusts
its payloads (a node is an authenticated member running the head's exact build, and a worker
makes all three from one list); where a head decodes them, it checks they match, and the client
checks every result it takes.

Channels (the Channel objects at the end list exactly what each direction accepts):
  client <-> head   OpenJob, ResumeJob, JobAccepted, JobResumed, InputBatch, InputsKept,
                    ResultBatch, ResultAck, OutputBatch, Progress, CancelJob, JobEnded, ErrorReply
  node   <-> head   RegisterNode, NodeRegistered, AssignJob, InputBatch, Credit, NodeResults,
                    OutputBatch, NodeState, Stolen, NodeLeaving, StealHint, CancelJob, ReleaseJob,
                    ShutdownNode, ErrorReply
  node   <-> node   StealRequest, StealGrant, StealAck
  worker <-> node   WorkerReady, LoadFunction, RunCalls, UnloadFunction, WorkerReport, WorkerWaiting
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from operator import itemgetter
from typing import TypeVar

import msgpack

from burla.errors import ProtocolError
from burla.protocol.framing import REGISTRY as REGISTRY  # every message class by tag (the wire's API)
from burla.protocol.framing import Channel as Channel
from burla.protocol.framing import ItemBudget, check_items, message
from burla.protocol.framing import Limits as Limits
from burla.protocol.framing import Message as Message
from burla.protocol.framing import decode as decode
from burla.protocol.packed_inputs import PackedInputs, pack_uints, unpack_uints
from burla.protocol.states import NodeStatus

_NODE_STATUSES = tuple(NodeStatus)  # in their order: the refusal names them so

STDOUT = 1
STDERR = 2

# --- client <-> head -----------------------------------------------------------------------


@message(1)
class OpenJob(Message):
    job_id: str
    function_name: str
    function_bytes: bytes
    n_inputs: int
    func_cpu: int | None  # None: dynamic
    func_ram: float | None  # GB per call; None: dynamic
    func_gpu: str | None
    image: str | None
    grow: bool
    max_parallelism: int | None
    detach: bool
    raise_errors: bool
    region: str | None
    disk_gb: int | None
    parent_job_id: str | None
    client_version: str
    python_version: str
    local_code: bytes  # a zip of the user's local modules the function needs (b"" if none)
    packages: dict  # the client's installed distributions: {canonical name: version}
    # The client's input_files.host_id() when it may pass large inputs by file ("" if not). The head
    # keeps it only if every node for the job shares that host, and the job then runs only there.
    client_host: str = ""
    # The first inputs, [[input_index, pickled_args], ...], in the opening's frame: a small job is
    # one frame. The head takes them as an InputBatch right after admitting the job.
    first_inputs: list = []  # (shared: messages are never changed in place)

    def validate(self) -> None:
        if self.first_inputs:
            check_items("OpenJob.first_inputs", self.first_inputs, (int, bytes))


@message(2)
class JobAccepted(Message):
    job_id: str
    window_inputs: int
    window_bytes: int
    n_nodes: int
    n_slots: int
    inputs_by_file: bool = False  # large inputs may go as references to files on the client's machine


@message(3)
class ErrorReply(Message):
    kind: str  # an exception class name from burla.errors
    message: str
    status: int  # the matching HTTP status, e.g. 400, 404, 409


_Carrier = TypeVar("_Carrier", bound="_CarriesInputs")


class _CarriesInputs(Message):
    """A message whose fields are a job id and a run of its inputs (`PackedInputs`' three parts)."""

    __slots__ = ()
    job_id: str  # declared again by each message: `message` makes fields of a class's own annotations
    indices: bytes
    sizes: bytes
    data: bytes

    @classmethod
    def of(cls: type[_Carrier], job_id: str, part: PackedInputs) -> _Carrier:
        return cls(job_id, part.indices, part.sizes, part.data)  # type: ignore[call-arg]

    def part(self) -> PackedInputs:
        return PackedInputs(self.indices, self.sizes, self.data)

    def validate(self) -> None:
        self.part().check(type(self).__name__, BATCH_ITEMS)


@message(4)
class InputBatch(_CarriesInputs):
    """A job's inputs, packed, from the client to the head and from the head to a node: neither
    takes them apart into an object per input (a node's worker does)."""

    job_id: str
    indices: bytes
    sizes: bytes
    data: bytes


@message(5)
class Credit(Message):
    """A node asks for this many more of a job's inputs (node to head only)."""

    job_id: str
    inputs: int


@message(6)
class ResultBatch(Message):
    job_id: str
    seq: int
    items: list  # [[input_index, ok, payload], ...]

    def validate(self) -> None:
        check_items("ResultBatch", self.items, (int, bool, bytes))


_index_of = itemgetter(0)
_ok_of = itemgetter(1)
_payload_of = itemgetter(2)


def pack_items(items: Sequence) -> bytes:
    """Items packed as they follow their array's header inside a frame. A head keeps the results
    it relays in this form until they go out in a ResultBatch (`result_batch_frame`): bytes, where
    a tuple per result would have been walked by the cyclic GC."""
    packed = msgpack.packb(items, use_bin_type=True)
    return packed[_array_header_bytes(len(items)):]


class PackedResults:
    """Results packed as a head sends them to its client (`pack_items`), beside their input indices
    and the indices of those that failed (`pack_indices`; usually empty). Workers pack their
    results so; nodes and the head pass them on without decoding each (a head decodes them only
    to sort out repeats and failures, and checks them then: `items`)."""

    __slots__ = ("indices", "failed", "packed")

    def __init__(self, indices: bytes, failed: bytes, packed: bytes) -> None:
        self.indices = indices
        self.failed = failed
        self.packed = packed

    @classmethod
    def of(cls, items: Sequence) -> PackedResults:
        """These results ([[input_index, ok, payload], ...]) packed."""
        failed = [] if all(map(_ok_of, items)) else [item[0] for item in items if not item[1]]
        return cls(pack_indices(list(map(_index_of, items))), pack_indices(failed), pack_items(items))

    @classmethod
    def join(cls, parts: Sequence[PackedResults]) -> PackedResults:
        if len(parts) == 1:
            return parts[0]
        return cls(b"".join(p.indices for p in parts), b"".join(p.failed for p in parts),
                   b"".join(p.packed for p in parts))

    @property
    def count(self) -> int:
        return len(self.indices) // _INDEX.size

    def items(self, name: str = "results") -> list:
        """The results, decoded and checked against the indices and failures they are listed with
        (`name` is the message's, for the error)."""
        indices = unpack_indices(self.indices)
        count = len(indices)
        # Limits as tight as the results allow (an array per result, of three scalars; no str, map
        # or ext), so that a frame that is not what it claims can't make this head balloon.
        budget = ItemBudget(4 * count)
        try:
            items = msgpack.unpackb(_array_header(count) + self.packed, raw=False, use_list=True,
                                    max_array_len=max(count, 3), max_map_len=0, max_str_len=0, max_ext_len=0,
                                    max_bin_len=len(self.packed), list_hook=budget.array)
        except Exception as e:  # msgpack raises several unrelated types on garbage
            raise ProtocolError(f"{name}.packed is not {count} packed results ({type(e).__name__}: {e})") from None
        check_items(name, items, (int, bool, bytes))
        if list(map(_index_of, items)) != indices:
            raise ProtocolError(f"{name}.packed holds other results than its indices name")
        if [item[0] for item in items if not item[1]] != unpack_indices(self.failed):
            raise ProtocolError(f"{name}.failed does not name the failed results it holds")
        return items


def _check_packed(name: str, indices: bytes, failed: bytes) -> None:
    for field, value in (("indices", indices), ("failed", failed)):
        if len(value) % _INDEX.size:
            raise ProtocolError(f"{name}.{field} must be packed {_INDEX.size}-byte integers")
    if len(indices) > BATCH_ITEMS * _INDEX.size:  # what one frame takes in one step of the head's loop
        raise ProtocolError(f"{name} carries more than {BATCH_ITEMS} results")
    if len(failed) > len(indices):
        raise ProtocolError(f"{name} lists more failed results than results")


def item_frames(items: Sequence) -> list[Sequence]:
    """Results in frames of at most BATCH_ITEMS and RESULT_FRAME_BYTES of payloads, unless one
    result is bigger."""
    if len(items) <= BATCH_ITEMS and sum(map(len, map(_payload_of, items))) <= RESULT_FRAME_BYTES:
        return [items] if items else []  # the common case: one frame
    frames, start, size = [], 0, 0
    for end, item in enumerate(items):
        size += len(item[2])
        if end > start and (end - start >= BATCH_ITEMS or size > RESULT_FRAME_BYTES):
            frames.append(items[start:end])
            start, size = end, len(item[2])
    frames.append(items[start:])
    return frames


def packed_frames(parts: Sequence[PackedResults]) -> list[PackedResults]:
    """Packed results joined into frames of at most BATCH_ITEMS and about RESULT_FRAME_BYTES (a part
    is never split: workers and nodes pack at most that many): a node's frames, which a head can
    pass on to its client as they are."""
    frames: list[PackedResults] = []
    group: list[PackedResults] = []
    count = size = 0
    for part in parts:
        if group and (count + part.count > BATCH_ITEMS or size + len(part.packed) > RESULT_FRAME_BYTES):
            frames.append(PackedResults.join(group))
            group, count, size = [], 0, 0
        group.append(part)
        count += part.count
        size += len(part.packed)
    if group:
        frames.append(PackedResults.join(group))
    return frames


def result_batch_frame(job_id: str, seq: int, count: int, parts: Sequence[bytes]) -> bytes:
    """The frame ResultBatch(job_id, seq, items).encode() would make, for `count` items packed in
    `parts` by pack_items."""
    head = msgpack.packb([ResultBatch.TAG, job_id, seq], use_bin_type=True)
    # [TAG, job_id, seq] is a 3-array (header 0x93); the frame is a 4-array (0x94) with items last.
    return b"\x94" + head[1:] + _array_header(count) + b"".join(parts)


def _array_header_bytes(length: int) -> int:
    return 1 if length < 16 else 3 if length < 65536 else 5


def _array_header(length: int) -> bytes:
    if length < 16:
        return bytes((0x90 | length,))
    if length < 65536:
        return struct.pack("!BH", 0xDC, length)
    return struct.pack("!BI", 0xDD, length)


@message(39)
class NodeResults(Message):
    """A node's results for one job, with the credit it asks for right after them (0: none):
    one frame where a result batch and a credit were two (at 1,000 nodes the head's loop runs a
    step per frame). The results are packed (PackedResults): when every one is new, none failed
    and the job is not detached, the head passes them on to the client without decoding them."""

    job_id: str
    indices: bytes  # PackedResults' three parts
    failed: bytes
    packed: bytes
    credit: int  # inputs the node can take now, as in Credit

    @classmethod
    def of(cls, job_id: str, part: PackedResults, credit: int) -> NodeResults:
        return cls(job_id, part.indices, part.failed, part.packed, credit)

    def part(self) -> PackedResults:
        return PackedResults(self.indices, self.failed, self.packed)

    def validate(self) -> None:
        _check_packed("NodeResults", self.indices, self.failed)
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

    def validate(self) -> None:
        check_items("RegisterNode.held", self.held, (str, bytes))
        for _, packed in self.held:
            if len(packed) % _INDEX.size:
                raise ProtocolError(f"RegisterNode.held indices must be packed {_INDEX.size}-byte integers")


_INDEX = struct.Struct("<I")  # input indices are below MAX_INPUTS < 2**32 (packed as PackedInputs' are)


def pack_indices(indices: list[int]) -> bytes:
    """Input indices as compact bytes (4 per index) for frames that list many of them."""
    return pack_uints(indices)


def unpack_indices(packed: bytes) -> list[int]:
    return list(unpack_uints(packed))


@message(21)
class NodeRegistered(Message):
    node_id: str
    head_version: str
    grant_key: bytes  # the secret the head signs this node's transfer grants with (burla.protocol.grants)


@message(22)
class AssignJob(Message):
    job_id: str
    function_name: str
    function_bytes: bytes
    parallelism: int
    ram_gb_per_call: float | None  # enforced per call when set
    cpus_per_call: int | None  # None: dynamic (the node may lower parallelism for CPU)
    local_code: bytes
    packages: dict  # what the node installs before running the job, if it lacks them
    credit: int  # inputs the head may push before the node asks (a node's first window, no round trip)
    func_gpu: str | None = None  # set: each call runs on a worker that has a GPU of its own
    n_inputs: int = 0  # the job's size (0: unknown): no node holds credit for more inputs than that


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

    def validate(self) -> None:
        if self.status not in _NODE_STATUSES:
            raise ProtocolError(f"NodeState.status must be one of {', '.join(_NODE_STATUSES)}")
        check_items("NodeState.jobs", self.jobs, (str, int, int, int))
        # Counts, summed over its jobs (at most 200,000 in a frame) and stored: bounded so that no
        # sum leaves 64 bits, and far above any job's size (calls run again count twice).
        counts = [count for _, running, queued, done in self.jobs for count in (running, queued, done)]
        if not 0 <= self.workers_alive <= _MAX_COUNT or not all(0 <= count <= _MAX_COUNT for count in counts):
            raise ProtocolError(f"NodeState counts must be from 0 to {_MAX_COUNT:,}")


@message(25)
class ShutdownNode(Message):
    reason: str


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
    """Thief to head: these inputs moved from `donor_id` to me (sent before the thief acks)."""

    job_id: str
    donor_id: str
    indices: list

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


# --- worker <-> node (a private socketpair, length-prefixed frames) ------------------------


@message(30)
class WorkerReady(Message):
    pid: int


@message(31)
class LoadFunction(Message):
    job_id: str
    function_bytes: bytes
    local_code: bytes


@message(32)
class RunCalls(_CarriesInputs):
    """A worker's batch: a job's inputs, packed as the node cut them out of what the head pushed."""

    job_id: str
    indices: bytes
    sizes: bytes
    data: bytes


@message(33)
class UnloadFunction(Message):
    job_id: str


@message(34)
class WorkerReport(Message):
    job_id: str
    indices: bytes  # the results, as PackedResults' three parts (the node passes them on)
    failed: bytes
    packed: bytes
    outputs: list  # [[input_index, stream, text], ...] of the same job
    batch_done: bool  # the last report of a RunCalls batch
    # How long the worker spent on these results' calls (0: not measured). What a call takes,
    # without the node's round trip and the function's loading, sizes the node's next batches.
    seconds: float = 0.0

    @classmethod
    def of(cls, job_id: str, items: Sequence, outputs: list, batch_done: bool, seconds: float = 0.0) -> WorkerReport:
        """The report of these results ([[input_index, ok, payload], ...]), packed."""
        part = PackedResults.of(items)
        return cls(job_id, part.indices, part.failed, part.packed, outputs, batch_done, seconds)

    def part(self) -> PackedResults:
        return PackedResults(self.indices, self.failed, self.packed)

    def validate(self) -> None:
        _check_packed("WorkerReport", self.indices, self.failed)
        check_items("WorkerReport.outputs", self.outputs, (int, int, str))


@message(35)
class WorkerWaiting(Message):
    """The running call is waiting on a nested job (True) or computing again (False)."""

    waiting: bool


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


@message(37)
class ErrorRecord(Message):
    """A failed call's error, as a result payload. The head, CLI and dashboard read the typed
    fields; only the client unpickles `exception`, so a failing call can't run code in the head."""

    type_name: str  # the class's qualified name
    module: str  # the class's module
    message: str
    traceback: str  # formatted, as the worker saw it
    exception: bytes | None  # the cloudpickled exception, None if it can't travel
    frames: dict | None  # tblib's dict of the traceback, to re-raise with the remote frames
    node_id: str = ""  # where the call failed ("" where not known)
    host: str = ""
    worker_pid: int = 0  # 0: the node itself (a crashed worker's pid is given when known)

    @property
    def qualified_name(self) -> str:
        return f"{self.module}.{self.type_name}" if self.module and self.module != "builtins" else self.type_name


def describe_error(exc: BaseException) -> bytes:
    """An error payload without a pickled object, for errors the head raises itself: the client
    re-creates exceptions of burla.errors from their name and message."""
    return ErrorRecord(type(exc).__qualname__, type(exc).__module__, str(exc), "", None, None).encode()


def read_error(payload: bytes) -> ErrorRecord:
    """The typed fields of an error payload; raises ProtocolError if it is not one."""
    record = decode(payload, ERROR_RECORD)
    assert isinstance(record, ErrorRecord)
    return record


# The most inputs or results one frame carries between client, head and nodes in the usual
# course (fewer when they are large). A frame is one step of the head's event loop, which every
# other connection waits for: this bounds that step to a few milliseconds.
BATCH_ITEMS = 4096

# The most bytes of results one frame carries from a node, and from the head to a client (more
# only for a single larger result).
RESULT_FRAME_BYTES = 8 * 1024 * 1024

# The largest frame: one 200 MB input or 100 MB function plus its envelope.
MAX_FRAME_BYTES = 216 * 1024 * 1024

# The most inputs one job may have; the head keeps a little state per input.
MAX_INPUTS = 100_000_000
# A call's output text per chunk, and the longest traceback or message worth carrying.
_TEXT = 64 * 1024 * 1024
_CALLS = 2_000_000  # the most results one frame to a client carries (8 MB of tiny results)
_PER_NODE = 200_000  # the most inputs, results or output chunks a node exchanges in one frame
_MAX_COUNT = 2**40  # a count a node reports (NodeState)

CLIENT_TO_HEAD = Channel("client to head", (OpenJob, ResumeJob, InputBatch, ResultAck, CancelJob),
                         Limits(200_000, 100_000, 1 << 20, MAX_FRAME_BYTES, 600_000))
NODE_TO_HEAD = Channel("node to head", (RegisterNode, Credit, NodeResults, OutputBatch, NodeState, Stolen, NodeLeaving),
                       Limits(_PER_NODE, 10_000, _TEXT, MAX_FRAME_BYTES, 4 * _PER_NODE))
HEAD_TO_NODE = Channel("head to node", (NodeRegistered, AssignJob, InputBatch, CreditWithdrawn, InputsPushed,
                                        CancelJob, ReleaseJob, ShutdownNode, ErrorReply, StealHint),
                       Limits(_PER_NODE, 100_000, 1 << 20, MAX_FRAME_BYTES, 4 * _PER_NODE))
HEAD_TO_CLIENT = Channel("head to client", (JobAccepted, JobResumed, ErrorReply, ResultBatch, OutputBatch,
                                            Progress, JobEnded, InputsKept),
                         Limits(_CALLS, 10_000, _TEXT, MAX_FRAME_BYTES, 4 * _CALLS))
WORKER_TO_NODE = Channel("worker to node", (WorkerReady, WorkerReport, WorkerWaiting),
                         Limits(_PER_NODE, 10_000, _TEXT, MAX_FRAME_BYTES, 4 * _PER_NODE))
NODE_TO_WORKER = Channel("node to worker", (LoadFunction, RunCalls, UnloadFunction),
                         Limits(_PER_NODE, 100_000, 1 << 20, MAX_FRAME_BYTES, 4 * _PER_NODE))
# The first frame of each link, with the limits of the link it opens.
JOB_OPENING = Channel("job opening", (OpenJob, ResumeJob), CLIENT_TO_HEAD.limits)
NODE_OPENING = Channel("node registration", (RegisterNode,), NODE_TO_HEAD.limits)
# Transfers between nodes: small requests, grants as big as the inputs they carry.
NODE_TO_NODE = Channel("node to node", (StealRequest, StealGrant, StealAck), NODE_TO_WORKER.limits)
ERROR_RECORD = Channel("error record", (ErrorRecord,), Limits(10_000, 10_000, _TEXT, MAX_FRAME_BYTES, 1_000_000))

# Length prefix for frames on the worker socket.
FRAME_HEADER = struct.Struct("!I")
