"""What a node does with the inputs it holds: feed its workers, collect results, grant credit.

Batches to workers are sized from the measured call time (many tiny calls per batch, slow
calls alone), short calls get one batch of prefetch so a worker never waits on the loop, and
each job runs on at most its `parallelism` workers, and all jobs together on at most the
pool's current size (the governor and the guards move it). Credit asks the head for about
100 ms of work per job for the workers it runs on now, so a slow node never hoards the queue
and a fast one never starves.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Protocol

from burla.errors import BurlaError, ProtocolError, WorkerCrashed
from burla.node.node_job import NodeJob
from burla.node.tenancy import Tenancy, may_run
from burla.node.workers.worker_pool import Batch, WorkerHandle, kill_error
from burla.protocol import direct_inputs, direct_results, wire, worker_wire
from burla.protocol.values import packed_results
from burla.protocol.values.packed_inputs import PackedInputs
from burla.protocol.values.serialization import ErrorOrigin, pack_error

log = logging.getLogger("burla.node")

TARGET_BATCH_S = 0.01  # aim for batches that take a worker about this long
MIN_SHARE_S = 0.001  # at a job's end, batches are cut to even shares, but not below this long
PREFETCH_BELOW_S = 0.05  # give workers a second batch only when calls are this short
MAX_BATCH = 1024  # at most limits.BATCH_ITEMS: a worker's report holds up to a batch's results
MAX_CRASH_ATTEMPTS = 2  # a call whose worker dies runs once more, then fails
HARD_KILL_AFTER_S = 1.5  # a cancelled call that ignores SIGUSR1 this long is killed
MAX_HELD_OUTPUTS = 100_000  # output chunks a job keeps while the head is away (results are always kept)


class WorkerEffects(Protocol):
    """What the dispatcher has done to workers: the node's pool does it (DirectEffects), a test
    records it. The dispatcher itself does no I/O and reads time from its clock."""

    def send(self, worker: WorkerHandle, *msgs: wire.Message) -> None:
        """Send these messages to the worker, in order (in one write)."""

    def interrupt(self, worker: WorkerHandle) -> None:
        """Stop the worker's running call (its job was cancelled)."""

    def kill(self, worker: WorkerHandle) -> None: ...


class DirectEffects:
    def send(self, worker: WorkerHandle, *msgs: wire.Message) -> None:
        worker.send(*msgs)

    def interrupt(self, worker: WorkerHandle) -> None:
        worker.signal_cancel()

    def kill(self, worker: WorkerHandle) -> None:
        worker.kill()


class Dispatcher:
    """The node's inputs as a state machine: events in (inputs, reports, exits, cancels), effects
    out (messages to workers, interrupts, kills) through `effects`, and results waiting in each
    job's `out_results` for the node's sender (`on_outgoing` says there are some)."""

    def __init__(self, workers: Callable[[], list[WorkerHandle]], on_outgoing: Callable[[], None],
                 node_id: str = "", host: str = "", capacity: Callable[[], int] = lambda: 1 << 30,
                 effects: WorkerEffects | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._workers = workers
        self._effects: WorkerEffects = effects or DirectEffects()
        self._clock = clock
        self._capacity = capacity  # how many workers may compute at once now (the pool's size)
        self._on_outgoing = on_outgoing
        self._node_id = node_id  # where the calls it fails itself failed (a crashed worker, OOM)
        self._host = host
        self.jobs: dict[str, NodeJob] = {}
        self.filled = {True: 0, False: 0}  # inputs whose placeholders were filled: sent straight here, or not
        self.results_sent = {True: 0, False: 0}  # large results sent apart: taken by the client, or via the head
        self.on_direct: Callable[[str], None] = lambda job_id: None  # a job has large results for its client
        self.on_assigned: Callable[[str], None] = lambda job_id: None  # a job is assigned here (again)
        # A fresh worker took a tenant, or an idle one should give its slot to another tenant's
        # job: the pool starts fresh workers and retires those (WorkerPool.rebalance).
        self.on_workers_changed: Callable[[], None] = lambda: None
        self.tenancy = Tenancy(self.jobs, workers, capacity)
        self._rr = 0

    # --- from the head -------------------------------------------------------------------

    def assign(self, msg: wire.AssignJob) -> NodeJob:
        job = self.jobs.get(msg.job_id)
        if job is None:
            job = NodeJob(job_id=msg.job_id, function_bytes=msg.function_bytes, parallelism=max(1, msg.parallelism),
                          func_ram=msg.func_ram, func_cpu=msg.func_cpu, local_code=msg.local_code,
                          job_token=msg.job_token, timeout_s=msg.timeout,
                          tenant=msg.reuse_key or b"job:" + msg.job_id.encode())
            self.jobs[msg.job_id] = job
        else:
            job.parallelism = max(1, msg.parallelism)
            job.cancelled = False  # the head runs it again here (it had cancelled it on a lost session)
        job.credit_unused += msg.credit  # the head pushes this much without being asked
        job.n_inputs = msg.n_inputs
        job.gpu = msg.func_gpu is not None
        job.direct = msg.direct_inputs
        job.direct_results = msg.direct_results
        self.on_assigned(job.job_id)
        return job

    def add_inputs(self, job_id: str, part: PackedInputs) -> bool:
        job = self.jobs.get(job_id)
        if job is None or job.cancelled:
            return False
        placeholders = direct_inputs.placeholders_in(part) if job.direct else []
        job.took_inputs(part, sum(size - direct_inputs.PLACEHOLDER_BYTES for _, size in placeholders))
        if job.failed_payload is not None:
            self._fail_all(job, part.index_list())
            return True
        if placeholders:  # their bytes come apart (fill): they wait aside until then
            job.awaited.update(placeholders)
            part = direct_inputs.without(part, placeholders)
            if not part.count:
                return True
        job.queue.append(part)
        self.pump()
        return True

    def fill(self, job_id: str, part: PackedInputs, straight: bool) -> list[int]:
        """The bytes of placeholders pushed here, sent `straight` here by the client or through the
        head: those still awaited are queued (each once), the rest dropped. Returns the indices taken."""
        job = self.jobs.get(job_id)
        if job is None or job.cancelled or not job.awaited:
            return []
        awaited = job.awaited
        taken = [(index, data) for index, data in part.items() if awaited.pop(index, None) is not None]
        if taken:
            job.queue.append(part if len(taken) == part.count else PackedInputs.of(taken))  # as it came, mostly
            self.filled[straight] += len(taken)
            self.pump()
        return [index for index, _ in taken]

    def inputs_pushed(self, job_id: str) -> None:
        """Every input of the job is on its nodes: this node's credit brings no more (NodeJob.still_to_run)."""
        job = self.jobs.get(job_id)
        if job is not None:
            job.all_pushed = True
            self.pump()

    def withdraw_credit(self, job_id: str, inputs: int) -> None:
        """The head keeps back part of the credit granted: ask for it again when due (NodeJob.credit_due)."""
        job = self.jobs.get(job_id)
        if job is not None:
            job.credit_unused = max(0, job.credit_unused - inputs)

    # --- package installation before a job runs ------------------------------------------

    def install_output(self, job_id: str, text: str) -> None:
        """Installation progress, shown to the client like output (of no call)."""
        job = self.jobs.get(job_id)
        if job is not None and not job.cancelled:
            job.out_outputs.append([wire.NOT_A_CALL, wire.STDERR, text])
            self._on_outgoing()

    def install_done(self, job_id: str) -> None:
        job = self.jobs.get(job_id)
        if job is not None:
            job.ready = True
            self.pump()

    def origin(self, worker_pid: int = 0) -> ErrorOrigin:
        """Where a call this node fails failed: this node, and the worker's pid if one ran it."""
        return ErrorOrigin(self._node_id, self._host, worker_pid)

    def install_failed(self, job_id: str, payload: bytes) -> None:
        """Every input of the job, queued or still to come, ends in the installation error."""
        job = self.jobs.get(job_id)
        if job is None:
            return
        job.failed_payload = payload
        self._fail_all(job, [*job.queue.take_all().index_list(), *job.awaited])  # no bytes needed for those
        job.awaited.clear()

    def _fail_all(self, job: NodeJob, indices: list[int]) -> None:
        failed = [[index, False, job.failed_payload] for index in indices]
        job.out_results.extend(map(packed_results.PackedResults.of, packed_results.item_frames(failed)))
        job.done += len(indices)
        self._on_outgoing()

    def timeout_of(self, job_id: str) -> float | None:
        job = self.jobs.get(job_id)
        return job.timeout_s if job is not None else None

    def _fail_one(self, job: NodeJob, index: int, error: BurlaError, worker: WorkerHandle) -> None:
        payload = pack_error(error, origin=self.origin(worker.pid))
        job.out_results.append(packed_results.PackedResults.of([[index, False, payload]]))
        job.done += 1
        self._on_outgoing()

    def cancel(self, job_id: str) -> list[WorkerHandle]:
        """Stop a job here: drop its queue and interrupt its running calls."""
        job = self.jobs.get(job_id)
        if job is None:
            return []
        job.cancelled = True
        job.queue.clear()
        job.out_results.clear()
        job.out_outputs.clear()
        job.direct_out.clear()
        job.result_pipe = False  # a receipt for what was out is stale: made again if it runs here again
        interrupted = [w for w in self._workers() if any(b.job_id == job_id for b in w.batches)]
        for worker in interrupted:
            self._effects.interrupt(worker)
        return interrupted

    def release(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)
        for worker in self._workers():
            if job_id in worker.loaded_jobs and worker.alive:
                worker.loaded_jobs.discard(job_id)
                self._effects.send(worker, worker_wire.UnloadFunction(job_id))

    # --- from workers --------------------------------------------------------------------

    def on_report(self, worker: WorkerHandle, report: worker_wire.WorkerReport) -> None:
        job = self.jobs.get(report.job_id)
        now = self._clock()
        if report.indices and worker.batches:
            n = worker.batches[0].took_results(report.indices)
            # The worker's own measure if it sent one: ours adds the round trip, and the first
            # batch's the function's loading, which kept the first batches small for longer.
            elapsed = report.seconds if report.seconds > 0 else now - worker.last_progress_at
            worker.last_progress_at = now
            if job is not None and n:
                job.calls_done(n, max(elapsed, 1e-7) / n)
        if job is not None and not job.cancelled:
            if report.outputs:
                self._keep_outputs(job, report.outputs)
            if report.direct_indices:  # large results the worker sent apart, for the client
                self._direct_report(job, report.part(), report.direct_part())
            elif report.indices:  # passed on as the worker packed them
                job.out_results.append(report.part())
            self._on_outgoing()
        if report.batch_done and worker.batches:
            batch = worker.batches.popleft()
            if job is not None:
                job.inflight -= batch.left  # only non-zero for a cancelled batch
                if not any(b.job_id == job.job_id for b in worker.batches):
                    job.workers.discard(worker)
            worker.last_progress_at = now
            if not worker.batches:
                worker.idle_since = now
        self.pump()

    def _direct_report(self, job: NodeJob, part: packed_results.PackedResults, direct: PackedInputs) -> None:
        if job.result_pipe:
            job.direct_out.append((part, direct))
            self.on_direct(job.job_id)
        else:  # the client's connection closed since the worker's batch began: through the head
            job.out_results.append(direct_results.restored(part, direct))
            self.results_sent[False] += direct.count

    def direct_received(self, job_id: str, indices: bytes) -> None:
        """The client's receipt for the oldest large results sent to it: the report they came in
        goes to the head now. Raises ProtocolError if it is not for those."""
        job = self.jobs.get(job_id)
        if job is None or job.cancelled:
            return
        if not job.direct_out or job.direct_out[0][1].indices != indices:
            raise ProtocolError("a receipt for other results than the oldest sent to the client")
        part, direct = job.direct_out.pop(0)
        job.out_results.append(part)
        self.results_sent[True] += direct.count
        self._on_outgoing()

    def direct_closed(self, job_id: str) -> None:
        """The client's connection that took a job's large results closed: those it did not
        receipt go through the head."""
        job = self.jobs.get(job_id)
        if job is None:
            return
        job.result_pipe = False
        waiting, job.direct_out = job.direct_out, []
        for part, direct in waiting:
            try:
                job.out_results.append(direct_results.restored(part, direct))
            except ProtocolError as e:  # a worker's bug: its report's other reports still go
                log.error("job %s: a worker's report of large results could not be restored: %s", job_id, e)
                continue
            self.results_sent[False] += direct.count
        if waiting:
            self._on_outgoing()

    @staticmethod
    def _keep_outputs(job: NodeJob, outputs: list) -> None:
        room = MAX_HELD_OUTPUTS - len(job.out_outputs)
        if room >= len(outputs):
            job.out_outputs.extend(outputs)
            return
        job.out_outputs.extend(outputs[:max(0, room)])
        job.dropped_outputs += len(outputs) - max(0, room)

    def on_worker_exit(self, worker: WorkerHandle, exit_code: int | None) -> None:
        """Requeue what a dead worker held; the call it was running counts one crash (or, if
        the node stopped it for memory, fails with OutOfMemory or runs again with fewer workers)."""
        crashed_index = worker.current_index()
        if crashed_index < 0 and worker.batches and worker.batches[0].left:
            # It died between calls (its own code failed): blame the call it was about to run, so
            # that a job that keeps breaking its workers ends in WorkerCrashed instead of looping.
            crashed_index = worker.batches[0].next_index()
        kill = worker.killed_for
        for batch in reversed(worker.batches):
            job = self.jobs.get(batch.job_id)
            if job is None:
                continue
            job.workers.discard(worker)
            job.inflight -= batch.left
            if job.cancelled:
                continue
            requeue = []
            for index, argument_bytes in batch.remaining_items():
                if index == crashed_index and kill is not None:
                    error = kill_error(index, kill)
                    if error is not None:
                        self._fail_one(job, index, error, worker)
                        continue
                elif index == crashed_index:
                    attempts = job.crash_attempts.get(index, 0) + 1
                    job.crash_attempts[index] = attempts
                    if attempts >= MAX_CRASH_ATTEMPTS:
                        self._fail_one(job, index, WorkerCrashed(index, exit_code, attempts), worker)
                        continue
                requeue.append((index, argument_bytes))
            job.queue.prepend(PackedInputs.of(requeue))
        worker.batches.clear()
        self.pump()

    # --- feeding workers -----------------------------------------------------------------

    def capacity(self) -> int:
        return self._capacity()

    def pump(self) -> None:
        workers = [w for w in self._workers() if w.alive and w.ready.is_set() and not w.retired]
        if not workers or not self.jobs:
            return
        # Past the pool's size (it shrank), an idle worker gets nothing: the pool retires it.
        room = self._capacity() - sum(1 for w in workers if w.batches and not w.waiting)
        changed = False
        for worker in workers:
            if room <= 0:
                break
            if not worker.batches:
                if worker.tenant is not None and self.tenancy.yields(worker):
                    changed = True  # the pool retires it: a fresh worker takes its slot
                    continue
                job = self._next_job(worker)
                if job is not None:
                    changed |= worker.tenant is None
                    self._dispatch(worker, job, len(workers))
                    room -= 1
        for worker in workers:
            if len(worker.batches) == 1 and not worker.waiting:
                job = self.jobs.get(worker.batches[0].job_id)
                if job is not None and job.queue and self._calls_are_short(job):
                    self._dispatch(worker, job, len(workers))
        if changed:
            self.on_workers_changed()

    @staticmethod
    def _calls_are_short(job: NodeJob) -> bool:
        return job.call_seconds is not None and job.call_seconds < PREFETCH_BELOW_S

    def _next_job(self, worker: WorkerHandle) -> NodeJob | None:
        jobs = list(self.jobs.values())
        for offset in range(len(jobs)):
            job = jobs[(self._rr + offset) % len(jobs)]
            if not may_run(worker, job):
                continue  # another tenant's worker, or a GPU job's call on a worker without a GPU
            if job.queue and job.ready and not job.cancelled and len(job.workers) < job.parallelism:
                self._rr = (self._rr + offset + 1) % len(jobs)
                return job
        return None

    def _dispatch(self, worker: WorkerHandle, job: NodeJob, n_workers: int) -> None:
        if job.call_seconds is None:
            size = spread = 1
        else:
            call_s = max(job.call_seconds, 1e-7)
            size = max(1, min(MAX_BATCH, int(TARGET_BATCH_S / call_s)))
            # Finer shares than a millisecond of calls balance nothing and cost a frame each way.
            spread = max(math.ceil(job.still_to_run() / max(1, min(job.parallelism, n_workers))),
                         int(MIN_SHARE_S / call_s))
        part = job.queue.take(max(1, min(size, spread)))
        worker.tenant = job.tenant  # a fresh worker is the tenant's from its first call on
        run = worker_wire.RunCalls(job.job_id, part.indices, part.sizes, part.data, job.result_pipe)
        if job.job_id not in worker.loaded_jobs:  # the function first, in the same write
            load = worker_wire.LoadFunction(job.job_id, job.function_bytes, job.local_code, job.job_token)
            self._effects.send(worker, load, run)
            worker.loaded_jobs.add(job.job_id)
        else:
            self._effects.send(worker, run)
        now = self._clock()
        if not worker.batches:
            worker.last_progress_at = now
        worker.batches.append(Batch(job.job_id, part, now))
        job.workers.add(worker)
        job.inflight += part.count

    # --- state ---------------------------------------------------------------------------

    def could_run_more(self) -> int:
        """How many more workers the jobs with calls queued here could keep busy: those that may
        run more at once than they do (func_cpu="dynamic", no GPU), up to their parallelism. The
        queue here is only a window (more arrives as credit allows), so it doesn't bound this."""
        more = 0
        for job in self.jobs.values():
            if job.queue and job.ready and not job.cancelled and job.func_cpu is None and not job.gpu:
                more += max(0, job.parallelism - len(job.workers))
        return more

    def running_calls(self, job: NodeJob) -> int:
        return sum(1 for w in self._workers() if w.alive and w.batches and w.batches[0].job_id == job.job_id)

    def held(self) -> list[list]:
        """Every input this node holds per job, queued, running or with a result not yet sent:
        [[job_id, packed_results.pack_indices(...)], ...], for a head this node registers with again."""
        by_job: dict[str, list[int]] = {}
        for job in self.jobs.values():
            indices = by_job[job.job_id] = []
            if not job.cancelled:  # a cancelled one is listed empty, so that the head releases it
                indices.extend(job.queue.index_list())
                for part in [*job.out_results, *(part for part, _ in job.direct_out)]:
                    indices.extend(packed_results.unpack_indices(part.indices))
        for worker in self._workers():
            for batch in worker.batches:
                if batch.job_id in by_job and not self.jobs[batch.job_id].cancelled:
                    by_job[batch.job_id].extend(batch.remaining_indices())
        return [[job_id, packed_results.pack_indices(indices)] for job_id, indices in by_job.items()]

    def new_head_session(self) -> None:
        """A new connection to the head: credit granted on the old one is void there, and so is
        what that head said of its pushes."""
        for job in self.jobs.values():
            job.credit_unused = 0
            job.all_pushed = False
            # Placeholders whose bytes never came are not held (`held`): the head pushes them again,
            # and their client is told again where to send them.
            job.awaited.clear()

    def take_outgoing(self) -> list[tuple[str, list, list[packed_results.PackedResults]]]:
        out = []
        for job in self.jobs.values():
            if job.dropped_outputs:
                note = (f"burla: {job.dropped_outputs} chunks of output were dropped on this node while the head "
                        "was unreachable\n")
                job.out_outputs.append([wire.NOT_A_CALL, wire.STDERR, note])
                job.dropped_outputs = 0
            if job.out_results or job.out_outputs:
                out.append((job.job_id, job.out_outputs, job.out_results))
                job.out_outputs, job.out_results = [], []
        return out

    def give_back(self, taken: list[tuple[str, list, list[packed_results.PackedResults]]]) -> None:
        """Results and output `take_outgoing` gave that may not have been sent (the session ended
        mid-send): they go first on the next send. The head keeps only a result's first copy."""
        for job_id, outputs, results in taken:
            job = self.jobs.get(job_id)
            if job is None or job.cancelled:
                continue
            job.out_outputs[:0] = outputs
            job.out_results[:0] = results

    def hard_kill_stragglers(self, job_id: str, interrupted: list[WorkerHandle]) -> None:
        for worker in interrupted:
            if worker.alive and any(b.job_id == job_id for b in worker.batches):
                self._effects.kill(worker)
