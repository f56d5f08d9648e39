"""What the head knows of each node and job: plain records, which the scheduler changes (and
`mark_fresh`, how a run of results marks its inputs done)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import repeat

from burla.head.scheduling.inflight import Holders, InFlight
from burla.head.scheduling.input_queue import InputQueue
from burla.protocol import wire
from burla.protocol.states import EndKind, JobStatus
from burla.protocol.values.packed_inputs import UINT_BYTES, pack_uints, run_first, unpack_uints
from burla.protocol.views import NodeDescription, NodeUsage

RUNNING = JobStatus.RUNNING
COMPLETED = JobStatus.COMPLETED
FAILED = JobStatus.FAILED
CANCELED = JobStatus.CANCELED


@dataclass
class NodeRecord(NodeUsage, NodeDescription):
    """A registered node as the head keeps it: what it said of itself, how busy it last was, and
    what only the head needs."""

    version: str = ""
    running_by_job: dict[str, int] = field(default_factory=dict)
    queued_by_job: dict[str, int] = field(default_factory=dict)
    cert_sha256: bytes = b""  # its TLS certificate's digest, which thieves pin
    grant_key: bytes = b""  # what the head signs transfer grants from this node with
    host_id: str = ""  # nodes sharing a client's host id can open the input files it writes
    peer_host: str = ""  # the address its connection to the head came from (direct_uploads.reachable_url)

    @classmethod
    def from_register(cls, msg: wire.RegisterNode, grant_key: bytes = b"", peer_host: str = "") -> NodeRecord:
        """What the node said of itself, field by field under the same names, the key the head
        signs its transfer grants with, and where its connection came from."""
        return cls(**{name: getattr(msg, name) for name in _REGISTERED_FIELDS}, grant_key=grant_key,
                   peer_host=peer_host)


# A node's record carries every field of its registration but those only checked when it registers.
_REGISTERED_FIELDS = tuple(name for name in wire.RegisterNode.FIELDS if name not in ("build", "held", "session_proof"))


def initial_credit(slots: int) -> int:
    """What the head may push to a node as soon as it assigns a job, before the node asks: the
    smallest window a node keeps (two inputs per worker), so the first inputs skip a round trip."""
    return 2 * slots


@dataclass
class Assignment:
    """One job's share of one node."""

    parallelism: int  # at most this many of its calls run there at once
    slots: int  # how many run at once before the node oversubscribes its CPUs (func_cpu="dynamic")
    inflight: InFlight  # sent, result not yet in: each input, and the frame it went in (should the node be lost)
    credit: int = 0  # inputs the node asked for and has not been sent yet

    @classmethod
    def first(cls, holders: Holders, parallelism: int, slots: int) -> Assignment:
        """A node's new share of a job, numbered in the job's `holders`, with the credit a node's
        first window gives (initial_credit)."""
        return cls(parallelism, slots, holders.new_share(), initial_credit(slots))


@dataclass
class JobRecord:
    spec: wire.OpenJob
    status: JobStatus = RUNNING
    reason: str = ""
    end_kind: EndKind = EndKind.NONE  # the error kind it ended with, if not COMPLETED
    pending: InputQueue = field(default_factory=InputQueue)  # (index, pickled args) not yet on a node
    received: int = 0  # inputs uploaded by the client so far
    all_pushed: bool = False  # every input was on a node at once (its nodes were told: InputsPushed)
    upload_prefix: int = 0  # every index below this one has been uploaded
    # Per index, as far as inputs have been uploaded (`cover`): uploaded yet? result in yet? An
    # index past their length is neither, so a job costs nothing per input until its inputs come.
    seen: bytearray = field(default_factory=bytearray)
    done: bytearray = field(default_factory=bytearray)
    n_done: int = 0
    n_failed: int = 0
    stolen: int = 0  # inputs that moved between nodes by stealing
    node_losses: dict[int, int] = field(default_factory=dict)  # index -> nodes lost while holding it
    assignments: dict[str, Assignment] = field(default_factory=dict)
    restored: bool = False  # taken up after a head restart; its client has not said what it holds yet
    taken_up: bool = False  # taken up after a head restart: nodes may hold inputs this head never pushed
    # Inputs that went back to the queue when a node was lost: node id -> indices. Only these (and
    # what is in flight on it) may the node say it still holds when it registers again.
    lost_holdings: dict[str, set[int]] = field(default_factory=dict)
    retried: dict[int, int] = field(default_factory=dict)  # index -> failed tries run again (spec.retries)
    calls_recorded: int = 0  # per-call records given to history (node_reports.MAX_CALL_RECORDS at most)
    results_offered: set[str] = field(default_factory=set)  # nodes its client was offered (DirectOffer)
    # Inputs a node reported holding when it registered again whose bytes this head has not got
    # yet (it restarted): index -> node id. The client's upload of one goes to that node's inflight.
    node_held: dict[int, str] = field(default_factory=dict)
    # Taken up after a restart: push nothing until the nodes that were running it are back (or
    # their grace is over), so what they still hold is not pushed to another node meanwhile.
    waits_for_nodes: bool = False
    lenient_uploads: bool = False  # inputs uploaded again are ignored (a job taken up from history)
    failed_here: set[int] = field(default_factory=set)  # failures recorded before a restored job's client is back
    holders: Holders = field(default_factory=Holders)  # per input, the node share it is in flight on

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def n_inputs(self) -> int:
        return self.spec.n_inputs

    def cover(self, end: int) -> None:
        """Make `seen`, `done` and the holders reach index `end - 1` (at most n_inputs), growing
        them at least twofold so a job's uploads extend them a logarithmic number of times."""
        have = len(self.seen)
        if end <= have:
            return
        grown = min(self.spec.n_inputs, max(end, 2 * have, 4096))
        self.seen.extend(bytes(grown - have))
        self.done.extend(bytes(grown - have))
        self.holders.cover(grown)

    def is_done(self, index: int) -> bool:
        return index < len(self.done) and self.done[index] == 1

    def running(self, nodes: dict[str, NodeRecord]) -> int:
        return sum(nodes[n].running_by_job.get(self.job_id, 0) for n in self.assignments if n in nodes)


def mark_fresh(job: JobRecord, assignment: Assignment, packed: bytes, runs: bytes = b"") -> bool:
    """Mark these inputs (their packed indices, in the parts `runs` counts: PackedResults.runs)
    done if none is yet (nor twice among them) and the node holds every one; else change nothing."""
    count = len(packed) // UINT_BYTES
    if not count or len(packed) % UINT_BYTES:
        return False
    spans = _spans(packed, runs)
    if spans is None:  # a part is not a run: a steal took inputs from between, or tries ran again
        indices = sorted(unpack_uints(packed))
        first = run_first(pack_uints(indices))
        if first < 0:
            return _mark_each(job, assignment, indices)
        spans = [(first, first + count)]
    done, inflight = job.done, assignment.inflight
    for first, end in spans:
        if end > len(done) or done.find(1, first, end) >= 0 or not inflight.holds(first, end):
            return False
    inflight.release(spans)
    for first, end in spans:
        done[first:end] = b"\x01" * (end - first)  # the common case, runs of calls' results: at C speed
    job.n_done += count
    return True


def _spans(packed: bytes, runs: bytes) -> list[tuple[int, int]] | None:
    """Each part's inputs as [first, end), in order, if every part is a run and none overlaps
    another; else None."""
    if not runs:
        first = run_first(packed)
        return None if first < 0 else [(first, first + len(packed) // UINT_BYTES)]
    spans = []
    at = 0
    for length in unpack_uints(runs):
        first = run_first(packed[at:at + UINT_BYTES * length])
        if first < 0:
            return None
        spans.append((first, first + length))
        at += UINT_BYTES * length
    spans.sort()
    if at != len(packed) or any(spans[k][1] > spans[k + 1][0] for k in range(len(spans) - 1)):
        return None
    return spans


def _mark_each(job: JobRecord, assignment: Assignment, indices: list[int]) -> bool:
    """mark_fresh for inputs that are not one run (`indices` sorted), one by one at C speed."""
    done = job.done
    if indices[-1] >= len(done) or any(map(done.__getitem__, indices)) or len(set(indices)) != len(indices):
        return False
    if not assignment.inflight.release_each(indices):
        return False
    deque(map(done.__setitem__, indices, repeat(1)), maxlen=0)
    job.n_done += len(indices)
    return True
