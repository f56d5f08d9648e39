"""The messages between a node and its workers: a private socketpair of length-prefixed frames."""

from __future__ import annotations

import struct
from collections.abc import Sequence

from burla.protocol.framing import Channel, Message, Payload, check_items, message
from burla.protocol.limits import BATCH_ITEMS, NODE_LINK, NODE_REPORTS
from burla.protocol.values.packed_inputs import CarriesInputs, PackedInputs
from burla.protocol.values.packed_results import PackedResults, check_packed

# A worker's shared page, which its node maps too: the input whose call runs (-1: none) at
# RUNNING_AT, and 1 at REPORTING_AT while it reports results between two calls of a batch.
PAGE_SLOT = struct.Struct("q")
RUNNING_AT, REPORTING_AT = 0, PAGE_SLOT.size


@message(30)
class WorkerReady(Message):
    pid: int


@message(31)
class LoadFunction(Message):
    job_id: str
    function_bytes: bytes
    local_code: bytes
    job_token: str = ""  # BURLA_JOB_TOKEN for the calls: nested jobs, never the cluster token


@message(32)
class RunCalls(CarriesInputs):
    """A worker's batch: a job's inputs, packed as the node cut them out of what the head pushed."""

    job_id: str
    indices: bytes
    sizes: bytes
    data: bytes | memoryview  # bulk
    # Its job's client takes large results from this node itself: the worker reports those apart
    # (WorkerReport.direct), each as a placeholder among the others (burla.protocol.direct_results).
    direct_results: bool = False


@message(33)
class UnloadFunction(Message):
    job_id: str


@message(34)
class WorkerReport(Message):
    job_id: str
    indices: bytes  # the results, as PackedResults' three parts (the node passes them on)
    failed: bytes
    packed: bytes | memoryview  # bulk
    outputs: list  # [[input_index, stream, text], ...] of the same job
    batch_done: bool  # the last report of a RunCalls batch
    # How long the worker spent on these results' calls (0: not measured). What a call takes,
    # without the node's round trip and the function's loading, sizes the node's next batches.
    seconds: float
    timings: bytes  # per result, when its call started, how long it ran, the worker's pid (packed_results)
    # Results sent apart, straight to the job's client (RunCalls.direct_results): their indices,
    # sizes and pickles end to end, as PackedInputs' three parts; `packed` has a placeholder for each.
    direct_indices: bytes = b""
    direct_sizes: bytes = b""
    direct: bytes | memoryview = b""  # bulk

    @classmethod
    def of(cls, job_id: str, items: Sequence, outputs: list, batch_done: bool, seconds: float = 0.0,
           timings: bytes | None = None) -> WorkerReport:
        """The report of these results ([[input_index, ok, payload], ...]), packed."""
        return cls.of_part(job_id, PackedResults.of(items, timings), outputs, batch_done, seconds)

    @classmethod
    def of_part(cls, job_id: str, part: PackedResults, outputs: list, batch_done: bool, seconds: float = 0.0,
                direct: PackedInputs | None = None) -> WorkerReport:
        if direct is None:
            return cls(job_id, part.indices, part.failed, part.packed, outputs, batch_done, seconds, part.timings)
        return cls(job_id, part.indices, part.failed, part.packed, outputs, batch_done, seconds, part.timings,
                   direct.indices, direct.sizes, direct.data)

    def part(self) -> PackedResults:
        return PackedResults(self.indices, self.failed, self.packed, self.timings)

    def direct_part(self) -> PackedInputs:
        return PackedInputs(self.direct_indices, self.direct_sizes, self.direct)

    def validate(self) -> None:
        check_packed("WorkerReport", self.indices, self.failed, self.timings)
        if self.direct_indices or self.direct_sizes or self.direct:
            self.direct_part().check("WorkerReport.direct", BATCH_ITEMS)
        check_items("WorkerReport.outputs", self.outputs, (int, int, str))


@message(35)
class WorkerWaiting(Message):
    """The running call is waiting on a nested job (True) or computing again (False)."""

    waiting: bool


WORKER_TO_NODE = Channel("worker to node", (WorkerReady, WorkerReport, WorkerWaiting),
                         NODE_REPORTS)
NODE_TO_WORKER = Channel("node to worker", (LoadFunction, RunCalls, UnloadFunction),
                         NODE_LINK)

# Length prefix for frames on the worker socket.
FRAME_HEADER = struct.Struct("!I")


def framed(msgs: Sequence[Message]) -> list[Payload]:
    """These messages as length-prefixed frames, in parts to write one after the other: small
    parts joined, a bulk frame's payloads (framing.BULK_MARK) as they are, never copied."""
    out: list[Payload] = []
    small: list[Payload] = []
    for msg in msgs:
        parts = msg.encode_parts()
        small.append(FRAME_HEADER.pack(sum(map(len, parts))))
        small.append(parts[0])
        for payload in parts[1:]:
            out.append(b"".join(small))
            small = []
            out.append(payload)
    if small:
        out.append(b"".join(small))
    return out
