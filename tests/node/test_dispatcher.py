"""A node's Dispatcher on its own (no workers attached: inputs stay queued)."""

from __future__ import annotations

import struct
from collections import deque

from burla.node import dispatcher
from burla.node.dispatcher import MAX_BATCH, Dispatcher
from burla.node.node_job import NodeJob
from burla.node.workers.worker_pool import Batch, WorkerHandle
from burla.protocol import limits, wire, worker_wire
from burla.protocol.values.packed_inputs import PackedInputs
from burla.protocol.values.packed_results import unpack_indices


def _dispatcher() -> Dispatcher:
    return Dispatcher(lambda: [], lambda: None)


def _assign(dispatcher: Dispatcher, job_id: str) -> None:
    dispatcher.assign(wire.AssignJob(job_id, "f", b"fn", 2, None, None, b"", {}, 4))


def test_held_lists_queued_inputs_and_cancelled_jobs_empty():
    dispatcher = _dispatcher()
    _assign(dispatcher, "kept")
    _assign(dispatcher, "cancelled")
    dispatcher.add_inputs("kept", PackedInputs.of([[0, b"a"], [1, b"b"]]))
    dispatcher.add_inputs("cancelled", PackedInputs.of([[0, b"a"]]))
    dispatcher.cancel("cancelled")
    held = {job_id: unpack_indices(packed) for job_id, packed in dispatcher.held()}
    # A cancelled job the head has not released yet is listed with nothing: the head then releases it.
    assert held == {"kept": [0, 1], "cancelled": []}
    dispatcher.release("cancelled")
    assert [job_id for job_id, _ in dispatcher.held()] == ["kept"]


class _DeadWorker:
    """A worker handle (the attributes the dispatcher reads) whose process died between calls:
    its shared index says it was in no call."""

    def __init__(self, batches: list) -> None:
        self.batches = deque(batches)
        self.killed_for = None
        self.pid = 4242

    def current_index(self) -> int:
        return -1


def test_a_worker_that_keeps_dying_between_calls_fails_the_call_it_was_about_to_run():
    outgoing = []
    dispatcher = Dispatcher(lambda: [], lambda: outgoing.append(1), "node-a", "host-a")
    _assign(dispatcher, "j")
    dispatcher.add_inputs("j", PackedInputs.of([[0, b"a"], [1, b"b"]]))
    job = dispatcher.jobs["j"]
    for _ in range(2):  # MAX_CRASH_ATTEMPTS: each death takes the two queued inputs back
        part = job.queue.take_all()
        job.inflight += part.count
        dispatcher.on_worker_exit(_DeadWorker([Batch("j", part, 0.0)]), 0)
    [(index, ok, payload)] = _out(job)  # it did not loop forever: input 0 failed
    record = wire.read_error(payload)
    assert (index, ok, record.type_name, record.node_id, record.worker_pid) == (0, False, "WorkerCrashed", "node-a",
                                                                                4242)
    assert job.queue.index_list() == [1]  # the other runs again


# --- the dispatcher as a state machine: events in, effects out, on a clock the test moves ---------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class RecordedEffects:
    """The effects the dispatcher asks for, in order (WorkerEffects)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int, object]] = []
        self.writes: list[tuple[int, list[type]]] = []  # per send: the worker and its messages' kinds

    def send(self, worker, *msgs) -> None:
        self.log.extend(("send", worker.number, msg) for msg in msgs)
        self.writes.append((worker.number, [type(msg) for msg in msgs]))

    def interrupt(self, worker) -> None:
        self.log.append(("interrupt", worker.number, None))

    def kill(self, worker) -> None:
        self.log.append(("kill", worker.number, None))

    def runs(self) -> list[tuple[int, list[int]]]:
        return [(n, m.part().index_list()) for kind, n, m in self.log if isinstance(m, worker_wire.RunCalls)]

    def take(self) -> list:
        taken, self.log = self.log, []
        return taken


class _Process:
    def __init__(self, pid: int) -> None:
        self.pid = pid


def _worker(number: int, gpu: int | None = None) -> WorkerHandle:
    import mmap

    handle = WorkerHandle(number, _Process(5000 + number), None, None, mmap.mmap(-1, mmap.PAGESIZE), gpu=gpu)
    handle.ready.set()
    return handle


class Machine:
    """A dispatcher with `n` ready workers, recorded effects and a test clock."""

    def __init__(self, n: int, capacity: int | None = None, gpus: int = 0) -> None:
        self.workers = [_worker(i, gpu=i if i < gpus else None) for i in range(n)]
        self.effects = RecordedEffects()
        self.clock = Clock()
        self.outgoing = 0
        self.dispatcher = Dispatcher(lambda: self.workers, self._wake, "node-t", "host-t",
                                     capacity=(lambda: capacity) if capacity else (lambda: 1 << 30),
                                     effects=self.effects, clock=self.clock)

    def _wake(self) -> None:
        self.outgoing += 1

    def assign(self, job_id: str, parallelism: int = 8, gpu: str | None = None, reuse_key: bytes = b"") -> None:
        self.dispatcher.assign(wire.AssignJob(job_id, "f", b"fn", parallelism, None, None, b"", {}, 0, gpu,
                                              reuse_key=reuse_key))

    def fresh_worker(self) -> WorkerHandle:
        """A worker the pool started, joining now (it never ran a call)."""
        worker = _worker(len(self.workers))
        self.workers.append(worker)
        self.dispatcher.pump()
        return worker

    def finish(self, worker: WorkerHandle, seconds: float) -> None:
        """The worker's first batch ends after `seconds`, every call ok."""
        batch = worker.batches[0]
        self.clock.now += seconds
        results = [[index, True, b"r"] for index in batch.remaining_indices()]
        self.dispatcher.on_report(worker, worker_wire.WorkerReport.of(batch.job_id, results, [], True))


def _out(job) -> list:
    """The results a node's job holds for the head, decoded."""
    return [item for part in job.out_results for item in part.items()]


def _inputs(first: int, count: int) -> PackedInputs:
    return PackedInputs.of([[i, b"x"] for i in range(first, first + count)])


def test_batches_start_at_one_call_and_grow_to_about_ten_milliseconds_of_calls():
    m = Machine(2)
    m.assign("j")
    m.dispatcher.add_inputs("j", _inputs(0, 5000))
    assert m.effects.runs() == [(0, [0]), (1, [1])]  # call time unknown: one call each
    assert [k for k, _, msg in m.effects.log if isinstance(msg, worker_wire.LoadFunction)] == ["send", "send"]
    m.effects.take()
    m.finish(m.workers[0], 0.001)  # 1 ms a call: batches of ~10 ms are 10 calls
    [(worker, items)] = [r for r in m.effects.runs() if r[0] == 0][:1]
    assert worker == 0 and 5 <= len(items) <= 10
    assert not [m for _, _, m in m.effects.log if isinstance(m, worker_wire.LoadFunction)]  # loaded once per worker


def test_short_calls_get_a_second_batch_ahead_and_long_ones_do_not():
    short, long_ = Machine(1), Machine(1)
    for m, seconds in ((short, 0.001), (long_, 0.5)):
        m.assign("j")
        m.dispatcher.add_inputs("j", _inputs(0, 100))
        m.finish(m.workers[0], seconds)
    assert len(short.workers[0].batches) == 2
    assert len(long_.workers[0].batches) == 1


def test_a_job_runs_on_at_most_its_parallelism_and_all_jobs_on_at_most_the_pools_size():
    capped = Machine(4)
    capped.assign("j", parallelism=2)
    capped.dispatcher.add_inputs("j", _inputs(0, 100))
    assert sorted(n for n, _ in capped.effects.runs()) == [0, 1]
    small_pool = Machine(4, capacity=3)
    small_pool.assign("j")
    small_pool.dispatcher.add_inputs("j", _inputs(0, 100))
    assert sorted(n for n, _ in small_pool.effects.runs()) == [0, 1, 2]


def _runs(m: Machine) -> list[tuple[int, str]]:
    return [(n, msg.job_id) for _, n, msg in m.effects.take() if isinstance(msg, worker_wire.RunCalls)]


def test_a_worker_never_runs_another_jobs_calls_and_gives_its_slot_to_a_fresh_one():
    changed = []
    m = Machine(2)
    m.dispatcher.on_workers_changed = lambda: changed.append(1)
    m.assign("a")
    m.assign("b")
    m.dispatcher.add_inputs("a", _inputs(0, 10))  # both workers take the only job with inputs
    m.dispatcher.add_inputs("b", _inputs(0, 10))
    assert _runs(m) == [(0, "a"), (1, "a")] and changed  # both fresh workers are now a's
    assert {w.tenant for w in m.workers} == {b"job:a"}
    changed.clear()
    m.finish(m.workers[0], 0.5)  # b waits, and a runs its share (one of two slots) on worker 1
    assert _runs(m) == [] and changed and m.dispatcher.tenancy.yields(m.workers[0])
    m.workers[0].retired = True  # the pool retires it (WorkerPool.rebalance) and starts a fresh one
    fresh = m.fresh_worker()
    assert _runs(m) == [(fresh.number, "b")] and fresh.tenant == b"job:b"
    m.workers.remove(m.workers[0])
    m.finish(m.workers[0], 0.5)  # worker 1 goes on with a: its tenant's share
    assert _runs(m) == [(1, "a")]


def test_a_clients_later_job_of_the_same_function_runs_in_its_warm_workers():
    m = Machine(1)
    m.assign("first", reuse_key=b"k" * 16)
    m.dispatcher.add_inputs("first", _inputs(0, 1))
    m.finish(m.workers[0], 0.1)
    m.dispatcher.release("first")
    m.assign("second", reuse_key=b"k" * 16)
    m.dispatcher.add_inputs("second", _inputs(0, 1))
    assert _runs(m)[-1] == (0, "second")  # the same process: a model it loaded stays loaded
    m.assign("other", reuse_key=b"o" * 16)
    m.dispatcher.add_inputs("other", _inputs(0, 1))
    assert m.dispatcher.tenancy.yields(m.workers[0]) is False  # busy: it yields only once idle
    m.finish(m.workers[0], 0.1)
    assert _runs(m) == [] and m.dispatcher.tenancy.yields(m.workers[0])  # another client's job never runs there


def test_a_gpu_job_runs_only_on_workers_that_have_a_gpu():
    m = Machine(3, gpus=1)
    m.assign("g", gpu="A100")
    m.dispatcher.add_inputs("g", _inputs(0, 10))
    assert [n for n, _ in m.effects.runs()] == [0]


def test_cancelling_interrupts_only_that_jobs_workers_and_release_unloads_it():
    m = Machine(2)
    m.assign("a", parallelism=1)
    m.assign("b", parallelism=1)
    m.dispatcher.add_inputs("a", _inputs(0, 10))
    m.dispatcher.add_inputs("b", _inputs(0, 10))
    running_a = next(n for _, n, msg in m.effects.log if isinstance(msg, worker_wire.RunCalls) and msg.job_id == "a")
    m.effects.take()
    m.dispatcher.cancel("a")
    assert m.effects.take() == [("interrupt", running_a, None)]
    assert not m.dispatcher.jobs["a"].queue
    m.dispatcher.release("a")
    unload = worker_wire.UnloadFunction("a")
    assert [(kind, n, msg) for kind, n, msg in m.effects.take()] == [("send", running_a, unload)]
    assert "a" not in m.dispatcher.jobs


def test_results_wait_for_the_sender_and_a_dead_workers_inputs_run_first():
    m = Machine(1)
    m.assign("j")
    m.dispatcher.add_inputs("j", _inputs(0, 3))
    m.finish(m.workers[0], 0.2)
    job = m.dispatcher.jobs["j"]
    assert [item[0] for item in _out(job)] == [0] and m.outgoing >= 1
    [(_, [second])] = m.effects.runs()[1:]
    worker = m.workers[0]
    worker.alive = False
    m.dispatcher.on_worker_exit(worker, 1)  # died between calls: the input it held goes back first
    assert job.queue.index_list()[0] == second


def test_credit_asks_for_a_window_then_waits_for_a_quarter_of_it_to_drain():
    job = NodeJob("j", b"", parallelism=2)
    job.call_seconds = 0.01  # a window is 0.1 s of calls: 10 per worker
    assert job.credit_due(workers=2) == 20
    assert job.credit_due(workers=2) == 0  # all asked for already
    job.credit_unused = 0
    job.queue.append(_inputs(0, 16))  # 4 missing: under a quarter of the window
    assert job.credit_due(workers=2) == 0
    job.queue.clear()
    job.queue.append(_inputs(0, 14))
    assert job.credit_due(workers=2) == 6


def test_a_worker_gets_a_jobs_function_and_its_first_calls_in_one_write():
    m = Machine(1)
    m.assign("j")
    m.dispatcher.add_inputs("j", _inputs(0, 1))
    assert m.effects.writes == [(0, [worker_wire.LoadFunction, worker_wire.RunCalls])]
    m.finish(m.workers[0], 0.001)
    m.dispatcher.add_inputs("j", _inputs(1, 1))
    assert m.effects.writes[-1] == (0, [worker_wire.RunCalls])  # loaded already


def test_credit_never_exceeds_the_jobs_size():
    # A one-input job: the head's first credit already covers it, so the node asks for nothing.
    dispatcher = _dispatcher()
    job = dispatcher.assign(wire.AssignJob("small", "f", b"fn", 2, None, None, b"", {}, 4, None, 1))
    assert job.credit_due(workers=2) == 0
    dispatcher.add_inputs("small", _inputs(0, 1))
    assert job.credit_due(workers=2) == 0
    # Ten inputs: the window is capped at ten, first credit included.
    job = dispatcher.assign(wire.AssignJob("ten", "f", b"fn", 2, None, None, b"", {}, 4, None, 10))
    job.call_seconds = 0.01
    assert job.credit_due(workers=2) == 6
    assert job.credit_due(workers=2) == 0
    # A head that does not say the job's size: the whole window, as before.
    job = dispatcher.assign(wire.AssignJob("unknown", "f", b"fn", 2, None, None, b"", {}, 4))
    job.call_seconds = 0.01
    assert job.credit_due(workers=2) == 16


def test_results_taken_for_a_session_that_ended_mid_send_go_first_on_the_next():
    m = Machine(1)
    m.assign("j")
    m.dispatcher.add_inputs("j", _inputs(0, 3))
    m.finish(m.workers[0], 0.2)  # input 0's result
    taken = m.dispatcher.take_outgoing()
    assert [[item[0] for part in results for item in part.items()] for _, _, results in taken] == [[0]]
    m.finish(m.workers[0], 0.2)  # input 1's result, while the session is down
    m.dispatcher.give_back(taken)
    [(job_id, _, results)] = m.dispatcher.take_outgoing()
    assert job_id == "j" and [item[0] for part in results for item in part.items()] == [0, 1]


def test_a_workers_batch_is_never_more_than_a_frame_of_results():
    # A worker's report holds at most one batch's results; a node refuses one of more than this.
    assert MAX_BATCH <= limits.BATCH_ITEMS


def test_a_calls_time_is_averaged_over_calls_not_reports():
    # The first report (one call, with the function's loading and a round trip in it) used to
    # weigh as much as one of hundreds of calls: batches of short calls grew over some twenty
    # batches, each a frame to the worker and back.
    job = NodeJob("j", b"fn", 2)
    job.calls_done(1, 0.5)
    job.calls_done(200, 0.000004)
    assert job.call_seconds is not None and job.call_seconds < 0.0001
    job.calls_done(1, 0.5)  # one slow call moves it as one call
    assert 0.1 < job.call_seconds < 0.2


def test_batches_stay_whole_while_credit_brings_inputs_and_shrink_only_at_the_end():
    # Fails on the previous code: cut by the queue alone, with each worker holding two batches,
    # every batch was half the one before (600, 300, 150, 75 of these 1,200 inputs).
    m = Machine(2)
    job = m.dispatcher.assign(wire.AssignJob("j", "f", b"fn", 8, None, None, b"", {}, 4, None, 10_000))
    m.dispatcher.add_inputs("j", _inputs(0, 2))
    for worker in m.workers:
        m.finish(worker, 0.00001)  # about 10 µs a call: a batch of about 10 ms is some 800 calls
    by_time = int(dispatcher.TARGET_BATCH_S / job.call_seconds)
    job.credit_unused = 4_000  # granted to the head: more inputs are on their way
    m.effects.take()
    m.dispatcher.add_inputs("j", _inputs(2, 1_200))
    assert [len(items) for _, items in m.effects.runs()] == [by_time, 1_200 - by_time]
    # Near the end the job's size bounds what the credit can still bring: even shares again.
    job.done, job.inflight = 9_000, 600
    assert job.credit_unused > 400 and job.still_to_run() == 400
    job.queue.append(_inputs(9_600, 400))  # here they are: nothing more to come
    assert job.still_to_run() == 400


def test_a_calls_time_is_the_workers_own_measure_without_the_round_trip():
    # Fails on the previous code: the node timed a batch from its dispatch, the round trip and the
    # function's loading included, and took several batches to see how short the calls were.
    m = Machine(1)
    m.assign("j")
    m.dispatcher.add_inputs("j", _inputs(0, 5_000))
    [batch] = m.workers[0].batches
    m.clock.now += 0.002  # the report comes 2 ms after the dispatch; its one call took 10 µs
    results = [[index, True, b"r"] for index in batch.remaining_indices()]
    m.dispatcher.on_report(m.workers[0], worker_wire.WorkerReport.of("j", results, [], True, 0.00001))
    job = m.dispatcher.jobs["j"]
    assert abs(job.call_seconds - 0.00001) < 1e-9
    # The next batch is about 10 ms of calls at once (on the node's own measure, 2 ms a call: 5).
    assert len(m.effects.runs()[-1][1]) == int(dispatcher.TARGET_BATCH_S / job.call_seconds) > 900


def test_once_every_input_is_pushed_unfilled_credit_no_longer_makes_batches_bigger():
    # A node of a multi-node job: the job's size bounds nothing here, and credit the head will
    # never fill stays. Fails on the previous code, which gave 100 and 20 of the last 120 inputs
    # to two of eight workers.
    def last_batches(told: bool) -> list[int]:
        m = Machine(8)
        job = m.dispatcher.assign(wire.AssignJob("j", "f", b"fn", 8, None, None, b"", {}, 4, None, 1_000_000))
        job.call_seconds = 0.0001  # 0.1 ms a call: a batch of about 10 ms is 100 calls
        job.credit_unused = 800
        if told:
            m.dispatcher.inputs_pushed("j")
        m.dispatcher.add_inputs("j", _inputs(0, 120))
        return [len(items) for _, items in m.effects.runs()]

    assert last_batches(told=False)[:2] == [100, 20]  # more inputs are counted on
    assert max(last_batches(told=True)) <= 15  # even shares for the eight


def test_a_workers_batch_stays_within_a_frames_bytes_and_a_large_input_goes_alone():
    # Found by review: batches were cut by count alone, and 400 inputs of which two were 150 MB
    # made one batch a worker could not read (its arguments over the worker channel's limits).
    from burla.protocol.values.packed_inputs import MAX_RUN_BYTES

    m = Machine(1)
    m.assign("j")
    job = m.dispatcher.jobs["j"]
    job.call_seconds = 0.00001  # short calls: a batch of about 10 ms is a thousand of them
    big = 20 * 1024 * 1024
    sizes = [20_000] * 300 + [big] + [20_000] * 300 + [big, big] + [20_000] * 10
    items = [[index, b"x" * size] for index, size in enumerate(sizes)]
    m.dispatcher.add_inputs("j", PackedInputs.of(items))
    while m.workers[0].batches:
        m.finish(m.workers[0], 0.001)
    runs = [msg for _, _, msg in m.effects.log if isinstance(msg, worker_wire.RunCalls)]
    assert all(wire.decode(run.encode(), worker_wire.NODE_TO_WORKER) == run for run in runs)
    sent = [run.part() for run in runs]
    assert [index for part in sent for index in part.index_list()] == list(range(len(sizes)))
    assert all(len(part.data) <= MAX_RUN_BYTES or part.count == 1 for part in sent)
    assert [part.count for part in sent if len(part.data) >= big] == [1, 1, 1]
    assert job.inflight == 0 and job.done == len(sizes)


def test_inputs_are_counted_in_flight_until_their_results_and_a_dead_workers_rest_runs_again():
    m = Machine(1)
    m.assign("j")
    job = m.dispatcher.jobs["j"]
    job.call_seconds = 0.001
    m.dispatcher.add_inputs("j", _inputs(0, 20))
    worker = m.workers[0]
    [batch, ahead] = worker.batches  # 10 ms of 1 ms calls, and as much again ahead (short calls)
    assert job.inflight == batch.left + ahead.left == 20
    first = batch.part.items()[:3]
    m.dispatcher.on_report(worker, worker_wire.WorkerReport.of("j", [[i, True, b"r"] for i, _ in first], [], False))
    assert job.inflight == 17 and job.done == 3 and batch.left == 7
    worker.alive = False
    struct.pack_into("q", worker.shm, 0, -1)  # in no call: it died between calls
    m.dispatcher.on_worker_exit(worker, -9)  # input 3, the next to run, counts a crash
    assert job.inflight == 0 and job.crash_attempts == {3: 1}
    assert job.queue.index_list() == list(range(3, 20))  # the batch's rest first, in order


def test_an_installation_that_fails_fails_every_input_queued_and_to_come():
    m = Machine(0)
    m.assign("j")
    job = m.dispatcher.jobs["j"]
    job.ready = False
    m.dispatcher.add_inputs("j", _inputs(0, 3))
    m.dispatcher.install_failed("j", b"why")
    m.dispatcher.add_inputs("j", _inputs(3, 2))
    assert [(index, ok, payload) for index, ok, payload in _out(job)] == [(i, False, b"why") for i in range(5)]
    assert len(job.queue) == 0 and job.done == 5
