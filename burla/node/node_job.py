"""One job as a node holds it: its queue, its workers, its credit with the head and its window."""

from __future__ import annotations

from dataclasses import dataclass, field

from burla.node.workers.worker_pool import WorkerHandle
from burla.protocol import limits
from burla.protocol.values import packed_results
from burla.protocol.values.packed_inputs import InputRuns, PackedInputs

TARGET_QUEUE_S = 0.1  # ask the head for about this much work ahead, per job
# Per call reported, how much of the previous estimate of a call's time is kept (EWMA).
CALL_TIME_KEPT = 0.7
MAX_WINDOW = limits.MAX_NODE_WINDOW
WINDOW_BYTES = 64 * 1024 * 1024


@dataclass
class NodeJob:
    job_id: str
    function_bytes: bytes
    parallelism: int
    func_ram: float | None = None
    func_cpu: int | None = None
    local_code: bytes = b""
    job_token: str = ""  # what its calls hold for nested jobs (never the cluster token)
    # Whose worker processes may run its calls: its client process's (AssignJob.reuse_key), or
    # this job's alone. A fresh worker takes the tenant of its first job.
    tenant: bytes = b""
    timeout_s: float | None = None  # how long one call may run (call_timeouts.py stops it past that)
    ready: bool = True  # False while the node installs packages the job needs
    failed_payload: bytes | None = None  # why every call of the job fails here (installation failed)
    queue: InputRuns = field(default_factory=InputRuns)  # as the head pushed them, packed
    workers: set[WorkerHandle] = field(default_factory=set)
    call_seconds: float | None = None  # EWMA of one call's duration
    mean_input_bytes: float = 0.0
    credit_unused: int = 0  # granted to the head and not yet filled
    n_inputs: int = 0  # the job's size, if the head said (0: unknown)
    all_pushed: bool = False  # the head has pushed every input of the job (InputsPushed)
    gpu: bool = False  # its calls run only on workers that have a GPU (one each)
    done: int = 0
    inflight: int = 0
    crash_attempts: dict[int, int] = field(default_factory=dict)
    cancelled: bool = False
    out_results: list[packed_results.PackedResults] = field(default_factory=list)  # results not yet sent, as packed
    out_outputs: list = field(default_factory=list)
    dropped_outputs: int = 0  # chunks over MAX_HELD_OUTPUTS since the last send
    direct: bool = False  # its pushes may hold placeholders (burla.protocol.direct_inputs)
    awaited: dict[int, int] = field(default_factory=dict)  # placeholders pushed here: index -> the input's size
    direct_results: bool = False  # its large results may go straight to its client (burla.protocol.direct_results)
    result_pipe: bool = False  # and its client's connection to take them is open here (node/result_pipes.py)
    # Workers' reports whose large results go straight to the client, in order, until its receipt:
    # (the report's results with placeholders, the large ones apart). Then they go to the head.
    direct_out: list[tuple[packed_results.PackedResults, PackedInputs]] = field(default_factory=list)

    def window(self, workers: int) -> int:
        """How many inputs to hold here, queued or running, with `workers` workers computing."""
        running = max(1, min(self.parallelism, workers))
        if self.call_seconds is None:
            want = running * 4
        else:
            want = int(running * TARGET_QUEUE_S / max(self.call_seconds, 1e-6))
        if self.mean_input_bytes:
            want = min(want, int(WINDOW_BYTES / self.mean_input_bytes))
        return max(running * 2, min(want, MAX_WINDOW))

    def took_inputs(self, part: PackedInputs, placeholder_bytes: int = 0) -> None:
        """Inputs from the head: they fill granted credit, and their size bounds the window (a
        placeholder's as the input it stands for: `placeholder_bytes` more in all)."""
        self.credit_unused = max(0, self.credit_unused - part.count)
        size = (len(part.data) + placeholder_bytes) / max(1, part.count)
        self.mean_input_bytes = size if not self.mean_input_bytes else 0.8 * self.mean_input_bytes + 0.2 * size

    def calls_done(self, count: int, seconds_per_call: float) -> None:
        """Calls finished, and what each took (it sizes the window)."""
        self.inflight -= count
        self.done += count
        if self.call_seconds is None:
            self.call_seconds = seconds_per_call
        else:  # an average over calls, not reports: a report of many calls outweighs one of a few
            kept = CALL_TIME_KEPT ** count
            self.call_seconds = kept * self.call_seconds + (1 - kept) * seconds_per_call

    def still_to_run(self) -> int:
        """Inputs this node may yet start: those queued and those its credit will bring (until the
        head says every input is pushed), no more than the job has left. Batches are cut to an
        even share of these: whole while inputs flow in, smaller only at the end (cut by the queue
        alone, with every worker holding two batches, they halved from one batch to the next, and
        their frames were most of a short call's cost)."""
        coming = len(self.queue) + len(self.awaited) + (0 if self.all_pushed else self.credit_unused)
        if self.n_inputs:
            coming = min(coming, self.n_inputs - self.done - self.inflight)
        return max(coming, len(self.queue))

    def credit_due(self, workers: int) -> int:
        """How many more inputs to ask the head for now, counted as granted (0 if the window is
        nearly full: asking in chunks of at least a quarter window keeps frames few)."""
        if self.cancelled:
            return 0
        window = self.window(workers)
        if self.n_inputs:  # a small job: asking for room it can never fill would cost a frame each way
            window = min(window, self.n_inputs)
        held = len(self.queue) + len(self.awaited) + self.inflight + self.credit_unused
        deficit = window - held
        if deficit <= 0 or (held > 0 and deficit < window // 4):
            return 0
        self.credit_unused += deficit
        return deficit
